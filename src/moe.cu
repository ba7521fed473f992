// moe.cu: the fused Mixture-of-Experts layer (fp4kit/moe.h).
//
// Contract: see fp4kit/moe.h. Decode path: one pass per kMoEDecodePassTokens tokens (BF16 experts: 64),
// five launches per pass, all stream-ordered and sized on the host from shapes only (CUDA-graph safe):
//   1. align      one CTA: counts per expert, sorted-row offsets, the schedule's entries (FP4: each
//                 expert's rows in blocks of the grouped kernel's token tiles, sized on the host for the
//                 pass's mean rows per expert; BF16: one per expert), for every (token, slot) pair its
//                 sorted row, and for every sorted row its token. Rows of one expert are in arrival order
//                 (atomics): the order does not change any value, since every row of a GEMM is computed
//                 independently and the final sum runs over slots in slot order.
//   2. gate_up    FP4 experts: the decode kernel in grouped mode (decode_gemm.cuh): stream-K over the
//                 entries' (row group, K slice) units only, read from the device, so every SM streams and
//                 each touched expert's weights are read once per entry (once for all but the experts
//                 far above the mean). At T ~ 1 on Hopper (plan_grouped: every schedule row group a
//                 cluster of CTAs within one wave, two or three K slices each) in cluster mode instead:
//                 the K split reduced in distributed shared memory, and with interleaved gate/up rows
//                 the activation applied there (step 3 is then not launched). BF16 experts: the grouped
//                 BF16 GEMV (moe_bf16_gemm.cuh), 1-8 warps of a CTA per 16-row tile (plan_bf16), tiles
//                 of the active experts dealt evenly over all SMs. X rows are gathered through the sorted rows.
//   3. activation silu_and_mul or gpt-oss SwiGLU on [rows, 2I] -> [rows, I] (fp32 math, act-dtype out;
//                 FP16 saturates its input and output at +-65504, see fp4kit/moe.h).
//   4. down       grouped again over the same schedule, X = the activations in sorted order.
//   5. combine    Y[t] = sum_j w[t, j] * O[row(t, j)] in fp32, slot order; a bad id makes the row NaN.
// A one-token call on Hopper whose GEMMs both run in cluster mode skips step 1 (MoEPlan::one_token): one
// token's top-k ids are distinct experts, so the pairs in slot order are the schedule (kernels::OneToken);
// gate_up's CTA 0 writes the rows count and each pair's row, which steps 3 and 5 read. So does a one-token
// call of BF16 experts (BF16 activations) on the wgmma kernel, whose gate_up also reads x's row itself (no
// gather launch).
// With MoEArgs::routing set, one launch before the passes routes every token from its router logits
// (kernels/moe_routing.cuh) into the workspace, and the passes read the ids and weights from there; a call
// of one pass of at most 32 tokens whose align is one CTA routes inside that CTA instead
// (kernels/moe_route_align.cuh: the same ids and weights, one launch fewer).
// Activations BF16 or FP16 (T): every kernel above is instantiated for both. BF16 experts with FP16
// activations (MoEPlan::split_x) take the tensor-core path with X gathered as two BF16 terms, BF16
// intermediates and an FP16 combine.
// The kernels of steps 1, 3 and 5 are in kernels/moe_align.cuh and kernels/moe_elementwise.cuh; the
// GEMMs in decode_gemm.cuh, moe_bf16_gemm.cuh, moe_bf16_mma.cuh and prefill_gemm_sm{90,80}.cuh.
//
// Tensor-core path (FP4 experts, sm_90a, large T): passes of up to kMoETensorCorePassTokens tokens, six
// launches per pass: align (which also numbers each expert's token tiles), a gather of X into sorted row
// order (the grouped prefill GEMM reads X by TMA, which takes contiguous rows; the gathered copy costs
// T * top_k * H * 2 bytes of traffic, ~1% of the GEMMs' time at T = 8192), gate_up and down as grouped
// prefill GEMMs (prefill_gemm_sm90.cuh, kGrouped: one launch covers every expert's 128-row x BN-token
// tiles), the activation and the same combine. The gather and the activation write their rows in lane
// order (layout::natural_pair, k_pad long), the K order in which each lane of the GEMM dequantises only
// its own weight records: the permutation costs nothing where the rows are written anyway. The gathered X
// lives where the down GEMM's output goes (it is dead by then). On devices without wgmma (or forced) the FP4
// GEMMs are the mma.sync prefill kernel's grouped mode (prefill_gemm_sm80.cuh), which reads X and the
// activations in natural order; BF16 experts take the same path (X in natural order) with their own grouped
// GEMM: wgmma on sm_90a at every T (moe_bf16_wgmma.cuh), mma.sync elsewhere (moe_bf16_mma.cuh) past one GEMV
// pass and at >= 8 rows per expert (choose_tensor_core).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "fp4kit/moe.h"
#include "fp4kit/repack.h"
#include "decode_kernels.cuh"
#include "launch.h"
#include "moe_internal.h"
#include "kernels/moe_align.cuh"
#include "kernels/moe_route_align.cuh"
#include "kernels/moe_bf16_gemm.cuh"
#include "kernels/moe_elementwise.cuh"
#include "gemm_internal.h"
#include "configs.h"
#include "prefill.h"
#include "repack_common.h"
#include "routing_common.h"
#include "routing_internal.h"

