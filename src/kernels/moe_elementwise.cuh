// moe_elementwise.cuh: steps 3 and 5 of the fused MoE layer (moe.cu), one 16-byte vector of a row per
// thread (grid: detail::row_vector_grid, CTAs striding over rows).
//
// Contract
//   moe_activation_kernel: for each of the *n_rows sorted rows r, a[r] = act(gate, up) of h[r] ([rows, 2I]
//     -> [rows, row_len]): silu(g) * u or gpt-oss SwiGLU (fp4kit/moe.h), gate/up interleaved or
//     concatenated as the checkpoint has them; in natural order (row_len = I) or, for the tensor-core
//     path's down GEMM, in lane order (k_pad long, pairs past I zero). fp32 math; FP16 saturates its
//     input and output at +-65504.
//   moe_combine_kernel: y[t] = sum over slots j of w[t, j] * o[row_of_pair[t, j]], fp32, slot order,
//     rounded once to TY (T, or FP16 from BF16 experts' o); a slot that was not routed (row -1) makes the row
//     NaN.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "fp4kit/moe.h"
#include "kernels/decode_gemm.cuh"  // Act, griddep_*
#include "kernels/moe_activation.cuh"  // Elem, activate
#include "kernels/decode_layout.h"  // layout::natural_pair

namespace fp4kit {
namespace kernels {

// ---- activation (step 3) ------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ T bits_to(uint16_t b);
template <> __device__ __forceinline__ __nv_bfloat16 bits_to<__nv_bfloat16>(uint16_t b) {
  return __ushort_as_bfloat16(b);
}
template <> __device__ __forceinline__ __half bits_to<__half>(uint16_t b) { return __ushort_as_half(b); }
__device__ __forceinline__ uint16_t raw_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ uint16_t raw_bits(__half v) { return __half_as_ushort(v); }
// Two elements as floats and back without saturation (the combine reads o and writes y as they are).
template <typename T> __device__ __forceinline__ float2 load2_raw(uint32_t bits) {
  return make_float2(Act<T>::to_float(bits_to<T>(uint16_t(bits))),
                     Act<T>::to_float(bits_to<T>(uint16_t(bits >> 16))));
}
template <typename T> __device__ __forceinline__ uint32_t store2_raw(float lo, float hi) {
  return uint32_t(raw_bits(Act<T>::from_float(lo))) | uint32_t(raw_bits(Act<T>::from_float(hi))) << 16;
}



// Two elements of T as raw bits <-> floats (loads saturate FP16, as Elem does).
template <typename T> __device__ __forceinline__ float2 load2(uint32_t bits) {
  const T lo = bits_to<T>(uint16_t(bits)), hi = bits_to<T>(uint16_t(bits >> 16));
  return make_float2(Elem<T>::load(lo), Elem<T>::load(hi));
}
template <typename T> __device__ __forceinline__ uint32_t store2(float lo, float hi) {
  return uint32_t(raw_bits(Elem<T>::store(lo))) | uint32_t(raw_bits(Elem<T>::store(hi))) << 16;
}

// a row r = act(h row r): [inter] in natural order (decode path, row_len = inter), or (lane) for the
// tensor-core path's down GEMM [row_len = k_pad] in lane order (lane_format: the experts' format; pairs
// past inter zero). Grid (x, y) (detail::row_vector_grid): CTA (x, y) takes rows x, x + gridDim.x, ...,
// and thread i the 16-byte output vector (4 pairs) y * blockDim.x + i of each. A thread loads its four
// pairs' gate/up values first (interleaved: 8 contiguous bytes per pair; concatenated: 4 + 4), so it has
// 32 bytes in flight, and the kernel fits the grid's 16 CTAs per SM (31 registers). (One pair per thread
// and step, with 2-byte loads and a 64-bit index division, ran at ~20% of the HBM bandwidth: 266 us of a
// 4096-token pass of gpt-oss-120b, in Nsight Compute; the math's instruction count is in activate.)
// Loading the next row before this row's math (40 registers) was slower at 8192 tokens: 168 against 145 us
// for gpt-oss-120b, 100 against 78 for Qwen3-30B-A3B. row_len and inter are multiples of 8 (the validator),
// so vectors and pairs are whole and aligned.
template <typename T>
__global__ void moe_activation_kernel(const T* h, T* a, const int* n_rows, int inter, int row_len, bool lane,
                                      Format lane_format, MoEActivation act, GateUpLayout layout, float alpha,
                                      float limit) {
  griddep_launch_dependents();
  griddep_wait();
  const int rows = *n_rows, vecs = row_len / 8;
  const bool il = layout == GateUpLayout::kInterleaved;
  const int v = blockIdx.y * blockDim.x + threadIdx.x;  // this thread's vector of every row it takes
  if (v >= vecs) return;
  int nat[4];  // the first natural element of each of the vector's pairs (>= inter: lane order's padding)
#pragma unroll
  for (int j = 0; j < 4; ++j) nat[j] = 2 * int(lane ? layout::natural_pair(lane_format, 4 * v + j) : 4 * v + j);
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* hr = h + int64_t(r) * 2 * inter;
    uint32_t g[4], u[4];  // gate and up of natural elements i, i + 1 of each pair, as raw T pairs
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = nat[j];
      g[j] = u[j] = 0u;
      if (i >= inter) continue;
      if (il) {  // g_i, u_i, g_i+1, u_i+1: 8 bytes
        const uint2 w = *reinterpret_cast<const uint2*>(hr + 2 * i);
        g[j] = __byte_perm(w.x, w.y, 0x5410);
        u[j] = __byte_perm(w.x, w.y, 0x7632);
      } else {
        g[j] = *reinterpret_cast<const uint32_t*>(hr + i);
        u[j] = *reinterpret_cast<const uint32_t*>(hr + inter + i);
      }
    }
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 gf = load2<T>(g[j]), uf = load2<T>(u[j]);
      out[j] = nat[j] < inter ? store2<T>(activate(gf.x, uf.x, act, alpha, limit), activate(gf.y, uf.y, act, alpha, limit))
                              : 0u;
    }
    reinterpret_cast<uint4*>(a + int64_t(r) * row_len)[v] = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

// ---- combine (step 5) ---------------------------------------------------------------------------------
// The expert outputs are read as they are (no saturation: an infinite o_tj makes its token's row infinite,
// as an unfused layer's would), summed in fp32 in slot order and rounded once to T. Grid (x, y) as the
// activation's, over tokens and 16-byte vectors of the row; up to four slots' vectors are loaded before
// they are summed (hidden % 8 == 0: the validator).
template <typename T, typename TY = T>
__global__ void moe_combine_kernel(const T* o, const int* row_of_pair, const float* weights, int tokens, int top_k,
                                   int hidden, TY* y) {
  griddep_launch_dependents();
  griddep_wait();
  const int vecs = hidden / 8;
  const int v = blockIdx.y * blockDim.x + threadIdx.x;  // this thread's vector of every token it takes
  if (v >= vecs) return;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int* rop = row_of_pair + int64_t(t) * top_k;
    const float* wt = weights + int64_t(t) * top_k;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    for (int j0 = 0; j0 < top_k; j0 += 4) {
      uint4 raw[4];
      int row[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        row[k] = j0 + k < top_k ? rop[j0 + k] : -2;
        raw[k] = row[k] >= 0 ? reinterpret_cast<const uint4*>(o + int64_t(row[k]) * hidden)[v] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (row[k] == -2) break;
        const float w = wt[j0 + k];
        const uint32_t words[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = load2_raw<T>(words[e]);
          acc[2 * e] += row[k] < 0 ? NAN : w * f.x;
          acc[2 * e + 1] += row[k] < 0 ? NAN : w * f.y;
        }
      }
    }
    uint32_t out[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = store2_raw<TY>(acc[2 * e], acc[2 * e + 1]);
    reinterpret_cast<uint4*>(y + int64_t(t) * hidden)[v] = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

}  // namespace kernels
}  // namespace fp4kit
