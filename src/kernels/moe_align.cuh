// moe_align.cuh: step 1 of the fused MoE layer (moe.cu): the device-side schedule of a pass.
//
// Contract
//   moe_align_kernel, one CTA of kAlignThreads threads, E ints of dynamic shared memory. From the pass's
//   top-k ids [tokens, top_k] it writes (AlignBufs, one workspace region):
//     offset[e]        first sorted row of expert e (exclusive sum of its routed pairs), offset[E] = rows;
//     tile_offset[e]   first token tile of expert e, tiles of tile_bn rows (tensor-core path; 0 if unused);
//     active[a], block_row[a], n_active
//                      the grouped decode GEMMs' entries: each expert's rows in blocks of block_rows
//                      (0: one entry per expert), in ascending expert order;
//     row_of_pair[p]   the sorted row of pair p = token * top_k + slot, -1 when not routed;
//     token_of_row[r]  the token of sorted row r;
//   and zeroes the n_counters arrival counters of the grouped GEMMs. A pair is routed when its id is in
//   [0, E) and no earlier slot of its token holds the same id (a bad or duplicate id makes the token's
//   output NaN in the combine). Rows of one expert are in arrival order (atomics): no value depends on it,
//   since every GEMM row is computed on its own and the combine sums slots in slot order.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/decode_gemm.cuh"  // griddep_*

namespace fp4kit {
namespace kernels {

constexpr int kAlignThreads = 1024;

// Workspace view of the schedule (ints): n_active[1] | offset[E+1] | active[E+P] | block_row[E+P] |
// tile_offset[E+1] | row_of_pair[P] | token_of_row[P].
struct AlignBufs {
  int* n_active;     // entries of the grouped decode schedule (kernels::GroupedSchedule)
  int* offset;
  int* active;       // expert of each entry
  int* block_row;    // first sorted row of each entry
  int* tile_offset;  // tensor-core path: first token tile of each expert (tiles of tile_bn rows)
  int* row_of_pair;
  int* token_of_row;
};
constexpr size_t align_ints(int experts, int pairs) {
  return 1 + 2 * size_t(experts + 1) + 2 * size_t(experts + pairs) + 2 * size_t(pairs);
}
inline AlignBufs align_bufs(int* ints, int experts, int pairs) {
  AlignBufs b;
  b.n_active = ints;
  b.offset = b.n_active + 1;
  b.active = b.offset + experts + 1;
  b.block_row = b.active + experts + pairs;
  b.tile_offset = b.block_row + experts + pairs;
  b.row_of_pair = b.tile_offset + experts + 1;
  b.token_of_row = b.row_of_pair + pairs;
  return b;
}

// A pair is routed when its id is in [0, E) and no earlier slot of the same token holds the same id (a
// duplicate would give one expert more rows than tokens; like a bad id, it makes the token's output NaN).
__device__ __forceinline__ bool routed(const int32_t* ids, int i, int top_k, int experts) {
  const int e = ids[i];
  if (e < 0 || e >= experts) return false;
  for (int j = i - i % top_k; j < i; ++j)
    if (ids[j] == e) return false;
  return true;
}

// The token-per-thread form of `routed` (top_k <= kAlignMaxSlots): token tok's slot ids, and whether each
// is routed. All loads come first and the duplicate check runs on registers, so a thread's tokens are in
// flight together; the pair-per-thread loop branched on each loaded id before its next load (Nsight
// Compute, DeepSeek-V3 T = 8192, 65536 pairs: align 218.6 us that way, 124.3 this way; what is left is the
// shared atomics of the single CTA).
constexpr int kAlignMaxSlots = 8;
struct TokenSlots {
  int id[kAlignMaxSlots];
  bool ok[kAlignMaxSlots];
};
__device__ __forceinline__ void load_token(const int32_t* ids, int tok, int tokens, int top_k, TokenSlots& s) {
#pragma unroll
  for (int j = 0; j < kAlignMaxSlots; ++j) s.id[j] = tok < tokens && j < top_k ? ids[int64_t(tok) * top_k + j] : -1;
}
__device__ __forceinline__ void check_token(int experts, TokenSlots& s) {
#pragma unroll
  for (int j = 0; j < kAlignMaxSlots; ++j) {
    bool ok = s.id[j] >= 0 && s.id[j] < experts;
#pragma unroll
    for (int jj = 0; jj < j; ++jj) ok = ok && s.id[jj] != s.id[j];
    s.ok[j] = ok;
  }
}

// f(tok, slots) for each of this thread's tokens, two per step: both tokens' slot ids are loaded before
// either is checked (TokenSlots).
template <typename F>
__device__ __forceinline__ void for_each_token(const int32_t* ids, int tokens, int top_k, int experts, F&& f) {
  for (int t0 = threadIdx.x; t0 < tokens; t0 += 2 * blockDim.x) {
    TokenSlots s[2];
    load_token(ids, t0, tokens, top_k, s[0]);
    load_token(ids, t0 + blockDim.x, tokens, top_k, s[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = t0 + h * blockDim.x;
      if (tok >= tokens) break;
      check_token(experts, s[h]);
      f(tok, s[h]);
    }
  }
}

// Per expert e (rows c = its routed pairs): its first sorted row (exclusive sum of c), first token tile
// (of ceil(c / tile_bn)) and first schedule entry (of ceil(c / block_rows), or one for any c > 0 when
// block_rows is 0), for the experts of one chunk of blockDim, on top of the previous chunks' totals
// (`carry`, updated). Warp shuffles, then the warp totals: two barriers per chunk. (A serial pass by one
// thread over E = 128 experts took ~8 us of the kernel's ~10 at T = 1, in Nsight Compute.)
struct AlignSums {
  int rows, tiles, entries;
};
__device__ __forceinline__ AlignSums align_scan(AlignSums v, AlignSums& carry, AlignSums* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  AlignSums in = v;  // inclusive within the warp
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int r = __shfl_up_sync(0xffffffffu, in.rows, d), t = __shfl_up_sync(0xffffffffu, in.tiles, d),
              n = __shfl_up_sync(0xffffffffu, in.entries, d);
    if (lane >= d) in = AlignSums{in.rows + r, in.tiles + t, in.entries + n};
  }
  if (lane == 31) s_warp[warp] = in;
  __syncthreads();
  if (warp == 0) {  // inclusive sums of the warp totals
    AlignSums w = lane < warps ? s_warp[lane] : AlignSums{0, 0, 0};
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, w.rows, d), t = __shfl_up_sync(0xffffffffu, w.tiles, d),
                n = __shfl_up_sync(0xffffffffu, w.entries, d);
      if (lane >= d) w = AlignSums{w.rows + r, w.tiles + t, w.entries + n};
    }
    if (lane < warps) s_warp[lane] = w;
  }
  __syncthreads();
  const AlignSums before = warp > 0 ? s_warp[warp - 1] : AlignSums{0, 0, 0}, total = s_warp[warps - 1];
  const AlignSums ex{carry.rows + before.rows + in.rows - v.rows, carry.tiles + before.tiles + in.tiles - v.tiles,
                     carry.entries + before.entries + in.entries - v.entries};
  carry = AlignSums{carry.rows + total.rows, carry.tiles + total.tiles, carry.entries + total.entries};
  __syncthreads();  // s_warp is reused by the next chunk
  return ex;
}

