// prefill_gemm_sm90.cuh: FP4 x BF16/FP16 GEMM for prefill (large m, compute-bound) on Hopper: wgmma with
// the dequantised weights as the register-sourced A operand, read from the decode kernel's prepacked layout.
//
// Contract
//   Y[m, N] = X[m, K] * W[N, K]^T (+ bias), W prepacked (decode_layout.h; the same buffer the decode kernel
//   reads, no second prepack), X/Y row-major in T (bf16/half), fp32 accumulation, the per-row fp32
//   out_scale and the bias applied in fp32 before the cast (exactly the decode kernel's epilogue math).
//   One CTA computes 128 weight rows x BN tokens over its share of K. The tiles before split_from (in
//   launch order, cta_tile) take the whole K, one CTA each, no workspace; every later tile takes `splits`
//   CTAs, split z over a contiguous range of 512-K slices: each split stores its fp32 partial tile in the
//   workspace, and the last of the tile's splits to arrive (arrival counter) sums the partials in split
//   order, 0 first, and runs the epilogue; it leaves the counter zeroed. The result is bitwise the same
//   whatever the arrival order (deterministic). With p.pairs (two splits, split_from even, the launch in
//   clusters of 2 CTAs) a split tile's two CTAs instead hand each other half of the tile through shared
//   memory and each finishes its half of the tokens (same bits; "split K in a pair" below).
//   Launch: grid split_from + (tiles - split_from) * splits, tiles = ceil(row_tiles / 8) * ceil(m / BN)
//   (1-D, see cta_tile), kThreads threads, the weight records as the tensor map tmap_w (prefill.cu,
//   w_tensor_map; experts as its outer dimension in grouped mode),
//   Geometry<BN, kBlocks>::kSmem bytes of dynamic shared memory (kBlocks: CTAs per SM, 1, or 2 at
//   BN = 64), X in lane order (below) described by a 2-D tensor map {k_pad, m} of T, box {64, BN},
//   128-byte swizzle, zero out-of-bounds fill (launch_prefill in prefill.cu builds it). Rows >= n and
//   tokens >= m are never written; where n % 8 == 0 the tile leaves through shared memory in 16-byte row
//   segments (Y 16-byte aligned, as the validator requires), else element by element. The body exists
//   for sm_90a only (wgmma, setmaxnreg); elsewhere it traps.
//   With or without programmatic dependent launch (launch.h): a dense CTA requests its first stages' weight
//   records (which no kernel writes) before griddepcontrol.wait and X and the bias after it, and lets the
//   next kernel launch once past its main loop; a grouped CTA waits before it reads the schedule.
//   Grouped mode (kGrouped, the MoE's tensor-core path): one launch computes every expert's product over
//   that expert's contiguous rows of X (PrefillGroup: each token tile's expert and rows, read on the device),
//   each CTA one expert's 128 rows x BN of its tokens; splits = 1. A tile's last rows may run into the
//   next expert's X rows: those columns are computed and never written. A tile of at most BN / 4 (BN / 2)
//   valid tokens runs m64n(BN/4) (m64n(BN/2)) wgmmas on its accumulators' prefix (the main loop) and loads
//   only that many tokens of X (NarrowX: the same tensor with narrower boxes). Dense BN = 64 launches do
//   the same for their last token tile where the launch passes NarrowX (PrefillParams::narrow): dispatch
//   runs m = 9-32 so, one narrow tile per row block.
//   X is read in lane order: rows k_pad long, 2-element pairs permuted inside each 64-K chunk (NVFP4) or
//   128-K block (MXFP4) as layout::natural_pair says, pairs past K zero. The dense GEMM permutes X into
//   the workspace first (kernels/lane_order.cuh); the MoE's gather and activation kernels write it so.
//
// Why it is shaped this way
//   Past m ~ 32 the GEMM is compute-bound, so the tensor cores must be fed by wgmma (mma.sync reaches
//   ~60% of Hopper's dense peak at best). The product stays transposed (Y^T = W X^T) so that the weights
//   are the A operand, the only wgmma operand that may come from registers: the dequantised FP4 never
//   touches shared memory, and X (the B operand, 16-bit already) goes straight from TMA to wgmma.
//   - A warpgroup owns 64 weight rows; warp w of the warpgroup owns one 16-row decode row tile, which is
//     exactly wgmma's per-warp slice of A, with (we rely on it; test_gemm_gpu's
//     gemm_prefill_grid_exact_bitwise checks it) the same per-thread fragment layout as mma.m16n8k16's A:
//     rows g, g+8 and k pairs 2t, 2t+8.
//   - The prepacked record of lane t holds 16 *consecutive* K (decode_layout.h: one NVFP4 group per lane,
//     so one scale per row per chunk), while wgmma's k16 step wants lane t to hold k {2t, 2t+1, 2t+8,
//     2t+9} of the step's 16 K of B. The decode kernel lets X follow the weights' K order (it builds its B
//     fragments itself from a small X); B here is a TMA tile, so X arrives already permuted ("lane order":
//     step s of a chunk covers K = lane_kbase(t) + 4s + {0..3} of every quad lane t, k = 8h + 2t + e for
//     K offset 2h + e) and lane t dequantises its own record's word s for step s, exactly the decode
//     kernel's pair mapping (Act<T>::pair / mul2, Scales<F, T>; exact, see decode_gemm.cuh). Cost per
//     lane per chunk: 1 shared load, ~60 integer/16x2 ops, against 4 wgmma of 64 x BN x 16 per
//     warpgroup. With X in natural order instead each lane took quad lane s's record for step s (a
//     broadcast load, a shuffle for the scale, and selects of words and pairs per step): ~2.3x the
//     instructions per weight, measured 3-9% slower at m >= 1024 including the permutation pass, which
//     costs 2 m k_pad bytes of traffic (docs/prefill-notes.md).
//   - Weight records are staged in shared memory (not loaded per lane from global as in decode): one TMA
//     copy per stage brings the CTA's 8 row tiles' 1 KB each (a 4-D tensor map over the prepacked records,
//     tmap_w), which keeps them off the consumers' issue slots; eight per-row-tile bulk copies measured up
//     to 7% slower on the MoE's short tiles (the copy count, not the bytes). Scale records (one per row tile and 512 K)
//     are loaded by the consumers from global one K slice ahead, as in decode: too small to stage.
//   - Warp specialisation: one producer warp (in a third warpgroup, so setmaxnreg can give its registers to
//     the consumers: 2 x 232 + 40 = 3 x 168) fills an S-stage ring (stage = 128 K: X 2 x BN x 128 B, two
//     swizzled 64-K halves, + 8 KB of records) guarded by full/empty mbarriers; 2 consumer warpgroups
//     (128 rows) share each X stage, which halves X's shared-memory and L2 traffic per flop compared to one.
//   - BN = 64 does 4x less MMA work per dequantised weight than BN = 256, so the consumers' dequantisation
//     and shared-memory reads are close to the wgmma time there. kBlocks = 2 runs two CTAs per SM (half the
//     ring each, 104 consumer registers: 32 accumulators, two chunks of A fragments): four consumer
//     warpgroups per SM, so the tensor cores have another CTA's wgmmas to run while one CTA's warps
//     dequantise, and a CTA's pipeline fill and epilogue overlap the other's main loop.
//   - A stage's chunk 0 and chunk 1 are two wgmma groups with separate A registers: while one group runs,
//     the next chunk is dequantised (wgmma.wait_group 1 keeps one group in flight); the stage is released
//     to the producer after the wait that retires its last group.
//   - 128 K per stage because MXFP4 lanes interleave two chunks over 128 K (lane_kbase): a stage then
//     always holds both chunks of a lane's group. NVFP4 with an odd chunk count has a last stage of one
//     chunk: its second chunk's fragments are zero (through the scale) against a zero-filled X half.
//   - Tails: TMA zero-fills X past k_pad and past m, and lane order zero-fills K .. k_pad (so padded K
//     meets zero X: never NaN * 0), prepack zero-pads the weights past K and N; row tiles past the matrix
//     are not loaded (their garbage A rows only reach accumulator rows that are never written).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only; nothing is linked from the driver here)

