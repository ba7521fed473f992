// fp4kit/formats.h: the FP4 formats, written once.
//
// E2M1 (the 4-bit element of NVFP4 and MXFP4), E4M3 (the NVFP4 block scale) and E8M0 (the MXFP4 block
// scale), each as a small traits struct with exact host/device codecs. Everything in fp4kit that needs a
// format fact (group size, scale width, checkpoint layout) reads it from here, so a new format touches
// one place.
//
// Facts (OCP MX v1.0, NVIDIA NVFP4):
//   E2M1: sign bit 3, codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; 0x8 is -0. No Inf/NaN.
//   E4M3 (OCP "fn"): bias 7, subnormals m/8 * 2^-6, max 448, NaN at 0x7F and 0xFF, no Inf.
//   E8M0: 2^(e-127) for e = 0..254 (e = 0 is 2^-127, a float32 subnormal), 0xFF = NaN, no zero.
//   Checkpoint layout (both formats): packed uint8 [N, K/2], byte = code[2i] | code[2i+1] << 4
//   (the low nibble holds the even K index); scales uint8 [N, K/group] row-major; NVFP4 adds one fp32
//   tensor scale (ModelOpt's weight_scale_2): value = e2m1 * e4m3 * tensor_scale.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP4KIT_HD __host__ __device__ __forceinline__
#else
#define FP4KIT_HD inline
#endif

namespace fp4kit {

enum class Format : int { kNVFP4 = 0, kMXFP4 = 1 };
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

const char* format_name(Format f);
const char* dtype_name(DType d);
inline int dtype_bytes(DType d) { return d == DType::kF32 ? 4 : 2; }

namespace detail {
FP4KIT_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
FP4KIT_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
// Round to nearest, ties to even, without depending on the host's rounding mode setting.
FP4KIT_HD float rint_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
FP4KIT_HD float quiet_nan() { return bits_to_float(0x7FC00000u); }
FP4KIT_HD bool is_finite(float x) { return (float_to_bits(x) & 0x7F800000u) != 0x7F800000u; }
}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// E2M1: the 4-bit element.
struct E2M1 {
  static constexpr float kMax = 6.0f;
  FP4KIT_HD static float decode(uint8_t code) {
    // Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: for exponent field e = (code>>1)&3 and mantissa m = code&1,
    // e == 0 is subnormal (m * 0.5), otherwise 2^(e-1) * (1 + m/2).
    const uint32_t e = (code >> 1) & 3u, m = code & 1u;
    const float mag = e == 0 ? 0.5f * float(m) : float(1u << (e - 1)) * (1.0f + 0.5f * float(m));
    return (code & 8u) ? -mag : mag;
  }
  // Round to nearest even, saturate at 6. Zero results are encoded as +0 (code 0) whatever the sign.
  FP4KIT_HD static uint8_t encode(float x) {
    const float a = fabsf(x);
    uint8_t c;
    // Midpoints between neighbours, ties go to the even code (even mantissa bit).
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;  // saturate (also for +-Inf; NaN never reaches here, see quantizers)
    if (c != 0 && (detail::float_to_bits(x) >> 31)) c |= 8u;
    return c;
  }
};

// ---------------------------------------------------------------------------------------------------
// E4M3 (OCP "e4m3fn"): the NVFP4 block scale.
struct E4M3 {
  static constexpr float kMax = 448.0f;
  FP4KIT_HD static bool is_nan(uint8_t b) { return (b & 0x7Fu) == 0x7Fu; }
  FP4KIT_HD static float decode(uint8_t b) {
    const uint32_t s = b >> 7, e = (b >> 3) & 0xFu, m = b & 7u;
    float mag;
    if (e == 15 && m == 7) return detail::quiet_nan();
    if (e == 0) mag = float(m) * 0.001953125f;  // m/8 * 2^-6 = m * 2^-9 (subnormal)
    else mag = ldexpf(1.0f + float(m) * 0.125f, int(e) - 7);
    return s ? -mag : mag;
  }
  // Round to nearest even with saturation to +-448 (the "satfinite" conversion); NaN -> 0x7F.
  FP4KIT_HD static uint8_t encode(float x) {
    if (x != x) return 0x7F;
    const uint8_t sign = (detail::float_to_bits(x) >> 31) ? 0x80 : 0x00;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0.015625f) {  // below the smallest normal 2^-6: step 2^-9; 8 steps round up into 0x08
      const uint32_t q = uint32_t(detail::rint_even(a * 512.0f));
      return q == 0 ? 0 : uint8_t(sign | q);
    }
    int ex;
    const float f = frexpf(a, &ex);                         // a = f * 2^ex, f in [0.5, 1)
    int e = ex - 1;                                         // a = (2f) * 2^e, 2f in [1, 2)
    uint32_t m = uint32_t(detail::rint_even((2.0f * f - 1.0f) * 8.0f));
    if (m == 8) { m = 0; e += 1; }
    const int field = e + 7;                                // 1..15 (a < 448 keeps it in range)
    uint32_t code = (uint32_t(field) << 3) | m;
    if (code > 0x7E) code = 0x7E;
    return uint8_t(sign | code);
  }
};

// ---------------------------------------------------------------------------------------------------
// E8M0: the MXFP4 block scale, a bare biased exponent.
struct E8M0 {
  FP4KIT_HD static bool is_nan(uint8_t b) { return b == 0xFF; }
  FP4KIT_HD static float decode(uint8_t b) {
    if (b == 0xFF) return detail::quiet_nan();
    if (b == 0) return detail::bits_to_float(0x00400000u);  // 2^-127, a float32 subnormal
    return detail::bits_to_float(uint32_t(b) << 23);
  }
};

// ---------------------------------------------------------------------------------------------------
// Format traits: what the rest of fp4kit asks of a format.
template <Format F> struct FormatTraits;

template <> struct FormatTraits<Format::kNVFP4> {
  static constexpr int kGroup = 16;         // values per block scale, along K
  static constexpr bool kHasTensorScale = true;
  using Scale = E4M3;
  FP4KIT_HD static float decode_scale(uint8_t b) { return E4M3::decode(b); }
};

template <> struct FormatTraits<Format::kMXFP4> {
  static constexpr int kGroup = 32;
  static constexpr bool kHasTensorScale = false;
  using Scale = E8M0;
  FP4KIT_HD static float decode_scale(uint8_t b) { return E8M0::decode(b); }
};

inline int group_size(Format f) { return f == Format::kNVFP4 ? 16 : 32; }

// Dequantize one element from the checkpoint layout (the spec, used by references and tests).
// NVFP4: e2m1 * e4m3 * tensor_scale, multiplied in that order in fp32. MXFP4: e2m1 * 2^(e-127).
FP4KIT_HD float dequant_element(Format f, uint8_t code, uint8_t scale, float tensor_scale) {
  if (f == Format::kNVFP4) return (E2M1::decode(code) * E4M3::decode(scale)) * tensor_scale;
  return E2M1::decode(code) * E8M0::decode(scale);
}

}  // namespace fp4kit
