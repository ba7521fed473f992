// gemm_internal.h: the launch plan shared by the workspace query, the launcher and the tests.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "configs.h"
#include "fp4kit/gemm.h"

namespace fp4kit {
namespace detail {

// The launch plan of either kernel (the name is the decode kernel's, which the MoE layer plans with too).
// Decode (kRing, kBulk): persistent stream-K CTAs over (row group, K slice) units, one launch per m_block
// tokens. Prefill (kWgmma): per pass of pass_m tokens, X into lane order, then one launch of row_groups
// (128-row blocks) x token_tiles tiles, the last split_tiles of them split K `splits` ways.
struct DecodePlan {
  const KernelConfig* cfg = nullptr;
  const void* kernel = nullptr;  // the instantiated kernel for (format, act, cfg)
  int threads = 0;               // its block size
  int smem_bytes = 0;            // its dynamic shared memory
  PackedLayout layout;           // of the weight
  int64_t m_block = 0;      // tokens per launch (decode: 8 * n_tiles; prefill: m)
  int row_groups = 0;       // decode: row groups; prefill: 128-row blocks
  int64_t units = 0;        // decode: row_groups * K slices; prefill: output tiles (row_groups * token_tiles)
  int grid = 0;             // CTAs per launch (decode: persistent; prefill: units + split_tiles * (splits - 1))
  int token_tiles = 0;      // prefill: ceil(m / token tile)
  int splits = 1;           // prefill: K splits of a split tile (> 1: partial tiles summed through the workspace)
  int64_t split_tiles = 0;  // prefill: the last split_tiles tiles run split K, the others whole K (PrefillSchedule)
  size_t counters_bytes = 0, partials_bytes = 0, workspace_bytes = 0;
  // prefill: X is read in lane order (layout::natural_pair) from the workspace at lane_x_offset, permuted
  // there by one pass of lane_order_kernel per pass_m tokens (the plan's token tiles and splits are those
  // of one pass: the workspace stays bounded, see lane_x_pass_bytes).
  int64_t pass_m = 0;
  size_t lane_x_offset = 0;
  int lane_x_sms = 0;       // prefill: the device's SMs, for the lane-order pass's grid (row_vector_grid)
  bool pdl = false;         // decode launches use programmatic dependent launch (launch.h)
  int cluster = 0;          // kCluster: CTAs per cluster (each row group's K split S ways; grid = row_groups * S);
                            // prefill (wgmma): 2 where split tiles run in pairs (prefill.cu, launch_prefill)
};

// Every plan's arrival counters lie in the workspace's first kCounterRegionBytes (all of them as long as
// they number <= 16384: row groups of n <= 2M rows, prefill tiles), and its partial tiles after it: the
// partials a call leaves behind never lie under another shape's counters, so one zero-filled workspace
// serves calls of every shape (each call leaves its counters zeroed).
constexpr size_t kCounterRegionBytes = size_t(64) << 10;
inline size_t counters_region(int64_t counters) {
  return std::max(kCounterRegionBytes, (size_t(counters) * sizeof(int) + 255) / 256 * 256);
}

// The most bytes of lane-ordered X a prefill pass stages in the workspace (larger m runs in passes of
// equal size). A variable only so that tests can force several passes on small shapes.
inline int64_t lane_x_pass_bytes = int64_t(128) << 20;

// Bytes of one CTA's partial tile in the stream-K workspace (fp32, warps x row tiles x token tiles).
inline size_t partial_slot_bytes(const KernelConfig& c) {
  return size_t(c.warps) * c.row_tiles * c.n_tiles * 4 * 32 * sizeof(float);
}

// Threads of a decode config's CTA: its warps, plus the producer warp of the bulk pipeline.
inline int launch_threads(const KernelConfig& c) { return (c.warps + (c.pipeline == kBulk ? 1 : 0)) * 32; }

// Everything a launch needs, from the shape, the config table and the (cached) device facts. config < 0:
// the dispatcher's pick (dispatch_config; a prefill pick falls back to the decode kernel where this build
// has no sm_90a code). Fails with the rule on bad shapes or configs, and with "device: ..." on a device
// fp4kit cannot run on.
Status make_plan(int64_t m, const PackedWeight& w, DType act, int config, DecodePlan* plan);

// CTAs of `kernel` (threads, dynamic shared memory smem) resident per SM on the current device, cached per
// (device, kernel); also the device and its SM count (either may be null). max_cluster (cluster-mode
// kernels; null otherwise): the largest cluster the device schedules for the kernel (1 before sm_90), at
// most kernels::kMaxCluster (clusters above the portable 8 CTAs are allowed with the first such query).
Status resident_per_sm(const void* kernel, int threads, int smem, int* dev, int* sms, int* blocks,
                       int* max_cluster = nullptr);

// gemm_validate's checks; on success `plan` holds the launch plan (gemm() validates and plans once).
Status validate(const GemmArgs& a, DecodePlan* plan);

// Default-on switches for same-build A/B runs: false only where the environment variable `name` is "0".
// Each switch reads it once and has a detail:: setter for tests that overrides it.
bool env_not_zero(const char* name);

// Prefill split K in a pair (prefill.cu, plan_prefill): 0 never (partials through the workspace), 1 by the
// rule, -1 as the environment says (FP4KIT_PREFILL_PAIRS=0 turns it off; default on). Not thread-safe: set
// it before the calls it affects.
void set_prefill_pairs(int on);

}  // namespace detail
}  // namespace fp4kit
