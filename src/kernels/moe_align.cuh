// moe_align.cuh: step 1 of the fused MoE layer (moe.cu): the device-side schedule of a pass.
//
// Contract
//   moe_align_kernel, one CTA of kAlignThreads threads, E ints of dynamic shared memory; or, for passes of
//   many pairs, moe_align_count_kernel then moe_align_assign_kernel over the same grid of C <=
//   kAlignMaxCtas CTAs of kAlignSplitThreads threads, CTA c taking tokens [c * chunk, (c + 1) * chunk)
//   (align_chunk), E ints of dynamic shared memory each. From the pass's top-k ids [tokens, top_k] they
//   write (AlignBufs, one workspace region):
//     offset[e]        first sorted row of expert e (exclusive sum of its routed pairs), offset[E] = rows;
//     active[a], block_row[a], n_active
//                      the grouped GEMMs' entries: each expert's rows in blocks of block_rows (the token
//                      tiles: the decode kernel's, or the tensor-core path's BN; 0: one entry per expert),
//                      in ascending expert order; block_row[n_active] = rows, so entry a holds sorted rows
//                      [block_row[a], block_row[a + 1]);
//     row_of_pair[p]   the sorted row of pair p = token * top_k + slot, -1 when not routed;
//     token_of_row[r]  the token of sorted row r;
//   and zeroes the n_counters arrival counters of the grouped GEMMs. A pair is routed when its id is in
//   [0, E) and no earlier slot of its token holds the same id (a bad or duplicate id makes the token's
//   output NaN in the combine). Rows of one expert are in arrival order (atomics; in the two-kernel form
//   CTA c's rows of an expert come after CTA c - 1's): no value depends on it, since every GEMM row is
//   computed on its own and the combine sums slots in slot order. The two-kernel form keeps each CTA's
//   per-expert counts in `hist` [C][E] between its kernels.
//
// Why two kernels for many pairs: one CTA's shared atomics on E counters serialise (Nsight Compute at
// T = 8192: 70 us for gpt-oss-120b's 32768 pairs, 162 us for Qwen3-30B-A3B's 65536, 8% of that layer).
// C CTAs count their tokens in parallel; the second kernel's CTAs each sum the counts (C x E ints from L2)
// into the same offsets and start their own rows after the CTAs before them.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/decode_gemm.cuh"  // griddep_*

namespace fp4kit {
namespace kernels {

constexpr int kAlignThreads = 1024;
constexpr int kAlignSplitThreads = 256;
constexpr int kAlignMaxCtas = 64;
// The two-kernel form from this many pairs on (below, one CTA's atomics cost less than a second launch).
constexpr int kAlignSplitMinPairs = 4096;
// Tokens per CTA of the two-kernel form (one per thread) and its grid.
__host__ __device__ constexpr int align_chunk(int tokens) {
  return (tokens + kAlignMaxCtas - 1) / kAlignMaxCtas > kAlignSplitThreads
             ? (tokens + kAlignMaxCtas - 1) / kAlignMaxCtas
             : kAlignSplitThreads;
}
__host__ __device__ constexpr int align_ctas(int tokens) { return (tokens + align_chunk(tokens) - 1) / align_chunk(tokens); }

// Workspace view of the schedule (ints): n_active[1] | offset[E+1] | active[E+P] | block_row[E+P+1] |
// row_of_pair[P] | token_of_row[P] | hist[kAlignMaxCtas * E]. Entries number at most min(E, P) + P
// (block_rows >= 1), so active and block_row (with its end mark) always have room.
struct AlignBufs {
  int* n_active;   // entries of the schedule (kernels::GroupedSchedule, prefill::PrefillGroup)
  int* offset;
  int* active;     // expert of each entry
  int* block_row;  // first sorted row of each entry, then the pass's rows
  int* row_of_pair;
  int* token_of_row;
  int* hist;  // the two-kernel form: [C][E] rows of expert e among CTA c's tokens
};
constexpr size_t align_ints(int experts, int pairs) {
  return 1 + size_t(experts + 1) + 2 * size_t(experts + pairs) + 1 + 2 * size_t(pairs) +
         size_t(kAlignMaxCtas) * experts;
}
inline AlignBufs align_bufs(int* ints, int experts, int pairs) {
  AlignBufs b;
  b.n_active = ints;
  b.offset = b.n_active + 1;
  b.active = b.offset + experts + 1;
  b.block_row = b.active + experts + pairs;
  b.row_of_pair = b.block_row + experts + pairs + 1;
  b.token_of_row = b.row_of_pair + pairs;
  b.hist = b.token_of_row + pairs;
  return b;
}

// `routed` (decode_gemm.cuh): whether a pair is routed (its id in [0, E), no earlier slot of its token on
// the same expert).

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

// f(tok, slots) for each of this thread's tokens of [begin, end), two per step: both tokens' slot ids are
// loaded before either is checked (TokenSlots).
template <typename F>
__device__ __forceinline__ void for_each_token(const int32_t* ids, int begin, int end, int top_k, int experts, F&& f) {
  for (int t0 = begin + threadIdx.x; t0 < end; t0 += 2 * blockDim.x) {
    TokenSlots s[2];
    load_token(ids, t0, end, top_k, s[0]);
    load_token(ids, t0 + blockDim.x, end, top_k, s[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int tok = t0 + h * blockDim.x;
      if (tok >= end) break;
      check_token(experts, s[h]);
      f(tok, s[h]);
    }
  }
}

// Per expert e (rows c = its routed pairs): its first sorted row (exclusive sum of c) and first schedule
// entry (of ceil(c / block_rows), or one for any c > 0 when block_rows is 0), for the experts of one chunk
// of blockDim, on top of the previous chunks' totals (`carry`, updated). Warp shuffles, then the warp
// totals: two barriers per chunk. (A serial pass by one thread over E = 128 experts took ~8 us of the
// kernel's ~10 at T = 1, in Nsight Compute.)
struct AlignSums {
  int rows, entries;
};
__device__ __forceinline__ AlignSums align_scan(AlignSums v, AlignSums& carry, AlignSums* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  AlignSums in = v;  // inclusive within the warp
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int r = __shfl_up_sync(0xffffffffu, in.rows, d), n = __shfl_up_sync(0xffffffffu, in.entries, d);
    if (lane >= d) in = AlignSums{in.rows + r, in.entries + n};
  }
  if (lane == 31) s_warp[warp] = in;
  __syncthreads();
  if (warp == 0) {  // inclusive sums of the warp totals
    AlignSums w = lane < warps ? s_warp[lane] : AlignSums{0, 0};
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, w.rows, d), n = __shfl_up_sync(0xffffffffu, w.entries, d);
      if (lane >= d) w = AlignSums{w.rows + r, w.entries + n};
    }
    if (lane < warps) s_warp[lane] = w;
  }
  __syncthreads();
  const AlignSums before = warp > 0 ? s_warp[warp - 1] : AlignSums{0, 0}, total = s_warp[warps - 1];
  const AlignSums ex{carry.rows + before.rows + in.rows - v.rows,
                     carry.entries + before.entries + in.entries - v.entries};
  carry = AlignSums{carry.rows + total.rows, carry.entries + total.entries};
  __syncthreads();  // s_warp is reused by the next chunk
  return ex;
}

