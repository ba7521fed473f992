// configs.h: the one table of GEMM kernel configs: the decode kernels (mma.sync, register-dequantised
// weights, stream-K; sm_80+) and the Hopper prefill kernel (wgmma; sm_90a).
//
// The dispatcher, the tests (every entry is tested), the benchmark and the tuner all read this table.
// A decode entry is instantiated for {NVFP4, MXFP4} x {BF16, FP16}; keep it short: each one costs compile
// time and must earn its place in a benchmark. Prefill entries share one kernel per token tile (the K
// split is a launch parameter), so a split variant costs no compile time.
#pragma once
#include <cstdint>
#include <string>

#include "fp4kit/formats.h"

namespace fp4kit {

struct KernelConfig {
  int id;
  const char* name;
  int n_tiles;      // 8-token MMA column tiles per launch: serves m <= 8 * n_tiles per launch
  int row_tiles;    // 16-row weight tiles per warp (B fragments are reused across them)
  int warps;        // warps per CTA (all walk the same K slice, so X is shared through L1)
  int min_blocks;   // CTAs per SM the register budget is sized for (__launch_bounds__)
  int chunks;       // CH: 16-byte records per row tile in one pipeline stage (divides 8)
  int stages;       // ring: D register stages (1: load, then compute; 2+: the next stages in flight);
                    // bulk: S shared-memory stages of one K slice each
  int pipeline;     // kRing: per-lane loads into a register ring (sm_80+); kBulk: a producer warp streams
                    // whole K slices into a shared-memory ring with cp.async.bulk + mbarriers (sm_90);
                    // kWgmma: the prefill kernel (kernels/prefill_gemm_sm90.cuh, sm_90a); kCluster: the
                    // register ring without stream-K: a row group's K split over a thread-block cluster,
                    // reduced through distributed shared memory (sm_90; decode_gemm.cuh, finish_cluster)
  int max_splits = 1;  // kWgmma: the most K splits the plan may use when the output tiles leave SMs idle
                       // (1: whole K per CTA, no workspace); decode entries: unused (always stream-K)
  bool balanced = false;  // decode: grid = ceil(units / u) CTAs with u = ceil(units / resident CTAs), so every
                          // CTA gets u or u - 1 units (a host-side choice: same kernel as its twin)
};

enum Pipeline : int { kRing = 0, kBulk = 1, kWgmma = 2, kCluster = 3, kMma = 4 };

// How the fields read for a kWgmma (prefill) entry:
//   n_tiles    token tile / 8 (token tile BN = 64, 128 or 256 tokens per CTA; any m runs in one launch)
//   row_tiles  16-row weight tiles per consumer warp (1: a CTA is 8 warps x 16 = 128 weight rows)
//   warps      consumer warps (8: two warpgroups; the CTA adds a producer warpgroup, 384 threads)
//   min_blocks CTAs per SM (1: the ring takes the shared memory; 2: BN = 64 only, half the ring each)
//   chunks     64-K chunks per ring stage (2: 128 K)
//   stages     ring stages (what fits in 220 KB: 8 / 5 / 3 for BN = 64 / 128 / 256, 4 in 108 KB for two
//              CTAs per SM; prefill.cu checks it)
//   max_splits most K splits (prefill_schedule picks the count per shape)
// A kMma entry (the Ampere/Ada prefill kernel, kernels/prefill_gemm_sm80.cuh) reads the same fields with
// the same tiles (128 weight rows x BN tokens, 128 K per stage, split K as the wgmma kernel), except:
//   row_tiles  16-row weight tiles per warp (2: 8 warps as 4 row warps x 2 token warps)
//   warps      8 (no producer warps)
//   stages     cp.async ring stages of X [BN][128 K] + 8 KB of records (4 at BN = 128: 160 KB, which fits
//              sm_80 / sm_87 / sm_90; 4 at BN = 64: 96 KB, which fits sm_86 / sm_89's 99 KB too)
// Both are "prefill" kernels: one launch covers any m, the weights are read once per token tile.
constexpr bool is_prefill(const KernelConfig& c) { return c.pipeline == kWgmma || c.pipeline == kMma; }

// Whether a device of compute capability major runs the config (the bulk pipeline and the wgmma prefill
// kernel are Hopper-only: sm_90 / sm_90a; the ring and mma.sync kernels run on every sm_80+ device).
constexpr bool config_supported(const KernelConfig& c, int cc_major) {
  return c.pipeline == kRing || c.pipeline == kMma || cc_major == 9;
}
// The prefill kernel family a device of compute capability major runs by default: wgmma on Hopper,
// mma.sync elsewhere.
constexpr int native_prefill(int cc_major) { return cc_major == 9 ? kWgmma : kMma; }

// The table. Kernels are instantiated from it at compile time (gemm.cu), so it is the only place a
// config is written down.
// id, name, n_tiles, row_tiles/warp, warps (consumer warps for kBulk), min CTAs/SM, chunks per stage, stages,
// pipeline[, max K splits]
// Order matters: for each n_tiles the first decode entry is the dispatcher's default, except on large
// layers (see pick_config). Decode entries come first (the MoE layer takes the first entry of a given
// n_tiles and pipeline).
inline constexpr KernelConfig kKernelConfigs[] = {
    {0, "m8_r1_w8_b3_c8x1", 1, 1, 8, 3, 8, 1, kRing},
    {1, "m8_r1_w8_b3_c4x2", 1, 1, 8, 3, 4, 2, kRing},
    {2, "m8_r1_w8_b3_c2x4", 1, 1, 8, 3, 2, 4, kRing},
    // m <= 16: the whole-slice double buffer first (slice j+1's records load while slice j is multiplied;
    // 64 ring registers, two CTAs per SM). Against c4x2 at m = 16 (NVFP4, same runs): Llama-70B down
    // 55.2 / 54.9 vs 59.7 / 59.8 us and qkv -2% (bench/results/sweep_c8x2_06fda22_*.json vs
    // sweep_v13_06fda22_default_*.json); every config at dafaa48 (bench/results/sweep_all_dafaa48_*.json):
    // 70B down 54.7 vs 59.8 us, 8B gate_up 31.9 vs 33.7, 8B down 23.0 vs 24.0; o 1-4% slower, qkv +-2%.
    // Its m <= 8 twin (m8_r1_w8_b2_c8x2) was 5-9% slower than c8x1 on every layer and is gone.
    // Balanced grid (every CTA u or u - 1 units) against the plain one at m = 16, same runs (NVFP4 / MXFP4,
    // us, bench/results/sweep_balanced_cd64908.json): Llama-70B o 22.2 / 21.8 vs 23.8 / 23.8, down 53.4 /
    // 54.6 vs 55.0 / 56.1, qkv +-1%; Llama-8B qkv 14.6 / 14.6 vs 15.1 / 15.3, down 22.0 / 22.4 vs 23.0 /
    // 23.3, o and gate_up within 3%; 70B gate_up (dispatch runs the two-tile entry there) +3.5% / +1.2%.
    // The m8 entry keeps the plain grid: balanced was 2-7% slower at m = 1 on Llama-70B gate_up and down.
    {34, "m16_r1_w8_b2_c8x2", 2, 1, 8, 2, 8, 2, kRing, 1, true},
    {4, "m16_r1_w8_b2_c4x2", 2, 1, 8, 2, 4, 2, kRing},
    {3, "m16_r2_w8_b2_c4x2", 2, 2, 8, 2, 4, 2, kRing},
    {5, "m16_r1_w8_b3_c4x2", 2, 1, 8, 3, 4, 2, kRing},
    // m <= 32: one row tile per warp first; pick_config takes the two-tile entry from 2^27 weights (every
    // config at m = 32, NVFP4, bench/results/sweep_all_73a7e62_*_m32.json: r1 ahead on every layer below
    // 2^27 weights, Llama-70B qkv 35.0 vs 38.4 us, o 30.3 vs 31.8, Llama-8B down 31.0 vs 35.4, tp8 o 9.3
    // vs 11.7; r2 ahead on Llama-70B down (2^27.8) 74.7 vs 78.8 and gate_up 135.3 vs 147.6).
    {7, "m32_r1_w8_b2_c4x2", 4, 1, 8, 2, 4, 2, kRing},
    {6, "m32_r2_w8_b2_c2x2", 4, 2, 8, 2, 2, 2, kRing},
    // m <= 64: c8x1 first (the default): 2-9% faster than c4x2 on every Llama-70B and 8B layer in two
    // sweeps (bench/results/sweep_bulk_0773a97_*.json, sweep_waves_8f07056_*.json), and no spills.
    {9, "m64_r2_w8_b1_c8x1", 8, 2, 8, 1, 8, 1, kRing},
    {8, "m64_r2_w8_b1_c4x2", 8, 2, 8, 1, 4, 2, kRing},
    // Half-size CTAs (64- and 128-row groups): twice the row groups, for layers whose 8-warp row groups
    // x K slices leave resident CTAs idle or split K many ways.
    {10, "m8_r1_w4_b6_c8x1", 1, 1, 4, 6, 8, 1, kRing},
    {11, "m16_r2_w4_b4_c4x2", 2, 2, 4, 4, 4, 2, kRing},
    // Bulk pipeline (sm_90): one producer warp keeps S whole K slices of the row group in flight through
    // shared memory, across segment boundaries and stream-K fixups; consumers read records with one
    // conflict-free 16-byte shared load per lane. Measured at 0773a97: slower than the ring on large
    // layers (fewer dequantising warps per SM), faster on small layers at m = 16 and 64 only.
    {14, "m16_bulk_w8_s4_b1", 2, 1, 8, 1, 4, 4, kBulk},
    {17, "m64_bulk_w8_s2_b1", 8, 1, 8, 1, 2, 2, kBulk},
    // Cluster mode (sm_90): the ring kernels of entries 0 and 34, each row group's K split over a cluster of
    // S CTAs (S ~ resident CTAs / row groups, <= 16 and <= the K slices), the partials summed through
    // distributed shared memory instead of the stream-K fixup's workspace round trips. Measured against
    // their twins (bench/results/cl_fbd3afb_*.json, NVFP4, us, m = 1 / 16): faster where few row groups'
    // units all fit one wave (pick_config: <= kClusterMaxRowGroups row groups): Llama-70B tp8 qkv (10 row
    // groups x 16 slices) 7.5 -> 6.2 / 10.8 -> 7.8, gpt-oss o (23 x 8) 7.4 -> 6.4 / 9.8 -> 7.9; slower
    // from 32 row groups (Llama-8B o 7.6 -> 7.8 / 10.6 -> 12.4, gpt-oss qkv (40 x 6) 7.6 -> 7.5 / 10.0 ->
    // 12.3, tp8 o (64 x 2) 6.1 -> 5.7 / 7.2 -> 7.6) and on every layer whose units exceed a wave (+12-45%).
    // With one-token tiles (m <= 8, entry 18) the sweep of cc8d1ca (cfg_cc8d1ca_*.json, m = 1-8) has tp8 o
    // 5.7-7.0% and gpt-oss qkv 1.9-7.6% faster in cluster mode: pick_config also takes entry 18 where all
    // units fit 5/8 of a wave (tp8 o 0.32, gpt-oss qkv 0.61; Llama-8B o at 0.65 was 2.6% slower at m = 1).
    // The fused MoE's one-token grouped passes run entry 18 in grouped mode where every row group of the
    // schedule gets a cluster of >= 2 CTAs within one wave (moe.cu, plan_grouped).
    {18, "m8_r1_w8_b3_c8x1_cl", 1, 1, 8, 3, 8, 1, kCluster},
    {19, "m16_r1_w8_b2_c8x2_cl", 2, 1, 8, 2, 8, 2, kCluster},
    // (Ids 30-32 were 24-warp CTAs, one or two per SM (m8_r1_w24_b1, m8_r1_w12_b2, m16_r1_w24_b1): slower
    // than the 8-warp defaults on every Llama-70B layer at m = 1 (gate_up 91.6 / 84.8 vs 79.0 us), within
    // 4% at m = 16, bench/results/sweep_w24_cee07c6_llama70b.json; removed.)
    // (Ids 27 and 28 were half-slice stream-K units, unit_chunks = 4: 5-21% slower than their one-slice
    // twins on every Llama-70B layer at m = 1 and 16, bench/results/sweep_all_63d06f0_llama70b.json;
    // removed, and with them the kernel's sub-slice units: a stream-K unit is one K slice.)
    // Prefill (sm_90a): CTA = 128 weight rows x BN tokens, wgmma with the dequantised weights as register
    // A, X by TMA; measured at b7022e8 (whole K per CTA): 640-730 TFLOP/s on Llama-70B layers at
    // m >= 1024, ~400 at m = 256 where 64-128 CTAs leave the 132 SMs of an H200 idle. The _k8 variants
    // split K (up to 8 ways, on 512-K slice boundaries) when the tiles leave SMs idle; the partial tiles
    // are summed in split order by the last CTA to arrive (deterministic, workspace from the plan).
    {20, "p64_w8_s8", 8, 1, 8, 1, 2, 8, kWgmma},
    {21, "p128_w8_s5", 16, 1, 8, 1, 2, 5, kWgmma},
    {22, "p256_w8_s3", 32, 1, 8, 1, 2, 3, kWgmma},
    {23, "p64_w8_s8_k8", 8, 1, 8, 1, 2, 8, kWgmma, 8},
    {24, "p128_w8_s5_k8", 16, 1, 8, 1, 2, 5, kWgmma, 8},
    {25, "p256_w8_s3_k8", 32, 1, 8, 1, 2, 3, kWgmma, 8},
    // Two CTAs per SM at BN = 64 (half the ring each, 104 consumer registers): four consumer warpgroups per
    // SM, so one CTA's wgmmas can run while the other's warps dequantise, and one CTA's pipeline fill and
    // epilogue overlap the other's main loop. Measured (bench/results/sweep_b2_c711427_*.json, NVFP4, us,
    // best one-CTA entry -> two CTAs): Llama-70B m = 64 qkv 42.8 -> 33.2, gate_up 161.8 -> 150.6, down
    // 78.1 -> 72.7, o 27.9 -> 27.1; Llama-8B gate_up 45.1 -> 38.5; the small layers' best stays one CTA.
    // The model prices them at 2 x (BN + 100) per slice (configs.cpp).
    {40, "p64_w8_s4_b2", 8, 1, 8, 2, 2, 4, kWgmma},
    {41, "p64_w8_s4_b2_k8", 8, 1, 8, 2, 2, 4, kWgmma, 8},
    // Prefill on sm_80-89 (mma.sync, cp.async; kernels/prefill_gemm_sm80.cuh): CTA = 128 weight rows x BN
    // tokens, X read in natural K order. BN = 128 needs 160 KB of shared memory (A100, Orin, Hopper); the
    // BN = 64 entries fit every sm_80+ part (make_plan takes them where the larger ring does not fit).
    {50, "a128_w8_s4", 16, 2, 8, 1, 2, 4, kMma},
    {51, "a128_w8_s4_k8", 16, 2, 8, 1, 2, 4, kMma, 8},
    {52, "a64_w8_s4", 8, 2, 8, 1, 2, 4, kMma},
    {53, "a64_w8_s4_k8", 8, 2, 8, 1, 2, 4, kMma, 8},
    // (Ids 56-57 were a128 with one row tile per warp, 8 row warps x 1 token warp: each weight dequantised
    // once per CTA, ~25% fewer instructions per MMA, yet 5-8% slower than a128_w8_s4 on every Llama-70B
    // layer at m = 256-4096, bench/results/ampere_sweep_993b017.json; removed.)
    // (Ids 54-55 were a64 at two CTAs per SM, three 72 KB stages each: within -2% .. +3% of a64_w8_s4 on
    // every Llama-70B layer at m = 128-4096 on the H200, bench/results/ampere_sweep_0b3b302.json; removed.)
};
inline constexpr int kNumKernelConfigs = int(sizeof(kKernelConfigs) / sizeof(kKernelConfigs[0]));

// The cluster twin of ring entry `ring` (its index in kKernelConfigs): the kCluster entry with the same
// shape fields (same kernel, its K split reduced in a thread-block cluster); -1 where the table has none.
// pick_config's cluster rule and the fused MoE's grouped cluster mode both run the twin of their pick.
constexpr int cluster_twin(int ring) {
  const KernelConfig& r = kKernelConfigs[ring];
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (c.pipeline == kCluster && c.n_tiles == r.n_tiles && c.row_tiles == r.row_tiles && c.warps == r.warps &&
        c.min_blocks == r.min_blocks && c.chunks == r.chunks && c.stages == r.stages)
      return i;
  }
  return -1;
}

