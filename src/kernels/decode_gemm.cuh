// decode_gemm.cuh: FP4 x BF16/FP16 GEMM for decode (m <= 64 per launch), streaming the weights once.
//
// Contract
//   Y[m, N] = X[m, K] * W[N, K]^T (+ bias), W prepacked (decode_layout.h), X/Y row-major in T (bf16/half),
//   fp32 accumulation; the per-row fp32 factor out_scale (tensor scale, MXFP4 row re-basing) and the bias
//   are applied in fp32 before the cast. m <= 8*NT. Deterministic: fixed summation order, no atomics on
//   data.
//
// Why it is shaped this way
//   Decode time is weight bytes / HBM bandwidth, so every design choice serves the weight stream:
//   - The product is computed transposed (Y^T = W X^T): 16 weight rows are mma.m16n8k16's A operand,
//     which lives in registers, so the dequantised weights never touch shared memory. Tokens are the
//     8-wide N side; m = 1 wastes MMA lanes, which are idle in decode anyway.
//   - Each lane streams 16-byte records laid out as its own A fragments (ld.global.nc, no L1 allocation,
//     L2 evict-first: weights are read once). A warp reads 512 contiguous bytes per load.
//   - E2M1 -> BF16 is a mask (plus shift) per pair of values, because prepack placed the code bits where
//     BF16's exponent/mantissa bits are: the result is e2m1 * 2^-126 exactly. One bf16x2 multiply by the
//     pre-biased block scale (s * 2^117) yields e2m1 * s * 2^-9 exactly; out_scale restores 2^9 * ts.
//     (FP16: bits 9..11 give e2m1 * 2^-14, times s * 2^5.) Every step is exact: the MMA sees the
//     spec's weights up to a power of two for any scale (subnormal, negative; FP16 with MXFP4 rounds
//     blocks more than ~2^22 below their row's largest, see README).
//   - All warps of a CTA walk the same 512-wide K slice of different row tiles, so X (tiny, L2-resident) is
//     staged once per slice in shared memory (cp.async, one slice ahead, one barrier per slice). Dense
//     launches stage each lane's scale record of the next slice there too (grouped ones hold it in
//     registers: see stage_scale_records).
//   - Work balance: stream-K over the linear space (row group, K slice): every CTA gets the same number of
//     slices (+-1), whatever the shape. A row group split between CTAs is finished by the last one to
//     arrive, which sums the partials in CTA order (deterministic) and runs the epilogue.
//   - A small register ring (D stages of CH records) per warp plus 16-24 resident warps per SM keep
//     > 50 KB per SM in flight (what Little's law asks of HBM3e at ~1 us latency) while the ring is
//     drained. Measured (docs/decode-gemm-notes.md), Llama-70B gate_up at m = 1: a whole-slice double
//     buffer at 8 warps/SM reached 39% of the copy roofline, load-then-compute at 24 warps/SM 63-73%,
//     X staged in shared memory 78%.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "fp4kit/formats.h"
#include "fp4kit/repack.h"
#include "kernels/decode_layout.h"
#include "kernels/moe_activation.cuh"
#include "kernels/one_token.h"
#include "kernels/pdl.cuh"
#include "kernels/stream_k.h"

namespace fp4kit {
namespace kernels {

// E experts of one prepacked layout, expert e's buffer at base + e * stride (the grouped decode and
// prefill kernels both read them through this).
struct ExpertStack {
  const uint8_t* base;
  size_t stride;
  size_t weights_offset, scales_offset, out_scale_offset;  // within one expert's buffer (packed_layout)
  const void* bias;                                         // [E, n] or null
  __device__ __forceinline__ const uint8_t* expert(int e) const { return base + size_t(e) * stride; }
  __device__ __forceinline__ const uint8_t* weights(int e) const { return expert(e) + weights_offset; }
  __device__ __forceinline__ const uint8_t* scales(int e) const { return expert(e) + scales_offset; }
  __device__ __forceinline__ const float* out_scale(int e) const {
    return reinterpret_cast<const float*>(expert(e) + out_scale_offset);
  }
  template <typename T> __device__ __forceinline__ const T* bias_of(int e, int n) const {
    return bias ? static_cast<const T*>(bias) + int64_t(e) * n : nullptr;
  }
};
inline ExpertStack expert_stack(const void* data, size_t stride, const void* bias, const PackedLayout& l) {
  return ExpertStack{static_cast<const uint8_t*>(data), stride, l.weights_offset, l.scales_offset, l.out_scale_offset,
                     bias};
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

// One-token passes: kernels/one_token.h.
// Whether this launch runs a one-token pass (cluster mode, sm_90 only: compiled out below).
__device__ __forceinline__ bool one_token_pass(const OneToken& o) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return o.ids != nullptr;
#else
  return false;
#endif
}
__device__ __forceinline__ void write_one_token_schedule(const OneToken& o) {
  for (int i = threadIdx.x; i < o.pairs; i += blockDim.x)
    o.row_of_pair[i] = routed(o.ids, i, o.pairs, o.experts) ? i : -1;
  if (threadIdx.x == 0) *o.n_rows = o.pairs;
}

// Grouped mode (Mixture-of-Experts): one launch multiplies every active expert's matrix by the rows routed
// to it. The schedule is built on the device (moe.cu's align kernel), so the launch needs no host sync:
// the row-group space is (entry a, row group) and stream-K runs over n_active * row_groups * k_macros
// units, read from device memory at kernel start. An entry is an expert and a block of at most
// block_rows of its rows (one entry per expert when block_rows is 0): the kernel's token tiles need only
// cover a typical expert's rows, and an expert with more takes several entries, each streaming its
// weights. Experts nobody routed to are not read. A one-token pass reads its entries from the pair ids
// instead (OneToken above).
struct GroupedSchedule {
  const int* n_active;      // [1] number of entries
  const int* active;        // [entries] expert of each entry
  const int* block_row;     // [entries + 1] first sorted row of each entry, then the rows' end: entry a holds
                            // sorted rows [block_row[a], block_row[a + 1]) (moe_align.cuh)
  ExpertStack experts;
  // Cluster mode only (gate_up with interleaved gate/up rows): non-null, the reduction writes act(gate,
  // up) of each row pair as sorted row r's element i of act_out ([rows, n / 2]) instead of y.
  void* act_out;
  MoEActivation act;
  float alpha, limit;
  OneToken one;  // cluster mode: one.ids non-null: the entries are the pairs (above), not the arrays
};

struct DecodeParams {
  const void* x;          // [m, K]
  void* y;                // [m, N]
  const void* bias;       // [N] or null
  const uint4* weights;   // prepacked records
  const uint8_t* scales;  // prepacked scale records
  const float* out_scale; // [n_pad]
  int m, n, k;
  int row_tiles, k_chunks, k_macros;
  int row_groups;         // ceil(row_tiles / (warps * row_tiles_per_warp))
  int64_t units;          // row_groups * k_macros
  int* counters;          // [row_groups], zero between calls
  float* partials;        // [gridDim.x][2][slot floats]
  const int* x_rows;      // null: X row i is token i; else X row of token i (grouped: of each sorted row)
  bool pdl;               // launched with programmatic dependent launch (see griddep_wait)
  GroupedSchedule grouped; // grouped (MoE) kernels only, see above
};



// The shape fields of a launch over a weight of layout `l` (the caller sets tokens, pointers and workspace).
inline DecodeParams shape_params(const PackedLayout& l, int row_groups) {
  DecodeParams p{};
  p.n = int(l.n);
  p.k = int(l.k);
  p.row_tiles = int(l.row_tiles);
  p.k_chunks = int(l.k_chunks);
  p.k_macros = int(l.k_macros);
  p.row_groups = row_groups;
  return p;
}

// ---- Optional timeline (tools/trace_decode.cu defines FP4KIT_DECODE_TRACE; the library never does) ------
// Thread 0 of each CTA records SM clock64 at points 0..7 and %globaltimer at entry (8) and exit (9).
#ifdef FP4KIT_DECODE_TRACE
__device__ unsigned long long* g_decode_trace;  // [gridDim.x][16]
__device__ __forceinline__ void decode_trace(int i) {
  if (threadIdx.x == 0 && g_decode_trace && i >= 0) g_decode_trace[blockIdx.x * 16 + i] = clock64();
}
__device__ __forceinline__ void decode_trace_global(int i) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0 && g_decode_trace) g_decode_trace[blockIdx.x * 16 + i] = t;
}
// Ablations (same tool): g_decode_ablate bit 1 replaces the dequantise-and-multiply of every stage by an
// XOR of its records (the loads stay), bit 2 lets every split segment write its own partial result as if
// it were whole (no partials, no arrival count, no last-arrival sum; the output is then wrong). What a
// call costs without them says what each part adds to the stream.
__device__ int g_decode_ablate;
__device__ __forceinline__ bool decode_ablate(int bit) { return (g_decode_ablate & bit) != 0; }
#else
__device__ __forceinline__ void decode_trace(int) {}
__device__ __forceinline__ void decode_trace_global(int) {}
__device__ __forceinline__ constexpr bool decode_ablate(int) { return false; }
#endif
constexpr int kAblateCompute = 1, kAblateFixup = 2;

