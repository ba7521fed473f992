// quant_cpu.cpp: the host quantizer (NVFP4 / MXFP4 recipes of quant.h), the dequantizer and the fp64
// reference GEMM. These are the oracles the GPU quantizer and the GEMM kernels are tested against.
#include <cmath>

#include "fp4kit/quant.h"
#include "quant_common.h"

namespace fp4kit {

namespace {

template <DType D>
void quantize_typed(const QuantizeArgs& a) {
  const int64_t count = a.n * a.k;
  float ts = 1.0f;
  if (a.format == Format::kNVFP4) {
    if (a.given_tensor_scale) {
      ts = *a.given_tensor_scale;
    } else {
      float amax = 0.0f;
      for (int64_t i = 0; i < count; ++i) {
        const float v = quant_detail::load_elem<D>(a.w, i);
        const float m = std::fabs(v);
        if (detail::is_finite(v) && m > amax) amax = m;
      }
      ts = quant_detail::tensor_scale_from_amax(amax);
    }
    *a.tensor_scale = ts;
  }
  const int g = group_size(a.format);
  float v[32];
  for (int64_t b = 0; b < count / g; ++b) {
    for (int i = 0; i < g; ++i) v[i] = quant_detail::load_elem<D>(a.w, b * g + i);
    if (a.format == Format::kNVFP4)
      quant_detail::quantize_block_nvfp4(v, ts, a.packed + b * (g / 2), a.scales + b);
    else
      quant_detail::quantize_block_mxfp4(v, a.packed + b * (g / 2), a.scales + b);
  }
}

}  // namespace

Status quantize_cpu(const QuantizeArgs& a) {
  FP4KIT_RETURN_IF_ERROR(quant_detail::validate_quantize(a));
  switch (a.w_dtype) {
    case DType::kF32: quantize_typed<DType::kF32>(a); break;
    case DType::kBF16: quantize_typed<DType::kBF16>(a); break;
    case DType::kF16: quantize_typed<DType::kF16>(a); break;
  }
  return Status::Ok();
}

Status dequantize_cpu(const DequantizeArgs& a) {
  FP4KIT_RETURN_IF_ERROR(quant_detail::check_shape(a.format, a.n, a.k));
  if (!a.packed) return Status::Invalid("packed: must not be null");
  if (!a.scales) return Status::Invalid("scales: must not be null");
  if (!a.out) return Status::Invalid("out: must not be null");
  const int g = group_size(a.format);
  const int64_t count = a.n * a.k;
  // Row-major with k % g == 0, so element i sits in scale block i / g and byte i / 2 (low nibble first).
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t code = uint8_t((a.packed[i / 2] >> (4 * (i & 1))) & 0xF);
    a.out[i] = dequant_element(a.format, code, a.scales[i / g], a.tensor_scale);
  }
  return Status::Ok();
}

Status reference_gemm(const float* x, const float* w, const float* bias, int64_t m, int64_t n, int64_t k,
                      double* y) {
  if (!x) return Status::Invalid("x: must not be null");
  if (!w) return Status::Invalid("w: must not be null");
  if (!y) return Status::Invalid("y: must not be null");
  if (m < 1) return Status::Invalid("m: must be >= 1 (got " + std::to_string(m) + ")");
  if (n < 1) return Status::Invalid("n: must be >= 1 (got " + std::to_string(n) + ")");
  if (k < 1) return Status::Invalid("k: must be >= 1 (got " + std::to_string(k) + ")");
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    for (int64_t j = 0; j < n; ++j) {
      const float* wr = w + j * k;
      double acc = 0.0;
      for (int64_t t = 0; t < k; ++t) acc += double(xr[t]) * double(wr[t]);  // each product is exact
      y[i * n + j] = acc + (bias ? double(bias[j]) : 0.0);
    }
  }
  return Status::Ok();
}

}  // namespace fp4kit