namespace fp4kit {
namespace {

using kernels::GroupedSchedule;
using detail::check_shape;
using detail::str;

using kernels::AlignBufs;
using kernels::align_bufs;
using kernels::align_ints;
using kernels::kAlignThreads;
using kernels::moe_activation_kernel;
using kernels::moe_align_assign_kernel;
using kernels::moe_align_count_kernel;
using kernels::moe_align_kernel;
using kernels::moe_combine_kernel;

// ---- the grouped GEMM kernels ----------------------------------------------------------------------
// The config table's first register-ring entry for each n_tiles (the dispatcher's default for small
// layers), instantiated in grouped mode for BF16 and FP16 activations. (The bulk pipeline measured slower
// here: gpt-oss-120b MXFP4, T = 4: 115 vs 96 us at 0773a97; MoE segments are short and its 8 consumer
// warps per CTA issue fewer dequantisations per SM.)
using GroupedFn = detail::DecodeKernelFn;

// At 32 tokens per pass that is the one-row-tile entry, as on dense layers below 2^27 weights (the
// two-tile entry also spilled a few bytes in grouped mode with NVFP4 and FP16).
constexpr int grouped_index(int n_tiles) { return first_ring_index(n_tiles); }
// The cluster twin of the one-token-tile entry (cluster mode, sm_90): a schedule entry's row group with
// its K split over a thread-block cluster, reduced in distributed shared memory (decode_gemm.cuh).
constexpr int grouped_cluster_index() { return cluster_twin(grouped_index(1)); }
static_assert(grouped_cluster_index() >= 0, "the config table has no cluster twin of the one-token-tile entry");
// The tensor-core path's entry for a token tile: the table's unsplit entry of that tile for the kernel
// (kWgmma, or kMma on devices without wgmma) with the most CTAs per SM (the first of equals). 64-token
// wgmma tiles thus run two CTAs per SM (p64_w8_s4_b2: 14% faster at T = 512-2048, docs/moe-notes.md), the
// wider tiles one; the mma.sync entries all run one.
constexpr int unsplit_index(Pipeline pipeline, int n_tiles) {
  int best = -1;
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (c.n_tiles == n_tiles && c.pipeline == pipeline && c.max_splits <= 1 &&
        (best < 0 || c.min_blocks > kKernelConfigs[best].min_blocks))
      best = i;
  }
  return best;
}
constexpr int prefill_index(int n_tiles) { return unsplit_index(kWgmma, n_tiles); }
constexpr int mma_index(int n_tiles) { return unsplit_index(kMma, n_tiles); }
static_assert(prefill_index(8) >= 0 && prefill_index(16) >= 0 && prefill_index(32) >= 0,
              "the config table has no unsplit p64 / p128 / p256 entry");
static_assert(kKernelConfigs[prefill_index(8)].min_blocks == 2, "64-token tiles: the two-CTA entry");
static_assert(mma_index(8) >= 0 && mma_index(16) >= 0, "the config table has no unsplit a64 / a128 entry");

template <Format F, typename T, int NT>
GroupedFn grouped_instance() {
  constexpr int i = grouped_index(NT);
  static_assert(i >= 0, "the config table has no register-ring entry for this n_tiles");
  return detail::decode_kernel_of<F, T, size_t(i), true>();
}
template <Format F, typename T>
GroupedFn grouped_kernel(int n_tiles) {
  switch (n_tiles) {
    case 1: return grouped_instance<F, T, 1>();
    case 2: return grouped_instance<F, T, 2>();
    case 4: return grouped_instance<F, T, 4>();
    default: return grouped_instance<F, T, 8>();
  }
}
template <typename T>
GroupedFn grouped_kernel(Format f, int n_tiles) {
  return f == Format::kNVFP4 ? grouped_kernel<Format::kNVFP4, T>(n_tiles) : grouped_kernel<Format::kMXFP4, T>(n_tiles);
}
GroupedFn grouped_kernel(Format f, DType act, int n_tiles) {
  return act == DType::kF16 ? grouped_kernel<__half>(f, n_tiles) : grouped_kernel<__nv_bfloat16>(f, n_tiles);
}
template <typename T>
GroupedFn grouped_cluster_kernel(Format f) {
  constexpr size_t i = size_t(grouped_cluster_index());
  return f == Format::kNVFP4 ? detail::decode_kernel_of<Format::kNVFP4, T, i, true>()
                             : detail::decode_kernel_of<Format::kMXFP4, T, i, true>();
}
GroupedFn grouped_cluster_kernel(Format f, DType act) {
  return act == DType::kF16 ? grouped_cluster_kernel<__half>(f) : grouped_cluster_kernel<__nv_bfloat16>(f);
}
// The grouped kernels' token tiles (of 8 rows: 1, 2, 4 or 8) that cover `rows` rows.
int n_tiles_covering(double rows) { return rows <= 8 ? 1 : rows <= 16 ? 2 : rows <= 32 ? 4 : 8; }
// BF16 experts: a pass of up to kMoEBF16PassTokens tokens.
int bf16_n_tiles(int64_t tokens) { return n_tiles_covering(double(std::min<int64_t>(tokens, kMoEBF16PassTokens))); }

// FP4 experts on the decode path: token tiles covering a typical expert's rows of a pass, the mean plus
// two standard deviations of uniform routing (experts with more rows take more schedule entries).
int fp4_decode_n_tiles(int pairs, int max_active) {
  const double mean = double(pairs) / max_active;
  return n_tiles_covering(mean + 2.0 * std::sqrt(mean) + 1.0);
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// One grouped GEMM's launch: the dense plan of its config (layout, row groups, shared memory), the grouped
// kernel, and a grid sized for the most experts a pass can touch; cluster > 1: in cluster mode.
struct GroupedPlan {
  detail::DecodePlan dense;
  GroupedFn fn = nullptr;
  int grid = 0;
  int sms = 0;
  int cluster = 0;
};

// Default-on switches for same-build A/B runs (detail::env_not_zero): the environment variable set to 0
// turns one off, and a detail:: setter (tests) overrides the environment (forced >= 0).
using detail::env_not_zero;
// The grouped cluster mode (plan_grouped): FP4KIT_MOE_CLUSTERS=0 (stream-K only), detail::set_moe_clusters.
int g_clusters = -1;  // -1: the environment decides
bool moe_clusters() {
  static const bool env = env_not_zero("FP4KIT_MOE_CLUSTERS");
  return g_clusters < 0 ? env : g_clusters != 0;
}
// One-token passes without the align launch (MoEPlan::one_token): FP4KIT_MOE_ONE_TOKEN=0,
// detail::set_moe_one_token.
int g_one_token = -1;
bool moe_one_token() {
  static const bool env = env_not_zero("FP4KIT_MOE_ONE_TOKEN");
  return g_one_token < 0 ? env : g_one_token != 0;
}

// fuse_act: gate_up with interleaved gate/up rows (its cluster reduction can apply the activation).
Status plan_grouped(const ExpertWeights& w, DType act, int max_active, int n_tiles, bool fuse_act, GroupedPlan* out) {
  GroupedPlan p;
  const PackedWeight pw{w.format, w.n, w.k, nullptr};
  FP4KIT_RETURN_IF_ERROR(
      detail::make_plan(8 * n_tiles, pw, act, kKernelConfigs[grouped_index(n_tiles)].id, &p.dense));
  p.dense.smem_bytes = detail::launch_smem_bytes(kKernelConfigs[grouped_index(n_tiles)], /*grouped=*/true);
  p.fn = grouped_kernel(w.format, act, n_tiles);
  int per_sm = 0;
  FP4KIT_RETURN_IF_ERROR(detail::resident_per_sm(reinterpret_cast<const void*>(p.fn), p.dense.threads,
                                                 p.dense.smem_bytes, nullptr, &p.sms, &per_sm));
  const int64_t max_units = int64_t(max_active) * p.dense.units;
  p.grid = int(std::max<int64_t>(1, std::min<int64_t>(max_units, int64_t(per_sm) * p.sms)));
  if (n_tiles == 1 && moe_clusters()) {
    // Cluster mode where every row group the schedule can hold gets a cluster of S >= 2 CTAs within one
    // wave, each CTA two or three K slices and no more than the balanced stream-K ranges would give it:
    // the same cut (ceil(slices / S) slices per CTA), the split reduced through distributed shared memory
    // instead of the global fixup; and, unless the reduction also applies the activation (gate_up with
    // interleaved rows), the clusters fill at most 4/5 of the wave. Same-run A/Bs (docs/moe-notes.md):
    // gpt-oss at T = 1 (gate_up 360 CTAs in pairs with the activation, down 276 in threes: 70% of the wave)
    // 5-6% faster than stream-K; its down at T = 2 (368 CTAs in pairs, 93%) 2-3.5% slower; Qwen3-30B-A3B's
    // gate_up at T = 2 (384 in pairs) even; Mixtral's down (5 slices per CTA) 5-7% slower.
    const GroupedFn fn = grouped_cluster_kernel(w.format, act);
    int per_sm_c = 0, max_cluster = 0;
    FP4KIT_RETURN_IF_ERROR(detail::resident_per_sm(reinterpret_cast<const void*>(fn), p.dense.threads,
                                                   p.dense.smem_bytes, nullptr, nullptr, &per_sm_c, &max_cluster));
    const int64_t rgs = int64_t(max_active) * p.dense.row_groups, km = p.dense.layout.k_macros;
    const int64_t resident_c = int64_t(per_sm_c) * p.sms;
    const int64_t s_max = std::min<int64_t>({resident_c / rgs, max_cluster, km});
    constexpr int64_t kMaxSlicesPerCta = 3;
    const int64_t per_cta = s_max >= 1 ? (km + s_max - 1) / s_max : km;
    const int64_t resident = int64_t(per_sm) * p.sms, stream_k_share = (max_units + resident - 1) / resident;
    const int64_t ctas = rgs * ((km + per_cta - 1) / per_cta);
    // The cluster code (and the one-token pass) is sm_90 only: a build whose image for this device is
    // compute_80 code JIT-compiled for Hopper has it compiled out, so it keeps stream-K.
    if (s_max >= 2 && per_cta >= 2 && per_cta <= std::min<int64_t>(kMaxSlicesPerCta, stream_k_share) &&
        (fuse_act || 5 * ctas <= 4 * resident_c) && detail::sm90_code_here(reinterpret_cast<const void*>(fn))) {
      p.cluster = int((km + per_cta - 1) / per_cta);
      p.grid = int(ctas);
      p.fn = fn;
    }
  }
  *out = p;
  return Status::Ok();
}

// BF16 experts: the grouped BF16 GEMV for the pass's token tiles, grid = resident CTAs (at most one per
// tile of the most experts a pass can touch).
using Bf16Fn = void (*)(kernels::Bf16GroupedParams);

Bf16Fn bf16_kernel(int n_tiles) {
  switch (n_tiles) {
    case 1: return kernels::moe_bf16_gemm_kernel<1>;
    case 2: return kernels::moe_bf16_gemm_kernel<2>;
    case 4: return kernels::moe_bf16_gemm_kernel<4>;
    default: return kernels::moe_bf16_gemm_kernel<8>;
  }
}

struct Bf16Plan {
  Bf16Fn fn = nullptr;
  int grid = 0;
  int sms = 0;
  int split = 1;  // warps per tile (moe_bf16_gemm.cuh)
  int smem = 0;   // dynamic shared memory (split > 1)
};

// The GEMV's warps per tile can be forced for same-build A/B runs and tests: FP4KIT_MOE_BF16_SPLIT=S (both
// GEMMs) or G,D (gate_up, down), each 1, 2, 4 or 8; or detail::set_moe_bf16_split (0: the rule below).
int g_bf16_split = -1;  // -1: the environment decides
int moe_bf16_split_forced(bool down) {
  static const std::pair<int, int> env = [] {
    const char* v = std::getenv("FP4KIT_MOE_BF16_SPLIT");
    auto ok = [](int s) { return s == 1 || s == 2 || s == 4 || s == 8 ? s : 0; };
    if (!v) return std::pair<int, int>(0, 0);
    const char* comma = std::strchr(v, ',');
    const int g = ok(std::atoi(v));
    return std::pair<int, int>(g, comma ? ok(std::atoi(comma + 1)) : g);
  }();
  return g_bf16_split >= 0 ? g_bf16_split : down ? env.second : env.first;
}

// Warps per tile, from a model of one SM's share of the tiles (fitted on the H200 to a sweep of 1, 2 and 4
// warps per tile for gate_up and down apart, gpt-oss-120b, Qwen3-30B-A3B and Mixtral-8x7B at T = 1, 2 and
// 4; docs/moe-notes.md). The busiest SM holds n = ceil(tiles / SMs) tiles in q = (its warps) / S groups,
// so it runs ceil(n / q) rounds; a round of w streaming warps moves w tile_bytes / S bytes, but fewer than
// kBf16SaturatingWarps warps leave HBM latency-bound at that many warps' time (each keeps a ring of ~7 KB
// in flight), and each round pays a start and a reduction (kBf16RoundBytes of streaming). The least cost
// wins, ties to fewer warps per tile. gpt-oss-120b at T = 1 (1440 gate_up, 720 down tiles) takes 4 and 2.
constexpr int kBf16SaturatingWarps = 12;
constexpr double kBf16RoundBytes = 32e3;  // ~1 us of one SM's share of HBM
double bf16_split_cost(int64_t tiles, int sms, int warps_per_sm, double tile_bytes, int split) {
  const int64_t n = (tiles + sms - 1) / sms, q = std::max(1, warps_per_sm / split);
  double warp_rounds = 0;
  int64_t rounds = 0;
  for (int64_t left = n; left > 0; left -= q, ++rounds)
    warp_rounds += double(std::max<int64_t>(std::min(left, q) * split, kBf16SaturatingWarps));
  return tile_bytes / split * warp_rounds + kBf16RoundBytes * double(rounds);
}
int bf16_split_rule(int64_t max_tiles, int sms, int warps_per_sm, int64_t k, int k_steps) {
  const double tile_bytes = 16.0 * double(k) * 2.0;
  int best = 1;
  double best_cost = bf16_split_cost(max_tiles, sms, warps_per_sm, tile_bytes, 1);
  for (int s = 2; s <= kernels::kBf16Warps && s <= k_steps; s *= 2) {
    const double c = bf16_split_cost(max_tiles, sms, warps_per_sm, tile_bytes, s);
    if (c < best_cost) best = s, best_cost = c;
  }
  return best;
}

Status plan_bf16(int max_active, int64_t n, int64_t k, int n_tiles, bool down, Bf16Plan* out) {
  Bf16Plan p;
  p.fn = bf16_kernel(n_tiles);
  const int split_smem = kernels::bf16_split_smem(n_tiles);
  int per_sm = 0;
  FP4KIT_RETURN_IF_ERROR(detail::resident_per_sm(reinterpret_cast<const void*>(p.fn), kernels::kBf16Warps * 32,
                                                 split_smem, nullptr, &p.sms, &per_sm));
  const int64_t max_tiles = int64_t(max_active) * ((n + 15) / 16);
  p.grid = int(std::max<int64_t>(1, std::min<int64_t>(max_tiles, int64_t(per_sm) * p.sms)));
  const int k_steps = int((k + 31) / 32);
  const int forced = moe_bf16_split_forced(down);
  p.split = forced ? forced : bf16_split_rule(max_tiles, p.sms, per_sm * kernels::kBf16Warps, k, k_steps);
  while (p.split > 1 && p.split > k_steps) p.split /= 2;  // every warp of a group has a K step
  p.smem = p.split > 1 ? split_smem : 0;
  *out = p;
  return Status::Ok();
}

// Workspace layout for one pass of up to pass_tokens tokens (reused by every pass, stream-ordered).
struct MoEPlan {
  int pairs = 0, max_active = 0;
  bool bf16 = false;
  bool tc = false;     // the tensor-core path (FP4 or, with bf16, BF16 experts)
  bool wgmma = false;  // ... through a wgmma kernel (sm_90a; FP4: prefill_gemm_sm90.cuh, BF16 experts:
                       // moe_bf16_wgmma.cuh), else mma.sync
  // X and the activations in natural order (mma.sync kernels, and BF16 experts' kernels), else lane order
  // (the FP4 wgmma kernel).
  bool natural() const { return tc && (bf16 || !wgmma); }
  // The dtype of the intermediates h, a and o (and of the tensor-core GEMMs' X): the activations' with FP4
  // experts, BF16 with BF16 experts. Where it is not the activations' (BF16 experts, FP16 activations:
  // split_x), gate_up reads each x as two BF16 terms (hi + lo, exact; the gather writes them,
  // prefill::PrefillParams::x_split) and the combine writes FP16.
  DType mid = DType::kBF16;
  bool split_x = false;
  GroupedPlan gu, dn;  // FP4 experts, decode path
  detail::GroupedPrefillPlan tgu, tdn;  // tensor-core path (FP4 or BF16 experts)
  Bf16Plan bgu, bdn;   // BF16 experts
  int sms = 0;
  bool pdl = false;  // launches use programmatic dependent launch (launch.h)
  bool early_w = false;  // BF16 experts' wgmma GEMMs: weights before the wait (GroupedPrefillArgs::early_w)
  bool early_trigger = false;  // ... and their dependents launched after it (GroupedPrefillArgs::early_trigger)
  bool early_down = false;     // FP4 one-token pass: down's ids and first weights before its wait
                               // (kernels::OneToken::early_down)
  int block_rows = 0;      // rows per schedule entry: the grouped GEMMs' token tiles (0: one per expert)
  int max_entries = 0;     // schedule entries a pass can need
  bool act_in_gate_up = false;  // FP4 decode path: gate_up's cluster reduction applies the activation
  bool one_token = false;  // T = 1, FP4 decode path in cluster mode or BF16 experts' wgmma kernel: no align
                           // launch (kernels::OneToken; moe_one_token)
  int64_t pass_tokens() const { return tc ? kMoETensorCorePassTokens : bf16 ? kMoEBF16PassTokens : kMoEDecodePassTokens; }
  int64_t a_len = 0, x_len = 0;  // row lengths of the activations and (tensor-core path) the gathered X
  size_t ints_off = 0, h_off = 0, a_off = 0, o_off = 0, counters_off = 0, partials_off = 0, total = 0;
  size_t route_ids_off = 0, route_w_off = 0;  // routing from logits: ids and weights of every token
  size_t counters_bytes = 0;
};

// The tensor-core path's kernel can be forced to the mma.sync one on Hopper too (tests, A/B runs):
// FP4KIT_MOE_MMA=1, or detail::set_moe_mma.
int g_mma = -1;  // -1: the environment decides
bool moe_mma_forced() {
  static const bool env = [] {
    const char* v = std::getenv("FP4KIT_MOE_MMA");
    return v != nullptr && std::string(v) == "1";
  }();
  return g_mma < 0 ? env : g_mma != 0;
}

// BF16 experts' wgmma GEMMs with their first weights before griddepcontrol.wait (MoEPlan::early_w):
// FP4KIT_MOE_BF16_EARLY_W=0 turns it off.
bool moe_bf16_early_w() {
  static const bool env = env_not_zero("FP4KIT_MOE_BF16_EARLY_W");
  return env;
}

// FP4 one-token passes with down's first weights before its wait (MoEPlan::early_down):
// FP4KIT_MOE_EARLY_DOWN=0 turns it off.
bool moe_early_down() {
  static const bool env = env_not_zero("FP4KIT_MOE_EARLY_DOWN");
  return env;
}

// BF16 experts' wgmma GEMMs letting their dependents launch after their wait (MoEPlan::early_trigger):
// FP4KIT_MOE_BF16_EARLY_TRIGGER=0 turns it off.
bool moe_bf16_early_trigger() {
  static const bool env = env_not_zero("FP4KIT_MOE_BF16_EARLY_TRIGGER");
  return env;
}

// Whether the experts take the tensor-core path (enough tokens, or forced), and through which kernel family:
// wgmma where this build runs it on this device (sm_90a), else mma.sync (any sm_80+ device).
Status choose_tensor_core(const MoEArgs& a, bool* tc, bool* wgmma_out) {
  *tc = false;
  *wgmma_out = false;
  const bool fp4 = a.gate_up.kind == ExpertKind::kFP4;
  const bool wgmma = !moe_mma_forced() && detail::prefill_runs_here();  // the tensor-core kernels here
  if (!fp4 && a.act == DType::kF16) {
    // BF16 experts with FP16 activations: the tensor-core kernels' split X (the GEMV reads BF16 X only).
    if (a.path == MoEPath::kDecode)
      return Status::Invalid("path: BF16 experts with float16 activations run on the tensor-core path only "
                             "(MoEPath::kAuto or kTensorCore; got kDecode)");
    *tc = true;
    *wgmma_out = wgmma;
    return Status::Ok();
  }
  if (a.path == MoEPath::kDecode) return Status::Ok();
  if (a.path == MoEPath::kTensorCore) {
    *tc = true;
  } else if (!fp4 && wgmma) {
    // BF16 experts where their wgmma kernel runs: the tensor cores at every T. Both paths forced on five
    // models (docs/moe-notes.md): the wgmma kernel took 0.50-0.95x the GEMV's time at every point of T = 2-64
    // (gpt-oss-120b T = 2 114.6 against 134.6 us), and at T = 1 (see there).
    *tc = true;
  } else if (!fp4) {
    // BF16 experts elsewhere (mma.sync): the tensor cores past one pass of the GEMV (which re-reads every
    // touched expert's weights per 64 tokens) and where experts average 8 or more rows of the pass.
    // Measured, both paths on five models at T = 1-64 (docs/moe-notes.md): 8-16 rows per expert 16-41% faster
    // on the tensor cores (gpt-oss-20b, Mixtral at T = 64); with the GEMV's split tiles the GEMV is 2-26%
    // faster at T = 1-4 (gpt-oss-120b, Qwen3-30B-A3B, Mixtral-8x7B).
    const int pairs = int(std::min(a.tokens, kMoEBF16PassTokens)) * a.top_k;
    const int avg_rows = pairs / std::min(a.num_experts, pairs);
    *tc = a.tokens > kMoEBF16PassTokens || avg_rows >= 8;
  } else {
    // kAuto: the decode path while one pass holds the tokens and its token tiles for them stay narrow
    // (fp4kit/moe.h). The wgmma kernel from 16-token decode tiles (experts averaging ~3.3 or more rows):
    // both paths forced on five models, two rounds (bench/results/moe_paths_2d64da5/, docs/moe-notes.md):
    // at 4-8 rows per expert (16-token tiles) the wgmma path takes 0.85-0.92x the decode path's time with
    // MXFP4 and 0.91-1.00x with NVFP4, at 2-3 rows (8-token tiles) 1.08-1.23x; from 32-token tiles it was
    // 0.56-0.89x already (bench/results/moe_crossover_40be328/). The mma.sync kernel (devices without sm_90a
    // code; not measured at these points) from the widest tiles and kMoETensorCoreMinTokens.
    const int pairs = int(std::min(a.tokens, kMoEDecodePassTokens)) * a.top_k;
    const int n_tiles = fp4_decode_n_tiles(pairs, std::min(a.num_experts, pairs));
    const bool wide = wgmma ? n_tiles >= 2 : a.tokens >= kMoETensorCoreMinTokens && n_tiles == 8;
    *tc = fp4 && (a.tokens > kMoEDecodePassTokens || wide);
  }
  *wgmma_out = *tc && wgmma;
  return Status::Ok();
}

Status make_moe_plan(const MoEArgs& a, MoEPlan* out) {
  MoEPlan p;
  FP4KIT_RETURN_IF_ERROR(choose_tensor_core(a, &p.tc, &p.wgmma));
  p.bf16 = a.gate_up.kind == ExpertKind::kBF16;
  p.mid = p.bf16 ? DType::kBF16 : a.act;
  p.split_x = p.mid != a.act;
  const int64_t pass = std::min<int64_t>(a.tokens, p.pass_tokens());
  p.pairs = int(pass) * a.top_k;
  p.max_active = std::min(a.num_experts, p.pairs);
  p.max_entries = p.max_active;
  // PDL by default: the layer's launches follow each other, and each may become resident while the one
  // before drains (FP4 experts: gpt-oss-120b T = 1-16 0-5% faster, DeepSeek-V3 and Qwen3 up to 3%; BF16
  // experts on the tensor-core path: 0.978 geometric mean over five models at T = 1-2048, T = 1 3-13%
  // faster, no row slower than +0.2%). BF16 experts' GEMV measured 3-4% slower with it at T = 16
  // (docs/moe-notes.md): opt-in there.
  p.pdl = detail::pdl_enabled_here(!p.bf16 || p.tc);
  if (p.tc) {
    // Token tile (unless a.token_tile says): 256 rows where an expert has >= 192 of the pass on average,
    // 128 from 96, else 64. An expert's last tile runs narrower wgmmas when it holds few rows
    // (prefill_gemm_sm90.cuh), but still dequantises all its weights; every extra tile dequantises the
    // expert's weights again (from L2). Forced tiles at 128 and 256 rows per expert
    // (moe_tiles_*_a1ca1c2.json): 128-token tiles win at 128, 256-token tiles at 256 and above.
    // The mma.sync kernels have 64- and 128-token tiles; BF16 experts on mma.sync, gpt-oss-120b: 16 rows
    // per expert at T = 512 1.67 ms on 64-token tiles against 2.21 on 128.
    const int avg = p.pairs / p.max_active;
    if (!p.wgmma && a.token_tile == 256)
      return Status::Invalid(p.bf16 ? "token_tile: 256-token tiles need the wgmma kernel (sm_90a); BF16 experts' "
                                      "tensor-core path here runs the mma.sync kernel: 0, 64 or 128"
                                    : "token_tile: 256-token tiles need the wgmma kernel (sm_90a); the tensor-core path "
                                      "here runs the mma.sync kernel: 0, 64 or 128");
    // BF16 experts' wgmma kernel (no dequantisation: a tile's fixed part is its weight stream, not the
    // dequantising of it): 128-token tiles from 48 rows per expert. Every tile forced on five models at T =
    // 512-8192 (docs/moe-notes.md): at 64 rows 128-token tiles 13% faster than 64 (gpt-oss-120b and DeepSeek-V3
    // at T = 2048, gpt-oss-20b at T = 512); 64 ahead at 16-32 rows; 256 ahead from 256 rows.
    const int mid = p.bf16 && p.wgmma ? 48 : 96;
    const int bn = a.token_tile ? a.token_tile : avg >= 192 && p.wgmma ? 256 : avg >= mid ? 128 : 64;
    if (p.bf16) {
      FP4KIT_RETURN_IF_ERROR(detail::plan_grouped_bf16(a.gate_up.n, a.gate_up.k, bn, p.wgmma, &p.tgu));
      FP4KIT_RETURN_IF_ERROR(detail::plan_grouped_bf16(a.down.n, a.down.k, bn, p.wgmma, &p.tdn));
    } else {
      const KernelConfig& cfg = kKernelConfigs[p.wgmma ? prefill_index(bn / 8) : mma_index(bn / 8)];
      FP4KIT_RETURN_IF_ERROR(detail::plan_prefill_grouped(a.gate_up.format, a.act, a.gate_up.n, a.gate_up.k, cfg, &p.tgu));
      FP4KIT_RETURN_IF_ERROR(detail::plan_prefill_grouped(a.down.format, a.act, a.down.n, a.down.k, cfg, &p.tdn));
    }
    // The schedule's entries are the token tiles (the kernels read each tile's expert and rows from them),
    // and the grouped prefill grids cover max_entries of them: every routed expert's rows in whole tiles, at
    // most pairs / bn full tiles plus one partial per expert.
    p.block_rows = bn;
    p.max_entries = (p.pairs + bn - 1) / bn + p.max_active;
    p.sms = p.tgu.sms;
    // BF16 experts' wgmma GEMMs at 64-token tiles read the schedule and request their first ring of weights
    // before their wait (GroupedPrefillArgs::early_w; FP4KIT_MOE_BF16_EARLY_W=0 turns it off). Same-run
    // A/B, five models, T = 1-2048 (docs/moe-notes.md): 2-4% faster at T <= 64; at 128-token tiles (T =
    // 2048) +0.7-2.9%, inside the rounds' spread but all one way, so those keep the wait first.
    p.early_w = p.pdl && p.bf16 && p.wgmma && bn == 64 && moe_bf16_early_w();
    // With early_w, gate_up and down also let their dependents launch once their wait has returned (the
    // activation kernel, then down, which reads the schedule early, onto the SMs gate_up's last wave leaves
    // idle). Same-run A/B, five models, T = 1-64 (docs/moe-notes.md): 0.5-5% faster where down's K is at
    // most 2880; Mixtral-8x7B at T = 1 (down: K = 14336, 64 tiles of 3.7 MB, one CTA each) 3.4% slower in
    // both rounds, so long-K downs keep the trigger at the end.
    p.early_trigger = p.early_w && a.down.k <= 4096 && moe_bf16_early_trigger();
    // One token (BF16 activations): the pairs are the schedule, as on the FP4 decode path: no align launch,
    // and gate_up reads the token's row of x itself (no gather launch).
    p.one_token = p.bf16 && p.wgmma && a.tokens == 1 && !p.split_x && moe_one_token();
  } else if (p.bf16) {
    const int n_tiles = bf16_n_tiles(a.tokens);
    FP4KIT_RETURN_IF_ERROR(plan_bf16(p.max_active, a.gate_up.n, a.gate_up.k, n_tiles, false, &p.bgu));
    FP4KIT_RETURN_IF_ERROR(plan_bf16(p.max_active, a.down.n, a.down.k, n_tiles, true, &p.bdn));
    p.sms = p.bgu.sms;
  } else {
    const int nt = fp4_decode_n_tiles(p.pairs, p.max_active);
    p.block_rows = 8 * nt;
    // An expert with r rows takes 1 + (r - 1) / block_rows entries: at most max_active + (pairs -
    // max_active) / block_rows in all (the most when every expert the pass can touch is touched).
    p.max_entries = p.max_active + (p.pairs - p.max_active) / p.block_rows;
    FP4KIT_RETURN_IF_ERROR(
        plan_grouped(a.gate_up, a.act, p.max_entries, nt, a.layout == GateUpLayout::kInterleaved, &p.gu));
    FP4KIT_RETURN_IF_ERROR(plan_grouped(a.down, a.act, p.max_entries, nt, false, &p.dn));
    p.sms = p.gu.sms;
    // Interleaved gate/up rows put each pair in one row group, so a gate_up in cluster mode writes the
    // activations itself and the activation launch goes.
    p.act_in_gate_up = p.gu.cluster > 0 && a.layout == GateUpLayout::kInterleaved;
    // One token: its top-k ids name distinct experts (a duplicate is a bad id), so the pairs are the
    // schedule and the align launch goes, where both GEMMs run in cluster mode (the stream-K kernels keep
    // the align schedule: the one-token branch measured 1-2% slower at T = 2-16 in their entry code);
    // gate_up writes what the later launches read from the align step (kernels::OneToken).
    p.one_token = a.tokens == 1 && p.gu.cluster > 0 && p.dn.cluster > 0 && moe_one_token();
    // In the one-token pass gate_up lets down launch only after its own wait, so down reads the ids and
    // requests its first weights before its wait (kernels::OneToken): gpt-oss-120b and -20b at T = 1
    // 3.5-4.4% faster, same-run A/B (docs/moe-notes.md).
    p.early_down = p.one_token && p.pdl && moe_early_down();
  }
  const size_t ints = align_ints(a.num_experts, p.pairs);
  size_t off = 0;
  p.ints_off = off;
  off = align256(off + ints * sizeof(int));
  p.h_off = off;
  const size_t eb = size_t(dtype_bytes(p.mid));  // h, a and o
  off = align256(off + size_t(p.pairs) * 2 * a.inter * eb);
  // Tensor-core path: the activations (down's X) and the gathered X (in o, dead until down writes it) are
  // rows of k_pad in lane order (wgmma), or rows of I and H in natural order (mma.sync).
  p.a_len = p.tc && !p.natural() ? p.tdn.layout.k_pad : a.inter;
  p.x_len = !p.tc ? 0 : p.split_x ? detail::split_x_row(a.hidden) : p.natural() ? a.hidden : p.tgu.layout.k_pad;
  p.a_off = off;
  off = align256(off + size_t(p.pairs) * p.a_len * eb);
  p.o_off = off;
  off = align256(off + size_t(p.pairs) * std::max<int64_t>(a.hidden, p.x_len) * eb);
  p.counters_off = off;
  if (!p.bf16 && !p.tc) {  // the BF16 GEMV and the grouped prefill GEMM have no split-K
    p.counters_bytes =
        align256(size_t(p.max_entries) * std::max(p.gu.dense.row_groups, p.dn.dense.row_groups) * sizeof(int));
  }
  off += p.counters_bytes;
  p.partials_off = off;
  if (!p.bf16 && !p.tc) {
    off += std::max(size_t(p.gu.grid) * 2 * detail::partial_slot_bytes(*p.gu.dense.cfg),
                    size_t(p.dn.grid) * 2 * detail::partial_slot_bytes(*p.dn.dense.cfg));
  }
  // Routing from logits: ids and weights of every token (all passes), written before the first pass.
  off = align256(off);
  if (a.routing.mode != RoutingMode::kNone) {
    const size_t slots = align256(size_t(a.tokens) * size_t(a.top_k) * 4);
    p.route_ids_off = off;
    p.route_w_off = off + slots;
    off += 2 * slots;
  }
  p.total = align256(off);
  *out = p;
  return Status::Ok();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool bf16_kind(const ExpertWeights& w) { return w.kind == ExpertKind::kBF16; }

Status check_expert_shape(const ExpertWeights& w, const std::string& nm, int64_t n, int64_t k,
                          const ExpertWeights& first) {
  if (w.kind != ExpertKind::kFP4 && w.kind != ExpertKind::kBF16)
    return Status::Invalid(nm + ".kind: must be ExpertKind::kFP4 or ExpertKind::kBF16 (got " +
                           std::to_string(int(w.kind)) + ")");
  if (w.kind != first.kind)
    return Status::Invalid(nm + ".kind: both expert sets must be of the same kind (gate_up is " +
                           (bf16_kind(first) ? "kBF16" : "kFP4") + ")");
  if (!bf16_kind(w) && w.format != first.format)
    return Status::Invalid(nm + ".format: both expert sets must have the same format");
  if (w.n != n || w.k != k)
    return Status::Invalid(nm + ": shape must be [" + str(n) + ", " + str(k) + "] per expert (got [" + str(w.n) +
                           ", " + str(w.k) + "])");
  if (bf16_kind(w)) return Status::Ok();  // k is H or I: a multiple of 8 (16-byte rows), checked with them
  return check_shape(w.format, w.n, w.k);
}

Status check_expert_data(const ExpertWeights& w, const std::string& nm) {
  if (bf16_kind(w)) {
    if (!w.data) return Status::Invalid(nm + ".data: must not be null (the experts' bf16 [E, n, k] weights)");
    if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
      return Status::Invalid(nm + ".data: BF16 experts must be 16-byte aligned");
    const size_t need = size_t(w.n) * size_t(w.k) * 2;
    if (w.stride % 16 != 0 || w.stride < need)
      return Status::Invalid(nm + ".stride: BF16 experts need a multiple of 16 bytes >= n * k * 2 = " +
                             std::to_string(need) + " (one row-major [" + str(w.n) + ", " + str(w.k) +
                             "] bf16 matrix; got " + std::to_string(w.stride) + ")");
    if (w.bias && reinterpret_cast<uintptr_t>(w.bias) % 2 != 0)
      return Status::Invalid(nm + ".bias: must be 2-byte aligned");
    return Status::Ok();
  }
  if (!w.data) return Status::Invalid(nm + ".data: must not be null (stack the prepacked experts first)");
  if (reinterpret_cast<uintptr_t>(w.data) % 256 != 0) return Status::Invalid(nm + ".data: must be 256-byte aligned");
  PackedLayout l;
  FP4KIT_RETURN_IF_ERROR(packed_layout(w.format, w.n, w.k, &l));
  if (w.stride % 256 != 0 || w.stride < l.total_bytes)
    return Status::Invalid(nm + ".stride: must be a multiple of 256 and >= " + std::to_string(l.total_bytes) +
                           " (the prepacked size; got " + std::to_string(w.stride) + ")");
  if (w.bias && reinterpret_cast<uintptr_t>(w.bias) % 2 != 0) return Status::Invalid(nm + ".bias: must be 2-byte aligned");
  return Status::Ok();
}

// The rules on shapes and options (all the workspace size depends on), then the plan.
Status check_shapes_and_plan(const MoEArgs& a, MoEPlan* plan) {
  if (a.tokens < 1) return Status::Invalid("tokens: must be >= 1 (got " + str(a.tokens) + ")");
  if (a.tokens > INT32_MAX / 64) return Status::Invalid("tokens: must be < 2^25 (got " + str(a.tokens) + ")");
  if (a.num_experts < 1 || a.num_experts > 4096)
    return Status::Invalid("num_experts: must be in [1, 4096] (got " + std::to_string(a.num_experts) + ")");
  if (a.top_k < 1 || a.top_k > a.num_experts)
    return Status::Invalid("top_k: must be in [1, num_experts = " + std::to_string(a.num_experts) + "] (got " +
                           std::to_string(a.top_k) + ")");
  if (a.act != DType::kBF16 && a.act != DType::kF16)
    return Status::Invalid(std::string("act: must be bfloat16 or float16 (got ") + dtype_name(a.act) + ")");
  if (a.hidden < 1 || a.inter < 1)
    return Status::Invalid("hidden, inter: must be >= 1 (got " + str(a.hidden) + ", " + str(a.inter) + ")");
  if (a.hidden % 8 != 0 || a.inter % 8 != 0)
    return Status::Invalid("hidden, inter: must be multiples of 8 (16-byte rows; got " + str(a.hidden) + ", " +
                           str(a.inter) + ")");
  FP4KIT_RETURN_IF_ERROR(check_expert_shape(a.gate_up, "gate_up", 2 * a.inter, a.hidden, a.gate_up));
  FP4KIT_RETURN_IF_ERROR(check_expert_shape(a.down, "down", a.hidden, a.inter, a.gate_up));
  if (a.activation != MoEActivation::kSiluAndMul && a.activation != MoEActivation::kSwigluOAI)
    return Status::Invalid("activation: must be silu_and_mul or swiglu_oai");
  if (a.layout != GateUpLayout::kConcatenated && a.layout != GateUpLayout::kInterleaved)
    return Status::Invalid("layout: must be concatenated or interleaved");
  if (!(a.limit > 0.0f) || !std::isfinite(a.alpha)) return Status::Invalid("alpha, limit: must be finite, limit > 0");
  if (a.path != MoEPath::kAuto && a.path != MoEPath::kDecode && a.path != MoEPath::kTensorCore)
    return Status::Invalid("path: must be MoEPath::kAuto, kDecode or kTensorCore (got " + std::to_string(int(a.path)) + ")");
  if (a.token_tile != 0 && a.token_tile != 64 && a.token_tile != 128 && a.token_tile != 256)
    return Status::Invalid("token_tile: must be 0 (chosen), 64, 128 or 256 (got " + std::to_string(a.token_tile) + ")");
  if (a.routing.mode != RoutingMode::kNone)
    FP4KIT_RETURN_IF_ERROR(detail::check_routing_shape(a.routing.mode, a.num_experts, a.top_k, "routing"));
  return make_moe_plan(a, plan);
}

// Every rule; on success `plan` is the launch plan (fused_moe validates and plans once).
Status validate(const MoEArgs& a, MoEPlan* plan) {
  FP4KIT_RETURN_IF_ERROR(check_shapes_and_plan(a, plan));
  FP4KIT_RETURN_IF_ERROR(check_expert_data(a.gate_up, "gate_up"));
  FP4KIT_RETURN_IF_ERROR(check_expert_data(a.down, "down"));
  if (!a.x || !aligned16(a.x)) return Status::Invalid("x: must be a non-null, 16-byte aligned pointer");
  if (!a.y || !aligned16(a.y)) return Status::Invalid("y: must be a non-null, 16-byte aligned pointer");
  if (a.routing.mode == RoutingMode::kNone) {
    if (!a.topk_ids) return Status::Invalid("topk_ids: must not be null (or route from logits: routing.mode)");
    if (!a.topk_weights) return Status::Invalid("topk_weights: must not be null (or route from logits: routing.mode)");
  } else {
    FP4KIT_RETURN_IF_ERROR(detail::check_routing(a.routing, a.tokens, a.num_experts, a.top_k, "routing"));
    if (a.topk_ids || a.topk_weights)
      return Status::Invalid("topk_ids, topk_weights: must be null when routing from logits (routing.mode is set; "
                             "route() gives the ids and weights)");
  }
  const char* xb = static_cast<const char*>(a.x);
  const char* yb = static_cast<const char*>(a.y);
  const int64_t bytes = a.tokens * a.hidden * 2;
  if (xb < yb + bytes && yb < xb + bytes) return Status::Invalid("y: must not overlap x");
  if (!a.workspace || !aligned16(a.workspace))
    return Status::Invalid("workspace: must be a non-null, 16-byte aligned pointer (" + std::to_string(plan->total) +
                           " bytes, see moe_workspace_bytes)");
  if (a.workspace_bytes < plan->total)
    return Status::Invalid("workspace_bytes: must be >= " + std::to_string(plan->total) + " (got " +
                           std::to_string(a.workspace_bytes) + ")");
  // The routing writes into the workspace while it reads the logits.
  if (a.routing.mode != RoutingMode::kNone &&
      detail::overlaps(a.routing.logits, detail::logits_bytes(a.routing, a.tokens, a.num_experts), a.workspace,
                       plan->total))
    return Status::Invalid("routing.logits: must not overlap the workspace");
  return Status::Ok();
}

}  // namespace

Status moe_validate(const MoEArgs& a) {
  MoEPlan plan;
  return validate(a, &plan);
}

Status moe_workspace_bytes(const MoEArgs& a, size_t* bytes) {
  if (!bytes) return Status::Invalid("bytes: must not be null");
  MoEPlan plan;
  FP4KIT_RETURN_IF_ERROR(check_shapes_and_plan(a, &plan));
  *bytes = plan.total;
  return Status::Ok();
}

namespace detail {
void set_moe_clusters(int on) { g_clusters = on; }
void set_moe_one_token(int on) { g_one_token = on; }
void set_moe_mma(int on) { g_mma = on; }
void set_moe_bf16_split(int split) { g_bf16_split = split; }

int moe_align_grid(int tokens, int top_k) {
  return int64_t(tokens) * top_k >= kernels::kAlignSplitMinPairs ? kernels::align_ctas(tokens) : 0;
}

Status moe_gemm_kernel(const MoEArgs& a, const char** kernel) {
  if (!kernel) return Status::Invalid("kernel: must not be null");
  MoEPlan plan;
  FP4KIT_RETURN_IF_ERROR(check_shapes_and_plan(a, &plan));
  *kernel = plan.tc ? (plan.bf16 ? (plan.wgmma ? "bf16 wgmma" : "bf16 mma.sync") : plan.wgmma ? "wgmma" : "mma.sync")
                    : plan.bf16 ? "bf16 gemv" : "decode";
  return Status::Ok();
}

Status moe_decode_clusters(const MoEArgs& a, int* gate_up, int* down, bool* act_in_gate_up, bool* one_token) {
  if (!gate_up || !down) return Status::Invalid("gate_up, down: must not be null");
  MoEPlan plan;
  FP4KIT_RETURN_IF_ERROR(check_shapes_and_plan(a, &plan));
  const bool decode = !plan.tc && !plan.bf16;
  *gate_up = decode ? plan.gu.cluster : 0;
  *down = decode ? plan.dn.cluster : 0;
  if (act_in_gate_up) *act_in_gate_up = decode && plan.act_in_gate_up;
  if (one_token) *one_token = plan.one_token;
  return Status::Ok();
}
}  // namespace detail

Status moe_path(const MoEArgs& a, MoEPath* path) {
  if (!path) return Status::Invalid("path: must not be null");
  MoEPlan plan;
  FP4KIT_RETURN_IF_ERROR(check_shapes_and_plan(a, &plan));
  *path = plan.tc ? MoEPath::kTensorCore : MoEPath::kDecode;
  return Status::Ok();
}

Status fused_moe(const MoEArgs& a, cudaStream_t stream) {
  MoEPlan plan;
  FP4KIT_RETURN_IF_ERROR(validate(a, &plan));
  uint8_t* ws = static_cast<uint8_t*>(a.workspace);
  const int E = a.num_experts;
  const AlignBufs b = align_bufs(reinterpret_cast<int*>(ws + plan.ints_off), E, plan.pairs);
  void* h = ws + plan.h_off;  // intermediates of the activation dtype
  void* act = ws + plan.a_off;
  void* o = ws + plan.o_off;
  int* counters = reinterpret_cast<int*>(ws + plan.counters_off);
  float* partials = reinterpret_cast<float*>(ws + plan.partials_off);
  // Routing from logits: every token's ids and weights into the workspace first; a call of one small pass
  // whose align step is one CTA routes in that CTA (moe_route_align.cuh: one launch fewer).
  const int32_t* topk_ids = a.topk_ids;
  const float* topk_weights = a.topk_weights;
  const bool routed_here = a.routing.mode != RoutingMode::kNone;
  const int n_group = a.routing.mode == RoutingMode::kSigmoidGroupedTopK ? a.routing.n_group : 1;
  const bool route_in_align = routed_here && !plan.one_token && kernels::route_align_fits(a.tokens, E, n_group);
  int32_t* route_ids = nullptr;
  float* route_w = nullptr;
  if (routed_here) {
    route_ids = reinterpret_cast<int32_t*>(ws + plan.route_ids_off);
    route_w = reinterpret_cast<float*>(ws + plan.route_w_off);
    if (!route_in_align) detail::launch_route(a.routing, a.tokens, E, a.top_k, route_ids, route_w, stream, plan.pdl);
    topk_ids = route_ids;
    topk_weights = route_w;
  }

  auto launch_grouped = [&](const GroupedPlan& gp, const ExpertWeights& w, const void* x, const int* x_rows, void* y,
                            const kernels::OneToken& one, void* act_out = nullptr) {
    const PackedLayout& l = gp.dense.layout;
    kernels::DecodeParams p = kernels::shape_params(l, gp.dense.row_groups);
    p.x = x;
    p.y = y;
    p.x_rows = x_rows;
    p.units = 0;  // grouped: n_active * row_groups * k_macros, read on the device
    p.counters = counters;
    p.partials = partials;
    GroupedSchedule& s = p.grouped;
    s.n_active = b.n_active;
    s.active = b.active;
    s.block_row = b.block_row;
    s.experts = kernels::expert_stack(w.data, w.stride, w.bias, l);
    s.act_out = act_out;
    s.act = a.activation;
    s.alpha = a.alpha;
    s.limit = a.limit;
    s.one = one;
    p.pdl = plan.pdl;
    detail::launch_kernel_cluster(gp.fn, dim3(gp.grid), dim3(gp.dense.threads), size_t(gp.dense.smem_bytes), stream,
                                  plan.pdl, gp.cluster, p);
  };
  auto launch_bf16 = [&](const Bf16Plan& bp, const ExpertWeights& w, const void* x, const int* x_rows, void* y) {
    kernels::Bf16GroupedParams p{};
    p.x = x;
    p.x_rows = x_rows;
    p.y = y;
    p.n_active = b.n_active;
    p.active = b.active;
    p.offset = b.offset;
    p.base = static_cast<const uint8_t*>(w.data);
    p.stride = w.stride;
    p.bias = w.bias;
    p.n = int(w.n);
    p.k = int(w.k);
    p.row_tiles = int((w.n + 15) / 16);
    p.k_steps = int((w.k + 31) / 32);
    p.split = bp.split;
    detail::launch_kernel(bp.fn, dim3(bp.grid), dim3(kernels::kBf16Warps * 32), size_t(bp.smem), stream, plan.pdl, p);
  };
  // Element-wise kernels (gather, activation, combine): one 16-byte vector of a row per thread.
  using detail::kRowVectorThreads;
  auto ew_grid = [&](int64_t max_rows, int64_t row_len) {
    return detail::row_vector_grid(max_rows, row_len / 8, plan.sms);
  };
  const bool f16 = plan.mid == DType::kF16;  // the intermediates' dtype (the combine's Y: a.act)
  const int64_t eb = dtype_bytes(a.act);
  const bool lane_act = plan.tc && !plan.natural();  // activations in lane order: the FP4 wgmma down GEMM's X
  auto launch_activation = [&](int pairs) {
    const int* n_rows = b.offset + E;
    const int inter = int(a.inter), len = int(plan.a_len);
    const dim3 grid = ew_grid(pairs, len);
    if (f16)
      detail::launch_kernel(&moe_activation_kernel<__half>, grid, dim3(kRowVectorThreads), 0, stream, plan.pdl,
                            static_cast<const __half*>(h), static_cast<__half*>(act), n_rows, inter, len, lane_act,
                            a.down.format, a.activation, a.layout, a.alpha, a.limit);
    else
      detail::launch_kernel(&moe_activation_kernel<__nv_bfloat16>, grid, dim3(kRowVectorThreads), 0, stream, plan.pdl,
                            static_cast<const __nv_bfloat16*>(h), static_cast<__nv_bfloat16*>(act), n_rows, inter,
                            len, lane_act, a.down.format, a.activation, a.layout, a.alpha, a.limit);
  };
  auto launch_combine = [&](int64_t t0, int tokens, void* y) {
    const float* w = topk_weights + t0 * a.top_k;
    const int* rop = b.row_of_pair;
    const int hidden = int(a.hidden);
    const dim3 grid = ew_grid(tokens, hidden);
    if (f16)
      detail::launch_kernel(&moe_combine_kernel<__half>, grid, dim3(kRowVectorThreads), 0, stream, plan.pdl,
                            static_cast<const __half*>(o), rop, w, tokens, a.top_k, hidden, static_cast<__half*>(y));
    else if (plan.split_x)
      detail::launch_kernel(&moe_combine_kernel<__nv_bfloat16, __half>, grid, dim3(kRowVectorThreads), 0, stream,
                            plan.pdl, static_cast<const __nv_bfloat16*>(o), rop, w, tokens, a.top_k, hidden,
                            static_cast<__half*>(y));
    else
      detail::launch_kernel(&moe_combine_kernel<__nv_bfloat16>, grid, dim3(kRowVectorThreads), 0, stream, plan.pdl,
                            static_cast<const __nv_bfloat16*>(o), rop, w, tokens, a.top_k, hidden,
                            static_cast<__nv_bfloat16*>(y));
  };

  // Tensor-core path: one grouped prefill GEMM over the pass's `rows` sorted rows.
  auto launch_tc = [&](const detail::GroupedPrefillPlan& tp, const ExpertWeights& w, const void* x, int rows,
                       void* y, bool x_split, bool early_w, const kernels::OneToken& one) {
    detail::GroupedPrefillArgs g;
    g.x = x;
    g.y = y;
    g.rows = rows;
    g.n_tiles = b.n_active;
    g.tile_expert = b.active;
    g.tile_row = b.block_row;
    g.experts = E;
    g.max_tiles = plan.max_entries;
    g.base = w.data;
    g.stride = w.stride;
    g.bias = w.bias;
    g.act = plan.mid;
    g.pdl = plan.pdl;
    g.x_split = x_split;
    g.early_w = early_w;
    g.early_trigger = plan.early_trigger;
    g.one = one;
    return detail::launch_prefill_grouped(tp, g, stream);
  };

  for (int64_t t0 = 0; t0 < a.tokens; t0 += plan.pass_tokens()) {
    const int tokens = int(std::min<int64_t>(plan.pass_tokens(), a.tokens - t0));
    const int pairs = tokens * a.top_k;
    const void* x = static_cast<const uint8_t*>(a.x) + t0 * a.hidden * eb;
    void* y = static_cast<uint8_t*>(a.y) + t0 * a.hidden * eb;
    const int32_t* ids = topk_ids + t0 * a.top_k;
    const int n_counters = int(plan.counters_bytes / sizeof(int));
    // One-token pass: the entries are the pairs (gate_up reads the token's X row, down each pair's
    // activation row), and gate_up writes the rows and each pair's row.
    kernels::OneToken gu_one{}, dn_one{};
    if (plan.one_token) {  // no align launch
      gu_one = kernels::OneToken{ids, pairs, E, true, b.offset + E, b.row_of_pair, plan.early_down};
      dn_one = kernels::OneToken{ids, pairs, E, false, nullptr, nullptr, plan.early_down};
    } else if (route_in_align) {
      const kernels::RouteParams rp = kernels::route_params(a.routing, tokens, E, a.top_k, route_ids, route_w);
      const dim3 block(unsigned(32 * kernels::route_align_warps(tokens)));
      const size_t smem = kernels::route_align_smem_bytes(tokens, E, n_group);
      auto fn = a.routing.logits_dtype == DType::kBF16  ? kernels::route_align_kernel<__nv_bfloat16>(E)
                : a.routing.logits_dtype == DType::kF16 ? kernels::route_align_kernel<__half>(E)
                                                        : kernels::route_align_kernel<float>(E);
      detail::launch_kernel(fn, dim3(1), block, smem, stream, plan.pdl, rp, plan.block_rows, b, counters, n_counters);
    } else if (const int ctas = detail::moe_align_grid(tokens, a.top_k)) {  // many pairs: the schedule from a grid
      const dim3 grid{unsigned(ctas)};
      detail::launch_kernel(&moe_align_count_kernel, grid, dim3(kernels::kAlignSplitThreads), E * sizeof(int), stream,
                            plan.pdl, ids, pairs, a.top_k, E, b, counters, n_counters);
      detail::launch_kernel(&moe_align_assign_kernel, grid, dim3(kernels::kAlignSplitThreads), E * sizeof(int), stream,
                            plan.pdl, ids, pairs, a.top_k, E, plan.block_rows, b);
    } else {
      detail::launch_kernel(&moe_align_kernel, dim3(1), dim3(kAlignThreads), E * sizeof(int), stream, plan.pdl, ids,
                            pairs, a.top_k, E, plan.block_rows, b, counters, n_counters);
    }
    if (plan.tc) {
      // X gathered into sorted rows (and lane order for wgmma) where the down GEMM's output goes later (o,
      // dead until then). A one-token pass (BF16 experts) has no gather: gate_up reads x's row itself, and
      // the pair ids after its wait (they may be the previous kernel's output); down reads them before its
      // own (gate_up, complete by then, waited for their writer).
      if (plan.split_x)  // (no one-token pass: its X must be split)
        detail::launch_split_rows(x, b.token_of_row, b.offset + E, pairs, a.hidden, o, plan.sms, stream, plan.pdl,
                                  plan.early_w);
      else if (!plan.one_token)
        detail::launch_lane_order(x, b.token_of_row, b.offset + E, pairs, a.gate_up.format, a.hidden, plan.x_len, o,
                                  plan.sms, stream, plan.pdl, /*natural=*/plan.natural(), plan.early_w);
      FP4KIT_RETURN_IF_ERROR(launch_tc(plan.tgu, a.gate_up, plan.one_token ? x : o, plan.one_token ? 1 : pairs, h,
                                       plan.split_x, plan.early_w && !plan.one_token, gu_one));
      launch_activation(pairs);
      FP4KIT_RETURN_IF_ERROR(launch_tc(plan.tdn, a.down, act, pairs, o, false, plan.early_w, dn_one));
      launch_combine(t0, tokens, y);
      continue;
    }
    if (plan.bf16) launch_bf16(plan.bgu, a.gate_up, x, b.token_of_row, h);
    else launch_grouped(plan.gu, a.gate_up, x, plan.one_token ? nullptr : b.token_of_row, h, gu_one,
                        plan.act_in_gate_up ? act : nullptr);
    if (!plan.act_in_gate_up) launch_activation(pairs);
    if (plan.bf16) launch_bf16(plan.bdn, a.down, act, nullptr, o);
    else launch_grouped(plan.dn, a.down, act, nullptr, o, dn_one);
    launch_combine(t0, tokens, y);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("fused_moe launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace fp4kit