// ---- PTX wrappers --------------------------------------------------------------------------------

// Streaming 16-byte load: read-only path, no L1 allocation (read once), L2 evict-first policy so the
// stream does not push X and partials out of L2.
__device__ __forceinline__ uint4 ld_stream(const uint4* p, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}
// A CTA's arrival at a split tile (one thread, after a barrier over the threads whose partial stores it
// publishes): returns the count before it. acq_rel at gpu scope: release makes the CTA's partials (ordered
// before it by the barrier) visible with the count, acquire lets the last arrival read the others'. One
// atomic instead of a fence, an atomic and a second fence.
__device__ __forceinline__ int count_arrival(int* counter) {
  int old;
  asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

template <typename T> struct Act;

// BF16: codes -> bf16 bits 6..8 (+ sign 15); value e2m1 * 2^-126.
template <> struct Act<__nv_bfloat16> {
  template <int P> __device__ __forceinline__ static uint32_t pair(uint32_t q) { return layout::bf16_pair<P>(q); }
  __device__ __forceinline__ static uint32_t mul2(uint32_t a, uint32_t b) {
    uint32_t d;  // fma with -0 addend: a*b exactly signed (sm_80 has no bf16x2 mul)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
  }
  __device__ __forceinline__ static void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  __device__ __forceinline__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
};

// FP16: codes -> half bits 9..11 (+ sign 15); value e2m1 * 2^-14.
template <> struct Act<__half> {
  template <int P> __device__ __forceinline__ static uint32_t pair(uint32_t q) { return layout::f16_pair<P>(q); }
  __device__ __forceinline__ static uint32_t mul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
  }
  __device__ __forceinline__ static void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static __half from_float(float v) { return __float2half_rn(v); }
  __device__ __forceinline__ static float to_float(__half v) { return __half2float(v); }
};

// The epilogue's per-row factors, as fp32: out_scale (tensor scale, MXFP4 row re-basing) and the bias (0
// without one). Output = from_float(acc * x + y). Every kernel's epilogue and fixup reads them here.
template <typename T> __device__ __forceinline__ float2 row_factors(const float* out_scale, const T* bias, int row) {
  return make_float2(out_scale[row], bias ? Act<T>::to_float(bias[row]) : 0.0f);
}

// Block scales -> the multipliers of the raw dequantised pairs.
//
// Prepack put the scales of one unit (NVFP4: a chunk; MXFP4: a chunk pair) for rows g and g+8 in the even
// (or odd) bytes of a 32-bit word, so a mask turns two scales into one 16x2 register {row g, row g+8}:
//   NVFP4: prepack stored each scale as ((E + 20) << 3) | m for |s| = 2^E (1 + m/8), the sign folded
//          into the block's codes (repack_common.h: nvfp4_scale_code). BF16: those bits at 4..11 with
//          exponent bits 12..14 set read as |s| * 2^117; FP16: at bits 7..14 they read as |s| * 2^5.
//          One shift and one mask, no multiply, subnormal scales included (prepack normalised them).
//   MXFP4, BF16: the re-based exponent e' at bf16 exponent position is 2^(e'-127) directly.
//   MXFP4, FP16: 2^(e'-239) may be an fp16 subnormal: computed in fp32 and converted.
// NaN scales need no test here: prepack made the row's out_scale NaN.
template <Format F, typename T> struct Scales;

template <typename T> struct Scales<Format::kNVFP4, T> {
  uint32_t w[4];  // the raw record; decoded per chunk (keeps 4 registers instead of 8 per row tile)
  __device__ __forceinline__ void decode(const uint4 rec) {
    w[0] = rec.x;
    w[1] = rec.y;
    w[2] = rec.z;
    w[3] = rec.w;
  }
  // {s_g, s_g8} of chunk cc: the even bytes of word cc/2 for even cc, the odd bytes for odd cc.
  __device__ __forceinline__ uint32_t get(int cc) const {
    const uint32_t x = w[cc >> 1];
    if (std::is_same<T, __nv_bfloat16>::value)
      return (((cc & 1) ? x >> 4 : x << 4) & 0x0FF00FF0u) | 0x70007000u;
    return ((cc & 1) ? x >> 1 : x << 7) & 0x7F807F80u;
  }
};

