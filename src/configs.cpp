#include "configs.h"

#include <algorithm>
#include <cstdio>

#include "kernels/decode_layout.h"

namespace fp4kit {

namespace {
constexpr int kDefaultSms = 132;       // H100 SXM / H200
constexpr int64_t kPrefillRows = 128;  // weight rows per prefill CTA (8 warps x 16)
// The prefill time model (configs.h): a CTA's time per 512-K slice ~ BN + kBnOverhead, plus kRampSlices
// per CTA and kSplitSlices more when K is split; ~kUsPerUnit us per unit on the H200. Two CTAs per SM
// (BN = 64) each take twice the time of BN + kBnOverheadB2: the co-resident CTA hides part of the
// per-slice work that one CTA pays alone.
constexpr double kBnOverhead = 125.0, kBnOverheadB2 = 100.0, kRampSlices = 3.0, kSplitSlices = 1.0,
                 kUsPerUnit = 0.0111;
// A split CTA's partial tile is 128 x BN fp32 (stored, then read back by the last arrival): at BN = 256
// twice BN = 128's bytes, for 1.5 times the slice time, so it costs kSplitSlices per 128 tokens of width.
// Measured (docs/prefill-notes.md, "The split cost of 256-token tiles"): Llama-3.3-70B o at m = 256 ran
// p256_w8_s3_k8 (64 tiles x 2 splits) 4.6% slower than p128_w8_s5 (128 whole-K tiles, one wave), which the
// flat charge ranked the other way.
double split_slices(const KernelConfig& c) { return kSplitSlices * std::max(1, c.n_tiles / 16); }  // 16 tiles: 128 tokens
// Four or more splits of a two-CTA entry's narrow tiles (m <= 32 on BN = 64, where a slice is cheap): the last
// arrival sums every partial from the workspace, which the flat charge underprices there. Measured
// (docs/prefill-notes.md, "Dispatch at m = 9-32 against every config"): Llama-3.3-70B down at m = 9-32 ran
// p64_w8_s4_b2_k8 (4 splits) 4-9% slower than p64_w8_s8_k8 (2 splits), which the flat charge ranked the
// other way, while 3-split plans of the same entry measured on the model (Llama-70B qkv). So
// kSplitExtraNarrowB2 slices per split past three: on the sweep of four models at m = 9 / 16 / 32, 1.5-4 make
// every prefill pick the fastest prefill config; on 132 SMs it moves only Llama-70B down's picks at m = 9-32.
constexpr double kSplitExtraNarrowB2 = 2.0;
// A split schedule replaces whole K only where the model makes it >= 3% faster: smaller modelled gains
// are inside the model's error (docs/prefill-notes.md) and would trade a known plan for a workspace.
constexpr double kSplitMinGain = 0.97;
// The decode kernel at 9-16 tokens (n_tiles = 2 entries) and at 17-32 (n_tiles = 4): ~fixed us + weight
// bytes / TB/s (NVFP4), MXFP4 slower by kDecodeMxFactor (configs.h).
constexpr double kDecode16FixedUs = 7.75, kDecode16Tbps = 3.0, kDecode32FixedUs = 13.0, kDecode32Tbps = 2.14,
                 kDecodeMxFactor = 1.1;
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t k_slices(int64_t k) { return std::max<int64_t>(1, cdiv(k, 512)); }  // = PackedLayout::k_macros
}  // namespace

// "T tiles, [the last R] split K S ways, on N SMs": the prefill schedule, for the analytic default's explanations.
static std::string prefill_plan_text(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms) {
  const PrefillSchedule sc = prefill_schedule(c, m, n, k, sms);
  const int64_t tiles = prefill_tiles(c, m, n);
  if (sc.splits == 1) return std::to_string(tiles) + " tiles, whole K, on " + std::to_string(sms) + " SMs";
  return std::to_string(tiles) + " tiles, " + (sc.split_tiles < tiles ? "the last " + std::to_string(sc.split_tiles) + " " : "") +
         "split K " + std::to_string(sc.splits) + " ways, on " + std::to_string(sms) + " SMs";
}

const KernelConfig* kernel_configs(int* count) {
  if (count) *count = kNumKernelConfigs;
  return kKernelConfigs;
}

const KernelConfig* find_config(int id) {
  for (int i = 0; i < kNumKernelConfigs; ++i)
    if (kKernelConfigs[i].id == id) return &kKernelConfigs[i];
  return nullptr;
}

int64_t prefill_tiles(const KernelConfig& c, int64_t m, int64_t n) {
  return cdiv(n, kPrefillRows) * cdiv(m, 8 * int64_t(c.n_tiles));
}

PrefillSchedule prefill_schedule(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms) {
  if (sms <= 0) sms = kDefaultSms;
  sms *= c.min_blocks;  // a wave is every resident CTA
  const int64_t tiles = prefill_tiles(c, m, n), slices = k_slices(k);
  PrefillSchedule best;  // s = 1: ceil(tiles / sms) whole-K waves
  best.slice_times = double(cdiv(tiles, sms)) * (double(slices) + kRampSlices);
  const bool narrow_b2 = c.min_blocks == 2 && prefill_width(c, m) < 8 * c.n_tiles;
  for (int s = 2; s <= c.max_splits && s <= slices; ++s)
    for (int64_t w = 0; w * sms < tiles; ++w) {  // tail = tiles - w sms > 0
      const int64_t tail = tiles - w * sms;
      if (tail * s > 2 * int64_t(sms)) continue;
      const double split = split_slices(c) + (narrow_b2 && s > 3 ? kSplitExtraNarrowB2 * (s - 3) : 0.0);
      const double cost = double(w) * (double(slices) + kRampSlices) +
                          double(cdiv(tail * s, sms)) * (double(cdiv(slices, s)) + kRampSlices + split);
      // Against whole K the margin; among splits the cheapest (ties: fewer splits, then fewer whole waves).
      if (best.splits == 1 ? cost < best.slice_times * kSplitMinGain : cost < best.slice_times) best = {s, tail, cost};
    }
  return best;
}

int prefill_width(const KernelConfig& c, int64_t m) {
  const int bn = 8 * c.n_tiles;
  return c.pipeline == kWgmma && bn == layout::kDenseNarrowBn ? layout::tile_width(bn, m) : bn;
}

double prefill_cost(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms) {
  // min_blocks CTAs share an SM: each runs a slice in about min_blocks times the time of its own work. A
  // single narrow tile per row block (m <= 32 on BN = 64) does the MMA work of its width.
  const double overhead = c.min_blocks == 1 ? kBnOverhead : kBnOverheadB2;
  return (double(prefill_width(c, m)) + overhead) * c.min_blocks * prefill_schedule(c, m, n, k, sms).slice_times;
}

double prefill_us(const KernelConfig& c, int64_t m, int64_t n, int64_t k, int sms) {
  return kUsPerUnit * prefill_cost(c, m, n, k, sms);
}

bool prefill_pdl_default(int64_t m, int64_t pass_m, int64_t grid, int sms, int min_blocks) {
  return pass_m >= m && grid <= int64_t(sms) * min_blocks;
}

double decode_us_small(int64_t m, int64_t n, int64_t k, Format f) {
  const double bits = 4.0 + 8.0 / group_size(f);  // per weight, with its share of a one-byte block scale
  const double bytes = double(n) * double(k) * bits / 8.0;
  const double us = m <= 16 ? kDecode16FixedUs + bytes / (kDecode16Tbps * 1e6) : kDecode32FixedUs + bytes / (kDecode32Tbps * 1e6);
  return f == Format::kMXFP4 ? us * kDecodeMxFactor : us;
}

int pick_prefill_config(int64_t m, int64_t n, int64_t k, int cc_major, int sms) {
  const KernelConfig* best = nullptr;
  double best_cost = 0;
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (c.pipeline != native_prefill(cc_major) || !config_supported(c, cc_major)) continue;
    const double cost = prefill_cost(c, m, n, k, sms);
    if (!best || cost < best_cost) {  // ties: the earlier entry (whole K before split)
      best = &c;
      best_cost = cost;
    }
  }
  return best ? best->id : -1;
}

