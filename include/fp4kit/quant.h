// fp4kit/quant.h: quantizers, dequantizers and the spec-level reference GEMM.
//
// Quantizers write the checkpoint layout (see formats.h): packed uint8 [N, K/2], scales uint8
// [N, K/group], and for NVFP4 one fp32 tensor scale.
//   NVFP4 (ModelOpt recipe): tensor_scale = amax / (6 * 448) (amax over the finite values; 1 if amax == 0),
//     block scale = e4m3_rne_sat(block_amax / (6 * tensor_scale)), element = e2m1_rne_sat(x / (s * ts)).
//   MXFP4 (OCP recipe): e = clamp(floor(log2(block_amax)) - 2 + 127, 0, 254) (0 for an all-zero block),
//     element = e2m1_rne_sat(x * 2^(127 - e)).
// A block holding a NaN or Inf gets the NaN scale (E4M3 0x7F, E8M0 0xFF) and zero codes.
// The CPU and GPU quantizers are bit-identical (same fp32 operations in the same order).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/formats.h"
#include "fp4kit/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace fp4kit {

struct QuantizeArgs {
  Format format = Format::kNVFP4;
  const void* w = nullptr;       // [N, K] row-major, dtype w_dtype
  DType w_dtype = DType::kF32;
  int64_t n = 0, k = 0;          // k % group_size(format) == 0
  uint8_t* packed = nullptr;     // out: [N, K/2]
  uint8_t* scales = nullptr;     // out: [N, K/group]
  float* tensor_scale = nullptr; // NVFP4 out: one float (ignored for MXFP4)
  // NVFP4 only: when non-null, use this tensor scale (one float, same memory space as w) instead of
  // amax / (6 * 448). Lets fused projections share a scale.
  const float* given_tensor_scale = nullptr;
};

// CPU: all pointers are host memory.
Status quantize_cpu(const QuantizeArgs& a);
// GPU: all pointers are device memory; `workspace` must hold quantize_workspace_bytes() bytes.
size_t quantize_workspace_bytes();
Status quantize_gpu(const QuantizeArgs& a, void* workspace, cudaStream_t stream);

struct DequantizeArgs {
  Format format = Format::kNVFP4;
  const uint8_t* packed = nullptr;  // [N, K/2]
  const uint8_t* scales = nullptr;  // [N, K/group]
  float tensor_scale = 1.0f;        // NVFP4 only
  int64_t n = 0, k = 0;
  float* out = nullptr;             // [N, K] fp32
};
Status dequantize_cpu(const DequantizeArgs& a);

// Reference GEMM (the oracle): Y[m, n] = sum_k X[m, k] * W[n, k] + bias[n], accumulated in fp64 from the
// fp32-dequantized weights. x: [M, K] fp32, w: [N, K] fp32, bias: [N] or null, y: [M, N] fp64.
Status reference_gemm(const float* x, const float* w, const float* bias, int64_t m, int64_t n, int64_t k,
                      double* y);

}  // namespace fp4kit
