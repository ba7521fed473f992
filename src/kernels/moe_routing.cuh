// moe_routing.cuh: router logits [T, E] -> top-k expert ids and weights (fp4kit/routing.h), one warp per
// token.
//
// Contract
//   For every token t < tokens: ids[t, j], w[t, j] for j < top_k as fp4kit/routing.h defines them
//   (softmax top-k; sigmoid with grouped top-k, renormalization and routed scaling factor); a token with
//   a NaN logit gets ids -1 and NaN weights. E <= kRoutingMaxExperts, top_k <= 32. fp32 arithmetic;
//   deterministic (fixed reduction order). route_cpu() is the reference.
//
// Why it is shaped this way
//   Routing is a few hundred floats per token: what matters is one launch and no host round trip, so a
//   warp owns a token, and one warp's dependency chain is the cost (Nsight Compute: ~2000 instructions
//   at ~6.7 cycles each for DeepSeek-V3): every step below shortens that chain.
//   - Lanes stride over the experts (lane, lane + 32, ...), V = E / 32 of them per lane (a template
//     parameter, so they live in registers); all of a lane's logits and biases are requested before any
//     is used (one memory latency, not V).
//   - The keys are compared as order-preserving unsigned integers (NaN for absent or taken experts at the
//     bottom): a warp argmax is two redux.sync (the largest key, then the lowest id holding it) instead of
//     five shuffle rounds. Each lane sorts its V (key, id) pairs once (a bitonic network on registers), so
//     a top-k round is those two reductions over the lanes' heads and the winner dropping its head.
//   - Groups (DeepSeek-V3) go through shared memory (2E + n_group floats per warp, at most 48 KB per CTA):
//     lane g computes group g's key (its two largest, reads skewed across banks), the topk_group winners
//     are marked by writing -inf over their group key (real group keys are finite: sigmoid plus a finite
//     bias), then experts outside the marked groups get key -inf. Skipped when every group is kept.
//   - The softmax denominator over all E is summed before the rounds; lane j keeps the j-th winner, so the
//     weights are one more warp sum.
//   Per call in a CUDA graph on the H200: gpt-oss-120b 2.3 us, Qwen3-30B-A3B 2.5, DeepSeek-V3 5.5-5.6
//   (docs/moe-notes.md).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "fp4kit/routing.h"
#include "kernels/pdl.cuh"