// Rows of each expert among tokens [begin, end) into s_count (zeroed and synchronised by the caller).
__device__ __forceinline__ void count_rows(const int32_t* ids, int begin, int end, int top_k, int experts,
                                           int* s_count) {
  if (top_k <= kAlignMaxSlots) {
    for_each_token(ids, begin, end, top_k, experts, [&](int, const TokenSlots& s) {
#pragma unroll
      for (int j = 0; j < kAlignMaxSlots; ++j)
        if (s.ok[j]) atomicAdd(&s_count[s.id[j]], 1);
    });
  } else {
    for (int i = begin * top_k + threadIdx.x; i < end * top_k; i += blockDim.x)
      if (routed(ids, i, top_k, experts)) atomicAdd(&s_count[ids[i]], 1);
  }
}

// Offsets and schedule entries in ascending expert order, so the stream-K split of each expert (and with it
// every sum) is the same on every call with the same routing. rows(e) = {expert e's rows, the rows of e that
// earlier CTAs assign}; s_cursor[e] becomes e's first row plus the second; the schedule (b.offset, active,
// block_row with its end mark, n_active) is written where `write`. Ends with a barrier.
// block_rows > 0: every expert's rows in entries of at most block_rows (the grouped GEMMs' token tiles);
// 0: one entry per expert.
template <typename Rows>
__device__ __forceinline__ void align_offsets(int experts, int block_rows, const AlignBufs& b, bool write,
                                              int* s_cursor, AlignSums* s_warp, Rows rows) {
  AlignSums carry{0, 0};
  for (int e0 = 0; e0 < experts; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    const int2 r = e < experts ? rows(e) : make_int2(0, 0);
    const int c = r.x;
    const int step = block_rows > 0 ? block_rows : max(c, 1);
    const AlignSums v{c, (c + step - 1) / step};
    const AlignSums ex = align_scan(v, carry, s_warp);
    if (e < experts) {
      s_cursor[e] = ex.rows + r.y;
      if (write) {
        b.offset[e] = ex.rows;
        for (int j = 0; j < v.entries; ++j) {
          b.active[ex.entries + j] = e;
          b.block_row[ex.entries + j] = ex.rows + j * step;
        }
      }
    }
  }
  if (write && threadIdx.x == 0) {
    b.offset[experts] = carry.rows;
    b.block_row[carry.entries] = carry.rows;  // the last entry's end
    *b.n_active = carry.entries;
  }
  __syncthreads();
}

