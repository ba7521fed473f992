// prefill_gemm_sm80.cuh: FP4 x BF16/FP16 GEMM for prefill (large m) on Ampere and Ada (sm_80-89): mma.sync
// with the dequantised weights as the register A operand, X and the weight records staged in shared memory
// by cp.async.
//
// Contract
//   The wgmma kernel's contract (prefill_gemm_sm90.cuh): Y[m, N] = X[m, K] * W[N, K]^T (+ bias) from the
//   same prepacked weights (decode_layout.h), the same fp32 epilogue (out_scale, bias, then the cast), the
//   same tiles (128 weight rows x BN tokens in cta_tile's launch order) and the same split-K rule (the
//   tiles from split_from on take `splits` CTAs over contiguous 512-K slice ranges, the last to arrive sums
//   the partials in split order: deterministic; it leaves the counter zeroed). Differences: X is read
//   directly, row-major [m, K] in its natural K order (p.x; no lane-order pass, no workspace for X, no
//   tensor map), and the body is plain sm_80 code, so every GPU fp4kit runs on can run it.
//   Grouped mode (kGrouped, the fused MoE's tensor-core path on devices without wgmma): as the wgmma
//   kernel's (PrefillGroup: each CTA one expert's 128 rows x BN of that expert's sorted rows of X, CTAs past
//   the routing's last tile leave at once; splits = 1), X in natural order, rows k long.
//   Launch: grid split_from + (tiles - split_from) * splits, kThreads threads, Geometry<BN, S>::kSmem
//   bytes of dynamic shared memory (prefill.cu: plan_prefill, plan_prefill_grouped). Rows >= n and tokens >= m are never written.
//
// Why it is shaped this way
//   - mma.m16n8k16 takes A (16 weight rows) from registers, so each lane dequantises its own 16-byte
//     record into its A fragments, exactly as the decode kernel does (Act<T>::pair / mul2, Scales<F, T>;
//     exact up to a power of two that out_scale restores). The dequantised weights never touch shared
//     memory.
//   - B (X) in the record's K order needs no permutation: lane t of step s needs K = lane_kbase(t) + 4s +
//     {0..3} of its token, 8 bytes, so one 16-byte shared load serves two steps of one 8-token column tile
//     (the decode kernel's compute_stage reads its X the same way).
//   - 8 warps as 4 (rows) x 2 (tokens): a warp owns 2 row tiles x BN / 2 tokens. A dequantised record feeds BN / 16 MMAs and each X load 4, so per 64-K chunk a warp spends
//     ~80 integer/16x2 instructions on the weights and BN / 8 shared loads on X against BN / 2 MMAs. Each
//     weight is dequantised twice per CTA (once per token warp). Measured on the H200 (docs/prefill-notes.md):
//     8 x 1 warps (dequantised once, ~25% fewer instructions per MMA) ran 5-8% slower, and two
//     64-token CTAs per SM were no faster: the SM waits on latency (dequantise -> multiply -> MMA chains),
//     not on issue slots or shared memory.
//   - Stage = 128 K: two 64-K chunks, because an MXFP4 lane's group spans a chunk pair over 128 K
//     (lane_kbase). A stage is X [BN tokens][128 K] plus the 8 row tiles' records of both chunks (8 KB).
//     S stages in the classic cp.async ring: wait for stage s (wait_group S - 2), one barrier (which also
//     frees the slot read in the previous iteration), issue stage s + S - 1 into that slot, compute s.
//   - X rows are 256 bytes, their 16-byte units swizzled (x_unit): the eight lanes of a quarter warp read
//     two tokens x four K slices, whose units (NVFP4: 2t + 8i + h; MXFP4: 4t + 2i + h) would otherwise
//     share bank groups; with unit u stored at u ^ ((u >> 2) & 2) ^ (token & 1) they hit eight distinct
//     ones for both formats.
//   - Scale records (one per row tile and 512 K) are loaded by each lane from global one slice ahead, as
//     in the wgmma kernel (too small to stage).
//   - Tails: X past m and past K is zero-filled by cp.async (src-size 0), prepack zero-pads the weights
//     past K and N; NVFP4's odd last chunk (not loaded) is skipped, uniformly; row tiles past the matrix
//     are not loaded and their rows are never written.
#pragma once
#include "kernels/prefill_gemm_sm90.cuh"  // PrefillParams, CtaOperands, cta_tile, lds128