int pick_config(int64_t m, int64_t n, int64_t k, std::string* why, int cc_major, int sms, Format f) {
  if (sms <= 0) sms = kDefaultSms;
  const int64_t prefill_min_m = cc_major == 9 ? kPrefillMinM : kMmaPrefillMinM;
  const bool mma_too_large = cc_major != 9 && n * k >= (int64_t(1) << kMmaMaxWeightsLog2);
  int prefill = m >= prefill_min_m && !mma_too_large ? pick_prefill_config(m, n, k, cc_major, sms) : -1;
  // sm_80-89: one token tile of whole-K mma.sync CTAs filling less than 3/4 of the SMs streams each row
  // block's weights on one SM while the rest idle; the decode kernel's 64-token blocks spread the same
  // bytes over every SM (stream-K) instead (see kMmaSubWaveQuarters).
  bool mma_sub_wave = false;
  if (prefill >= 0 && cc_major != 9) {
    const KernelConfig& c = *find_config(prefill);
    mma_sub_wave = m <= 8 * c.n_tiles && prefill_schedule(c, m, n, k, sms).splits == 1 &&
                   4 * prefill_tiles(c, m, n) < int64_t(kMmaSubWaveQuarters) * sms;
    if (mma_sub_wave) prefill = -1;
  }
  if (prefill >= 0) {
    const KernelConfig& best = *find_config(prefill);
    if (why) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.0f", prefill_cost(best, m, n, k, sms));
      *why = "m=" + std::to_string(m) + ": " + best.name + " (" + (cc_major == 9 ? "wgmma" : "mma.sync") +
             " prefill kernel from m >= " + std::to_string(prefill_min_m) + " on cc " + std::to_string(cc_major) +
             ".x: least modelled time " + buf + ", " + prefill_plan_text(best, m, n, k, sms) + ")";
    }
    return prefill;
  }
  const int64_t mb = m > 64 ? 64 : m;  // larger m runs in blocks of 64 tokens
  int nt = 0;
  for (int i = 0; i < kNumKernelConfigs; ++i)
    if (!is_prefill(kKernelConfigs[i]) && config_supported(kKernelConfigs[i], cc_major) &&
        8 * kKernelConfigs[i].n_tiles >= mb && (nt == 0 || kKernelConfigs[i].n_tiles < nt))
      nt = kKernelConfigs[i].n_tiles;
  // Two row tiles per warp share each X fragment over twice the weights, which pays on large layers: from
  // 2^28 weights at 16 tokens per launch, from 2^27 at 32 (measured: configs.h). Each record meets one X
  // fragment per token tile, so the more token tiles, the more the sharing saves.
  const int large_log2 = nt >= 4 ? 27 : 28;
  const bool large = n * k >= (int64_t(1) << large_log2);
  const KernelConfig* pick = nullptr;
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (c.n_tiles != nt || is_prefill(c) || !config_supported(c, cc_major)) continue;
    if (!pick || (large && c.row_tiles > pick->row_tiles)) pick = &c;
  }
  if (!pick) return kKernelConfigs[0].id;  // unreachable: the table has ring entries up to 64 tokens
  // Few row groups whose every (row group, K slice) unit fits one wave of resident CTAs: stream-K gives each
  // CTA about one slice and every row group's last arrival its fixup round trips; the cluster twin of the
  // pick (same ring, the K split reduced in distributed shared memory) is faster there (configs.h).
  const int64_t rg = cdiv(cdiv(n, 16), int64_t(pick->warps) * pick->row_tiles), slices = k_slices(k);
  const int64_t wave = int64_t(sms) * pick->min_blocks;
  const bool few = rg <= kClusterMaxRowGroups ||
                   (pick->n_tiles == 1 && 8 * rg * slices <= kClusterOneTileWaveEighths * wave);
  const int twin = cluster_twin(int(pick - kKernelConfigs));
  const bool cluster = cc_major == 9 && !large && few && rg * slices <= wave && twin >= 0;
  // 9-32 tokens on cc 9.x: whichever kernel the models make faster (see kCrossoverMinM in configs.h); the
  // decode kernel's cluster mode (few row groups) is not in its model and stays.
  std::string kept;  // why the decode kernel stays in that band (appended to its explanation)
  if (cc_major == 9 && m >= kCrossoverMinM && m < kPrefillMinM && !cluster) {
    const int pre = pick_prefill_config(m, n, k, cc_major, sms);
    if (pre >= 0) {
      const KernelConfig& c = *find_config(pre);
      const double pre_us = prefill_us(c, m, n, k, sms), dec_us = decode_us_small(m, n, k, f);
      if (why) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "; modelled %.1f us against the prefill kernel's %.1f (%s)", dec_us, pre_us, c.name);
        kept = buf;
      }
      if (pre_us < dec_us * kCrossoverMargin) {
        if (why) {
          char buf[96];
          std::snprintf(buf, sizeof buf, "modelled %.1f us against the decode kernel's %.1f", pre_us, dec_us);
          *why = "m=" + std::to_string(m) + ": " + c.name + " (" + std::to_string(kCrossoverMinM) + "-" +
                 std::to_string(kPrefillMinM - 1) + " tokens: the prefill kernel, m64n" +
                 std::to_string(prefill_width(c, m)) + " wgmmas, " + buf + "; " + prefill_plan_text(c, m, n, k, sms) +
                 ")";
        }
        return pre;
      }
    }
  }
  if (cluster) {
    const KernelConfig& c = kKernelConfigs[twin];
    if (why)
      *why = "m=" + std::to_string(m) + ": " + c.name + " (smallest n_tiles with 8*n_tiles >= " + std::to_string(mb) +
             "; " + std::to_string(rg) + " row groups x " + std::to_string(slices) + " K slices fit one wave" +
             (rg <= kClusterMaxRowGroups ? "" : " (5/8 of it, one-token tiles)") + ": the first entry's cluster twin)";
    return c.id;
  }
  if (why)
    *why = "m=" + std::to_string(m) + ": " + pick->name + " (smallest n_tiles with 8*n_tiles >= " + std::to_string(mb) +
           (m > 64 ? ", 64-token blocks" : "") +
           (m >= kMmaPrefillMinM && mma_too_large ? " (>= 2^" + std::to_string(kMmaMaxWeightsLog2) +
                                                        " weights: not the mma.sync prefill kernel)"
                                                  : "") +
           (mma_sub_wave ? " (one whole-K token tile of mma.sync CTAs would fill less than " +
                               std::to_string(kMmaSubWaveQuarters) + "/4 of the SMs)"
                         : "") +
           (large ? "; >= 2^" + std::to_string(large_log2) + " weights: most row tiles per warp" : "; first entry") + kept +
           ")";
  return pick->id;
}

}  // namespace fp4kit