template <typename T> struct Scales<Format::kMXFP4, T> {
  uint32_t v[layout::kChunksPerMacro / 2];  // per chunk pair: {s_g, s_g8}
  __device__ __forceinline__ void decode(const uint2 rec) {
    const uint32_t w[2] = {rec.x, rec.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (std::is_same<T, __nv_bfloat16>::value) {
        v[2 * i] = (w[i] << 7) & 0x7F807F80u;
        v[2 * i + 1] = (w[i] >> 1) & 0x7F807F80u;
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float lo = __uint_as_float(((w[i] >> (8 * h)) & 0xFFu) << 23) * 0x1p-112f;
          const float hi = __uint_as_float(((w[i] >> (16 + 8 * h)) & 0xFFu) << 23) * 0x1p-112f;
          __half2 p = __floats2half2_rn(lo, hi);
          v[2 * i + h] = *reinterpret_cast<uint32_t*>(&p);
        }
      }
    }
  }
  __device__ __forceinline__ uint32_t get(int cc) const { return v[cc / 2]; }
};

// {x, x} from the low or high half of a 16x2 register. Written as an unpack and repack of the halves,
// ptxas folds it into the consuming multiply's operand selector (HMUL2 R, R, S.H0_H0: no instruction);
// a byte permute stays a PRMT of its own (SASS of both forms compared on sm_90a).
__device__ __forceinline__ uint32_t dup_lo(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l};}" : "=r"(d) : "r"(v));
  return d;
}
__device__ __forceinline__ uint32_t dup_hi(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h};}" : "=r"(d) : "r"(v));
  return d;
}

template <Format F> struct ScaleRecord;
// stage(): this lane's record into its own 16-byte slot of shared memory (cp.async, committed with the
// next X slice); from_smem(): read it back once this thread's copies are complete (cp_async_wait_all).
// Only the lane that copied a slot reads it, so no barrier orders the two.
template <> struct ScaleRecord<Format::kNVFP4> {
  uint4 v;
  __device__ __forceinline__ void load(const uint8_t* base, int64_t rec, uint64_t pol) {
    v = ld_stream(reinterpret_cast<const uint4*>(base) + rec, pol);
  }
  __device__ __forceinline__ static void stage(uint32_t slot, const uint8_t* base, int64_t rec, uint64_t) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(slot), "l"(reinterpret_cast<const uint4*>(base) + rec)
                 : "memory");
  }
  __device__ __forceinline__ void from_smem(uint32_t slot) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(slot) : "memory");
  }
  __device__ __forceinline__ void zero() { v = make_uint4(0, 0, 0, 0); }
};
template <> struct ScaleRecord<Format::kMXFP4> {
  uint2 v;
  __device__ __forceinline__ void load(const uint8_t* base, int64_t rec, uint64_t) {
    v = __ldg(reinterpret_cast<const uint2*>(base) + rec);
  }
  __device__ __forceinline__ static void stage(uint32_t slot, const uint8_t* base, int64_t rec, uint64_t) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(slot), "l"(reinterpret_cast<const uint2*>(base) + rec)
                 : "memory");
  }
  __device__ __forceinline__ void from_smem(uint32_t slot) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(slot) : "memory");
  }
  __device__ __forceinline__ void zero() { v = make_uint2(0, 0); }
};

// The register ring: D stages of CH chunks (16-byte records) for each of the warp's RW row tiles. While
// stage i is dequantised and multiplied, stages i+1 .. i+D-1 are in flight, so a warp keeps streaming
// through its own compute instead of relying only on other warps to cover the load latency.
template <int RW, int CH> struct Stage {
  uint4 w[RW][CH];
};

// Row tiles past the matrix (idle warps of the last row group) read the matrix's last tile instead of
// being masked: their products are never stored (epilogue and fixup skip rows >= n), and an unmasked load
// costs the hot loop no predicate and no zero fill per record. Chunks past c_end (only in a K slice cut
// short by K) are zero: compute_stage then runs every stage in full, with no test per chunk.
__device__ __forceinline__ int64_t load_tile(const DecodeParams& p, int rt) { return min(rt, p.row_tiles - 1); }
// This lane's record of chunk c0 in row tile rt (through load_tile); chunk c0 + i is i * 32 records on.
__device__ __forceinline__ const uint4* lane_records(const DecodeParams& p, int rt, int c0, int lane) {
  return p.weights + (load_tile(p, rt) * p.k_chunks + c0) * 32 + lane;
}

template <int RW, int CH>
__device__ __forceinline__ void load_stage(Stage<RW, CH>& st, const DecodeParams& p, const int* rt, int c0,
                                           int c_end, int lane, uint64_t pol) {
  // One base address per row tile, the chunks at constant offsets (immediates of the loads). Two
  // branches, not one predicated form: the zero fill would otherwise run on every stage.
  if (c0 + CH <= c_end) {
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const uint4* src = lane_records(p, rt[r], c0, lane);
#pragma unroll
      for (int i = 0; i < CH; ++i) st.w[r][i] = ld_stream(src + i * 32, pol);
    }
  } else {
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const uint4* src = lane_records(p, rt[r], c0, lane);
#pragma unroll
      for (int i = 0; i < CH; ++i) st.w[r][i] = c0 + i < c_end ? ld_stream(src + i * 32, pol) : make_uint4(0, 0, 0, 0);
    }
  }
}

// The first stage's records into L2 (no registers held), for D = 1 rings before a programmatic wait.
template <int RW, int CH>
__device__ __forceinline__ void prefetch_stage_l2(const DecodeParams& p, const int* rt, int c0, int c_end, int lane) {
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int i = 0; i < CH; ++i)
      if (c0 + i < c_end) asm volatile("prefetch.global.L2 [%0];" ::"l"(lane_records(p, rt[r], c0, lane) + i * 32));
}

// Dense launches of the ring kernel stage their scale records through shared memory, one K slice ahead:
// slots [2][warps][RW][32] of 16 bytes after the two X buffers (Llama NVFP4 m = 1-2: 4-9% faster on the
// small layers than records held in registers). Grouped (MoE) launches keep them in registers
// (load_scale_records): there the shared-memory form read 1-2.5% slower with NVFP4, whose records lose
// the weights' evict-first L2 hint in a cp.async (cp.async with an L2 cache hint stops the H200 with an
// illegal instruction under this toolkit, however the policy is made).
template <Format F, int RW>
__device__ __forceinline__ void load_scale_records(ScaleRecord<F> (&rec)[RW], const DecodeParams& p,
                                                   const int* rt, int j, int lane, uint64_t pol) {
#pragma unroll
  for (int r = 0; r < RW; ++r) rec[r].load(p.scales, (load_tile(p, rt[r]) * p.k_macros + j) * 32 + lane, pol);
}
__host__ __device__ constexpr int scale_stage_bytes_for(int warps, int row_tiles) { return 2 * warps * row_tiles * 32 * 16; }

template <Format F, int RW>
__device__ __forceinline__ void stage_scale_records(uint32_t slots, const DecodeParams& p, const int* rt, int j,
                                                    int lane, uint64_t pol) {
#pragma unroll
  for (int r = 0; r < RW; ++r)
    ScaleRecord<F>::stage(slots + r * 512, p.scales, (load_tile(p, rt[r]) * p.k_macros + j) * 32 + lane, pol);
}