namespace fp4kit {
namespace kernels {
namespace mma80 {

using prefill::CtaOperands;
using prefill::PrefillParams;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRowTilesPerCta = 8;                            // 128 rows, the wgmma kernel's row block
constexpr int kWarpRowTiles = 2;                              // 16-row tiles per warp
constexpr int kRowWarps = kRowTilesPerCta / kWarpRowTiles;    // x 2 token warps
static_assert(kRowTilesPerCta == prefill::kRowTilesPerCta, "one tile geometry for both prefill kernels");
constexpr int kStageChunks = 2;
constexpr int kStageK = kStageChunks * layout::kChunkK;      // 128
constexpr int kStagesPerSlice = layout::kChunksPerMacro / kStageChunks;
constexpr int kRecordBytes = 32 * 16;                         // one row tile's records of one chunk
constexpr int kXRowBytes = kStageK * 2;                       // one token's X of a stage

// X bytes of one stage of a BN-token tile.
constexpr int x_stage_bytes(int bn) { return bn * kXRowBytes; }

template <int BN, int S> struct Geometry {
  static_assert(BN == 64 || BN == 128, "token tile");
  static_assert(S >= 2, "ring");
  static constexpr int kX = x_stage_bytes(BN);
  static constexpr int kW = kRowTilesPerCta * kStageChunks * kRecordBytes;
  static constexpr int kStage = kX + kW;
  static constexpr int kStages = S;
  static constexpr int kSmem = S * kStage;
  static constexpr int kWarpToks = BN / 2;                    // tokens per warp (2 token warps)
  static constexpr int kWarpTiles = kWarpToks / 8;            // 8-token column tiles per warp
  static constexpr int kAcc = kWarpRowTiles * kWarpTiles * 4; // fp32 accumulators per thread
  static constexpr int kPartialFloats = kAcc * kThreads;      // one split's partial tile (128 x BN)
  static constexpr int kPitch = kRowTilesPerCta * 16 * 2 + 16;  // epilogue: bytes per token (+16: banks)
  static_assert(BN * kPitch <= kSmem, "the staged output tile fits the ring");
};

// Where 16-byte unit u (K 8u .. 8u + 7 of the stage) of token row `tok` lives (see the contract).
__device__ __forceinline__ int x_unit(int tok, int u) { return layout::mma_x_unit(tok, u); }


// Copies stage s (K 128 s .. 128 s + 127) of this CTA into a ring slot: X of its BN tokens (zero past m
// and K) and the records of its row tiles' chunks 2s, 2s + 1 that exist. Thread tid keeps one 16-byte unit
// column of X (u = tid % 16) over tokens tid / 16 + 16 j, and record slots tid + 256 j, so every address
// is a per-thread base plus a constant per piece and a stride per stage: set up once, not per copy.
template <typename T, int BN> struct StageLoader {
  static constexpr int kXPieces = BN * 16 / kThreads;  // 16-byte X units per thread and stage
  static constexpr int kWPieces = kRowTilesPerCta * kStageChunks * 32 / kThreads;
  const T* x;               // this thread's first X unit: token tok_begin + tid / 16, K 8u
  int64_t x_step;           // elements from piece j to j + 1 (16 tokens)
  int k8;                   // K - 8u: unit u of stage s exists while 128 s < k8
  unsigned tok_ok;          // bit j: piece j's token exists
  uint32_t x_dst;           // slot offset of piece 0 (piece j: + 4096 j)
  const uint8_t* w;         // record slot tid's source in stage 0 (stage s: + 1024 s; piece j: + j w_step)
  int64_t w_step;           // bytes from record piece j to j + 1 (4 row tiles)
  int w_ch;                 // its chunk within the stage (0, 1)
  unsigned w_ok;            // bit j: record piece j's row tile exists
  int k_chunks;

  __device__ __forceinline__ StageLoader(const PrefillParams& p, const CtaOperands<T>& op, int rt0, int tid) {
    const int u = tid & 15, tk = tid >> 4;
    x = static_cast<const T*>(p.x) + int64_t(op.tok_begin + tk) * p.k + 8 * u;
    x_step = int64_t(16) * p.k;
    k8 = p.k - 8 * u;
    tok_ok = 0;
#pragma unroll
    for (int j = 0; j < kXPieces; ++j) tok_ok |= unsigned(op.tok_begin + tk + 16 * j < op.tok_end) << j;
    x_dst = uint32_t(tk * kXRowBytes + x_unit(tk, u) * 16);  // tk + 16 j has tk's parity: same unit
    const int lt = tid >> 6, ln = tid & 31;
    w_ch = (tid >> 5) & 1;
    w = op.weights + ((int64_t(rt0 + lt) * p.k_chunks + w_ch) * 32 + ln) * 16;
    w_step = int64_t(kThreads / 64) * p.k_chunks * kRecordBytes;
    w_ok = 0;
#pragma unroll
    for (int j = 0; j < kWPieces; ++j) w_ok |= unsigned(rt0 + lt + (kThreads / 64) * j < p.row_tiles) << j;
    k_chunks = p.k_chunks;
  }
  // The copies of stage s into the slot at shared address `slot` (record slot tid + 256 j at 16 (tid + 256 j)
  // after X).
  __device__ __forceinline__ void load(uint32_t slot, int s, int tid) const {
#pragma unroll
    for (int j = 0; j < kXPieces; ++j) {
      const bool valid = ((tok_ok >> j) & 1) && s * kStageK < k8;
      cp_async16_u32(slot + x_dst + 4096 * j, valid ? x + j * x_step + s * kStageK : x, valid);
    }
    const bool chunk_ok = s * kStageChunks + w_ch < k_chunks;
#pragma unroll
    for (int j = 0; j < kWPieces; ++j)
      if (((w_ok >> j) & 1) && chunk_ok)
        cp_async16_u32(slot + x_stage_bytes(BN) + uint32_t(16 * (tid + kThreads * j)), w + j * w_step + int64_t(s) * 1024, true);
  }
};

template <Format F, typename T, int BN, int S, bool kGrouped = false>
__global__ void __launch_bounds__(kThreads, 1) prefill_mma_kernel(const PrefillParams p) {
  using G = Geometry<BN, S>;
  constexpr int kWarpToks = G::kWarpToks;
  constexpr int WT = G::kWarpTiles;
  extern __shared__ __align__(16) uint8_t mma_smem[];
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp % kRowWarps, wn = warp / kRowWarps;  // row warp, token warp
  int row_block, token_tile, split, splits, tail;
  prefill::cta_tile(p, row_block, token_tile, split, splits, tail);
  CtaOperands<T> op;
  if (!prefill::cta_operands<T, BN, kGrouped>(p, token_tile, op)) return;  // uniform, before any barrier
  const int rt0 = row_block * kRowTilesPerCta;
  const int n_stages = (p.k_chunks + kStageChunks - 1) / kStageChunks;
  const int j_begin = int(int64_t(p.k_macros) * split / splits);
  const int j_end = int(int64_t(p.k_macros) * (split + 1) / splits);
  const int s_begin = j_begin * kStagesPerSlice, s_end = min(j_end * kStagesPerSlice, n_stages);
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem));
  const StageLoader<T, BN> loader(p, op, rt0, tid);

