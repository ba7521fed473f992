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

}  // namespace detail
}  // namespace fp4kit