// The first ring entry (the decode kernel's default) for n_tiles 8-token tiles: its index in kKernelConfigs,
// -1 where the table has none. The fused MoE's grouped decode GEMMs run it; past 64 tokens it is the decode
// kernel in 64-token blocks.
constexpr int first_ring_index(int n_tiles) {
  for (int i = 0; i < kNumKernelConfigs; ++i)
    if (kKernelConfigs[i].n_tiles == n_tiles && kKernelConfigs[i].pipeline == kRing) return i;
  return -1;
}

// The table (static storage, `count` entries).
const KernelConfig* kernel_configs(int* count);
const KernelConfig* find_config(int id);

// The m from which the analytic default runs the prefill kernel on a cc 9.x device: m >= 33. Measured at
// 89822ce (bench/results/prefill_llama70b.json, Llama-3.3-70B, both formats): at m = 64 the prefill
// kernel (X in lane order, p64 entries) beats the decode kernel's default on every layer, 17-40% (qkv 43
// vs 52 us, o 28 vs 45, gate_up 160-172 vs 221-231, down 76-77 vs 124-129); at m = 32 the two are
// within -10% .. +12% of each other (the decode kernel ahead on qkv and gate_up). m = 33 .. 64 runs
// the decode kernel's 64-token entry, as slow as m = 64, so the prefill kernel takes over above 32.
// Past 64 tokens the decode kernel would also re-read the weights once per 64-token launch.
inline constexpr int64_t kPrefillMinM = 33;
// The same on sm_80-89 (the mma.sync prefill kernel against the decode kernel): from 65 tokens, where the
// decode kernel would stream the weights a second time. Not measured on an Ampere or Ada part: the H200
// running both kernels (forced) is the only measurement (docs/prefill-notes.md).
inline constexpr int64_t kMmaPrefillMinM = 65;
// ... except on layers of >= 2^kMmaMaxWeightsLog2 weights, which keep the decode kernel in 64-token blocks:
// on Llama-3.3-70B gate_up (2^28.8) it ran 4-9% faster than the best mma.sync entry at m = 128-4096 on the
// H200 (forced, bench/results/ampere_sweep_0b3b302.json), where down (2^27.8) was within 1-4% and qkv and o
// 16-30% slower. Measured on the H200 only (no Ampere or Ada part here).
inline constexpr int kMmaMaxWeightsLog2 = 28;
// ... and where the mma.sync plan is one token tile (m <= its BN) of whole-K CTAs that fill less than
// kMmaSubWaveQuarters / 4 of the SMs, the decode kernel's 64-token blocks: Llama-3.3-70B qkv at m = 128
// (80 row blocks on 132 SMs) ran 92.6-92.8 us there against 124.3-124.9 us for a128_w8_s4 (three runs on the
// H200, forced: ampere_sweep_0b3b302.json, prefill_llama70b_sm80.json) and 98.0 for the best split entry;
// o (split K 2 ways) and o at m = 256 (128 whole-K tiles, 97% of a wave: 126.3 against 162.1 us) keep the
// mma.sync kernel.
inline constexpr int kMmaSubWaveQuarters = 3;