#include "kernels/decode_gemm.cuh"

namespace fp4kit {
namespace kernels {
namespace prefill {

constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);  // + the producer warpgroup
constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
constexpr int kRowTilesPerCta = 4 * kConsumerWarpgroups;   // one 16-row tile per consumer warp
constexpr int kRowsPerCta = 16 * kRowTilesPerCta;
constexpr int kStageChunks = 2;                            // 64-K chunks per stage
constexpr int kStageK = kStageChunks * layout::kChunkK;
constexpr int kStagesPerSlice = layout::kChunksPerMacro / kStageChunks;  // stages per 512-K slice
// Split K in a pair (the kernel's "split K in a pair") for token tiles of at least this many tokens: at
// BN = 64 the partial tile through the workspace is small (32 KB) and the pairs' same-run A/B on the H200 was
// mixed (Llama-3.3-70B o 2% faster, the tp8 down shard up to 5% slower; docs/prefill-notes.md), so those
// instantiations keep the workspace path only (plan_prefill plans pairs by the same rule).
constexpr int kPairMinBn = 128;
constexpr int kRecordBytes = 32 * 16;                      // one row tile's records for one chunk
// Registers per thread after setmaxnreg, by CTAs per SM (kBlocks), within what __launch_bounds__(kThreads,
// kBlocks) gives every thread (launch_regs: 168 for one CTA, 80 for two; allocated in multiples of 8).
// Two CTAs run BN = 64 only, whose consumers hold 32 accumulators; the producer needs few registers (one
// warp issues copies).
constexpr int launch_regs(int blocks) { return 65536 / (kThreads * blocks) / 8 * 8; }
template <int kBlocks> struct Regs;
template <> struct Regs<1> { static constexpr int kProducer = 40, kConsumer = 232; };
template <> struct Regs<2> { static constexpr int kProducer = 24, kConsumer = 104; };
template <int kBlocks> constexpr bool regs_fit() {
  return kConsumerWarpgroups * Regs<kBlocks>::kConsumer + Regs<kBlocks>::kProducer <= 3 * launch_regs(kBlocks);
}
static_assert(regs_fit<1>() && regs_fit<2>(), "setmaxnreg budget");

// Shared memory of one stage: X halves [BN tokens][64 K] (128 B rows, 128-byte swizzle, 1024-aligned),
// then the records [row tile][chunk][lane][16 B]. kBlocks CTAs per SM share its ~227 KB.
template <int BN, int kBlocks = 1> struct Geometry {
  static_assert(BN == 64 || BN == 128 || BN == 256, "token tile");
  static_assert(kBlocks == 1 || (kBlocks == 2 && BN == 64), "two CTAs per SM: BN = 64 only (registers)");
  static constexpr int kXHalf = BN * 128;
  static constexpr int kX = 2 * kXHalf;
  static constexpr int kW = kRowTilesPerCta * kStageChunks * kRecordBytes;
  static constexpr int kStage = kX + kW;
  static constexpr int kFit = (kBlocks == 1 ? 220 * 1024 : 108 * 1024) / kStage;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;
  static constexpr int kSmem = kStages * kStage + 1024;  // + slack to align the ring to 1024 B
  static constexpr int kAcc = BN / 2;                     // fp32 accumulators per thread (m64nBN)
  static constexpr int kPartialFloats = kAcc * kConsumerThreads;  // one split's partial tile (128 x BN)
  static_assert(kStages >= 2 && kBlocks * (kSmem + 1024) <= 228 * 1024 - 1024, "ring does not fit");
};

// Grouped mode (MoE experts, kGrouped): the token tiles of all experts are numbered one after another in
// expert order; tile t is sorted rows [tile_row[t], tile_row[t + 1]) of X and Y (at most BN of them) of
// expert tile_expert[t] (rows of one expert are contiguous: the MoE gathers X into that order). These are
// the MoE schedule's entries (moe_align.cuh, block_rows = BN), written on the device, so the grid is sized
// for the most tiles any routing can need (p.token_tiles) and CTAs past the routing's n_tiles exit at once.
struct PrefillGroup {
  const int* n_tiles;      // [1] the routing's token tiles
  const int* tile_expert;  // [n_tiles] the expert of each tile
  const int* tile_row;     // [n_tiles + 1] first sorted row of each tile, then the pass's rows
  ExpertStack experts;
};

struct PrefillParams {
  void* y;                 // [m, n]
  const void* bias;        // [n] or null
  const uint8_t* weights;  // prepacked records
  const uint8_t* scales;   // prepacked scale records
  const float* out_scale;  // [n_pad]
  const void* x;           // the mma.sync kernel only (prefill_gemm_sm80.cuh): X [m, k], natural K order
  int m, n, k;
  int row_tiles, k_chunks, k_macros;
  int row_blocks, token_tiles;  // of 128 rows, of BN tokens
  int splits;                   // K splits of each tile from split_from on (1: every tile whole K)
  int split_from;               // tiles [0, split_from) whole K; grid = split_from + (tiles - split_from) * splits
  int* counters;                // splits > 1: [tiles - split_from] arrival counters, zero between calls
  bool pairs;                   // splits == 2, split_from even, launched in clusters of 2 (dense only): each
                                // split tile's two CTAs are one cluster and finish the tile through each
                                // other's shared memory (kernel: "split K in a pair"); counters and
                                // partials unused
  float* partials;              // splits > 1: [tile - split_from][split][kAcc / 4][kConsumerThreads] float4
  PrefillGroup group;           // kGrouped only (splits == 1; m = the rows of X and Y)
  bool narrow;                  // dense: the launch passed NarrowX maps, so a last tile of at most BN / 2
                                // tokens runs narrow (layout::tile_width); grouped launches always run
                                // narrow tiles and leave it unset
  int x_split;                  // BF16 experts with FP16 activations (moe_bf16_*.cuh): X's rows hold each
                                // FP16 x as two BF16 terms, hi and lo, 64-K chunk by chunk ([hi_0 | lo_0 |
                                // hi_1 | lo_1 | ...], x_split chunks of each, zero past k); the kernels run
                                // 2 x_split stages, stages 2j and 2j + 1 over the weights' stage j (its
                                // second copy an L2 hit). 0: X is BF16, rows k long
  bool early_w;                 // BF16 experts' wgmma kernel: the schedule and the first stages' weights
                                // before griddepcontrol.wait (GroupedPrefillArgs::early_w)
  bool early_trigger;           // BF16 experts' wgmma kernel: dependents may launch once the wait returned
  OneToken one;                 // BF16 experts' wgmma kernel: one.ids non-null: a one-token pass (the
                                // entries are the pairs; decode_gemm.cuh), not the group's arrays
};

// BF16 experts' kernels: the weights' stage of stage s, and X's row length in elements. x = hi + lo exactly
// (an FP16 value has 11 significant bits: hi takes 8, lo the rest, and both lie in BF16's range), so
// W x = W hi + W lo with every product exact in fp32: FP16 activations are used as they are, at twice the
// tensor work of BF16 ones and the same DRAM traffic (hi and lo of a chunk meet its weights back to back).
__device__ __forceinline__ int w_stage(const PrefillParams& p, int s) { return p.x_split ? s >> 1 : s; }
__device__ __forceinline__ int64_t x_row_elems(const PrefillParams& p) { return p.x_split ? 128 * int64_t(p.x_split) : p.k; }

// What one CTA reads and writes: the weights of its matrix (one expert's in grouped mode) and its tokens
// [tok_begin, tok_end) of which its tile covers tok_begin .. tok_begin + BN - 1 (grouped mode: tok_end is
// the tile's own end, at most tok_begin + BN; dense: m).
template <typename T> struct CtaOperands {
  const uint8_t* weights;
  const uint8_t* scales;
  const float* out_scale;
  const T* bias;
  int tok_begin, tok_end;
  int expert;  // grouped mode: the expert (the weights tensor map's outer coordinate); dense: 0
};

// CTAs are launched in groups of kRasterTokenTiles token tiles: consecutive CTAs walk the group's token
// tiles fastest, then the row blocks, so a wave of ~132 CTAs touches ~33 row blocks' weights and 4 X
// tiles (~16 MB + ~17 MB for K = 8192) that stay in L2, instead of 132 row blocks' weights (66 MB, more
// than L2) that all token tiles would re-read from DRAM in row-block-major order. The K splits of a tile
// are consecutive CTAs (they run in the same wave, so the last to arrive waits for no other wave). The
// split tiles come last: whole waves of whole-K tiles first, the split tail fills the last wave (configs.h,
// PrefillSchedule). tail: the tile's index among the split ones (-1 for a whole-K tile).
constexpr int kRasterTokenTiles = 4;
__device__ __forceinline__ void cta_tile(const PrefillParams& p, int& row_block, int& token_tile, int& split,
                                         int& splits, int& tail) {
  int b = blockIdx.x;
  split = 0, splits = 1, tail = -1;
  if (b >= p.split_from) {
    const int i = b - p.split_from;
    tail = i / p.splits, split = i % p.splits, splits = p.splits;
    b = p.split_from + tail;
  }
  const int per_group = p.row_blocks * kRasterTokenTiles;
  const int grp = b / per_group, rem = b % per_group;
  const int tiles = min(kRasterTokenTiles, p.token_tiles - grp * kRasterTokenTiles);  // the last group may be short
  token_tile = grp * kRasterTokenTiles + rem % tiles;
  row_block = rem / tiles;
}

// ---- PTX wrappers (sm_90) --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Waits for phase `parity` of this CTA's barrier; kCluster: with acquire at cluster scope (arrivals from
// another CTA of the cluster whose writes this thread then reads), else the default (CTA scope).
#define FP4KIT_MBAR_WAIT(SEM)                                                  \
  "{\n"                                                                       \
  " .reg .pred done;\n"                                                       \
  "PREFILL_WAIT_%=:\n"                                                        \
  " mbarrier.try_wait.parity" SEM ".shared::cta.b64 done, [%0], %1;\n"        \
  " @!done bra PREFILL_WAIT_%=;\n"                                            \
  "}\n"
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if constexpr (kCluster) asm volatile(FP4KIT_MBAR_WAIT(".acquire.cluster") ::"r"(bar), "r"(parity) : "memory");
  else asm volatile(FP4KIT_MBAR_WAIT("") ::"r"(bar), "r"(parity) : "memory");
}
#undef FP4KIT_MBAR_WAIT
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Split K in a pair (the kernel's "split K in a pair"): a 16-byte store into another cluster CTA's shared
// memory, and an arrive on that CTA's barrier (release at cluster scope: this thread's earlier writes,
// remote ones included, are visible to whoever acquires the barrier's phase: mbar_wait<true>).
__device__ __forceinline__ void st_cluster_v4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, int rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr(bar, rank))
               : "memory");
}
// TMA: box {64 K, BN tokens} of X at (k, token) into `dst` (1024-aligned), completing on `bar`.
__device__ __forceinline__ void tma_load_x(uint32_t dst, const CUtensorMap* map, int k, int tok, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(tok), "r"(bar)
      : "memory");
}
// TMA: the weight records of one stage, box {256 B, 4 pieces (2 chunks), 8 row tiles, 1 expert} from piece
// `piece` of row tile `rt` of expert `e` (w_tensor_map in prefill.cu), into `dst` as [row tile][1 KB].
__device__ __forceinline__ void tma_load_w(uint32_t dst, const CUtensorMap* map, int piece, int rt, int e,
                                           uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(piece), "r"(rt), "r"(e), "r"(bar)
      : "memory");
}
// The ring's barriers, by thread 0, then a CTA barrier: full[s] completes on the producer's arrive and its
// copies' bytes, empty[s] on every consumer thread's arrive.
template <int S>
__device__ __forceinline__ void init_ring(uint64_t (&full)[S], uint64_t (&empty)[S]) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(smem_u32(&full[s]), 1);
      mbar_init(smem_u32(&empty[s]), kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// Scale records are re-read once per token tile: keep them at normal L2 priority (decode streams them).
__device__ __forceinline__ uint64_t evict_normal_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  return p;
}
template <int R> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <int R> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}
// Barrier over the consumer warpgroups only (the producer warpgroup has exited by then).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma window.
template <int N> __device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void fence_frag(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
}