// block_rows > 0: every expert's rows in entries of at most block_rows (the grouped decode kernel's token
// tiles); 0: one entry per expert. One CTA of kAlignThreads threads.
__global__ void __launch_bounds__(kAlignThreads) moe_align_kernel(const int32_t* ids, int pairs, int top_k, int experts,
                                                                   int tile_bn, int block_rows, AlignBufs b,
                                                                   int* counters, int n_counters) {
  extern __shared__ int s_count[];  // [experts]: rows per expert, then each expert's next free row
  __shared__ AlignSums s_warp[32];
  griddep_launch_dependents();
  griddep_wait();  // the ids and the workspace: written by earlier kernels
  // The grouped GEMMs' arrival counters start at zero whatever the workspace held before (they leave
  // them zeroed too): the workspace needs no initialisation, and calls of other shapes may share it.
  for (int i = threadIdx.x; i < n_counters; i += blockDim.x) counters[i] = 0;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) s_count[e] = 0;
  __syncthreads();
  const bool by_token = top_k <= kAlignMaxSlots;  // pairs = tokens * top_k
  const int tokens = pairs / top_k;
  if (by_token) {
    for_each_token(ids, tokens, top_k, experts, [&](int, const TokenSlots& s) {
#pragma unroll
      for (int j = 0; j < kAlignMaxSlots; ++j)
        if (s.ok[j]) atomicAdd(&s_count[s.id[j]], 1);
    });
  } else {
    for (int i = threadIdx.x; i < pairs; i += blockDim.x)
      if (routed(ids, i, top_k, experts)) atomicAdd(&s_count[ids[i]], 1);
  }
  __syncthreads();
  // Offsets, tiles and schedule entries in ascending expert order, so the stream-K split of each expert
  // (and with it every sum) is the same on every call with the same routing.
  AlignSums carry{0, 0, 0};
  for (int e0 = 0; e0 < experts; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    const int c = e < experts ? s_count[e] : 0;
    const int step = block_rows > 0 ? block_rows : max(c, 1);
    const AlignSums v{c, tile_bn > 0 ? (c + tile_bn - 1) / tile_bn : 0, (c + step - 1) / step};
    const AlignSums ex = align_scan(v, carry, s_warp);
    if (e < experts) {
      b.offset[e] = ex.rows;
      b.tile_offset[e] = ex.tiles;
      s_count[e] = ex.rows;  // the cursor of the row assignment below
      for (int j = 0; j < v.entries; ++j) {
        b.active[ex.entries + j] = e;
        b.block_row[ex.entries + j] = ex.rows + j * step;
      }
    }
  }
  if (threadIdx.x == 0) {
    b.offset[experts] = carry.rows;
    b.tile_offset[experts] = carry.tiles;
    *b.n_active = carry.entries;
  }
  __syncthreads();
  // Rows in arrival order within an expert (atomics): no value depends on it.
  if (by_token) {
    for_each_token(ids, tokens, top_k, experts, [&](int tok, const TokenSlots& s) {
#pragma unroll
      for (int j = 0; j < kAlignMaxSlots; ++j) {
        if (j >= top_k) break;
        int row = -1;
        if (s.ok[j]) {
          row = atomicAdd(&s_count[s.id[j]], 1);
          b.token_of_row[row] = tok;
        }
        b.row_of_pair[int64_t(tok) * top_k + j] = row;
      }
    });
  } else {
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
      int row = -1;
      if (routed(ids, i, top_k, experts)) {
        row = atomicAdd(&s_count[ids[i]], 1);
        b.token_of_row[row] = i / top_k;
      }
      b.row_of_pair[i] = row;
    }
  }
}

}  // namespace kernels
}  // namespace fp4kit
