// repack_common.h: argument checks and per-row scale bookkeeping shared by the CPU and GPU prepack.
#pragma once
#include <cstdint>
#include <string>

#include "fp4kit/repack.h"

namespace fp4kit {
namespace detail {

inline std::string str(int64_t v) { return std::to_string(v); }

inline Status check_format(Format f) {
  if (f != Format::kNVFP4 && f != Format::kMXFP4)
    return Status::Invalid("format: must be nvfp4 or mxfp4 (got " + std::to_string(int(f)) + ")");
  return Status::Ok();
}

// The format and group rules every entry point shares (quantizers, prepack, GEMM).
inline Status check_group_shape(Format f, int64_t n, int64_t k) {
  FP4KIT_RETURN_IF_ERROR(check_format(f));
  if (n < 1) return Status::Invalid("n: must be >= 1 (got " + str(n) + ")");
  if (k < 1) return Status::Invalid("k: must be >= 1 (got " + str(k) + ")");
  const int g = group_size(f);
  if (k % g != 0)
    return Status::Invalid("k: must be a multiple of the group size " + std::to_string(g) + " for " +
                           format_name(f) + " (got " + str(k) + ")");
  return Status::Ok();
}

// The kernel layout and the GEMM index rows and K with 32-bit integers on top of that.
inline Status check_shape(Format f, int64_t n, int64_t k) {
  FP4KIT_RETURN_IF_ERROR(check_group_shape(f, n, k));
  if (n > INT32_MAX - 64) return Status::Invalid("n: must be < 2^31 - 64 (got " + str(n) + ")");
  if (k > INT32_MAX - 512) return Status::Invalid("k: must be < 2^31 - 512 (got " + str(k) + ")");
  return Status::Ok();
}

inline Status check_prepack(const PrepackArgs& a) {
  FP4KIT_RETURN_IF_ERROR(check_shape(a.format, a.n, a.k));
  if (!a.packed) return Status::Invalid("packed: must not be null");
  if (!a.scales) return Status::Invalid("scales: must not be null");
  if (!a.dst) return Status::Invalid("dst: must not be null");
  if (reinterpret_cast<uintptr_t>(a.dst) % 16 != 0) return Status::Invalid("dst: must be 16-byte aligned");
  if (a.format == Format::kMXFP4 && (a.tensor_scale || a.row_tensor_scale))
    return Status::Invalid("tensor_scale: mxfp4 has no tensor scale (pass null)");
  if (a.tensor_scale && a.row_tensor_scale)
    return Status::Invalid("row_tensor_scale: give either tensor_scale or row_tensor_scale, not both");
  return Status::Ok();
}

// MXFP4 per-row re-basing (see repack.h): the row's largest finite exponent.
FP4KIT_HD int mx_rebase(uint8_t e, int emax) {
  if (e == 0xFF) return 0xFF;
  const int r = int(e) - emax + 254;
  return r < 0 ? 0 : r;
}

// A row holding a NaN block scale gets a NaN out_scale, so all its outputs are NaN (the spec's answer:
// every output of the row sums over the NaN block) and the kernel needs no NaN test per scale. For MXFP4
// the NaN's payload keeps the row's emax, so unpack can undo the re-basing.
FP4KIT_HD float mx_nan_row(int emax) { return bits_to_float(0x7FC00000u | uint32_t(emax)); }
FP4KIT_HD int mx_emax_of(float out_scale) {
  const uint32_t u = float_to_bits(out_scale);
  if ((u & 0x7F800000u) == 0x7F800000u) return int(u & 0xFFu);
  int e2 = 0;
  frexpf(out_scale, &e2);  // out_scale = 2^(emax - 128) = 0.5 * 2^(emax - 127)
  return e2 + 127;
}

// NVFP4 block scales as the kernel stores them: non-negative and normalised, a 5-bit exponent and the 3
// mantissa bits. An E4M3 magnitude 2^E * (1 + m/8), E in [-9, 8] (subnormals normalised), is stored as
// ((E + 20) << 3) | m, so that the kernel builds its multiplier with one shift and one mask: s * 2^117 as
// BF16 is (code << 4) | 0x7000 (exponent field E + 244), s * 2^5 as FP16 is code << 7 (exponent field
// E + 20). No multiply, no sign. The sign goes into the block's codes instead (-s * c = s * -c, exact);
// a zero scale zeroes its block's codes (the multiplier of code 0 is not zero, the products are).
// Codes 0 / 1 keep +0 / -0 and 0xFF / 0xFE the NaNs 0x7F / 0xFF, so unpack restores those bytes.
FP4KIT_HD uint8_t nvfp4_scale_code(uint8_t e4m3) {
  if (E4M3::is_nan(e4m3)) return (e4m3 & 0x80u) ? 0xFE : 0xFF;  // the row's out_scale is NaN anyway
  const uint32_t e = (e4m3 >> 3) & 0xFu, m = e4m3 & 7u;
  if (e == 0 && m == 0) return (e4m3 & 0x80u) ? 1 : 0;
  if (e != 0) return uint8_t(((e - 7 + 20) << 3) | m);
  const int h = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // subnormal m * 2^-9 = 2^(h-9) * (m / 2^h)
  return uint8_t(((h - 9 + 20) << 3) | ((m << (3 - h)) & 7u));
}
// The E4M3 byte of a stored code (positive: a negative scale comes back positive, its codes negated).
FP4KIT_HD uint8_t nvfp4_scale_byte(uint8_t code) {
  if (code >= 0xFE) return code == 0xFF ? 0x7F : 0xFF;
  if (code <= 1) return code ? 0x80 : 0x00;
  const int E = int(code >> 3) - 20;
  const uint32_t m = code & 7u;
  if (E >= -6) return uint8_t((uint32_t(E + 7) << 3) | m);
  return uint8_t((8u | m) >> (-6 - E));  // back to a subnormal (exact: it came from one)
}
// A code of a block with E4M3 scale `scale` as prepack stores it (see nvfp4_scale_code).
FP4KIT_HD uint8_t nvfp4_block_code(uint8_t code, uint8_t scale) {
  if (E4M3::is_nan(scale)) return code;
  if ((scale & 0x7Fu) == 0) return 0;
  return (scale & 0x80u) ? uint8_t(code ^ 8u) : code;
}

}  // namespace detail
}  // namespace fp4kit