namespace fp4kit {
namespace kernels {

constexpr int kRouteWarps = 4;  // tokens per CTA

struct RouteParams {
  const void* logits;  // [T, E] of L
  int tokens, experts, top_k;
  bool sigmoid_grouped, renormalize;
  int n_group, topk_group;
  float scale;                  // routed_scaling_factor (1 for softmax)
  const float* bias;            // [E] or null
  int32_t* ids;                 // [T, top_k]
  float* weights;               // [T, top_k]
};

// The kernel's parameters for checked arguments (routing_common.h).
inline RouteParams route_params(const Routing& r, int64_t tokens, int experts, int top_k, int32_t* ids,
                                float* weights) {
  RouteParams p{};
  p.logits = r.logits;
  p.tokens = int(tokens);
  p.experts = experts;
  p.top_k = top_k;
  p.sigmoid_grouped = r.mode == RoutingMode::kSigmoidGroupedTopK;
  p.renormalize = r.renormalize;
  p.n_group = p.sigmoid_grouped ? r.n_group : 1;
  p.topk_group = p.sigmoid_grouped ? r.topk_group : 1;
  p.scale = p.sigmoid_grouped ? r.routed_scaling_factor : 1.0f;
  p.bias = p.sigmoid_grouped ? r.correction_bias : nullptr;
  p.ids = ids;
  p.weights = weights;
  return p;
}

// Shared memory per warp: selection keys [E], scores [E], group keys [n_group].
__host__ __device__ inline size_t route_smem_floats_per_warp(int experts, int n_group) { return size_t(2 * experts + n_group); }

__device__ __forceinline__ float route_load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float route_load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float route_load(const __half* p, int64_t i) { return __half2float(p[i]); }

// Keys as unsigned integers in the same order (-0 first made +0, so that keys equal as floats stay
// equal); NaN (a taken or absent key) below everything, -inf just above it. key_of inverts it.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;
  const uint32_t u = __float_as_uint(v + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_of(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// The largest order key over the warp, and (win) the lowest id holding it: two warp reductions
// (redux.sync, sm_80) instead of five rounds of shuffles. Ids are unique, so exactly one lane's pair wins.
__device__ __forceinline__ uint32_t warp_max_key(uint32_t key, uint32_t id, uint32_t& win) {
  const uint32_t m = __reduce_max_sync(0xffffffffu, key);
  win = __reduce_min_sync(0xffffffffu, key == m ? id : 0xffffffffu);
  return m;
}
// The (key, id) pair every lane agrees on: the largest key, ties to the lower id, from each lane's own
// best pair (lanes without a candidate pass (-inf, INT_MAX)); a NaN key never wins.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  uint32_t win;
  v = key_of(warp_max_key(order_key(v), uint32_t(i), win));
  i = int(win);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// One round of a top-k over key[0, n): the winner (key, id), whose key its owner lane then marks taken.
__device__ __forceinline__ void take_best(float* key, int n, int lane, float& best, int& id) {
  best = -INFINITY;
  id = INT_MAX;
  for (int e = lane; e < n; e += 32) {  // ascending ids per lane: `>` keeps the lower id on ties
    const float v = key[e];
    if (v > best || (v == best && e < id)) {
      best = v;
      id = e;
    }
  }
  warp_argmax(best, id);
}

// Sorts V (key, id) pairs by descending key, ties by ascending id (a total order, so the bitonic network
// needs no stability), on registers: every index is a compile-time constant.
template <int V>
__device__ __forceinline__ void sort_desc(uint32_t (&ku)[V], uint32_t (&ki)[V]) {
#pragma unroll
  for (int size = 2; size <= V; size *= 2) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int j = i ^ stride;
        if (j <= i) continue;
        // (i & size) == 0: this pair ends in descending order (i first), else ascending.
        const bool j_first = ku[j] > ku[i] || (ku[j] == ku[i] && ki[j] < ki[i]);
        if (j_first == ((i & size) == 0)) {
          const uint32_t tu = ku[i], ti = ki[i];
          ku[i] = ku[j];
          ki[i] = ki[j];
          ku[j] = tu;
          ki[j] = ti;
        }
      }
    }
  }
}

// Token t's ids and weights, by one whole warp. V: keys per lane (E <= 32 V) for the top-k rounds, which
// run on registers; `key`: the warp's route_smem_floats_per_warp floats of shared memory.
template <typename L, int V>
__device__ __forceinline__ void route_token(const RouteParams& p, int64_t t, float* key) {
  const int lane = threadIdx.x % 32;
  const int E = p.experts, k = p.top_k;
  float* score = key + E;
  float* gkey = score + E;
  const L* lg = static_cast<const L*>(p.logits) + t * E;
  int32_t* ids = p.ids + t * k;
  float* w = p.weights + t * k;

  // Every logit (and bias) of this lane is requested before any is used: one memory latency, not V.
  float lv[V], bv[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int e = lane + 32 * i;
    lv[i] = e < E ? route_load(lg, e) : 0.0f;
    bv[i] = e < E && p.bias ? p.bias[e] : 0.0f;
  }
  bool nan = false;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int e = lane + 32 * i;
    if (e >= E) break;
    const float v = lv[i];
    nan |= v != v;
    if (p.sigmoid_grouped) {
      const float s = __frcp_rn(1.0f + expf(-v));  // the correctly rounded 1 / x, as a division gives
      score[e] = s;
      key[e] = s + bv[i];
    } else {
      key[e] = v;
      mx = fmaxf(mx, v);
    }
  }
  if (__any_sync(0xffffffffu, nan)) {
    if (lane < k) {
      ids[lane] = -1;
      w[lane] = __int_as_float(0x7fc00000);
    }
    return;
  }
  // Softmax over all experts: the denominator, shifted by the largest logit (the first winner below).
  float denom = 0.0f;
  if (!p.sigmoid_grouped && !p.renormalize) {
    mx = warp_max(mx);
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (lane + 32 * i < E) denom += expf(lv[i] - mx);
    denom = warp_sum(denom);
  }
  __syncwarp();