// Shared-memory matrix descriptor of a K-major operand with the 128-byte swizzle: rows of 128 B, 8-row
// core-matrix groups 1024 B apart (SBO), LBO unused for swizzled K-major (set to 1), base offset 0 (every
// X half starts on a 1024-byte boundary). A k16 step inside the 64-K swizzle row is selected by adding its
// byte offset (32 per step) to the start address, the hardware applying the XOR pattern to the final
// address exactly as TMA did when writing.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// wgmma.mma_async m64nBNk16, f32 += T(A, registers) * T(B, shared memory, K-major), scale-d = 1, on the
// first BN / 2 floats of the accumulator array it is given (a narrower product on a wider tile's prefix:
// the m64nN layout puts token 8j + 2t + e at element 4j + 2h + e, so the first N tokens are the first N / 2
// elements). One macro instantiates the wrapper per activation type and size over the operand lists below.
template <typename T, int BN> struct Wgmma;
// Each size's lists extend the previous size's (the accumulator of m64nBN is BN / 2 floats per thread).
#define FP4KIT_WGMMA_D16 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FP4KIT_WGMMA_D32 FP4KIT_WGMMA_D16 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FP4KIT_WGMMA_D64 FP4KIT_WGMMA_D32 ", " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FP4KIT_WGMMA_D128 FP4KIT_WGMMA_D64 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FP4KIT_WGMMA_D256 FP4KIT_WGMMA_D128 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FP4KIT_WGMMA_OPS16(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define FP4KIT_WGMMA_OPS32(d) FP4KIT_WGMMA_OPS16(d), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define FP4KIT_WGMMA_OPS64(d) FP4KIT_WGMMA_OPS32(d), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FP4KIT_WGMMA_OPS128(d) FP4KIT_WGMMA_OPS64(d), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define FP4KIT_WGMMA_OPS256(d) FP4KIT_WGMMA_OPS128(d), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define FP4KIT_WGMMA_TAIL16 "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
#define FP4KIT_WGMMA_PRED16 "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
#define FP4KIT_WGMMA_TAIL32 "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
#define FP4KIT_WGMMA_PRED32 "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
#define FP4KIT_WGMMA_TAIL64 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
#define FP4KIT_WGMMA_PRED64 "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
#define FP4KIT_WGMMA_TAIL128 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
#define FP4KIT_WGMMA_PRED128 "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
#define FP4KIT_WGMMA_TAIL256 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
#define FP4KIT_WGMMA_PRED256 "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
#define FP4KIT_WGMMA(CT, PT, BN)                                                                          \
  template <> struct Wgmma<CT, BN> {                                                                       \
    template <int kLen>                                                                                    \
    __device__ __forceinline__ static void mma(float (&d)[kLen], const uint32_t (&a)[4], uint64_t desc) {   \
      static_assert(kLen >= BN / 2, "m64nBN writes BN / 2 accumulators per thread");                        \
      asm volatile(FP4KIT_WGMMA_PRED##BN "wgmma.mma_async.sync.aligned.m64n" #BN "k16.f32." PT "." PT " {"   \
                   FP4KIT_WGMMA_D##BN FP4KIT_WGMMA_TAIL##BN                                                  \
                   : FP4KIT_WGMMA_OPS##BN(d)                                                                \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));                        \
    }                                                                                                      \
  };
FP4KIT_WGMMA(__nv_bfloat16, "bf16", 16)
FP4KIT_WGMMA(__half, "f16", 16)
FP4KIT_WGMMA(__nv_bfloat16, "bf16", 32)
FP4KIT_WGMMA(__half, "f16", 32)
FP4KIT_WGMMA(__nv_bfloat16, "bf16", 64)
FP4KIT_WGMMA(__half, "f16", 64)
FP4KIT_WGMMA(__nv_bfloat16, "bf16", 128)
FP4KIT_WGMMA(__half, "f16", 128)
FP4KIT_WGMMA(__nv_bfloat16, "bf16", 256)
FP4KIT_WGMMA(__half, "f16", 256)
#undef FP4KIT_WGMMA

// The same with A from shared memory too (both operands K-major, 128-byte swizzle: kernels/moe_bf16_wgmma.cuh
// for plain BF16 weights, where nothing needs the register path). The operands after the accumulators: A's
// descriptor, B's, then scale-d as before; imm-scale-a/b 1, no transposes.
template <typename T, int BN> struct WgmmaSS;
#define FP4KIT_WGMMA_SS_TAIL16 "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
#define FP4KIT_WGMMA_SS_PRED16 "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
#define FP4KIT_WGMMA_SS_TAIL32 "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
#define FP4KIT_WGMMA_SS_PRED32 "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
#define FP4KIT_WGMMA_SS_TAIL64 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
#define FP4KIT_WGMMA_SS_PRED64 "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
#define FP4KIT_WGMMA_SS_TAIL128 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
#define FP4KIT_WGMMA_SS_PRED128 "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
#define FP4KIT_WGMMA_SS_TAIL256 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
#define FP4KIT_WGMMA_SS_PRED256 "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
#define FP4KIT_WGMMA_SS(CT, PT, BN)                                                                        \
  template <> struct WgmmaSS<CT, BN> {                                                                     \
    template <int kLen>                                                                                    \
    __device__ __forceinline__ static void mma(float (&d)[kLen], uint64_t desc_a, uint64_t desc_b) {        \
      static_assert(kLen >= BN / 2, "m64nBN writes BN / 2 accumulators per thread");                        \
      asm volatile(FP4KIT_WGMMA_SS_PRED##BN "wgmma.mma_async.sync.aligned.m64n" #BN "k16.f32." PT "." PT " {" \
                   FP4KIT_WGMMA_D##BN FP4KIT_WGMMA_SS_TAIL##BN                                               \
                   : FP4KIT_WGMMA_OPS##BN(d)                                                                \
                   : "l"(desc_a), "l"(desc_b), "r"(1));                                                     \
    }                                                                                                      \
  };
FP4KIT_WGMMA_SS(__nv_bfloat16, "bf16", 16)
FP4KIT_WGMMA_SS(__nv_bfloat16, "bf16", 32)
FP4KIT_WGMMA_SS(__nv_bfloat16, "bf16", 64)
FP4KIT_WGMMA_SS(__nv_bfloat16, "bf16", 128)
FP4KIT_WGMMA_SS(__nv_bfloat16, "bf16", 256)
#undef FP4KIT_WGMMA_SS
#undef FP4KIT_WGMMA_SS_TAIL16
#undef FP4KIT_WGMMA_SS_PRED16
#undef FP4KIT_WGMMA_SS_TAIL32
#undef FP4KIT_WGMMA_SS_PRED32
#undef FP4KIT_WGMMA_SS_TAIL64
#undef FP4KIT_WGMMA_SS_PRED64
#undef FP4KIT_WGMMA_SS_TAIL128
#undef FP4KIT_WGMMA_SS_PRED128
#undef FP4KIT_WGMMA_SS_TAIL256
#undef FP4KIT_WGMMA_SS_PRED256

#undef FP4KIT_WGMMA_D16
#undef FP4KIT_WGMMA_OPS16
#undef FP4KIT_WGMMA_TAIL16
#undef FP4KIT_WGMMA_PRED16
#undef FP4KIT_WGMMA_D32
#undef FP4KIT_WGMMA_OPS32
#undef FP4KIT_WGMMA_TAIL32
#undef FP4KIT_WGMMA_PRED32
#undef FP4KIT_WGMMA_D64
#undef FP4KIT_WGMMA_OPS64
#undef FP4KIT_WGMMA_TAIL64
#undef FP4KIT_WGMMA_PRED64
#undef FP4KIT_WGMMA_D128
#undef FP4KIT_WGMMA_OPS128
#undef FP4KIT_WGMMA_TAIL128
#undef FP4KIT_WGMMA_PRED128
#undef FP4KIT_WGMMA_D256
#undef FP4KIT_WGMMA_OPS256
#undef FP4KIT_WGMMA_TAIL256
#undef FP4KIT_WGMMA_PRED256

// The A fragments of one chunk (four k16 steps) for this lane, X being in lane order (layout::natural_pair):
// step s is this lane's own record word s (`recs`: the warp's 512-byte record block, lane L's record at
// recs + 16 L), with the decode kernel's mapping: p0/p1 are rows g/g+8 at k 2t, 2t+1, p2/p3 at k 2t+8,
// 2t+9. own_scale: Scales::get of this lane's K slice.
template <Format F, typename T>
__device__ __forceinline__ void own_fragments(uint32_t (&a)[4][4], uint32_t recs, uint32_t own_scale, int lane) {
  const uint4 v = lds128(recs + lane * 16);
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
  const uint32_t s_lo = dup_lo(own_scale), s_hi = dup_hi(own_scale);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    a[s][0] = Act<T>::mul2(Act<T>::template pair<0>(q[s]), s_lo);  // row g,   k 2t, 2t+1
    a[s][1] = Act<T>::mul2(Act<T>::template pair<1>(q[s]), s_hi);  // row g+8, k 2t, 2t+1
    a[s][2] = Act<T>::mul2(Act<T>::template pair<2>(q[s]), s_lo);  // row g,   k 2t+8, 2t+9
    a[s][3] = Act<T>::mul2(Act<T>::template pair<3>(q[s]), s_hi);  // row g+8, k 2t+8, 2t+9
  }
}

