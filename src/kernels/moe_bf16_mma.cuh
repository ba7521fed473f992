// moe_bf16_mma.cuh: the grouped BF16 x BF16 GEMM of the fused MoE layer's tensor-core path with BF16 experts
// (moe.cu), for many rows per expert (prefill).
//
// Contract
//   The grouped prefill kernels' contract (prefill_gemm_sm80.cuh, grouped mode) with plain BF16 weights:
//   CTA b takes the tile cta_tile(b) gives, i.e. 128 weight rows of one expert e (row block) x BN of that
//   expert's sorted rows (cta_operands: the expert whose tiles hold the token tile; CTAs past the routing's
//   last tile leave at once):
//     Y[r, n0 : n0 + 128] = X[r, :] @ W_e[n0 : n0 + 128, :]^T (+ bias[e, n0 : n0 + 128])
//   W_e plain row-major [n, k] BF16 at base + e * stride (what checkpoints ship, no prepack), X [rows, k] and
//   Y [rows, n] BF16 in the sorted row order (the gather kernel put X there). fp32 accumulation, the bias
//   added in fp32, one rounding. Whole K per CTA (no split, no workspace): deterministic. Needs n % 8 == 0
//   and k % 8 == 0 (the validator's rule for BF16 experts: H and I are multiples of 8) and 16-byte aligned
//   rows. Rows >= n and rows past the expert's are never written.
//   FP16 activations (p.x_split, prefill_gemm_sm90.cuh): X's rows hold hi and lo BF16 terms chunk by chunk
//   and the K loop meets each 64-K chunk of weights twice (its hi, then its lo stage).
//   Launch: grid row_blocks x max token tiles, kThreads threads, Geometry<BN, S>::kSmem bytes of dynamic
//   shared memory (prefill.cu, plan_grouped_bf16; launch_prefill_grouped launches it).
//
// Why it is shaped this way
//   - The textbook sm_80 tensor-core GEMM, because nothing needs dequantising: both operands stream through
//     an S-stage cp.async ring (stage = 64 K: W [128][64] and X [BN][64], 128-byte rows) and reach the MMA
//     through ldmatrix. mma.m16n8k16 computes Y^T = W X^T as in every fp4kit GEMM: the weight rows are the
//     A operand (ldmatrix.x4 of a 16 x 16 block gives a0..a3 in order), the tokens the 8-wide N side (X rows
//     are K-contiguous, i.e. B "col": ldmatrix.x4 of 16 tokens x 16 K gives two column tiles' b0, b1).
//   - 16-byte unit u of row r is stored at unit u ^ (r & 7) (layout::bf16_unit): the eight row addresses
//     of each ldmatrix phase and the cp.async writes of a warp then fall on eight distinct bank groups.
//   - 8 warps as 2 (64 rows) x 4 (BN / 4 tokens): per 16 K a warp loads 4 A and BN / 64 B fragments x4
//     for 4 x BN / 32 MMAs. kBlocks CTAs per SM (launch bound): at BN = 128 two (3 stages, 128 registers)
//     ran 10% faster than one on gpt-oss-120b at T = 8192, and faster than 256-token tiles at one per SM
//     (docs/moe-notes.md): the SM waits on one CTA's ring fill and epilogue unless another CTA runs.
//   - The epilogue stages the tile as [token][row] in the (free) ring and stores 16-byte row segments
//     (prefill::store_staged_tile, as the FP4 prefill kernels do).
#pragma once
#include "kernels/prefill_gemm_sm90.cuh"  // PrefillParams, CtaOperands, cta_tile, cta_operands, store_staged_tile

