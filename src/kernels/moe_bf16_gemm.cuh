// moe_bf16_gemm.cuh: the grouped BF16 x BF16 GEMM of the fused MoE layer with BF16 experts (moe.cu).
//
// Contract
//   For every active expert e of the device-side schedule (moe.cu's align kernel: n_active, active[],
//   offset[]) and its m_e = offset[e+1] - offset[e] <= 64 sorted rows:
//     Y[offset[e] + j, :] = X[row(offset[e] + j), :] @ W_e^T (+ bias[e])     j < m_e
//   W_e plain row-major [n, k] BF16 at base + e * stride (what checkpoints ship, no prepack); X row-major
//   [*, k] BF16, gathered through x_rows (gate_up: the token of each sorted row) or read in sorted order
//   (down); Y [rows, n] BF16. fp32 accumulation, bias added in fp32, one rounding. Deterministic: each
//   output is summed by one warp in a fixed order, no atomics, no split-K.
//
// Why it is shaped this way
//   A decode MoE step is the touched experts' weight bytes over HBM bandwidth; BF16 weights are ~3.8x
//   the FP4 bytes, so the kernel only has to stream them without stalls:
//   - A group of S warps of one CTA (split: 1, 2, 4 or 8) owns one 16-row tile of one expert, warp z of the
//     group K steps [z k_steps / S, (z + 1) k_steps / S): no partials in global memory, fences or arrival
//     counters (the fixed cost that limits the FP4 grouped GEMM on small experts). Where the touched
//     experts have few tiles (gpt-oss-120b at T = 1: 4 x 360 gate_up and 4 x 180 down tiles for 2112
//     resident warps) S > 1 puts every warp to streaming (the plan's rule, moe.cu); the group's warps
//     then add their accumulators through shared memory in z order (deterministic) and warp 0 stores.
//   - Tiles are dealt round-robin over CTAs first (tile i -> CTA i % G, then group), so every SM gets the
//     same number of tiles (+-1) whatever the routing; the tile count is read from the device schedule,
//     so the launch (grid = resident CTAs) is CUDA-graph safe.
//   - Y^T = W X^T on mma.m16n8k16: the 16 weight rows are the A operand, loaded straight into registers.
//     Lane (g, t) loads 16 bytes of row g and of row g+8 at K offset 32s + 8t: a warp's load covers 64
//     contiguous bytes of 8 rows (whole 32-byte sectors). MMA k-slots are a permutation of K: slots
//     {2t, 2t+1, 2t+8, 2t+9} of the first MMA are K = 32s + 8t + {0, 1, 2, 3}, those of the second
//     +4..7; the B fragment of lane (g, t) is token g's same 8 K values, one 16-byte load of X (L1-cached:
//     every warp on the same expert reads the same rows).
//   - A register ring of D stages (2 x 16 bytes per lane each) keeps D-1 loads per lane in flight while a
//     stage is multiplied: 8 KB per warp at D = 8, ~40-90 KB per SM with 5-11 busy warps, above what
//     Little's law asks of HBM3e (~30 KB per SM at ~1 us). Loads are ld.global.nc, no L1 allocation, L2
//     evict-first with a 256-byte L2 prefetch (4 consecutive stages of a row share 256 bytes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode_gemm.cuh"