  // Prologue: stages s_begin .. s_begin + S - 2 in flight (one commit group each, empty past the range).
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (s_begin + i < s_end) loader.load(ring + i * G::kStage, s_begin + i, tid);
    cp_async_commit();
  }

  // This warp's row tiles and their scale records (slice j + 1's loaded while slice j is computed).
  int rt[kWarpRowTiles];
  bool rt_ok[kWarpRowTiles];
  ScaleRecord<F> rec[kWarpRowTiles];
  Scales<F, T> sc[kWarpRowTiles];
  const uint64_t pol = prefill::evict_normal_policy();
#pragma unroll
  for (int r = 0; r < kWarpRowTiles; ++r) {
    rt[r] = rt0 + wm * kWarpRowTiles + r;
    rt_ok[r] = rt[r] < p.row_tiles;
    if (rt_ok[r]) rec[r].load(op.scales, (int64_t(rt[r]) * p.k_macros + j_begin) * 32 + lane, pol);
    else rec[r].zero();
  }
  float acc[kWarpRowTiles][WT][4];
  zero_acc(acc);

  const int tok_w = wn * kWarpToks + g;  // this lane's token (column g) of the warp's first column tile
  for (int j = j_begin; j < j_end; ++j) {
#pragma unroll
    for (int r = 0; r < kWarpRowTiles; ++r) {
      sc[r].decode(rec[r].v);
      if (rt_ok[r] && j + 1 < j_end) rec[r].load(op.scales, (int64_t(rt[r]) * p.k_macros + j + 1) * 32 + lane, pol);
    }
    // Unrolled over the slice's stages so that every chunk's scale unit (Scales::get) is a constant.
#pragma unroll
    for (int q = 0; q < kStagesPerSlice; ++q) {
      const int s = j * kStagesPerSlice + q;
      if (s >= s_end) break;  // uniform: only the last slice may be short
      const int ri = s - s_begin;
      cp_async_wait<S - 2>();
      __syncthreads();  // stage s is visible to all; every thread is done with the slot of stage s - 1
      if (s + S - 1 < s_end) loader.load(ring + ((ri + S - 1) % S) * G::kStage, s + S - 1, tid);
      cp_async_commit();
      const uint8_t* st = mma_smem + (ri % S) * G::kStage;
#pragma unroll
      for (int i = 0; i < kStageChunks; ++i) {
        const int c = kStageChunks * s + i;
        if (c >= p.k_chunks) break;  // NVFP4's odd last chunk: not loaded (uniform)
        uint4 w[kWarpRowTiles];
        uint32_t s_lo[kWarpRowTiles], s_hi[kWarpRowTiles];
#pragma unroll
        for (int r = 0; r < kWarpRowTiles; ++r) {
          w[r] = *reinterpret_cast<const uint4*>(st + G::kX + ((wm * kWarpRowTiles + r) * kStageChunks + i) * kRecordBytes +
                                                 lane * 16);
          const uint32_t s2 = sc[r].get(kStageChunks * q + i);
          s_lo[r] = dup_lo(s2);
          s_hi[r] = dup_hi(s2);
        }
        // This lane's first X unit: lane_kbase of the chunk's place in the stage (a stage's 128 K hold its
        // chunks whole; of c itself, MXFP4 paid a signed 64-bit division per chunk).
        const int u0 = int(layout::lane_kbase(F, i, t)) >> 3;
#pragma unroll
        for (int sp = 0; sp < 2; ++sp) {  // steps 2 sp, 2 sp + 1: one 16-byte X load per column tile
          uint4 xv[WT];
#pragma unroll
          for (int nt = 0; nt < WT; ++nt) {
            const int tk = tok_w + 8 * nt;
            xv[nt] = *reinterpret_cast<const uint4*>(st + tk * kXRowBytes + x_unit(tk, u0 + sp) * 16);
          }
#pragma unroll
          for (int r = 0; r < kWarpRowTiles; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint32_t qw = (sp == 0) ? (e == 0 ? w[r].x : w[r].y) : (e == 0 ? w[r].z : w[r].w);
              uint32_t a[4];
              a[0] = Act<T>::mul2(Act<T>::template pair<0>(qw), s_lo[r]);  // row g,   K+0,1
              a[1] = Act<T>::mul2(Act<T>::template pair<1>(qw), s_hi[r]);  // row g+8, K+0,1
              a[2] = Act<T>::mul2(Act<T>::template pair<2>(qw), s_lo[r]);  // row g,   K+2,3
              a[3] = Act<T>::mul2(Act<T>::template pair<3>(qw), s_hi[r]);  // row g+8, K+2,3
#pragma unroll
              for (int nt = 0; nt < WT; ++nt)
                Act<T>::mma(acc[r][nt], a, e == 0 ? xv[nt].x : xv[nt].z, e == 0 ? xv[nt].y : xv[nt].w);
            }
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending; the ring is reused below

  // ---- split K: park this split's partial tile, count the arrival; the last split sums all partials in
  // split order (the same bits whatever the arrival order), then runs the epilogue.
  if (splits > 1) {
    constexpr int kVec = G::kAcc / 4;  // float4 per thread
    const int64_t tile_i = tail;
    const float4* slots = reinterpret_cast<const float4*>(p.partials) + tile_i * splits * (G::kPartialFloats / 4);
    float4* mine = reinterpret_cast<float4*>(p.partials) + (tile_i * splits + split) * (G::kPartialFloats / 4);
#pragma unroll
    for (int r = 0; r < kWarpRowTiles; ++r)
#pragma unroll
      for (int nt = 0; nt < WT; ++nt)
        __stcg(mine + (r * WT + nt) * kThreads + tid, make_float4(acc[r][nt][0], acc[r][nt][1], acc[r][nt][2], acc[r][nt][3]));
    __syncthreads();
    if (tid == 0) s_last = count_arrival(&p.counters[tile_i]) == splits - 1;
    __syncthreads();
    if (!s_last) return;
    zero_acc(acc);
    for (int z = 0; z < splits; ++z) {
      const float4* src = slots + int64_t(z) * (G::kPartialFloats / 4) + tid;
      float4 v[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[i] = __ldcg(src + i * kThreads);
#pragma unroll
      for (int r = 0; r < kWarpRowTiles; ++r)
#pragma unroll
        for (int nt = 0; nt < WT; ++nt) {
          const float4 x = v[r * WT + nt];
          acc[r][nt][0] += x.x;
          acc[r][nt][1] += x.y;
          acc[r][nt][2] += x.z;
          acc[r][nt][3] += x.w;
        }
    }
    if (tid == 0) p.counters[tile_i] = 0;  // leave the workspace as we found it
  }

  // ---- epilogue: acc[r][nt][2h + e] is row g + 8h of row tile wm * 2 + r, token 8 nt + 2t + e of the
  // warp's BN / 2 tokens.
  T* y = static_cast<T*>(p.y);
  const int row0 = row_block * kRowTilesPerCta * 16, tok0 = op.tok_begin;
  if (p.n % 8 == 0) {
    // Through shared memory as [token][row], leaving in 16-byte row segments (whole sectors per warp store;
    // with n % 8 == 0 every segment of an existing row is whole and 16-byte aligned, as the validator makes
    // Y). The ring is free: every copy was waited for, and the barrier orders the last stage's reads.
    __syncthreads();
    const int rows = min(kRowTilesPerCta * 16, p.n - row0), toks = min(BN, op.tok_end - tok0);
#pragma unroll
    for (int r = 0; r < kWarpRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rr = (wm * kWarpRowTiles + r) * 16 + g + 8 * h;  // row in the CTA
        if (rr >= rows) continue;
        const float2 fb = row_factors(op.out_scale, op.bias, row0 + rr);
#pragma unroll
        for (int nt = 0; nt < WT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            *reinterpret_cast<T*>(mma_smem + (wn * kWarpToks + 8 * nt + 2 * t + e) * G::kPitch + rr * 2) =
                Act<T>::from_float(acc[r][nt][2 * h + e] * fb.x + fb.y);
      }
    __syncthreads();
    prefill::store_staged_tile<G::kPitch, kThreads>(mma_smem, y, p.n, row0, rows, tok0, toks, tid);
    return;
  }
#pragma unroll
  for (int r = 0; r < kWarpRowTiles; ++r) {
    if (!rt_ok[r]) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rt[r] * 16 + g + 8 * h;
      if (row >= p.n) continue;
      const float2 fb = row_factors(op.out_scale, op.bias, row);
#pragma unroll
      for (int nt = 0; nt < WT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = tok0 + wn * kWarpToks + 8 * nt + 2 * t + e;
          if (tok < op.tok_end) y[int64_t(tok) * p.n + row] = Act<T>::from_float(acc[r][nt][2 * h + e] * fb.x + fb.y);
        }
    }
  }
}

}  // namespace mma80
}  // namespace kernels
}  // namespace fp4kit