// X staging: a CTA's warps all walk the same K slice, so the slice of X (all m tokens x 512 K) is
// copied once into shared memory with cp.async, one slice ahead, and every warp reads its B fragments
// there (X from L1/L2 directly stalled each chunk on a miss: ncu showed long-scoreboard stalls dominant).
// Rows are padded by 16 bytes so the quad's 16-byte reads of a row pair hit distinct banks.
constexpr int kXRowElems = layout::kMacroK + 8;
// Bytes of the two X slice buffers of a launch with n_tiles token tiles.
__host__ __device__ constexpr int x_stage_bytes_for(int n_tiles) { return 2 * 8 * n_tiles * kXRowElems * 2; }

// 16 bytes global -> shared (dst: a shared-space address), zero-filled when !valid (nothing is read).
__device__ __forceinline__ void cp_async16_u32(uint32_t dst, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_u32(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Until at most N of this thread's commit groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// Copy X[0:m, 512 j : 512 j + 512] into buffer `xs` (zero past K).
// Threads tid = 0 .. nthreads-1 share the copy.
template <typename T, int NT>
__device__ __forceinline__ void stage_x(T* xs, const DecodeParams& p, int j, int tid, int nthreads) {
  const T* x = static_cast<const T*>(p.x);
  constexpr int kPieces = layout::kMacroK / 8;  // 16-byte pieces per token row
  const int total = p.m * kPieces;
  for (int i = tid; i < total; i += nthreads) {
    const int tok = i / kPieces, piece = i % kPieces;
    const int k = j * layout::kMacroK + piece * 8;
    const bool valid = k < p.k;
    const int64_t row = p.x_rows ? p.x_rows[tok] : tok;
    cp_async16(xs + tok * kXRowElems + piece * 8, valid ? x + row * p.k + k : x, valid);
  }
  cp_async_commit();
}

// kStopAtEnd: the stage may hold chunks past c_end that are not zero (the bulk kernel's stale shared
// memory), so stop there; the register ring's loads zero them instead (load_stage) and run in full.
// Refill (kRefill, the one-stage ring: Skew below): once chunk i of row tile r has been dequantised, its
// registers take the same chunk of the next stage (chunks c0 + CH .., every one inside the segment: the
// caller checks), so the next stage streams in while this one is multiplied, in the registers of one stage.
template <int RW, int CH> struct Refill {
  const uint4* src[RW];  // this lane's record of the next stage's first chunk, per row tile
  uint64_t pol;
};
template <Format F, typename T, int NT, int RW, int CH, bool kStopAtEnd = false, bool kRefill = false>
__device__ __forceinline__ void compute_stage(Stage<RW, CH>& st, const Scales<F, T> (&sc)[RW],
                                              const T* xs, const DecodeParams& p, int c0, int c_end, int g,
                                              int t, float (&acc)[RW][NT][4], const Refill<RW, CH>* next = nullptr) {
  // c0 is a multiple of CH (a segment's stages start at a slice start, and CH divides a slice's chunks), so
  // chunk c0 + i sits at cc0 + i in its slice, with cc0 = 0 at CH = 8 (every default): the chunk's scale
  // select and X offset are then constants. Lane t's K in the slice is lane_kbase of that place (a slice's
  // 512 K hold its 8 chunks whole, both formats); lane_kbase of c itself cost MXFP4 a signed 64-bit
  // division and remainder per chunk (Nsight Compute, Llama-70B gate_up at m = 1: 7.5% more instructions
  // than NVFP4, the excess all integer address arithmetic).
  const int cc0 = c0 & (layout::kChunksPerMacro - 1) & ~(CH - 1);
#pragma unroll
  for (int i = 0; i < CH; ++i) {
    const int c = c0 + i;
    if (kStopAtEnd && c >= c_end) break;
    const int cc = cc0 + i;
    const int kl = int(layout::lane_kbase(F, cc, t));
    // B fragments: this lane's 16 K values of token (8*nt + g), clamped to a real row (extra columns are
    // discarded). Past K the staged X is zero (and so are the padded weights).
    uint4 xv[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = min(8 * nt + g, p.m - 1);
      const uint4* src = reinterpret_cast<const uint4*>(xs + tok * kXRowElems + kl);
      xv[nt][0] = src[0];
      xv[nt][1] = src[1];
    }
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const uint32_t s2 = sc[r].get(cc);
      const uint32_t s_lo = dup_lo(s2), s_hi = dup_hi(s2);
      const uint32_t q[4] = {st.w[r][i].x, st.w[r][i].y, st.w[r][i].z, st.w[r][i].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[4];
        a[0] = Act<T>::mul2(Act<T>::template pair<0>(q[s]), s_lo);  // row g,   K+0,1
        a[1] = Act<T>::mul2(Act<T>::template pair<1>(q[s]), s_hi);  // row g+8, K+0,1
        a[2] = Act<T>::mul2(Act<T>::template pair<2>(q[s]), s_lo);  // row g,   K+2,3
        a[3] = Act<T>::mul2(Act<T>::template pair<3>(q[s]), s_hi);  // row g+8, K+2,3
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t* xw = reinterpret_cast<const uint32_t*>(&xv[nt][s >> 1]);
          Act<T>::mma(acc[r][nt], a, xw[(s & 1) * 2], xw[(s & 1) * 2 + 1]);
        }
      }
      if constexpr (kRefill) st.w[r][i] = ld_stream(next->src[r] + i * 32, next->pol);
    }
  }
}

template <typename T, int NT, int RW>
__device__ __forceinline__ void epilogue(const DecodeParams& p, const int* rt, int g, int t,
                                         const float (&acc)[RW][NT][4]) {
  T* y = static_cast<T*>(p.y);
  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (rt[r] >= p.row_tiles) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rt[r] * 16 + g + 8 * h;
      if (row >= p.n) continue;
      const float2 fb = row_factors(p.out_scale, bias, row);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = 8 * nt + 2 * t + e;
          if (tok < p.m) y[int64_t(tok) * p.n + row] = Act<T>::from_float(acc[r][nt][2 * h + e] * fb.x + fb.y);
        }
    }
  }
}

// The next segment of a CTA's stream-K range starting at unit u: row group rg (in the launch's row-group
// space), K slices [j0, j1). Advances u.
__device__ __forceinline__ void next_segment(int64_t& u, int64_t u_end, int k_macros, int& rg, int& j0, int& j1) {
  rg = int(u / k_macros);
  j0 = int(u % k_macros);
  j1 = int(u_end - u < int64_t(k_macros - j0) ? j0 + (u_end - u) : k_macros);
  u += j1 - j0;
}