  if (p.sigmoid_grouped && p.topk_group < p.n_group) {
    const int gsize = E / p.n_group;
    for (int g = lane; g < p.n_group; g += 32) {
      float a = -INFINITY, b = -INFINITY;  // the group's two largest keys
      // Lane g starts at member g % gsize of its group: the lanes' reads fall in different banks (groups
      // of 32 keys would otherwise all hit one bank); the order does not change the two largest.
      const int off = g % gsize;
#pragma unroll 8
      for (int j = 0; j < gsize; ++j) {
        const int m = j + off < gsize ? j + off : j + off - gsize;
        const float v = key[g * gsize + m];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gkey[g] = gsize == 1 ? a : a + b;
    }
    __syncwarp();
    for (int r = 0; r < p.topk_group; ++r) {
      float best;
      int g;
      take_best(gkey, p.n_group, lane, best, g);
      if (lane == g % 32) gkey[g] = -INFINITY;  // kept
      __syncwarp();
    }
    // e / gsize as (e + 1/2) / gsize in fp32, truncated: exact for E <= 1024 (the quotient's distance to
    // an integer, >= 1 / (2 gsize), exceeds the product's rounding error).
    const float inv_gsize = 1.0f / float(gsize);
    for (int e = lane; e < E; e += 32)
      if (gkey[__float2int_rz((float(e) + 0.5f) * inv_gsize)] != -INFINITY) key[e] = -INFINITY;
    __syncwarp();
  }

  // top_k rounds on registers: each lane sorts its V (key, id) pairs once (expert lane + 32 i; absent
  // experts as NaN, last), then a round is two warp reductions over the lanes' heads and the winning lane
  // drops its head. Lane j keeps the j-th winner.
  uint32_t ku[V];
  uint32_t ki[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    ku[i] = lane + 32 * i < E ? order_key(key[lane + 32 * i]) : 0u;
    ki[i] = uint32_t(lane + 32 * i);
  }
  sort_desc<V>(ku, ki);
  float my_key = 0.0f;
  int my_id = -1;
  for (int j = 0; j < k; ++j) {
    uint32_t win;
    const uint32_t m = warp_max_key(ku[0], ki[0], win);
    if (lane == j) {
      my_key = key_of(m);
      my_id = int(win);
    }
    if (ki[0] == win) {  // ids are unique: only the winner's head matches
#pragma unroll
      for (int i = 0; i + 1 < V; ++i) {
        ku[i] = ku[i + 1];
        ki[i] = ki[i + 1];
      }
      ku[V - 1] = 0u;
      ki[V - 1] = 0xffffffffu;
    }
  }

  float wt = 0.0f;
  if (p.sigmoid_grouped) {
    const float s = lane < k ? score[my_id] : 0.0f;
    const float sum = p.renormalize ? warp_sum(s) : 1.0f;
    wt = (p.renormalize ? s / sum : s) * p.scale;
  } else {
    const float top = __shfl_sync(0xffffffffu, my_key, 0);  // the largest logit
    const float ex = lane < k ? expf(my_key - top) : 0.0f;
    const float sum = p.renormalize ? warp_sum(ex) : denom;
    wt = ex / sum;
  }
  if (lane < k) {
    ids[lane] = my_id;
    w[lane] = wt;
  }
}

template <typename L, int V>
__global__ void __launch_bounds__(kRouteWarps * 32) moe_route_kernel(const RouteParams p) {
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x / 32;
  griddep_launch_dependents();
  griddep_wait();  // the logits may come from the previous kernel
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.tokens) return;  // whole warps leave: no shuffle below misses a lane
  route_token<L, V>(p, t, route_smem + size_t(warp) * route_smem_floats_per_warp(p.experts, p.n_group));
}

// The kernel instance for E experts (keys per lane: the next power of two of E / 32).
template <typename L> inline void (*route_kernel(int experts))(RouteParams) {
  const int v = (experts + 31) / 32;
  if (v <= 1) return &moe_route_kernel<L, 1>;
  if (v <= 2) return &moe_route_kernel<L, 2>;
  if (v <= 4) return &moe_route_kernel<L, 4>;
  if (v <= 8) return &moe_route_kernel<L, 8>;
  if (v <= 16) return &moe_route_kernel<L, 16>;
  return &moe_route_kernel<L, 32>;
}

}  // namespace kernels
}  // namespace fp4kit