namespace fp4kit {
namespace kernels {

struct Bf16GroupedParams {
  const void* x;          // [rows, k] bf16 (gate_up: token rows of the pass; down: sorted rows)
  const int* x_rows;      // [rows] X row of each sorted row, or null (X row = sorted row)
  void* y;                // [rows, n] bf16, sorted rows
  const int* n_active;    // the device schedule (moe.cu's align kernel)
  const int* active;
  const int* offset;
  const uint8_t* base;    // expert e's [n, k] bf16 matrix at base + e * stride
  size_t stride;
  const void* bias;       // [E, n] bf16 or null
  int n, k;
  int row_tiles;          // ceil(n / 16)
  int k_steps;            // ceil(k / 32)
  int split;              // warps per tile (1, 2, 4 or 8); > 1: bf16_split_smem(NT) bytes of dynamic shared memory
};

constexpr int kBf16Warps = 8;  // warps per CTA (2 CTAs per SM)
// Shared memory of a split launch: every warp's accumulators (NT x 4 floats per lane).
constexpr int bf16_split_smem(int n_tiles) { return kBf16Warps * n_tiles * 4 * 32 * 4; }

// Ring depth per token-tile count: the deepest ring that stays within 128 registers.
constexpr int bf16_depth(int n_tiles) { return n_tiles <= 2 ? 8 : n_tiles == 4 ? 6 : 4; }

// 16 weight bytes: read-only path, no L1 allocation, L2 evict-first, 256-byte L2 prefetch.
__device__ __forceinline__ uint4 ld_weight16(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

template <int NT>
__global__ void __launch_bounds__(kBf16Warps * 32, 2) moe_bf16_gemm_kernel(const Bf16GroupedParams p) {
  constexpr int D = bf16_depth(NT);
  griddep_launch_dependents();
  griddep_wait();  // the schedule and X: written by the previous kernels
  extern __shared__ float bf16_red[];  // split > 1: [warp][NT * 4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int S = p.split, group = warp / S, z = warp % S;
  const int64_t tiles = int64_t(*p.n_active) * p.row_tiles;
  const int64_t step = int64_t(gridDim.x) * (kBf16Warps / S);
  const int kv = p.k / 8;  // 16-byte pieces per row (k is a multiple of 8)
  const int s_begin = p.k_steps * z / S, s_end = p.k_steps * (z + 1) / S;  // this warp's K steps
  const uint64_t pol = evict_first_policy();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint4* x = static_cast<const uint4*>(p.x);
  // The group's warps meet on named barrier 1 + group (0 is __syncthreads'), S * 32 threads.
  auto group_sync = [&] { asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(S * 32) : "memory"); };

  for (int64_t i = blockIdx.x + int64_t(gridDim.x) * group; i < tiles; i += step) {
    const int e = p.active[int(i / p.row_tiles)];
    const int tile = int(i % p.row_tiles);
    const int r0 = p.offset[e], m = p.offset[e + 1] - r0;
    const uint4* w = reinterpret_cast<const uint4*>(p.base + size_t(e) * p.stride);
    const int row_a = tile * 16 + g, row_b = row_a + 8;
    const bool ok_a = row_a < p.n, ok_b = row_b < p.n;
    const uint4* wa = w + int64_t(ok_a ? row_a : 0) * kv + t;
    const uint4* wb = w + int64_t(ok_b ? row_b : 0) * kv + t;
    // X row of token column g of each token tile (clamped to a real row; extra columns are discarded).
    // (16-byte pieces: X holds at most 64 * top_k rows of k values, far below 2^31 pieces.)
    int xo[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int j = min(8 * nt + g, m - 1);
      xo[nt] = (p.x_rows ? p.x_rows[r0 + j] : r0 + j) * kv + t;
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[nt][c] = 0.0f;

    // Stages past this warp's range are not read (they are the next warp's): a split costs no bytes.
    uint4 ra[D], rb[D];
#pragma unroll
    for (int d = 0; d + 1 < D; ++d) {
      const int sl = s_begin + d;
      const bool v = sl < s_end && 4 * sl + t < kv;
      ra[d] = (ok_a && v) ? ld_weight16(wa + 4 * sl, pol) : zero;
      rb[d] = (ok_b && v) ? ld_weight16(wb + 4 * sl, pol) : zero;
    }
    for (int s0 = s_begin; s0 < s_end; s0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int s = s0 + d;
        if (s >= s_end) break;
        {  // refill the slot stage s-1 used with stage s+D-1
          const int sl = s + D - 1;
          const bool v = sl < s_end && 4 * sl + t < kv;
          ra[(d + D - 1) % D] = (ok_a && v) ? ld_weight16(wa + 4 * sl, pol) : zero;
          rb[(d + D - 1) % D] = (ok_b && v) ? ld_weight16(wb + 4 * sl, pol) : zero;
        }
        const bool v = 4 * s + t < kv;
        const uint32_t qa[4] = {ra[d].x, ra[d].y, ra[d].z, ra[d].w};
        const uint32_t qb[4] = {rb[d].x, rb[d].y, rb[d].z, rb[d].w};
        const uint32_t a0[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a1[4] = {qa[2], qb[2], qa[3], qb[3]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (8 * nt >= m) break;  // warp-uniform
          const uint4 xv = v ? __ldg(x + xo[nt] + 4 * s) : zero;
          Act<__nv_bfloat16>::mma(acc[nt], a0, xv.x, xv.y);
          Act<__nv_bfloat16>::mma(acc[nt], a1, xv.z, xv.w);
        }
      }
    }

    if (S > 1) {
      // The group's sum in z order: warps 1 .. S-1 park their accumulators, warp 0 adds them to its own.
      float* mine = bf16_red + warp * (NT * 4 * 32) + lane;
      if (z > 0) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) mine[(nt * 4 + c) * 32] = acc[nt][c];
      }
      group_sync();
      if (z == 0) {
        for (int o = 1; o < S; ++o)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[nt][c] += mine[o * (NT * 4 * 32) + (nt * 4 + c) * 32];
      }
      group_sync();  // the slots are free for the next tile
      if (z > 0) continue;
    }
    // Epilogue: c0, c1 = rows g (tokens 2t, 2t+1), c2, c3 = row g+8.
    __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y);
    const __nv_bfloat16* bias = p.bias ? static_cast<const __nv_bfloat16*>(p.bias) + int64_t(e) * p.n : nullptr;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = h ? row_b : row_a;
      if (!(h ? ok_b : ok_a)) continue;
      const float b = bias ? __bfloat162float(bias[row]) : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int j = 8 * nt + 2 * t + c;
          if (j < m) y[int64_t(r0 + j) * p.n + row] = __float2bfloat16_rn(acc[nt][2 * h + c] + b);
        }
    }
  }
}

}  // namespace kernels
}  // namespace fp4kit