// A grouped entry: its expert and its sorted rows [r0, r1). Three loads whose addresses the entry's index
// gives (the end is the next entry's start), so one round trip; the end was once the expert's end offset,
// a second round trip after the expert's id, on every segment's way to its X rows.
struct Entry {
  int e, r0, r1;
};
__device__ __forceinline__ int one_token_expert(const OneToken& o, int e) {
  return unsigned(e) < unsigned(o.experts) ? e : 0;
}
__device__ __forceinline__ Entry load_entry(const GroupedSchedule& gs, int a) {
  return Entry{gs.active[a], gs.block_row[a], gs.block_row[a + 1]};
}
// The same loads (or a one-token pass's id), issued here even where a branch follows that may leave before
// their values are used (ptxas sinks plain loads past such a branch, which puts their round trip after the
// branch's own).
__device__ __forceinline__ int ld_issued(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ Entry load_entry_issued(const GroupedSchedule& gs, int a) {
  if (one_token_pass(gs.one)) return Entry{one_token_expert(gs.one, ld_issued(gs.one.ids + a)), a, a + 1};
  return Entry{ld_issued(gs.active + a), ld_issued(gs.block_row + a), ld_issued(gs.block_row + a + 1)};
}
// The schedule's entry count (cluster mode: issued with the entry, see above).
__device__ __forceinline__ int entries_issued(const GroupedSchedule& gs) {
  return one_token_pass(gs.one) ? gs.one.pairs : ld_issued(gs.n_active);
}

// The segment's problem: the whole GEMM (lrg = rg), or (grouped) one expert's matrix and rows, with lrg
// the row group inside that matrix; `en` the entry of row group rg, when already loaded.
template <typename T, bool kGrouped>
__device__ __forceinline__ void segment_problem(const DecodeParams& p, int rg, DecodeParams& q, int& lrg,
                                                const Entry* en = nullptr) {
  q = p;
  lrg = rg;
  if constexpr (kGrouped) {
    const GroupedSchedule& gs = p.grouped;
    const Entry ent = en ? *en : load_entry(gs, rg / p.row_groups);
    const int e = ent.e, r0 = ent.r0;
    lrg = rg % p.row_groups;
    q.m = ent.r1 - r0;  // at most the launch's token tiles' rows (align cuts each expert's rows so)
    q.weights = reinterpret_cast<const uint4*>(gs.experts.weights(e));
    q.scales = gs.experts.scales(e);
    q.out_scale = gs.experts.out_scale(e);
    q.bias = gs.experts.bias_of<T>(e, p.n);
    q.x_rows = p.x_rows ? p.x_rows + r0 : nullptr;
    const int x_row = en && one_token_pass(gs.one) && gs.one.token_x ? 0 : r0;  // en: cluster mode
    q.x = p.x_rows ? p.x : static_cast<const T*>(p.x) + int64_t(x_row) * p.k;
    q.y = static_cast<T*>(p.y) + int64_t(r0) * p.n;
    if (gs.act_out) q.grouped.act_out = static_cast<T*>(gs.act_out) + int64_t(r0) * (p.n / 2);
  }
}

template <int RW, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[RW][NT][4]) {
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.0f;
}

// The end of a segment that covers only part of its row group's K: park the partial tile, count arrivals;
// the last CTA to arrive sums all partials in CTA order (deterministic) and runs the epilogue.
// This tail runs after the weight stream has ended, so each step is a whole L2 round trip on the
// kernel's critical path (ablation on the H200, Llama-70B o at m = 1: ~4 us of ~20 without it):
//   - One thread (tid 0 of the WARPS warps that computed) publishes for the CTA: barrier, then one
//     acq_rel atomic (count_arrival), no separate fences.
//   - Compact partials: when the row group's m x rows outputs are few (m <= 2 at one 16-row tile per warp),
//     a CTA parks only those (not the MMA fragments, 8 tokens wide), and the last arrival gives each thread
//     one output and reads it from kCompactBatch CTAs at once: one round trip per 8 partials instead of
//     one per 4, and an eighth of the bytes (Llama-3.1-8B and tp8 layers: 7-26% faster at m = 1).
//   - Otherwise each thread reads its own fragments of up to kBatch CTAs at once.
// `sync` is a barrier over exactly those WARPS warps (threads 0 .. WARPS * 32 - 1); `s_last` a shared int.
template <typename T, int NT, int RW, int WARPS, class Sync>
__device__ __forceinline__ void finish_split(const DecodeParams& p, const DecodeParams& q, int64_t b, int64_t G,
                                             int64_t units, int rg, int first_rg, const int* rt, int g, int t,
                                             float (&acc)[RW][NT][4], int* s_last, Sync sync, int trace_slot = -1) {
  constexpr int kSlot = WARPS * RW * NT * 4 * 32;  // floats per partial tile
  constexpr int kRowsG = WARPS * RW * 16;          // rows of a row group
  constexpr int kTile = RW * NT * 4;               // floats per thread per partial (fragment layout)
  constexpr int kBatch = kTile >= 16 ? 1 : 16 / kTile;  // ~16 loads in flight per thread (more spills)
  constexpr int kCompactBatch = 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t lo_u = int64_t(rg) * p.k_macros, hi_u = lo_u + p.k_macros - 1;
  const int64_t b_lo = stream_k_owner(lo_u, units, G);
  const int64_t b_hi = stream_k_owner(hi_u, units, G);
  const int n_parts = int(b_hi - b_lo + 1);
  // Compact when its read passes (one per WARPS * 32 outputs, each with up to kCompactBatch partials in
  // flight) are no more than the fragment layout's (up to kBatch partials each). Every CTA of the row group
  // decides alike (same m, same count). Entries of up to 8 tokens only (NT == 1, folded at compile time):
  // wider ones would spill for a path they rarely take.
  const int passes = (q.m * kRowsG + WARPS * 32 - 1) / (WARPS * 32);
  const bool compact = NT == 1 && passes * ((n_parts + kCompactBatch - 1) / kCompactBatch) <= (n_parts + kBatch - 1) / kBatch;
  float* mine = p.partials + (b * 2 + (rg == first_rg ? 0 : 1)) * int64_t(kSlot);
  const int base = (warp * RW) * NT * 128;
  if (compact) {  // [token][row of the group]
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 8 * nt + 2 * t + (e & 1), row = (warp * RW + r) * 16 + g + 8 * (e >> 1);
          if (tok < q.m) __stcg(mine + tok * kRowsG + row, acc[r][nt][e]);
        }
  } else {
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) __stcg(mine + base + ((r * NT + nt) * 4 + e) * 32 + lane, acc[r][nt][e]);
  }
  sync();
  if (threadIdx.x == 0) *s_last = count_arrival(&p.counters[rg]) == n_parts - 1;
  sync();
  decode_trace(trace_slot);
  if (!*s_last) return;
  // CTA c parks its partial of this row group in its slot 0 if its range starts here (every c > b_lo),
  // b_lo in slot 1 if it started in an earlier row group. CTA c0 + i's slot 0 is i * 2 * kSlot floats on.
  const int lo_slot = stream_k_start(b_lo, units, G) < lo_u ? 1 : 0;
  auto slot_of = [&](int64_t c0, int i) { return i == 0 && c0 == b_lo ? lo_slot * kSlot : i * 2 * kSlot; };
  if (compact) {
    const int lrg = rt[0] / RW / WARPS;
    const T* bias = static_cast<const T*>(q.bias);
    for (int f = threadIdx.x; f < q.m * kRowsG; f += WARPS * 32) {
      float sum = 0.0f;
      for (int64_t c0 = b_lo; c0 <= b_hi; c0 += kCompactBatch) {
        const float* src = p.partials + c0 * 2 * kSlot + f;
        const int n_c = int(b_hi - c0 + 1 < kCompactBatch ? b_hi - c0 + 1 : kCompactBatch);
        float v[kCompactBatch];
#pragma unroll
        for (int i = 0; i < kCompactBatch; ++i)
          if (i < n_c) v[i] = __ldcg(src + slot_of(c0, i));
#pragma unroll
        for (int i = 0; i < kCompactBatch; ++i)  // in CTA order: the sum is the same whatever the timing
          if (i < n_c) sum += v[i];
      }
      const int tok = f / kRowsG, row = lrg * kRowsG + f % kRowsG;
      if (row < q.n) {
        const float2 fb = row_factors(q.out_scale, bias, row);
        static_cast<T*>(q.y)[int64_t(tok) * q.n + row] = Act<T>::from_float(sum * fb.x + fb.y);
      }
    }
  } else {
    zero_acc(acc);
    for (int64_t c0 = b_lo; c0 <= b_hi; c0 += kBatch) {
      const float* src = p.partials + c0 * 2 * kSlot + base + lane;
      float v[kBatch][kTile];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (c0 + i > b_hi) break;
#pragma unroll
        for (int f = 0; f < kTile; ++f) v[i][f] = __ldcg(src + slot_of(c0, i) + f * 32);
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {  // in CTA order: the sum is the same whatever the timing
        if (c0 + i > b_hi) break;
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][nt][e] += v[i][(r * NT + nt) * 4 + e];
      }
    }
    epilogue<T, NT, RW>(q, rt, g, t, acc);
  }
  if (threadIdx.x == 0) p.counters[rg] = 0;  // leave the workspace as we found it
}

