// moe_bf16_wgmma.cuh: the grouped BF16 x BF16 GEMM of the fused MoE layer's tensor-core path with BF16
// experts on Hopper (sm_90a): both operands through TMA into a shared-memory ring, wgmma from shared memory.
//
// Contract
//   The contract of moe_bf16_mma.cuh (the sm_80 kernel it replaces where this build carries sm_90a code):
//   CTA b takes the tile prefill::cta_tile(b) gives, 128 weight rows of one expert e x that token tile's
//   sorted rows (the schedule's tile_expert and tile_row; CTAs past the routing's last tile leave at once;
//   a one-token pass, p.one: tile a is pair a, expert ids[a], row a, X row 0 for gate_up), and computes
//     Y[r, n0 : n0 + 128] = X[r, :] @ W_e[n0 : n0 + 128, :]^T (+ bias[e, n0 : n0 + 128])
//   W_e plain row-major [n, k] BF16 at base + e * stride, X [rows, k] and Y [rows, n] BF16 in sorted row
//   order, fp32 accumulation, the bias added in fp32, one rounding. Whole K per CTA, deterministic. Needs
//   n % 8 == 0, k % 8 == 0 and a stride that is a multiple of 16 bytes (the BF16 experts' validator rules;
//   also TMA's), 16-byte aligned base, X and Y.
//   FP16 activations (p.x_split, prefill_gemm_sm90.cuh): X's rows hold hi and lo BF16 terms chunk by chunk
//   ({2 kx, rows}), and stages 2j and 2j + 1 load the weights' chunk j with X's hi and lo chunk j (the
//   second weight copy an L2 hit).
//   Launch: grid row_blocks x the most token tiles, kThreads threads, Geometry<BN>::kSmem bytes of dynamic
//   shared memory; tmap_x over X {k, rows} with boxes {64, BN}, narrow.half / quarter with boxes of BN / 2
//   and BN / 4 tokens, tmap_w over the experts {k, n, experts} with boxes {64, 128, 1}; all BF16 with the
//   128-byte swizzle, zero out-of-bounds fill (prefill.cu, launch_prefill_grouped). Rows >= n and rows past
//   the tile's are never written. The body exists for sm_90a only; elsewhere it traps.
//   PDL: the kernel lets its dependents launch only after its griddepcontrol.wait has returned
//   (p.early_trigger), else only when it ends (moe.cu relies on either: see early_w).
//   p.early_w: the launch guarantees that the schedule (or a one-token pass's ids) is complete when the
//   kernel starts, so it is read before griddepcontrol.wait, with the first ring of weights requested; X
//   is requested and Y written after the wait.
//
// Why it is shaped this way
//   - The FP4 prefill kernel's frame (prefill_gemm_sm90.cuh: producer warpgroup, two consumer warpgroups of
//     64 weight rows, full / empty mbarriers, setmaxnreg, the staged epilogue) without the dequantisation:
//     BF16 weights go from TMA straight to wgmma's A descriptor, so no consumer instruction touches a weight
//     and the consumers only wait, issue four wgmmas per stage and release the slot. The sm_80 kernel runs
//     mma.sync from ldmatrix fragments at ~250 TFLOP/s on the H200 (gpt-oss-120b, T = 8192).
//   - Stage = 64 K: W [128 rows][128 B] (16 KB) then X [BN tokens][128 B], each a 128-byte swizzled box, so
//     one descriptor form serves both operands (K-major, 8-row groups 1024 B apart) and a k16 step is +32 B.
//     Warpgroup w's 64 rows start 8 KB into the W box (1024-aligned).
//   - One CTA per SM. Two (BN = 64 and 128, a producer warp instead of a warpgroup for ptxas's register budget)
//     measured 2.6% faster at 64-token tiles and 2.5% slower at 128 (geometric means, five models, T = 512 -
//     8192; docs/moe-notes.md), and no faster where the plan takes 64-token tiles.
//   - An expert's last tile often holds few rows: at most BN / 4 (BN / 2) of them run m64n(BN/4)
//     (m64n(BN/2)) wgmmas on the accumulators' prefix and load only that many X rows (layout::tile_width,
//     as the FP4 grouped kernel does); the weights' box is the same.
//   - Rows of X past the tile's end belong to the next expert (or are TMA zero fill): computed, never
//     written. Weight rows past n are zero fill.
//   - The first ring before the wait (early_w): a decode-sized call is a chain of launches, and each GEMM's
//     first weight request used to wait for the kernel before it; 2-4% at T <= 64 (docs/moe-notes.md).
//     Cutting the tiles' stages evenly over one CTA per SM (stream-K) measured slower (T = 1 +9%).
#pragma once
#include "kernels/prefill_gemm_sm90.cuh"  // PrefillParams, cta_tile, cta_operands, the PTX wrappers