// Each routed pair of tokens [begin, end) takes the next row of its expert (s_cursor, atomics): row_of_pair
// and token_of_row.
__device__ __forceinline__ void assign_rows(const int32_t* ids, int begin, int end, int top_k, int experts,
                                            const AlignBufs& b, int* s_cursor) {
  if (top_k <= kAlignMaxSlots) {
    for_each_token(ids, begin, end, top_k, experts, [&](int tok, const TokenSlots& s) {
#pragma unroll
      for (int j = 0; j < kAlignMaxSlots; ++j) {
        if (j >= top_k) break;
        int row = -1;
        if (s.ok[j]) {
          row = atomicAdd(&s_cursor[s.id[j]], 1);
          b.token_of_row[row] = tok;
        }
        b.row_of_pair[int64_t(tok) * top_k + j] = row;
      }
    });
  } else {
    for (int i = begin * top_k + threadIdx.x; i < end * top_k; i += blockDim.x) {
      int row = -1;
      if (routed(ids, i, top_k, experts)) {
        row = atomicAdd(&s_cursor[ids[i]], 1);
        b.token_of_row[row] = i / top_k;
      }
      b.row_of_pair[i] = row;
    }
  }
}

// The grouped GEMMs' arrival counters start at zero whatever the workspace held before (they leave them
// zeroed too): the workspace needs no initialisation, and calls of other shapes may share it.
__device__ __forceinline__ void zero_counters(int* counters, int n_counters) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_counters; i += gridDim.x * blockDim.x) counters[i] = 0;
}

// The whole schedule of a pass by one CTA (any block size of whole warps, at most 32). s_count: [experts]
// ints of shared memory (rows per expert, then each expert's next free row).
__device__ __forceinline__ void align_one_cta(const int32_t* ids, int pairs, int top_k, int experts, int block_rows,
                                              const AlignBufs& b, int* s_count, AlignSums* s_warp) {
  for (int e = threadIdx.x; e < experts; e += blockDim.x) s_count[e] = 0;
  __syncthreads();
  const int tokens = pairs / top_k;
  count_rows(ids, 0, tokens, top_k, experts, s_count);
  __syncthreads();
  align_offsets(experts, block_rows, b, true, s_count, s_warp, [&](int e) { return make_int2(s_count[e], 0); });
  assign_rows(ids, 0, tokens, top_k, experts, b, s_count);
}

// The whole schedule in one CTA of kAlignThreads threads (passes of few pairs). The bound names the one CTA:
// without it ptxas fits 32 registers (two CTAs per SM) and spilled.
__global__ void __launch_bounds__(kAlignThreads, 1)
    moe_align_kernel(const int32_t* ids, int pairs, int top_k, int experts, int block_rows, AlignBufs b, int* counters,
                     int n_counters) {
  extern __shared__ int s_count[];  // [experts]
  __shared__ AlignSums s_warp[32];
  griddep_launch_dependents();
  griddep_wait();  // the ids and the workspace: written by earlier kernels
  zero_counters(counters, n_counters);
  align_one_cta(ids, pairs, top_k, experts, block_rows, b, s_count, s_warp);
}

// The two-kernel form, first kernel: CTA c's rows per expert into b.hist[c][e]; the counters zeroed.
__global__ void __launch_bounds__(kAlignSplitThreads) moe_align_count_kernel(const int32_t* ids, int pairs, int top_k,
                                                                              int experts, AlignBufs b, int* counters,
                                                                              int n_counters) {
  extern __shared__ int s_count[];  // [experts]
  griddep_launch_dependents();
  griddep_wait();
  zero_counters(counters, n_counters);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) s_count[e] = 0;
  __syncthreads();
  const int tokens = pairs / top_k, chunk = align_chunk(tokens);
  const int begin = blockIdx.x * chunk, end = min(tokens, begin + chunk);
  count_rows(ids, begin, end, top_k, experts, s_count);
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) b.hist[int64_t(blockIdx.x) * experts + e] = s_count[e];
}

// Second kernel: every CTA sums the counts into the schedule (CTA 0 writes it) and assigns its tokens' rows
// after those of the CTAs before it.
__global__ void __launch_bounds__(kAlignSplitThreads) moe_align_assign_kernel(const int32_t* ids, int pairs, int top_k,
                                                                               int experts, int block_rows, AlignBufs b) {
  extern __shared__ int s_cursor[];  // [experts]
  __shared__ AlignSums s_warp[32];
  griddep_launch_dependents();
  griddep_wait();  // the counts
  const int tokens = pairs / top_k, chunk = align_chunk(tokens), ctas = int(gridDim.x);
  const int begin = blockIdx.x * chunk, end = min(tokens, begin + chunk);
  // Expert e's rows: the sum over every CTA's count, and over those before this CTA.
  align_offsets(experts, block_rows, b, blockIdx.x == 0, s_cursor, s_warp, [&](int e) {
    int total = 0, before = 0;
#pragma unroll 8
    for (int c = 0; c < ctas; ++c) {
      const int n = b.hist[int64_t(c) * experts + e];
      total += n;
      before += c < int(blockIdx.x) ? n : 0;
    }
    return make_int2(total, before);
  });
  assign_rows(ids, begin, end, top_k, experts, b, s_cursor);
}

}  // namespace kernels
}  // namespace fp4kit