// The units of a launch (grouped: read from the device schedule) and CTA b's range of them. The host sizes
// the grid to at most `units` (dense); grouped grids are sized for the most experts a call can touch, so
// CTAs past the actual unit count leave (returns false), and the others split the units among themselves
// (every range non-empty, which the fixup's arrival count relies on). Every CTA lets the next kernel
// launch here; a grouped one first waits for the align kernel that wrote the schedule it reads.
template <bool kGrouped>
__device__ __forceinline__ bool cta_range(const DecodeParams& p, int64_t& units, int64_t& G, int64_t& u_begin,
                                          int64_t& u_end) {
  griddep_launch_dependents();
  if constexpr (kGrouped) griddep_wait();
  units = p.units;
  if constexpr (kGrouped) units = int64_t(*p.grouped.n_active) * p.row_groups * p.k_macros;
  G = min(int64_t(gridDim.x), units);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kGrouped) {
    // Few units per CTA (the MoE's one-token passes: 1-6 K slices each): stream-K's cut gives some CTAs
    // one unit more than the rest (2 or 3 at 2.6 per CTA), and the last of them sets the call's time.
    // Give every CTA ceil(units / G) and leave the spare CTAs out (docs/moe-notes.md: gpt-oss-120b T = 1
    // 8-10% faster; at 10 units per CTA, DeepSeek-V3 and Mixtral lose 3-4% with 9% fewer CTAs). Measured
    // on Hopper only; the sm_80 build, whose m = 1 entry already spills, keeps the plain cut (the rule
    // cost it 24-36 more bytes of spills).
    G = balanced_ctas(units, G, kBalancedMaxUnits);
  }
#endif
  const int64_t b = blockIdx.x;
  if (b >= G) return false;
  u_begin = stream_k_start(b, units, G);
  u_end = stream_k_start(b + 1, units, G);
  return true;
}

// ---- Cluster mode (sm_90): the K split of a row group reduced through distributed shared memory ---------
// A launch of row_groups x S CTAs in clusters of S (plan: S <= k_macros): cluster c is row group c
// (grouped: of the (entry, row group) space; the grid covers the most entries a call can have), its CTA z
// takes K slices [z * KM / S, (z + 1) * KM / S) (at least one). At the end every CTA parks its partial
// tile in its own shared memory, one cluster barrier publishes them, each CTA sums 1/S of the tile's
// values over the S CTAs in rank order (ld.shared::cluster: deterministic) and writes those outputs, and a
// second barrier keeps every CTA resident until its partial has been read. No workspace, no atomics, no
// global round trip after the stream: the stream-K fixup's store, acq_rel count and partial reads (the
// tail of every small layer) become two cluster barriers and one shared-memory hop.
// This CTA's rank in its cluster (x) and the cluster's size (y); 0 and 1 below sm_90.
__device__ __forceinline__ int2 cluster_rank_size() {
  int2 v = make_int2(0, 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(v.x), "=r"(v.y));
#endif
  return v;
}
__device__ __forceinline__ void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// Shared address `addr` of this CTA mapped into cluster CTA `rank`'s window (`addr` itself below sm_90).
__device__ __forceinline__ uint32_t cluster_addr(uint32_t addr, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"(addr), "r"(rank));
#endif
  return addr;
}
// The float at shared address `addr` of this kernel's shared window in cluster CTA `rank`.
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr, int rank) {
  float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr(addr, rank)) : "memory");
#endif
  return v;
}
constexpr int kMaxCluster = 16;  // non-portable cluster size (the plan asks for it above 8)

