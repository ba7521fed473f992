// moe_route_align.cuh: routing and the align step of a small pass in one launch (fused_moe with routing
// from logits, moe.cu).
//
// Contract
//   moe_route_align_kernel<L, V>, one CTA of 32 x W threads (W = route_align_warps(tokens): one warp per
//   token, at least 4), route_align_smem_bytes(...) of dynamic shared memory: warp w routes token w
//   exactly as moe_route_kernel does (route_token: ids and weights into the workspace), then the CTA builds
//   the pass's schedule from those ids exactly as moe_align_kernel does (align_one_cta) and zeroes the
//   grouped GEMMs' arrival counters. For passes of at most kRouteAlignMaxTokens tokens that are the whole
//   call (one pass), E <= 256 (V <= 8 keys per lane: 39-47 registers, within the 64 of the 1024-thread
//   bound, no local memory) and a shared-memory need of at most 48 KB (route_align_fits).
//
// Why: a decode call's routing and align launches each wait for the previous kernel and then run a single
// dependency chain of a few microseconds (docs/moe-notes.md: the align launch alone is ~2.8 us of a
// gpt-oss-120b T = 1 call inside the graph). One CTA that routes every token can read the ids it just
// wrote after a barrier, so the second launch, its wait and its id loads from L2 go.
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/moe.h"
#include "fp4kit/routing.h"
#include "kernels/moe_align.cuh"
#include "kernels/moe_routing.cuh"

namespace fp4kit {
namespace kernels {

constexpr int kRouteAlignMaxTokens = 32;
// Such a call is one pass on every path, and its align step is the one-CTA form.
static_assert(kRouteAlignMaxTokens <= kMoEBF16PassTokens && kRouteAlignMaxTokens <= kMoEDecodePassTokens &&
                  kRouteAlignMaxTokens <= kMoETensorCorePassTokens,
              "a routed-in-align call must be a single pass");
static_assert(kRouteAlignMaxTokens * kRoutingMaxTopK < kAlignSplitMinPairs,
              "a routed-in-align call must take the one-CTA align");
__host__ __device__ constexpr int route_align_warps(int tokens) { return tokens < 4 ? 4 : tokens; }
inline size_t route_align_smem_bytes(int tokens, int experts, int n_group) {
  const size_t route = size_t(route_align_warps(tokens)) * route_smem_floats_per_warp(experts, n_group) * sizeof(float);
  const size_t align = size_t(experts) * sizeof(int);
  return route > align ? route : align;
}
inline bool route_align_fits(int64_t tokens, int experts, int n_group) {
  return tokens >= 1 && tokens <= kRouteAlignMaxTokens && experts <= 256 &&
         route_align_smem_bytes(int(tokens), experts, n_group) <= 48 * 1024;
}

template <typename L, int V>
__global__ void __launch_bounds__(kRouteAlignMaxTokens * 32, 1)
    moe_route_align_kernel(const RouteParams p, int block_rows, AlignBufs b, int* counters, int n_counters) {
  extern __shared__ float route_align_smem[];  // routing: [warps][2E + n_group] floats; then align: [E] ints
  __shared__ AlignSums s_warp[32];
  const int warp = threadIdx.x / 32;
  griddep_launch_dependents();
  griddep_wait();  // the logits may come from the previous kernel; the workspace is read by earlier ones
  zero_counters(counters, n_counters);
  if (warp < p.tokens)
    route_token<L, V>(p, warp, route_align_smem + size_t(warp) * route_smem_floats_per_warp(p.experts, p.n_group));
  __syncthreads();  // every token's ids are in global memory and visible to the whole CTA; the keys are dead
  align_one_cta(p.ids, p.tokens * p.top_k, p.top_k, p.experts, block_rows, b,
                reinterpret_cast<int*>(route_align_smem), s_warp);
}

// The instance for E <= 256 experts (keys per lane: the next power of two of E / 32, as route_kernel).
template <typename L>
inline void (*route_align_kernel(int experts))(RouteParams, int, AlignBufs, int*, int) {
  const int v = (experts + 31) / 32;
  if (v <= 1) return &moe_route_align_kernel<L, 1>;
  if (v <= 2) return &moe_route_align_kernel<L, 2>;
  if (v <= 4) return &moe_route_align_kernel<L, 4>;
  return &moe_route_align_kernel<L, 8>;
}

}  // namespace kernels
}  // namespace fp4kit