// pick_config takes the cluster twin of its decode pick (cc 9.x) for layers of at most this many row
// groups whose (row group, K slice) units all fit one wave of resident CTAs, and with one-token tiles
// also for layers whose units fit kClusterOneTileWaveEighths / 8 of a wave (see the cluster entries).
inline constexpr int64_t kClusterMaxRowGroups = 24;
inline constexpr int64_t kClusterOneTileWaveEighths = 5;

// From 9 tokens on a cc 9.x device the two kernels are compared by model: the prefill kernel's least-cost
// entry (prefill_us; at m <= 32 its BN = 64 entries run one narrow tile per row block, m64n16 or m64n32
// wgmmas) against the decode kernel's (decode_us_small: ~7.75 us + weight bytes / 3.0 TB/s at 9-16 tokens,
// ~13 us + bytes / 2.14 TB/s at 17-32, x 1.1 for MXFP4), except where the decode pick is a cluster twin
// (few row groups: its cluster mode is not in the model and is faster there). Every config timed at
// m = 8-32 with narrow tiles (bench/results/cfg_narrow_24052bc_*.json, Llama-3.3-70B, Llama-3.1-8B, the tp8
// shards and gpt-oss attention, NVFP4 and MXFP4; the 9-16 constants fit to the decode picks there):
// - at 17-32 tokens the prefill kernel is the faster on every layer, by 11-41% (36 points at m = 24 and 32;
//   Llama-70B gate_up at m = 32 111.8 vs 145.4 us, qkv 26.9 vs 31.5; the tp8 o shard, K = 1024, 6.8 vs 8.4);
// - at 9-16 on most (Llama-8B gate_up 26.1 vs 29.8, the tp8 down shard 12.2-12.4 vs 14.1-14.9, Llama-70B
//   down 47-48 vs 50-55), within 2% either way on Llama-70B o and gate_up, behind on Llama-70B qkv NVFP4
//   (24.9-25.2 vs 23.8-24.1: the model keeps the decode kernel) and on the two cluster layers (tp8 qkv
//   10.1-10.6 vs 7.6-7.9, gpt-oss o 8.8-9.0 vs 7.5-8.0);
// - at 8 tokens the decode kernel's one-token-tile entries win every layer (Llama-70B down 41.3 vs 47.4).
inline constexpr int64_t kCrossoverMinM = 9;
// The prefill kernel is taken where its modelled time is below kCrossoverMargin x the decode kernel's: at
// 9-16 tokens the prefill model reads 0-7% above the measured times (median over the sweep's points of each
// BN = 64 entry), and the near-ties it decided the wrong way (Llama-8B qkv 12.1 vs 13.4 us, the tp8 gate_up
// shard 18.9 vs 19.7, Llama-70B qkv MXFP4 24.4 vs 25.6) were the prefill kernel's.
inline constexpr double kCrossoverMargin = 1.05;