// The end of a cluster-mode CTA's single segment (see above). red: shared memory for WARPS * RW * NT * 4 *
// 32 floats (the X buffers, free after the main loop).
template <typename T, int NT, int RW, int WARPS, bool kGrouped>
__device__ __forceinline__ void finish_cluster(const DecodeParams& q, int lrg, float* red,
                                               const float (&acc)[RW][NT][4]) {
  constexpr int kF = WARPS * RW * NT * 4 * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int2 rs = cluster_rank_size();
  const int z = rs.x, S = rs.y;
  __syncthreads();  // every warp is done with the X buffers
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(((warp * RW + r) * NT + nt) * 4 + e) * 32 + lane] = acc[r][nt][e];
  cluster_sync_all();  // every CTA's partial is in place
  const uint32_t red_addr = static_cast<uint32_t>(__cvta_generic_to_shared(red));
  T* y = static_cast<T*>(q.y);
  const T* bias = static_cast<const T*>(q.bias);
  // Fragment element i (i & 31: lane, bits 5-6: accumulator, then token tile and warp x row tile): its
  // output row and token; false where they lie outside the problem.
  auto coords = [&](int i, int& row, int& tok) {
    const int ln = i & 31, e = (i >> 5) & 3, nt = (i >> 7) % NT, wr = (i >> 7) / NT;  // wr = warp * RW + r
    const int rt = lrg * WARPS * RW + wr;
    row = rt * 16 + (ln >> 2) + 8 * (e >> 1);
    tok = 8 * nt + 2 * (ln & 3) + (e & 1);
    return rt < q.row_tiles && row < q.n && tok < q.m;
  };
  // The value of fragment element i summed over the cluster in rank order (the same bits whatever the
  // timing), scaled and biased.
  auto reduced = [&](int i, int row) {
    const float2 fb = row_factors(q.out_scale, bias, row);
    float v[kMaxCluster];
#pragma unroll
    for (int c = 0; c < kMaxCluster; ++c)
      if (c < S) v[c] = ld_cluster_f32(red_addr + 4u * uint32_t(i), c);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxCluster; ++c)
      if (c < S) sum += v[c];
    return sum * fb.x + fb.y;
  };
  if constexpr (kGrouped) {
    if (q.grouped.act_out) {
      // gate_up with interleaved rows: row 2p (gate) sits at lane ln, row 2p + 1 (up) at lane ln + 4 of
      // the same element; each even-row element of this CTA's share writes pair p's activation, rounded
      // through T as the activation kernel reads h (moe_elementwise.cuh), so the bits are the same.
      T* a = static_cast<T*>(q.grouped.act_out);
      const int half_n = q.n / 2;
      for (int i = z * kF / S + int(threadIdx.x); i < (z + 1) * kF / S; i += blockDim.x) {
        int row, tok;
        if ((i & 4) || !coords(i, row, tok)) continue;
        const float g = Elem<T>::load(Act<T>::from_float(reduced(i, row)));
        const float u = Elem<T>::load(Act<T>::from_float(reduced(i + 4, row + 1)));
        a[int64_t(tok) * half_n + row / 2] = Elem<T>::store(activate(g, u, q.grouped.act, q.grouped.alpha, q.grouped.limit));
      }
      cluster_sync_all();  // no CTA leaves while another reads its shared memory
      return;
    }
  }
  for (int i = z * kF / S + int(threadIdx.x); i < (z + 1) * kF / S; i += blockDim.x) {
    int row, tok;
    if (!coords(i, row, tok)) continue;
    y[int64_t(tok) * q.n + row] = Act<T>::from_float(reduced(i, row));
  }
  cluster_sync_all();  // no CTA leaves while another reads its shared memory
}

template <Format F, typename T, int NT, int RW, int WARPS, int MINB, int CH, int D, bool kGrouped = false,
          bool kCluster = false>