namespace fp4kit {
namespace kernels {
namespace bf16mma {

using prefill::CtaOperands;
using prefill::PrefillParams;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kRows = 128;      // weight rows per CTA (the FP4 prefill kernels' row block)
constexpr int kStageK = 64;     // K per stage: 128-byte rows of 8 units
constexpr int kRowBytes = 2 * kStageK;
constexpr int kWBytes = kRows * kRowBytes;  // a stage's weights (16 KB); X follows them
constexpr int kRowWarps = 2, kTokWarps = kWarps / kRowWarps;
constexpr int kWarpRowTiles = kRows / kRowWarps / 16;  // 4 tiles of 16 rows per warp
static_assert(kRows == prefill::kRowTilesPerCta * 16, "one row block for every prefill kernel");

template <int BN, int S> struct Geometry {
  static_assert(BN == 64 || BN == 128, "token tile");
  static_assert(S >= 2, "ring");
  static constexpr int kX = BN * kRowBytes;
  static constexpr int kStage = kWBytes + kX;
  static constexpr int kSmem = S * kStage;
  static constexpr int kWarpToks = BN / kTokWarps;    // 16 or 32
  static constexpr int kWarpTiles = kWarpToks / 8;    // 8-token column tiles per warp
  static constexpr int kPitch = kRows * 2 + 16;       // epilogue: bytes per token (+16: banks)
  static_assert(BN * kPitch <= kSmem, "the staged output tile fits the ring");
};

// Byte offset of 16-byte unit u of row r in a [rows][64 K] stage buffer (swizzled: see the contract).
__device__ __forceinline__ uint32_t unit_at(int r, int u) { return uint32_t(r * kRowBytes + (layout::bf16_unit(r, u) << 4)); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Stage s (K 64 s .. 64 s + 63) of the CTA's weights and tokens into a ring slot, zero past n, past the
// expert's rows and past K. Thread tid copies unit tid % 8 of rows tid / 8 + 32 j.
template <int BN>
__device__ __forceinline__ void load_stage(uint32_t slot, const PrefillParams& p, const CtaOperands<__nv_bfloat16>& op,
                                           int row0, int s, int tid) {
  const int u = tid & 7, r0 = tid >> 3;
  const int k = prefill::w_stage(p, s) * kStageK + 8 * u, xk = s * kStageK + 8 * u;
  const bool k_ok = k < p.k;
  const int64_t x_len = prefill::x_row_elems(p);
  const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(op.weights);
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);
#pragma unroll
  for (int j = 0; j < kRows / 32; ++j) {
    const int r = r0 + 32 * j;
    const bool ok = k_ok && row0 + r < p.n;
    cp_async16_u32(slot + unit_at(r, u), ok ? w + int64_t(row0 + r) * p.k + k : w, ok);
  }
#pragma unroll
  for (int j = 0; j < BN / 32; ++j) {
    const int r = r0 + 32 * j;
    const bool ok = k_ok && op.tok_begin + r < op.tok_end;
    cp_async16_u32(slot + kWBytes + unit_at(r, u), ok ? x + int64_t(op.tok_begin + r) * x_len + xk : x, ok);
  }
}

template <int BN, int S, int kBlocks = 1>
__global__ void __launch_bounds__(kThreads, kBlocks) moe_bf16_mma_kernel(const PrefillParams p) {
  using G = Geometry<BN, S>;
  using T = __nv_bfloat16;
  constexpr int MT = kWarpRowTiles, NT = G::kWarpTiles;
  extern __shared__ __align__(128) uint8_t bf16_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp % kRowWarps, wn = warp / kRowWarps;
  int row_block, token_tile, split, splits, tail;
  prefill::cta_tile(p, row_block, token_tile, split, splits, tail);
  CtaOperands<T> op;
  if (!prefill::cta_operands<T, BN, true>(p, token_tile, op)) return;  // uniform, before any barrier
  const int row0 = row_block * kRows;
  const int n_stages = p.x_split ? 2 * p.x_split : (p.k + kStageK - 1) / kStageK;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(bf16_smem));

#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n_stages) load_stage<BN>(ring + i * G::kStage, p, op, row0, i, tid);
    cp_async_commit();
  }
  float acc[MT][NT][4];
  zero_acc(acc);
  // ldmatrix row addresses: A lane l reads row (l & 15) of a 16-row tile, unit 2 ks + (l >> 4); B lane l
  // reads token (l & 7) + 8 (l >> 4) of a 16-token pair of column tiles, unit 2 ks + ((l >> 3) & 1).
  const int a_row = wm * (kRows / kRowWarps) + (lane & 15), a_hi = lane >> 4;
  const int b_tok = wn * G::kWarpToks + (lane & 7) + 8 * (lane >> 4), b_hi = (lane >> 3) & 1;
  for (int s = 0; s < n_stages; ++s) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage s is visible to all; every thread is done with the slot of stage s - 1
    if (s + S - 1 < n_stages) load_stage<BN>(ring + ((s + S - 1) % S) * G::kStage, p, op, row0, s + S - 1, tid);
    cp_async_commit();
    const uint32_t wst = ring + (s % S) * G::kStage, xst = wst + kWBytes;
#pragma unroll
    for (int ks = 0; ks < kStageK / 16; ++ks) {
      uint32_t a[MT][4], b[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(wst + unit_at(a_row + 16 * mt, 2 * ks + a_hi), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np)
        ldsm_x4(xst + unit_at(b_tok + 16 * np, 2 * ks + b_hi), b[2 * np][0], b[2 * np][1], b[2 * np + 1][0],
                b[2 * np + 1][1]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) Act<T>::mma(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
  }
  cp_async_wait<0>();  // only empty groups can be pending; the ring is reused below

  // Epilogue: acc[mt][nt][2h + e] is row 16 mt + g + 8h of the warp's 64, token 8 nt + 2t + e of its BN / 4;
  // staged as [token][row] (the ring is free once every thread is past its last stage), then 16-byte row
  // segments to Y.
  __syncthreads();
  const int rows = min(kRows, p.n - row0), toks = min(BN, op.tok_end - op.tok_begin);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rr = wm * (kRows / kRowWarps) + 16 * mt + g + 8 * h;
      if (rr >= rows) continue;
      const float bias = op.bias ? __bfloat162float(op.bias[row0 + rr]) : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          *reinterpret_cast<T*>(bf16_smem + (wn * G::kWarpToks + 8 * nt + 2 * t + e) * G::kPitch + rr * 2) =
              __float2bfloat16_rn(acc[mt][nt][2 * h + e] + bias);
    }
  __syncthreads();
  prefill::store_staged_tile<G::kPitch, kThreads>(bf16_smem, static_cast<T*>(p.y), p.n, row0, rows, op.tok_begin, toks,
                                                  tid);
}

}  // namespace bf16mma
}  // namespace kernels
}  // namespace fp4kit