// Analytic default (cc_major: the device's compute capability major; sms: its SM count, 0 = 132, the
// H100 SXM / H200 count). On cc 9.x from m >= kPrefillMinM: the prefill entry of least modelled time
// (prefill_cost); from kCrossoverMinM, the same where the models make it faster (above). Otherwise the decode kernel: the smallest n_tiles that covers m (m > 64 runs in
// 64-token blocks), then the entry the table lists first for it; on layers of >= 2^28 weights (2^27 from
// 32 tokens per launch) the first entry with the most row tiles per warp (B fragments reused over two
// row tiles pay where row groups are plentiful: measured on Llama-70B gate_up at m = 16, 104 vs 111 us,
// every smaller layer faster with one row tile; at m = 32 from Llama-70B down, 2^27.8, on). `why`
// (optional) receives a one-line explanation. Only entries the device runs are considered.
int pick_config(int64_t m, int64_t n, int64_t k, std::string* why = nullptr, int cc_major = 9, int sms = 0,
                Format f = Format::kNVFP4);
// The prefill entry of least modelled time for any m (what pick_config takes from kPrefillMinM on), or -1
// where the device runs none: among the wgmma entries on cc 9.x, the mma.sync entries elsewhere.
int pick_prefill_config(int64_t m, int64_t n, int64_t k, int cc_major = 9, int sms = 0);