// The CTA's operands; false (grouped mode) when its tile is past the routing's last tile.
template <typename T, int BN, bool kGrouped>
__device__ __forceinline__ bool cta_operands(const PrefillParams& p, int token_tile, CtaOperands<T>& o) {
  o.weights = p.weights;
  o.scales = p.scales;
  o.out_scale = p.out_scale;
  o.bias = static_cast<const T*>(p.bias);
  o.tok_begin = token_tile * BN;
  o.tok_end = p.m;
  o.expert = 0;
  if constexpr (kGrouped) {
    // Two rounds of loads before the CTA's first copy: the tile count, then the tile's expert and rows
    // together. (A binary search over per-expert tile offsets, then the expert's rows, made a chain of ~9
    // dependent loads at the start of every tile.)
    const PrefillGroup& g = p.group;
    if (token_tile >= *g.n_tiles) return false;
    const int e = g.tile_expert[token_tile];
    o.tok_begin = g.tile_row[token_tile];
    o.tok_end = g.tile_row[token_tile + 1];
    o.weights = g.experts.weights(e);
    o.scales = g.experts.scales(e);
    o.out_scale = g.experts.out_scale(e);
    o.bias = g.experts.bias_of<T>(e, p.n);
    o.expert = e;
  }
  return true;
}

