// quant_common.h: what the CPU and GPU quantizers share: argument validation, exact input conversion
// (bf16/fp16 -> fp32) and the per-block NVFP4/MXFP4 recipes of quant.h.
//
// Both quantizers call the same block functions, so they run the same fp32 operations in the same
// order. The host side is compiled with -ffp-contract=off; on the device every rounding step that is
// not exact is an explicit round-to-nearest intrinsic (__fmul_rn/__fdiv_rn never fuse into an fma and
// do not depend on -prec-div), which makes the two bit-identical.
#pragma once
#include <cstdint>
#include <string>

#include "fp4kit/formats.h"
#include "fp4kit/quant.h"
#include "repack_common.h"

namespace fp4kit {
namespace quant_detail {

// ---- validation (host only) ---------------------------------------------------------------------
inline bool valid_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }
inline bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Shape rules of the quantizers and the dequantizer: the shared format/group rules, and no 32-bit limit
// (they index with 64-bit integers) beyond n * k < 2^62.
inline Status check_shape(Format f, int64_t n, int64_t k) {
  FP4KIT_RETURN_IF_ERROR(detail::check_group_shape(f, n, k));
  if (n > (int64_t(1) << 62) / k)
    return Status::Invalid("n * k: must be < 2^62 (got n=" + std::to_string(n) + ", k=" + std::to_string(k) + ")");
  return Status::Ok();
}

inline Status validate_quantize(const QuantizeArgs& a) {
  FP4KIT_RETURN_IF_ERROR(check_shape(a.format, a.n, a.k));
  if (!a.w) return Status::Invalid("w: must not be null");
  if (!valid_dtype(a.w_dtype))
    return Status::Invalid("w_dtype: must be float32, bfloat16 or float16 (got " + std::to_string(int(a.w_dtype)) + ")");
  if (!aligned(a.w, dtype_bytes(a.w_dtype)))
    return Status::Invalid(std::string("w: must be aligned to ") + std::to_string(dtype_bytes(a.w_dtype)) +
                           " bytes for " + dtype_name(a.w_dtype));
  if (!a.packed) return Status::Invalid("packed: must not be null");
  if (!a.scales) return Status::Invalid("scales: must not be null");
  if (a.format == Format::kNVFP4) {
    if (!a.tensor_scale) return Status::Invalid("tensor_scale: must not be null for nvfp4");
    if (!aligned(a.tensor_scale, 4)) return Status::Invalid("tensor_scale: must be 4-byte aligned");
    if (a.given_tensor_scale && !aligned(a.given_tensor_scale, 4))
      return Status::Invalid("given_tensor_scale: must be 4-byte aligned");
  }
  return Status::Ok();
}

// ---- exact arithmetic helpers (host and device) ------------------------------------------------
FP4KIT_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP4KIT_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

FP4KIT_HD float bf16_to_float(uint16_t h) { return detail::bits_to_float(uint32_t(h) << 16); }

// IEEE binary16 -> fp32, exact (every half is a float). Inf/NaN keep their payload.
FP4KIT_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return detail::bits_to_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) {  // zero or subnormal: m * 2^-24 (an exact product)
    const float mag = mul_rn(float(m), 5.9604644775390625e-08f);
    return sign ? -mag : mag;
  }
  return detail::bits_to_float(sign | ((e + 112u) << 23) | (m << 13));  // re-bias 15 -> 127
}

template <DType D>
FP4KIT_HD float load_elem(const void* w, int64_t i) {
  if (D == DType::kF32) return static_cast<const float*>(w)[i];
  const uint16_t h = static_cast<const uint16_t*>(w)[i];
  return D == DType::kBF16 ? bf16_to_float(h) : f16_to_float(h);
}

// NVFP4 tensor scale: amax / (6 * 448), one fp32 division; 1 for an all-zero tensor.
FP4KIT_HD float tensor_scale_from_amax(float amax) { return amax == 0.0f ? 1.0f : div_rn(amax, 2688.0f); }

// ---- the block recipes -------------------------------------------------------------------------
// amax of |v| over a block; `nonfinite` is set when the block holds a NaN or Inf.
template <int G>
FP4KIT_HD float block_amax(const float* v, bool& nonfinite) {
  float amax = 0.0f;
  nonfinite = false;
  for (int i = 0; i < G; ++i) {
    if (!detail::is_finite(v[i])) nonfinite = true;
    const float a = fabsf(v[i]);
    if (a > amax) amax = a;  // max is exact: the order of the scan cannot change it
  }
  return amax;
}

template <int G>
FP4KIT_HD void pack_codes(const uint8_t* c, uint8_t* packed) {
  for (int i = 0; i < G / 2; ++i) packed[i] = uint8_t(c[2 * i] | (c[2 * i + 1] << 4));
}

// One NVFP4 block of 16: scale byte = e4m3(amax / (6 * ts)), code = e2m1(x / (e4m3 * ts)).
FP4KIT_HD void quantize_block_nvfp4(const float* v, float ts, uint8_t* packed, uint8_t* scale) {
  uint8_t c[16] = {};
  bool bad;
  const float amax = block_amax<16>(v, bad);
  uint8_t s = 0x7F;  // the NaN scale for a block holding NaN/Inf, its codes stay 0
  if (!bad) {
    s = E4M3::encode(div_rn(amax, mul_rn(6.0f, ts)));
    const float d = mul_rn(E4M3::decode(s), ts);
    // A zero (all-zero block, or a scale that underflowed) or NaN denominator (a NaN given tensor
    // scale) has no meaningful quotient: those blocks keep zero codes.
    if (d != 0.0f && d == d)
      for (int i = 0; i < 16; ++i) c[i] = E2M1::encode(div_rn(v[i], d));
  }
  *scale = s;
  pack_codes<16>(c, packed);
}

// One MXFP4 block of 32: e = clamp(floor(log2 amax) - 2 + 127, 0, 254), code = e2m1(x * 2^(127 - e)).
FP4KIT_HD void quantize_block_mxfp4(const float* v, uint8_t* packed, uint8_t* scale) {
  uint8_t c[32] = {};
  bool bad;
  const float amax = block_amax<32>(v, bad);
  uint8_t s = 0xFF;  // the NaN scale
  if (!bad) {
    s = 0;  // all-zero block
    if (amax != 0.0f) {
      // floor(log2(amax)) + 127 is the biased exponent field of a normal amax (what frexpf gives, less
      // one). A subnormal amax has field 0 and floor(log2) <= -127, where the clamp yields 0 either way.
      int e = int(detail::float_to_bits(amax) >> 23) - 2;
      e = e < 0 ? 0 : (e > 254 ? 254 : e);
      s = uint8_t(e);
      // x * 2^(127-e) is exact except for elements far below the block amax, which encode to 0 anyway.
      for (int i = 0; i < 32; ++i) c[i] = E2M1::encode(ldexpf(v[i], 127 - e));
    }
  }
  *scale = s;
  pack_codes<32>(c, packed);
}

}  // namespace quant_detail
}  // namespace fp4kit
