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

// act(g, u) in fp32: gpt-oss SwiGLU or silu(g) * u, the sigmoid as 1 / (1 + 2^(g * c)) with c = -alpha *
// log2(e) (1 for silu) from the approximate exponential and reciprocal (a few ulp of fp32, far below the
// output's BF16/FP16 rounding). Nine instructions per element: with expf and a full division the kernel
// was bound by its ~40 instructions per output, and with __expf and an IEEE reciprocal (Newton steps) it
// still issued on 72% of the cycles at 37% of the HBM bandwidth (Nsight Compute, gpt-oss-120b T = 8192).
// g = -inf gives NaN (-inf * 0), as g / inf did.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float activate(float g, float u, MoEActivation act, float alpha, float limit) {
  constexpr float kLog2e = 1.4426950408889634f;
  if (act == MoEActivation::kSwigluOAI) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    const float s = g * rcp_approx(1.0f + ex2_approx(g * (-alpha * kLog2e)));  // g * sigmoid(alpha g)
    return fmaf(s, u, s);                                                       // s * (u + 1)
  }
  return g * rcp_approx(1.0f + ex2_approx(g * -kLog2e)) * u;
}

}  // namespace kernels
}  // namespace fp4kit
