// gemm_test_util.h: random checkpoint-layout weights, the spec-level oracle and comparison metrics for
// the GPU GEMM tests and the benchmark's self-check.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fp4kit/formats.h"
#include "fp4kit/repack.h"

namespace fp4test {

struct CkptWeight {
  fp4kit::Format format;
  int64_t n, k;
  std::vector<uint8_t> packed;  // [n, k/2]
  std::vector<uint8_t> scales;  // [n, k/group]
  float tensor_scale = 1.0f;
};

enum class ScaleMode { kRandom, kPow2 };

// Random codes over all 16 values (-0 included); NVFP4 scales drawn over normal and subnormal E4M3, with
// both signs when allow_negative; MXFP4 exponents around 127.
inline CkptWeight random_weight(fp4kit::Format f, int64_t n, int64_t k, std::mt19937& rng,
                                ScaleMode mode = ScaleMode::kRandom, bool allow_negative = true) {
  CkptWeight w{f, n, k, {}, {}, 1.0f};
  const int g = fp4kit::group_size(f);
  w.packed.resize(size_t(n * k / 2));
  w.scales.resize(size_t(n * (k / g)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w.packed) b = uint8_t(byte(rng));
  for (auto& s : w.scales) {
    if (f == fp4kit::Format::kNVFP4) {
      if (mode == ScaleMode::kPow2) {
        s = uint8_t((byte(rng) % 6 + 4) << 3);  // 2^-3 .. 2^2, exact
      } else {
        uint8_t v;
        do v = uint8_t(byte(rng) & 0x7F); while (v == 0x7F || v < 0x01 || v > 0x60);  // up to 16, subnormals in
        if (allow_negative && byte(rng) < 32) v |= 0x80;
        s = v;
      }
    } else {
      s = uint8_t(mode == ScaleMode::kPow2 ? 125 + byte(rng) % 4 : 118 + byte(rng) % 14);
    }
  }
  w.tensor_scale = f == fp4kit::Format::kNVFP4 ? (mode == ScaleMode::kPow2 ? 0.5f : 0.0137f) : 1.0f;
  return w;
}

// Prepack arguments for w's host tensors into dst (prepack_cpu; NVFP4 with w's tensor scale).
inline fp4kit::PrepackArgs prepack_args(const CkptWeight& w, void* dst) {
  fp4kit::PrepackArgs a;
  a.format = w.format;
  a.n = w.n;
  a.k = w.k;
  a.packed = w.packed.data();
  a.scales = w.scales.data();
  a.tensor_scale = w.format == fp4kit::Format::kNVFP4 ? &w.tensor_scale : nullptr;
  a.dst = dst;
  return a;
}

// Dequantize from the checkpoint layout with the spec functions of formats.h.
inline std::vector<float> dequant(const CkptWeight& w) {
  const int g = fp4kit::group_size(w.format);
  std::vector<float> out(size_t(w.n * w.k));
  for (int64_t r = 0; r < w.n; ++r)
    for (int64_t c = 0; c < w.k; ++c) {
      const uint8_t b = w.packed[size_t(r * (w.k / 2) + c / 2)];
      const uint8_t code = (c & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
      out[size_t(r * w.k + c)] =
          fp4kit::dequant_element(w.format, code, w.scales[size_t(r * (w.k / g) + c / g)], w.tensor_scale);
    }
  return out;
}

inline uint16_t to_bits(float v, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __half h = __float2half_rn(v);
  return *reinterpret_cast<uint16_t*>(&h);
}
inline float from_bits(uint16_t u, bool bf16) {
  if (bf16) {
    uint32_t x = uint32_t(u) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

// Y_ref[i, r] for the listed rows (all rows when rows is empty), fp64 accumulation.
inline std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>* bias, int64_t m, int64_t n, int64_t k) {
  std::vector<double> y(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < n; ++r) {
      double s = bias ? double((*bias)[size_t(r)]) : 0.0;
      const float* xr = &x[size_t(i * k)];
      const float* wr = &w[size_t(r * k)];
      for (int64_t c = 0; c < k; ++c) s += double(xr[c]) * double(wr[c]);
      y[size_t(i * n + r)] = s;
    }
  return y;
}

struct Compare {
  double rel_l2 = 0, cosine = 0;
  int64_t nonfinite = 0;
};
inline Compare compare(const std::vector<double>& ref, const std::vector<float>& got) {
  double num = 0, den = 0, dot = 0, gg = 0;
  Compare c;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) { ++c.nonfinite; continue; }
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    dot += ref[i] * double(got[i]);
    gg += double(got[i]) * double(got[i]);
  }
  c.rel_l2 = std::sqrt(num / (den > 0 ? den : 1));
  c.cosine = dot / std::sqrt((den > 0 ? den : 1) * (gg > 0 ? gg : 1));
  return c;
}

}  // namespace fp4test