// Prefill scheduling model, shared by the plan and the analytic default (host only).
// Output tiles of a prefill entry: ceil(n / 128) row blocks x ceil(m / BN) token tiles.
int64_t prefill_tiles(const KernelConfig& c, int64_t m, int64_t n);
// How a prefill launch covers its tiles: the first `tiles - split_tiles` (in launch order) run whole K, one
// CTA each; the last `split_tiles` run split K, `splits` CTAs each (a contiguous range of 512-K slices per
// split, summed through the workspace). Whole waves of whole-K tiles followed by a split tail: a layer whose
// tiles make 3.4 waves (Llama-70B gate_up at m = 256: 448 tiles on 132 SMs) runs 3 waves and splits the
// last 52 tiles 2 ways into one short wave, instead of a fourth full wave; a sub-wave layer splits every
// tile (split_tiles = tiles). Chosen by the model below: over w whole waves (0 .. tiles / SMs) and s in
// [1, min(max_splits, ceil(k / 512))] with (tiles - w SMs) x s <= 2 x SMs, the least
// w (slices + ramp) + ceil((tiles - w SMs) s / SMs) (ceil(slices / s) + ramp + 1); s = 1 (no split, the
// cost of every w alike) unless a split is >= 3% cheaper; among splits the cheapest, ties to fewer splits,
// then fewer whole waves. "SMs" here are the resident CTAs: SMs x min_blocks.
struct PrefillSchedule {
  int splits = 1;
  int64_t split_tiles = 0;  // 0 when splits == 1; <= the tiles
  double slice_times = 0;   // the model's cost above, in slice times of one CTA, before prefill_cost's
                            // x (BN + 125) (x 2 (BN + 100) at two CTAs per SM)
};
PrefillSchedule prefill_schedule(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms);
// Modelled time in arbitrary units: the schedule's whole-K waves x (slices + 3) plus its split waves x
// (slices per split + 3 + 1, + 2 at BN = 256), all x (BN + 125). Fitted (before the split tail) to every config at m = 64-1024 on Llama-70B, Llama-8B, the tp8 shards and gpt-oss attention (two runs,
// 84 points, docs/prefill-notes.md): with X in lane order the dequantisation is cheaper than it was and a
// slice costs more nearly its MMA work (BN); a CTA pays ~3 slices of pipeline fill and epilogue, a split
// one more per 128 tokens of tile width for its partials. The former constants (BN + 300, + 0.25, + 0.5) predate lane order and
// favoured BN = 256 on small layers (up to 54% slower than the best config; 24 of the 84 points past 5%,
// now none). Two CTAs per SM (min_blocks 2): waves of 2 x SMs CTAs, each slice x 2 (BN + 100), fitted to
// the two-CTA entries' sweeps (62 points at m = 32-256: geometric mean 1.010 over the best config;
// docs/prefill-notes.md, "Two CTAs per SM at BN = 64").
double prefill_cost(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms);
// The same in microseconds on an H200 (~0.0111 us per unit, fitted at m = 32: a BN = 64 slice ~2.1 us).
double prefill_us(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms);
// The decode kernel's modelled time at 9-16 tokens (the n_tiles = 2 entries) and 17-32 (n_tiles = 4),
// microseconds on an H200.
double decode_us_small(int64_t m, int64_t n, int64_t k, Format f);
// The token width of a prefill entry's wgmmas at m tokens: BN, or a quarter / half of BN = 64 where one
// narrow tile per row block covers m (wgmma entries only).
int prefill_width(const KernelConfig& c, int64_t m);
// Whether a dense wgmma prefill call uses programmatic dependent launch by default (FP4KIT_PDL overrides):
// one pass (pass_m >= m) whose grid is at most one wave of resident CTAs (SMs x min_blocks). There the
// GEMM's launch and first weight requests, overlapped with its lane-order pass, are a large share of the
// call (Llama-3.3-70B qkv and o at m = 64 5-7% faster on the H200); from m = 256 it measured +1% .. -4.6%
// (docs/prefill-notes.md).
bool prefill_pdl_default(int64_t m, int64_t pass_m, int64_t grid, int sms, int min_blocks);

}  // namespace fp4kit