// An output tile staged in shared memory as [token][128 rows] (kPitch bytes per token) to Y in 16-byte row
// segments, 8 rows of one token per thread (threads tid of kN): whole sectors per warp store. Rows of the
// tile from `rows` on and tokens from `toks` on are not written; with n % 8 == 0 (the caller's condition)
// every segment of an existing row is whole and 16-byte aligned. Both prefill kernels' epilogues end here.
template <int kPitch, int kN, typename T>
__device__ __forceinline__ void store_staged_tile(const uint8_t* tile, T* y, int n, int row0, int rows, int tok0,
                                                  int toks, int tid) {
  constexpr int kSegs = kRowsPerCta / 8;  // 16-byte segments per token
  for (int c = tid; c < toks * kSegs; c += kN) {
    const int tk = c / kSegs, r = (c % kSegs) * 8;
    if (r < rows)
      *reinterpret_cast<uint4*>(y + int64_t(tok0 + tk) * n + row0 + r) =
          *reinterpret_cast<const uint4*>(tile + tk * kPitch + r * 2);
  }
}

// The tensor maps of X for tiles of at most BN / 2 and BN / 4 valid tokens (boxes {64, BN / 2} and
// {64, BN / 4}); the launch's tmap_x has boxes of BN. Grouped launches always pass them; dense BN =
// layout::kDenseNarrowBn launches where their last tile is narrow (PrefillParams::narrow); other dense
// launches leave them unset.
struct NarrowX {
  CUtensorMap half, quarter;
};
// Which instantiations have the narrow main loops (layout::tile_width): every grouped one, the dense ones
// at layout::kDenseNarrowBn.
template <int BN, bool kGrouped> constexpr bool kHasNarrow = kGrouped || BN == layout::kDenseNarrowBn;

// ---- Optional timeline (tools/trace_prefill.cu instantiates kTrace = 1 with FP4KIT_PREFILL_TRACE defined;
// the library instantiates kTrace = 0 only, where every hook is empty). Per CTA a record of kTraceRecord
// values: [0] the SM, then clock64 at [1] entry, [2] past the main loop, [3] before the epilogue (the last
// split only), [4] when consumer thread 0 leaves (after its epilogue stores, or its split's arrival); then
// per ring position r < kTraceStages, kTraceEvents values: consumer warpgroup w's first thread when the
// stage's data is there (2w) and when its last wgmma group of the stage is issued and the group before it
// retired (2w + 1), and the producer when it requests the stage's weight records (4).
constexpr int kTraceStages = 64, kTraceHeader = 5, kTraceEvents = 5;
constexpr int kTraceRecord = kTraceHeader + kTraceStages * kTraceEvents;
#ifdef FP4KIT_PREFILL_TRACE
__device__ unsigned long long* g_prefill_trace;  // [gridDim.x][kTraceRecord], or null: no timestamps
#endif
template <int kTrace> __device__ __forceinline__ void trace_at(int slot, bool smid = false) {
#ifdef FP4KIT_PREFILL_TRACE
  if constexpr (kTrace != 0) {
    if (!g_prefill_trace) return;
    unsigned long long v;
    if (smid) {
      unsigned id;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
      v = id;
    } else {
      v = clock64();
    }
    g_prefill_trace[size_t(blockIdx.x) * kTraceRecord + slot] = v;
  }
#endif
}
template <int kTrace> __device__ __forceinline__ void trace_stage(int r, int event) {
  if (r < kTraceStages) trace_at<kTrace>(kTraceHeader + r * kTraceEvents + event);
}

