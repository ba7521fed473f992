// moe_activation.cuh: the MoE activation of one gate/up pair, and the activation dtype's saturating
// conversions. Used by the activation kernel (moe_elementwise.cuh) and by the grouped decode GEMM's
// cluster reduction, which can apply it to gate_up's outputs directly (decode_gemm.cuh, finish_cluster):
// both produce the same bits from the same h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp4kit/moe.h"

namespace fp4kit {
namespace kernels {

// Element conversions of the activation dtype; FP16 saturates (see fp4kit/moe.h): a gate/up value that
// overflowed to +-inf in the gate_up epilogue reads as +-65504, and an activation output past the range
// is written as +-65504, so the down GEMM never sees an infinity. NaN stays NaN (comparisons, not
// fminf/fmaxf, which would drop it).
template <typename T> struct Elem;
template <> struct Elem<__nv_bfloat16> {
  __device__ __forceinline__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<__half> {
  static constexpr float kMax = 65504.0f;  // the largest finite fp16
  __device__ __forceinline__ static float sat(float v) { return v > kMax ? kMax : (v < -kMax ? -kMax : v); }
  __device__ __forceinline__ static float load(__half v) { return sat(__half2float(v)); }
  __device__ __forceinline__ static __half store(float v) { return __float2half_rn(sat(v)); }
};

// act(g, u) in fp32: gpt-oss SwiGLU or silu(g) * u. The sigmoid takes the fast exponential and an IEEE
// reciprocal (a few ulp of fp32, far below the output's BF16/FP16 rounding); with expf and a full division
// the kernel was bound by its instructions (~40 per output). g = -inf gives NaN (-inf * 0), as g / inf did.
__device__ __forceinline__ float activate(float g, float u, MoEActivation act, float alpha, float limit) {
  if (act == MoEActivation::kSwigluOAI) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g * __frcp_rn(1.0f + __expf(-alpha * g)) * (u + 1.0f);
  }
  return g * __frcp_rn(1.0f + __expf(-g)) * u;
}

}  // namespace kernels
}  // namespace fp4kit