__global__ void __launch_bounds__(WARPS * 32, MINB) decode_gemm_kernel(const DecodeParams p) {
  static_assert(layout::kChunksPerMacro % CH == 0, "a stage must not straddle two K slices");
  // Skew: a one-stage ring refilled chunk by chunk (compute_stage, Refill), so a warp's next stage is in
  // flight while it multiplies this one, at the registers of one stage. Only the grouped cluster kernel
  // (the MoE's one-token passes): there it measured 0.3-2.7% faster (gpt-oss at T = 1); on dense layers
  // and the grouped stream-K kernels 2-8% slower (the eight loads of a slice issued back to back stream
  // better; docs/decode-gemm-notes.md).
  constexpr bool kSkew = D == 1 && kGrouped && kCluster;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint64_t pol = evict_first_policy();
  __shared__ int s_last;
  extern __shared__ uint4 x_smem_raw[];
  T* x_smem = reinterpret_cast<T*>(x_smem_raw);  // [2][8*NT][kXRowElems]
  constexpr int kXBuf = 8 * NT * kXRowElems;
  // This lane's scale-record slot (shared-memory address) of row tile 0 in the buffer of slice j; row tile
  // r's is r * 512 bytes on (scale_stage_bytes_for: [2][WARPS][RW][32] slots of 16 bytes).
  const uint32_t rec_smem = static_cast<uint32_t>(__cvta_generic_to_shared(x_smem_raw)) + x_stage_bytes_for(NT) +
                            (warp * RW * 32 + lane) * 16;
  auto rec_slots = [&](int j) { return rec_smem + (j & 1) * (WARPS * RW * 512); };

  // Stream-K: CTA b owns units [b*U/G, (b+1)*U/G) of the (row group, K slice) space, row-group major.
  // `rg` below is the row group in that space (grouped: active expert * row_groups + its row group).
  int64_t units, G, u_begin, u_end;
  Entry cluster_entry{};  // grouped cluster mode: the one segment's entry, loaded with the entry count
  if constexpr (kCluster) {  // one segment: this CTA's K slices of its cluster's row group (above)
    // One-token passes with early_down (OneToken): gate_up (n_rows set) triggers after its wait, down reads
    // the ids before its own.
    const bool early = kGrouped && one_token_pass(p.grouped.one) && p.grouped.one.early_down;
    const bool late_trigger = early && p.grouped.one.n_rows, early_ids = early && !p.grouped.one.n_rows;
    if (!late_trigger) griddep_launch_dependents();
    units = p.units;
    G = gridDim.x;
    const int2 rs = cluster_rank_size();
    const int z = rs.x, S = rs.y;
    const int c = int(blockIdx.x) / S;
    if constexpr (kGrouped) {
      // Grouped: the grid covers the most entries a call can have; clusters past the schedule's row
      // groups leave, all their CTAs together (c is the cluster's), before any cluster barrier. The
      // entry is loaded with the entry count (the schedule's arrays hold the grid's most entries + 1, so
      // the loads are in bounds; a leaving cluster's values go unused): one round trip, not two.
      // A one-token down with early_down reads the ids before its wait: its first weights are then
      // requested before it too (the main loop's first stage, below).
      const int a = c / p.row_groups;
      if (!early_ids) griddep_wait();
      const int n_active = entries_issued(p.grouped);
      cluster_entry = load_entry_issued(p.grouped, a);
      if (late_trigger) griddep_launch_dependents();
      if (one_token_pass(p.grouped.one) && p.grouped.one.n_rows && blockIdx.x == 0)
        write_one_token_schedule(p.grouped.one);
      if (c >= n_active * p.row_groups) return;
    }
    const int64_t rg0 = int64_t(c) * p.k_macros;
    u_begin = rg0 + int64_t(p.k_macros) * z / S;
    u_end = rg0 + int64_t(p.k_macros) * (z + 1) / S;
  } else if (!cta_range<kGrouped>(p, units, G, u_begin, u_end)) {
    return;
  }
  const int64_t b = blockIdx.x;
  const int first_rg = int(u_begin / p.k_macros);
  decode_trace_global(8);
  decode_trace(0);
  int seg = 0;

  for (int64_t u = u_begin; u < u_end; ++seg) {
    int rg, j0, j1, lrg;
    next_segment(u, u_end, p.k_macros, rg, j0, j1);
    DecodeParams q;
    segment_problem<T, kGrouped>(p, rg, q, lrg, kCluster && kGrouped ? &cluster_entry : nullptr);

    int rt[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) rt[r] = (lrg * WARPS + warp) * RW + r;

    float acc[RW][NT][4];
    zero_acc(acc);

    // Main loop over the chunks of this segment through the register ring (see Stage). A K slice's scale
    // records are requested one slice ahead (dense: into shared memory; grouped: into registers) and
    // decoded when its first stage comes up.
    const int c_begin = j0 * layout::kChunksPerMacro;
    const int c_end = min(j1 * layout::kChunksPerMacro, p.k_chunks);
    Scales<F, T> sc[RW];
    ScaleRecord<F> rec[RW];  // grouped launches: slice j + 1's records, in registers
    if constexpr (kGrouped)
      load_scale_records<F, RW>(rec, q, rt, j0, lane, pol);
    else
      stage_scale_records<F, RW>(rec_slots(j0), q, rt, j0, lane, pol);  // committed with X's first slice
    Stage<RW, CH> ring[D];
#pragma unroll
    for (int d = 0; d + 1 < D; ++d) load_stage<RW, CH>(ring[d], q, rt, c_begin + d * CH, c_end, lane, pol);
    if constexpr (kSkew) load_stage<RW, CH>(ring[0], q, rt, c_begin, c_end, lane, pol);
    if (seg == 0) {
      // Weights and scales are nobody's output: they are requested above (D = 1 without skew: the first
      // stage into L2) before waiting for the previous kernel, whose X and workspace come next.
      if constexpr (D == 1 && !kSkew)
        if (p.pdl) prefetch_stage_l2<RW, CH>(q, rt, c_begin, c_end, lane);
      griddep_wait();
    }
    __syncthreads();  // the previous segment's last slice is no longer read from either X buffer
    stage_x<T, NT>(x_smem + (j0 & 1) * kXBuf, q, j0, threadIdx.x, blockDim.x);
    for (int base = c_begin; base < c_end; base += D * CH) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int cs = base + d * CH;
        if (cs >= c_end) break;
        if constexpr (!kSkew) load_stage<RW, CH>(ring[(d + D - 1) % D], q, rt, cs + (D - 1) * CH, c_end, lane, pol);
        const int j = cs / layout::kChunksPerMacro;
        if ((cs & (layout::kChunksPerMacro - 1)) == 0) {
          // Slice j starts: its X is complete and visible; every warp is done with slice j-1, whose
          // buffer now receives slice j+1.
          cp_async_wait_all();
          __syncthreads();
#pragma unroll
          for (int r = 0; r < RW; ++r) {
            if constexpr (!kGrouped) rec[r].from_smem(rec_slots(j) + r * 512);
            sc[r].decode(rec[r].v);
          }
          if (j + 1 < j1) {
            if constexpr (!kGrouped) stage_scale_records<F, RW>(rec_slots(j + 1), q, rt, j + 1, lane, pol);
            stage_x<T, NT>(x_smem + ((j + 1) & 1) * kXBuf, q, j + 1, threadIdx.x, blockDim.x);
          }
          // Grouped: unconditional (the segment's last slice reloads its own records): a conditional load
          // makes the loop-carried records a merge of two values, and ptxas then copies the loaded
          // registers right after the load, which waits for it there (ncu, m = 16: 8% of the stall samples).
          if constexpr (kGrouped) load_scale_records<F, RW>(rec, q, rt, min(j + 1, j1 - 1), lane, pol);
        }
        if (decode_ablate(kAblateCompute)) {
          uint32_t h = 0;
#pragma unroll
          for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int i = 0; i < CH; ++i) h ^= ring[d].w[r][i].x ^ ring[d].w[r][i].y ^ ring[d].w[r][i].z ^ ring[d].w[r][i].w;
          acc[0][0][0] += __uint_as_float(h & 0x3FFFFFFFu);
          if constexpr (kSkew)
            if (cs + CH < c_end) load_stage<RW, CH>(ring[0], q, rt, cs + CH, c_end, lane, pol);
        } else if constexpr (kSkew) {
          // The next stage, where it is whole, refills the ring chunk by chunk while this one is multiplied;
          // a next stage cut short by K (the segment's last, at most) loads after it, zero-filled.
          const int cn = cs + CH;
          if (cn + CH <= c_end) {
            Refill<RW, CH> next;
            next.pol = pol;
#pragma unroll
            for (int r = 0; r < RW; ++r) next.src[r] = lane_records(q, rt[r], cn, lane);
            compute_stage<F, T, NT, RW, CH, false, true>(ring[0], sc, x_smem + (j & 1) * kXBuf, q, cs, c_end, g, t,
                                                         acc, &next);
          } else {
            compute_stage<F, T, NT, RW, CH>(ring[0], sc, x_smem + (j & 1) * kXBuf, q, cs, c_end, g, t, acc);
            if (cn < c_end) load_stage<RW, CH>(ring[0], q, rt, cn, c_end, lane, pol);
          }
        } else {
          compute_stage<F, T, NT, RW, CH>(ring[d], sc, x_smem + (j & 1) * kXBuf, q, cs, c_end, g, t, acc);
        }
        if (seg == 0 && cs == c_begin) decode_trace(1);  // the CTA's first stage is in and multiplied
      }
    }
    decode_trace(seg == 0 ? 2 : 5);

    // Grouped cluster launches always reduce in the cluster (a cluster of one included): the reduction
    // is where gate_up's activation can be applied (finish_cluster).
    if constexpr (kCluster && kGrouped) {
      finish_cluster<T, NT, RW, WARPS, kGrouped>(q, lrg, reinterpret_cast<float*>(x_smem_raw), acc);
      continue;
    }
    if ((j0 == 0 && j1 == p.k_macros) || decode_ablate(kAblateFixup)) {  // the whole K: finish here
      epilogue<T, NT, RW>(q, rt, g, t, acc);
      if (seg == 0) decode_trace(4);
      continue;
    }
    if constexpr (kCluster) {
      finish_cluster<T, NT, RW, WARPS, kGrouped>(q, lrg, reinterpret_cast<float*>(x_smem_raw), acc);
      continue;
    }
    finish_split<T, NT, RW, WARPS>(p, q, b, G, units, rg, first_rg, rt, g, t, acc, &s_last, [] { __syncthreads(); },
                                   seg == 0 ? 3 : 6);
    if (seg == 0) decode_trace(4);
  }
  decode_trace(7);
  decode_trace_global(9);
}

}  // namespace kernels
}  // namespace fp4kit