template <Format F, typename T, int BN, bool kGrouped = false, int kBlocks = 1, int kTrace = 0>
__global__ void __launch_bounds__(kThreads, kBlocks)
    prefill_gemm_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ NarrowX narrow,
                        const __grid_constant__ CUtensorMap tmap_w, const PrefillParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using G = Geometry<BN, kBlocks>;
  constexpr int S = G::kStages;
  extern __shared__ uint8_t prefill_smem[];
  __shared__ __align__(8) uint64_t full_bar[S], empty_bar[S];
  __shared__ int s_last;  // split K: this CTA is the tile's last split to arrive
  // Split K in a pair (p.pairs): the peer's consumers arrive on pair_free once their ring may be written,
  // and on pair_data once their half of this CTA's tokens is in it.
  __shared__ __align__(8) uint64_t pair_free, pair_data;
  const uint32_t ring = (smem_u32(prefill_smem) + 1023u) & ~1023u;  // TMA 128B swizzle: 1024-aligned
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_stages = (p.k_chunks + kStageChunks - 1) / kStageChunks;
  int row_block, token_tile, split, splits, tail;
  cta_tile(p, row_block, token_tile, split, splits, tail);
  if (threadIdx.x == 0) {
    trace_at<kTrace>(0, true);
    trace_at<kTrace>(1);
  }
  CtaOperands<T> op;
  // Programmatic dependent launch (launch.h): a grouped CTA first reads the schedule, which the previous
  // kernels wrote; a dense one waits only where it first reads X, or the bias (below).
  if constexpr (kGrouped) griddep_wait();
  if (!cta_operands<T, BN, kGrouped>(p, token_tile, op)) return;  // uniform, before any barrier
  // The width of this CTA's wgmmas and X boxes (uniform): narrow where its tile is short and the launch
  // passed the narrow maps.
  const int width = kHasNarrow<BN, kGrouped> && (kGrouped || p.narrow)
                        ? layout::tile_width(BN, op.tok_end - op.tok_begin)
                        : BN;
  // This CTA's K: slices [j_begin, j_end) of 512 K, i.e. ring stages [s_begin, s_end). Every split has at
  // least one slice (the host keeps splits <= k_macros), and slice j's first stage exists for j < k_macros.
  const int j_begin = int(int64_t(p.k_macros) * split / splits);
  const int j_end = int(int64_t(p.k_macros) * (split + 1) / splits);
  const int s_begin = j_begin * kStagesPerSlice, s_end = min(j_end * kStagesPerSlice, n_stages);

  init_ring<S>(full_bar, empty_bar);
  if constexpr (!kGrouped && BN >= kPairMinBn) {
    if (p.pairs) {
      // Both CTAs' pair barriers exist before either CTA arrives on the other's: one cluster barrier, while
      // every thread of both is still here (the producer warpgroup leaves early).
      if (threadIdx.x == 0) {
        mbar_init(smem_u32(&pair_free), kConsumerThreads);
        mbar_init(smem_u32(&pair_data), kConsumerThreads);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      }
      cluster_sync_all();
    }
  }

  if (warp >= 4 * kConsumerWarpgroups) {
    // ---- producer warpgroup: one thread of one warp fills the ring, the other warps only give their
    // registers back.
    setmaxnreg_dec<Regs<kBlocks>::kProducer>();
    if (warp != 4 * kConsumerWarpgroups) return;
    const int rt0 = row_block * kRowTilesPerCta, tok0 = op.tok_begin;
    // X rows: one box per half, as wide as the main loop's wgmmas (grouped mode: a narrow tile's box from
    // its own tensor map; an expert's tile often holds a few rows, 16 per expert at gpt-oss-120b T = 512,
    // and a BN-token box moved 4x the X bytes it multiplies).
    const CUtensorMap* map = width == BN ? &tmap_x : width == BN / 2 ? &narrow.half : &narrow.quarter;
    const uint32_t x_bytes = uint32_t(2 * width * 128);
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tmap_w)) : "memory");
    }
    if (lane != 0) return;  // one thread issues every copy
    // Stage s's barrier expects its bytes, and its weight records are requested (into ring slot `slot`).
    auto request_w = [&](int s, int slot) {
      trace_stage<kTrace>(s - s_begin, 4);
      const uint32_t bar = smem_u32(&full_bar[slot]);
      mbar_arrive_expect_tx(bar, x_bytes + uint32_t(G::kW));
      tma_load_w(ring + slot * G::kStage + G::kX, &tmap_w, 2 * kStageChunks * s, rt0, op.expert, bar);
    };
    // Dense: the first `pre` stages' weight records (which no kernel writes) are requested before the wait
    // for the previous kernel (with PDL, the lane-order pass writing X), so that their DRAM round trip
    // overlaps its end; their X halves follow the wait. (A fresh ring: those slots are free.)
    int pre = 0;
    if constexpr (!kGrouped) {
      pre = min(S, s_end - s_begin);
      for (int r = 0; r < pre; ++r) request_w(s_begin + r, r);
      griddep_wait();
    }
    for (int s = s_begin; s < s_end; ++s) {
      const int r = s - s_begin, slot = r % S;                     // r: this CTA's ring position
      const uint32_t st = ring + slot * G::kStage, bar = smem_u32(&full_bar[slot]);
      // Both X halves always (a half wholly past K is zero-filled: the consumers multiply it by zero
      // fragments, which must not meet stale NaN bits). The records of all 8 row tiles in one copy (a
      // chunk past K and row tiles past the matrix read as zeros): per-row-tile bulk copies, eight more
      // copies per stage, kept the copy engine busier than the bytes do (docs/prefill-notes.md).
      if (r >= pre) {
        mbar_wait(smem_u32(&empty_bar[slot]), ((r / S) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
        request_w(s, slot);
      }
      tma_load_x(st, map, s * kStageK, tok0, bar);
      tma_load_x(st + G::kXHalf, map, s * kStageK + 64, tok0, bar);
    }
    return;
  }

  // ---- consumer warpgroups: warp w (0..7) owns row tile rt = 8 * row_block + w, i.e. rows 16w..16w+15
  // of the CTA's 128, which is warpgroup w/4's wgmma rows 16 (w%4) .. +15.
  setmaxnreg_inc<Regs<kBlocks>::kConsumer>();
  const int rt = row_block * kRowTilesPerCta + warp;
  const bool rt_ok = rt < p.row_tiles;
  const uint64_t pol = evict_normal_policy();
  float acc[G::kAcc];
#pragma unroll
  for (int i = 0; i < G::kAcc; ++i) acc[i] = 0.0f;

  ScaleRecord<F> rec;  // slice j + 1's record, loaded while slice j is computed
  Scales<F, T> sc;
  if (rt_ok) rec.load(op.scales, (int64_t(rt) * p.k_macros + j_begin) * 32 + lane, pol);
  else rec.zero();
  if constexpr (!kGrouped) griddep_wait();  // the bias may be a previous kernel's output
  // The epilogue's factors of this thread's rows g and g + 8 (out_scale, bias), loaded now so that their
  // round trip is spent under the main loop rather than after it, once per tile. Not at two CTAs per SM:
  // four more registers live through the loop spill there (104 per consumer thread).
  constexpr bool kEarlyFactors = kBlocks == 1;
  const int g = lane >> 2;
  float2 early[2] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = rt * 16 + g + 8 * h;
    if (kEarlyFactors && rt_ok && row < p.n) early[h] = row_factors(op.out_scale, op.bias, row);
  }
  auto factors = [&](int h, int row) { return kEarlyFactors ? early[h] : row_factors(op.out_scale, op.bias, row); };

  // The main loop, its wgmmas NW tokens wide. Grouped mode: an expert's last tile often holds far fewer
  // rows than BN (gpt-oss-120b, 8192 tokens per pass: 256 +- 16 rows per expert in 256-token tiles, so
  // about half the experts take a second tile of a few rows), so a tile of at most BN / 4 or BN / 2 valid
  // tokens runs m64n(BN/4) or m64n(BN/2) on the accumulator's prefix: a quarter or half of the tensor-core
  // work (its columns past NW stay zero and are never written). The width is uniform per CTA; each width
  // is its own copy of the loop, so every wgmma group keeps one shape.
  // Ring slots: where the ring holds whole slices (S a multiple of a slice's 4 stages: the two-CTA entries'
  // 4, the one-CTA BN = 64 entries' 8) slice jr of this CTA starts at slot (4 jr) mod S, so a stage's slot
  // is a compile-time q plus at most one bit of jr, and its descriptor is the ring's plus a constant. The
  // general r % S, a shared address and a descriptor rebuilt per stage took ~30 uniform-datapath
  // instructions per stage and consumer warp (SASS at 10a331a), in a loop whose instruction issue is one
  // of its bounds at m = 16-32 (docs/prefill-notes.md). Every shared address is below 2^18, so adding to
  // the descriptor's 14-bit address field is exact.
  const uint64_t ring_desc = sw128_desc(ring);
  auto main_loop = [&](auto nw) {
    constexpr int NW = decltype(nw)::value;
    // Slice j (512 K) is stages 4j .. 4j+3: unrolled over its stages so that the scale unit of every chunk
    // (Scales::get(cc)) is a compile-time index (a runtime one put the decoded scales in local memory).
    for (int j = j_begin; j < j_end; ++j) {
      sc.decode(rec.v);
      if (rt_ok && j + 1 < j_end) rec.load(op.scales, (int64_t(rt) * p.k_macros + j + 1) * 32 + lane, pol);
#pragma unroll
      for (int q = 0; q < kStagesPerSlice; ++q) {
        const int s = j * kStagesPerSlice + q;
        if (s >= n_stages) break;  // uniform: only the last slice may be short
        const int r = s - s_begin;
        constexpr bool kWholeSlices = S % kStagesPerSlice == 0;
        const unsigned jr = unsigned(j - j_begin);
        const int slot = kWholeSlices ? int((jr * kStagesPerSlice) % unsigned(S)) + q : r % S;
        const int prev = slot == 0 ? S - 1 : slot - 1;  // stage r - 1's slot
        const uint32_t parity = kWholeSlices ? (jr * kStagesPerSlice / unsigned(S)) & 1u : uint32_t(r / S) & 1u;
        mbar_wait(smem_u32(&full_bar[slot]), parity);
        if ((threadIdx.x & 127) == 0) trace_stage<kTrace>(r, 2 * (warp >> 2));
        const uint32_t st = ring + slot * G::kStage;
        const uint32_t recs = st + G::kX + warp * kStageChunks * kRecordBytes;
        const uint64_t desc0 = ring_desc + uint64_t((slot * G::kStage) >> 4);
#pragma unroll
        for (int i = 0; i < kStageChunks; ++i) {
          // NVFP4's last stage may lack chunk 1: its records were not loaded, so its fragments are zeroed
          // through the scale (garbage codes dequantise to finite values; the X half is TMA zero-fill). The
          // wgmmas run regardless: control flow around them made ptxas close each group with an extra
          // dummy wgmma and lose the overlap of one group with the next chunk's dequantisation.
          const bool have = kStageChunks * s + i < p.k_chunks;
          uint32_t a[4][4];
          own_fragments<F, T>(a, recs + i * kRecordBytes, have ? sc.get(kStageChunks * q + i) : 0u, lane);
          fence_frag(a);  // the fragments are complete before the fence (else ptxas injects its own)
          fence_acc(acc);
          wgmma_fence();  // A registers and accumulators were written by this thread
#pragma unroll
          for (int ks = 0; ks < 4; ++ks) {
            // In lane order chunk i of the stage is X half i, and step ks its 16 K at 16 ks (32 bytes).
            const uint32_t off = i * G::kXHalf + ks * 32;
            Wgmma<T, NW>::mma(acc, a[ks], desc0 + (off >> 4));
          }
          wgmma_commit();
          fence_acc(acc);
          wgmma_wait<1>();  // the group before this one is done: its A registers and X half are free
          if (i == kStageChunks - 1 && (threadIdx.x & 127) == 0) trace_stage<kTrace>(r, 2 * (warp >> 2) + 1);
          if (i == 0 && r > 0) {
            // That group was stage s-1's last: hand its slot back to the producer.
            // Every thread arrives for its own reads (records by ld.shared, X by its wgmmas): the release
            // of each read is its own thread's arrive, which compute-sanitizer's racecheck can follow
            // (one arrive per warp after __syncwarp is also ordered, but racecheck reports it).
            mbar_arrive(smem_u32(&empty_bar[prev]));
          }
        }
      }
    }
    wgmma_wait<0>();
    fence_acc(acc);
  };
  if constexpr (kHasNarrow<BN, kGrouped>) {
    if (width == BN / 4) main_loop(std::integral_constant<int, BN / 4>{});
    else if (width == BN / 2) main_loop(std::integral_constant<int, BN / 2>{});
    else main_loop(std::integral_constant<int, BN>{});
  } else {
    main_loop(std::integral_constant<int, BN>{});
  }
  // PDL (dense): the next kernel may launch once every CTA is past its main loop (its own wait still waits
  // for this grid's end and memory); its launch and prologue then overlap the fixups and epilogues. Same-run
  // A/B on the H200: one-wave calls of small layers 2-13% faster (gpt-oss attention, Llama-3.1-8B qkv, the
  // tp8 shards at m = 48-64), larger calls unchanged; the fused MoE's GEMMs 0-3.5% slower with it (Qwen3-30B-A3B
  // at T = 8192), so not in grouped mode.
  if constexpr (!kGrouped) griddep_launch_dependents();
  if (threadIdx.x == 0) trace_at<kTrace>(2);

  // ---- epilogue over the tile's 8-token groups [JB, JE): accumulator (m64nBN f32 layout) element
  // 4j + 2h + e is row g + 8h of the warp's tile, token 8j + 2t + e of the CTA's token tile. `staged`: the
  // ring offset of the shared-memory staging (past what a pair's exchange left there).
  const int t = lane & 3;
  T* y = static_cast<T*>(p.y);
  auto epilogue = [&](auto jb, auto je, uint32_t staged) {
    constexpr int JB = decltype(jb)::value, JE = decltype(je)::value;
    const int tok0 = op.tok_begin + 8 * JB;
    if (p.n % 8 == 0) {
      // Through shared memory: each thread holds 2 rows x BN/4 tokens, so direct stores write one element
      // per lane (a warp store fills four 32-byte sectors with 16 bytes each). The tile goes to shared
      // memory as [token][row] and leaves in 16-byte segments, 8 rows of one token per lane, whole sectors
      // per warp store. With n % 8 == 0 every segment of an existing row is whole and 16-byte aligned (Y is;
      // row blocks start at multiples of 128). The ring is free once every consumer has passed its last
      // wgmma wait (the barrier below): all its copies were waited on, the producer issues no more.
      constexpr int kPitch = kRowsPerCta * 2 + 16;  // bytes per token; + 16: the 2-byte writes hit 16 banks
      static_assert(BN * kPitch <= S * G::kStage, "the staged tile fits the ring");
      uint8_t* tile = prefill_smem + (ring - smem_u32(prefill_smem)) + staged;
      const int row0 = row_block * kRowsPerCta, rows = min(kRowsPerCta, p.n - row0);
      const int toks = min(8 * (JE - JB), op.tok_end - tok0);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the ring's TMA writes and wgmma reads
      consumer_sync();                                               // come before these generic writes
      if (rt_ok) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = warp * 16 + g + 8 * h;  // row in the CTA
          if (r >= rows) continue;
          const float2 fb = factors(h, row0 + r);
#pragma unroll
          for (int j = JB; j < JE; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              *reinterpret_cast<T*>(tile + (8 * (j - JB) + 2 * t + e) * kPitch + r * 2) =
                  Act<T>::from_float(acc[4 * j + 2 * h + e] * fb.x + fb.y);
        }
      }
      consumer_sync();
      store_staged_tile<kPitch, kConsumerThreads>(tile, y, p.n, row0, rows, tok0, toks, threadIdx.x);
      return;
    }
    if (!rt_ok) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rt * 16 + g + 8 * h;
      if (row >= p.n) continue;
      const float2 fb = factors(h, row);