namespace fp4kit {
namespace kernels {
namespace bf16wgmma {

using prefill::NarrowX;
using prefill::PrefillGroup;
using prefill::PrefillParams;

constexpr int kThreads = prefill::kThreads;  // two consumer warpgroups + the producer warpgroup
constexpr int kConsumerThreads = prefill::kConsumerThreads;
constexpr int kRows = prefill::kRowsPerCta;  // 128 weight rows per CTA
constexpr int kStageK = 64;
constexpr int kWBytes = kRows * 128;  // a stage's weights: 16 KB, a multiple of 1024 (X's box follows)

template <int BN> struct Geometry {
  static_assert(BN == 64 || BN == 128 || BN == 256, "token tile");
  static constexpr int kX = BN * 128;
  static constexpr int kStage = kWBytes + kX;
  static constexpr int kFit = 220 * 1024 / kStage;
  static constexpr int kStages = kFit > 8 ? 8 : kFit;   // 8 / 6 / 4 at BN = 64 / 128 / 256
  static constexpr int kSmem = kStages * kStage + 1024;  // + slack to align the ring to 1024 B
  static constexpr int kAcc = BN / 2;
  static constexpr int kPitch = kRows * 2 + 16;          // epilogue: bytes per token (+16: banks)
  static_assert(BN * kPitch <= kStages * kStage, "the staged output tile fits the ring");
};

// TMA: box {64 K, 128 rows, 1 expert} of the experts' weights at (k, row, e) into `dst` (1024-aligned).
__device__ __forceinline__ void tma_load_w(uint32_t dst, const CUtensorMap* map, int k, int row, int e, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(e), "r"(bar)
      : "memory");
}

template <int BN>
__global__ void __launch_bounds__(kThreads, 1)
    moe_bf16_wgmma_kernel(const __grid_constant__ CUtensorMap tmap_x, const __grid_constant__ NarrowX narrow,
                          const __grid_constant__ CUtensorMap tmap_w, const PrefillParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace prefill;
  using G = Geometry<BN>;
  using T = __nv_bfloat16;
  constexpr int S = G::kStages;
  extern __shared__ uint8_t bf16w_smem[];
  __shared__ __align__(8) uint64_t full_bar[S], empty_bar[S];
  const uint32_t ring = (smem_u32(bf16w_smem) + 1023u) & ~1023u;  // TMA 128B swizzle: 1024-aligned
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_stages = p.x_split ? 2 * p.x_split : (p.k + kStageK - 1) / kStageK;
  int row_block, token_tile, split, splits, tail;
  cta_tile(p, row_block, token_tile, split, splits, tail);
  // The schedule: after griddepcontrol.wait, or before it where the launch says its writers are complete
  // (p.early_w), read from L2 (the SM's L1 may hold lines of an earlier call's schedule). A one-token pass
  // reads pair ids instead (tile a = pair a) and its gate_up's CTA 0 writes the rows and each pair's row.
  if (!p.early_w) griddep_wait();
  const PrefillGroup& grp = p.group;
  const bool one = p.one.ids != nullptr;
  if (one && p.one.n_rows && blockIdx.x == 0) write_one_token_schedule(p.one);
  if (token_tile >= (one ? p.one.pairs : __ldcg(grp.n_tiles))) return;  // uniform, before any barrier
  const int expert = one ? one_token_expert(p.one, __ldcg(p.one.ids + token_tile)) : __ldcg(grp.tile_expert + token_tile);
  const int tok_begin = one ? token_tile : __ldcg(grp.tile_row + token_tile);
  const int tok_end = one ? token_tile + 1 : __ldcg(grp.tile_row + token_tile + 1);
  const int x_row = one && p.one.token_x ? 0 : tok_begin;  // X's first row (a one-token gate_up: the token's)
  const int width = layout::tile_width(BN, tok_end - tok_begin);
  const int row0 = row_block * kRows;

  init_ring<S>(full_bar, empty_bar);

  if (warp >= 4 * kConsumerWarpgroups) {
    // ---- producer warpgroup: one thread fills the ring; the other warps give their registers back.
    setmaxnreg_dec<Regs<1>::kProducer>();
    if (warp != 4 * kConsumerWarpgroups) return;
    const CUtensorMap* map = width == BN ? &tmap_x : width == BN / 2 ? &narrow.half : &narrow.quarter;
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tmap_w)) : "memory");
    }
    if (lane != 0) return;
    const uint32_t bytes = uint32_t(kWBytes + width * 128);
    // early_w: the first ring's weights (which no kernel writes) are requested before the wait, X after it.
    const int pre = p.early_w ? min(S, n_stages) : 0;
    for (int s = 0; s < pre; ++s) {
      const uint32_t bar = smem_u32(&full_bar[s]);
      mbar_arrive_expect_tx(bar, bytes);  // a fresh slot: no empty wait
      tma_load_w(ring + s * G::kStage, &tmap_w, w_stage(p, s) * kStageK, row0, expert, bar);
    }
    if (p.early_w) griddep_wait();  // X is the previous kernel's output
    for (int s = 0; s < pre; ++s)
      tma_load_x(ring + s * G::kStage + kWBytes, map, s * kStageK, x_row, smem_u32(&full_bar[s]));
    for (int s = pre; s < n_stages; ++s) {
      const int slot = s % S;
      const uint32_t st = ring + slot * G::kStage, bar = smem_u32(&full_bar[slot]);
      mbar_wait(smem_u32(&empty_bar[slot]), ((s / S) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
      mbar_arrive_expect_tx(bar, bytes);
      tma_load_w(st, &tmap_w, w_stage(p, s) * kStageK, row0, expert, bar);
      tma_load_x(st + kWBytes, map, s * kStageK, x_row, bar);
    }
    return;
  }

  // ---- consumer warpgroups: warpgroup wg multiplies weight rows 64 wg .. 64 wg + 63 of the CTA's 128.
  setmaxnreg_inc<Regs<1>::kConsumer>();
  if (p.early_w) griddep_wait();  // before this CTA writes Y (which an earlier kernel may read)
  // early_trigger: past the wait, the kernels after this one may launch (the activation kernel, then down
  // onto SMs this grid leaves idle in its last wave); the schedule and ids they read early are complete.
  if (p.early_trigger) griddep_launch_dependents();
  const int wg = warp >> 2;
  float acc[G::kAcc];
#pragma unroll
  for (int i = 0; i < G::kAcc; ++i) acc[i] = 0.0f;
  // Descriptors: the ring's, plus a slot's offset, warpgroup wg's 8 KB into the W box, 32 B per k16 step
  // (every shared address is below 2^18, so adding to the 14-bit address field is exact).
  const uint64_t ring_desc = sw128_desc(ring);
  auto main_loop = [&](auto nw) {
    constexpr int NW = decltype(nw)::value;
    for (int s = 0; s < n_stages; ++s) {
      const int slot = s % S;
      mbar_wait(smem_u32(&full_bar[slot]), uint32_t(s / S) & 1u);
      const uint64_t da = ring_desc + uint64_t((slot * G::kStage + wg * (kWBytes / 2)) >> 4);
      const uint64_t db = ring_desc + uint64_t((slot * G::kStage + kWBytes) >> 4);
      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kStageK / 16; ++ks) WgmmaSS<T, NW>::mma(acc, da + 2 * ks, db + 2 * ks);
      wgmma_commit();
      fence_acc(acc);
      wgmma_wait<1>();  // the group before this one is done: hand its slot back to the producer
      if (s > 0) mbar_arrive(smem_u32(&empty_bar[(s - 1) % S]));
    }
    wgmma_wait<0>();
    fence_acc(acc);
  };
  if (width == BN / 4) main_loop(std::integral_constant<int, BN / 4>{});
  else if (width == BN / 2) main_loop(std::integral_constant<int, BN / 2>{});
  else main_loop(std::integral_constant<int, BN>{});

  // ---- epilogue: accumulator element 4j + 2h + e is row 16 warp + g + 8h of the CTA's 128, token
  // 8j + 2t + e of the tile; staged as [token][row] in the ring (free: every copy was waited on, the producer
  // issues no more), then 16-byte row segments to Y (n % 8 == 0: every segment whole and aligned).
  const int g = lane >> 2, t = lane & 3;
  uint8_t* tile = bf16w_smem + (ring - smem_u32(bf16w_smem));
  const int rows = min(kRows, p.n - row0), toks = min(BN, tok_end - tok_begin);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the ring's TMA writes and wgmma reads
  consumer_sync();                                               // come before these generic writes
  const T* bias_row = grp.experts.bias_of<T>(expert, p.n);  // null without biases
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h;
    if (r >= rows) continue;
    const float bias = bias_row ? __bfloat162float(bias_row[row0 + r]) : 0.0f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        *reinterpret_cast<T*>(tile + (8 * j + 2 * t + e) * G::kPitch + r * 2) =
            __float2bfloat16_rn(acc[4 * j + 2 * h + e] + bias);
  }
  consumer_sync();
  store_staged_tile<G::kPitch, kConsumerThreads>(tile, static_cast<T*>(p.y), p.n, row0, rows, tok_begin, toks,
                                                 threadIdx.x);
#else
  __trap();  // built for another architecture: the plan never launches this
#endif
}

}  // namespace bf16wgmma
}  // namespace kernels
}  // namespace fp4kit