#pragma unroll
      for (int j = JB; j < JE; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = tok0 + 8 * (j - JB) + 2 * t + e;
          if (tok < op.tok_end)
            y[int64_t(tok) * p.n + row] = Act<T>::from_float(acc[4 * j + 2 * h + e] * fb.x + fb.y);
        }
    }
  };

  // ---- split K in a pair (p.pairs: a tile's two splits are one 2-CTA cluster, the split its rank): split z
  // finishes the tile's tokens of half z. Each CTA writes the other half of its accumulators into the other
  // CTA's ring (free once that CTA's consumers are past their last wgmma wait: they say so on pair_free),
  // says so on the other's pair_data, adds what it received to its own half (p_z + p_(1-z), the same bits as
  // the last arrival's sum below) and runs the epilogue on its half. No partial tile through L2, no arrival
  // counter, and the two CTAs' epilogues run side by side instead of one after the other.
  if constexpr (!kGrouped && BN >= kPairMinBn) {
    if (p.pairs && splits > 1) {
      constexpr int kHalf = G::kAcc / 8;                                // float4 per thread per half
      constexpr uint32_t kRecv = uint32_t(kHalf) * kConsumerThreads * 16;  // the received half in the ring
      static_assert(kRecv + (BN / 2) * (kRowsPerCta * 2 + 16) <= S * G::kStage, "exchange and staging fit the ring");
      const int ct = threadIdx.x;  // consumer thread 0 .. kConsumerThreads - 1
      const int peer = split ^ 1;
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // this ring's wgmma reads, before its writes
      mbar_arrive_remote(smem_u32(&pair_free), peer);
      mbar_wait<true>(smem_u32(&pair_free), 0);  // the peer's ring is free
      const uint32_t dst = cluster_addr(ring, peer);
      auto exchange = [&](auto keep_hi) {
        constexpr int kSend = decltype(keep_hi)::value ? 0 : kHalf, kKeep = kHalf - kSend;
#pragma unroll
        for (int v = 0; v < kHalf; ++v)
          st_cluster_v4(dst + uint32_t(v * kConsumerThreads + ct) * 16u, acc[4 * (kSend + v)], acc[4 * (kSend + v) + 1],
                        acc[4 * (kSend + v) + 2], acc[4 * (kSend + v) + 3]);
        mbar_arrive_remote(smem_u32(&pair_data), peer);
        mbar_wait<true>(smem_u32(&pair_data), 0);  // the peer's half of this CTA's tokens is here
#pragma unroll
        for (int v = 0; v < kHalf; ++v) {
          const uint4 x = lds128(ring + uint32_t(v * kConsumerThreads + ct) * 16u);
          acc[4 * (kKeep + v)] += __uint_as_float(x.x);
          acc[4 * (kKeep + v) + 1] += __uint_as_float(x.y);
          acc[4 * (kKeep + v) + 2] += __uint_as_float(x.z);
          acc[4 * (kKeep + v) + 3] += __uint_as_float(x.w);
        }
      };
      if (threadIdx.x == 0) trace_at<kTrace>(3);
      if (split == 0) {
        exchange(std::false_type{});
        epilogue(std::integral_constant<int, 0>{}, std::integral_constant<int, BN / 16>{}, kRecv);
      } else {
        exchange(std::true_type{});
        epilogue(std::integral_constant<int, BN / 16>{}, std::integral_constant<int, BN / 8>{}, kRecv);
      }
      if (threadIdx.x == 0) trace_at<kTrace>(4);
      return;
    }
  }

  // ---- split K: store this split's partial tile, count the arrival; the last split sums the partials in
  // split order (the same bits whatever the arrival order), then runs the epilogue. With two splits the last
  // one adds the other's partial to its own registers (p0 + p1 == p1 + p0 bit for bit): one partial tile
  // read instead of two on the call's critical path. Warps whose row tile is past the matrix store and load
  // nothing but take part in the barriers.
  if (splits > 1) {
    constexpr int kVec = G::kAcc / 4;  // float4 per thread per partial
    const int ct = threadIdx.x;        // consumer thread 0 .. kConsumerThreads - 1
    const int64_t tile = tail;         // counters and partial slots are the split tiles'
    const float4* slots = reinterpret_cast<const float4*>(p.partials) + tile * splits * (G::kPartialFloats / 4);
    if (rt_ok) {
      float4* mine = reinterpret_cast<float4*>(p.partials) + (tile * splits + split) * (G::kPartialFloats / 4);
#pragma unroll
      for (int v = 0; v < kVec; ++v)
        __stcg(mine + v * kConsumerThreads + ct, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
    }
    consumer_sync();
    if (ct == 0) s_last = kernels::count_arrival(&p.counters[tile]) == splits - 1;
    consumer_sync();
    if (!s_last) {
      if (threadIdx.x == 0) trace_at<kTrace>(4);
      return;
    }
    const int z_first = splits == 2 ? 1 - split : 0;  // two splits: only the other one's partial
    const int z_count = splits == 2 ? 1 : splits;
    if (splits != 2) {
#pragma unroll
      for (int i = 0; i < G::kAcc; ++i) acc[i] = 0.0f;
    }
    if (rt_ok) {
      constexpr int kBatch = 8;  // float4 loads in flight per thread
      static_assert(kVec % kBatch == 0, "partial tile in whole batches");
#pragma unroll
      for (int v0 = 0; v0 < kVec; v0 += kBatch)
        for (int z = z_first; z < z_first + z_count; ++z) {
          const float4* src = slots + int64_t(z) * (G::kPartialFloats / 4) + ct;
          float4 x[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) x[b] = __ldcg(src + (v0 + b) * kConsumerThreads);
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            acc[4 * (v0 + b)] += x[b].x;
            acc[4 * (v0 + b) + 1] += x[b].y;
            acc[4 * (v0 + b) + 2] += x[b].z;
            acc[4 * (v0 + b) + 3] += x[b].w;
          }
        }
    }
    if (ct == 0) p.counters[tile] = 0;  // leave the workspace as we found it
  }

  if (threadIdx.x == 0) trace_at<kTrace>(3);
  epilogue(std::integral_constant<int, 0>{}, std::integral_constant<int, BN / 8>{}, 0u);
  if (threadIdx.x == 0) trace_at<kTrace>(4);
#else
  __trap();  // built for another architecture: the plan never launches this
#endif
}

}  // namespace prefill
}  // namespace kernels
}  // namespace fp4kit
