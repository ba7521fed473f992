// gemm_internal.h: the launch plan shared by the workspace query, the launcher and the tests.
#pragma once
#include <cstddef>
#include <cstdint>

#include "configs.h"
#include "fp4kit/gemm.h"

namespace fp4kit {
namespace detail {

struct DecodePlan {
  const KernelConfig* cfg = nullptr;
  const void* kernel = nullptr;  // the instantiated kernel for (format, act, cfg)
  int threads = 0;               // its block size
  int smem_bytes = 0;            // its dynamic shared memory
  PackedLayout layout;           // of the weight
  int64_t m_block = 0;      // tokens per launch (8 * n_tiles)
  int row_groups = 0;
  int64_t units = 0;        // row_groups * k_macros
  int grid = 0;             // persistent CTAs
  size_t counters_bytes = 0, partials_bytes = 0, workspace_bytes = 0;
};

// Bytes of one CTA's partial tile in the stream-K workspace (fp32, warps x row tiles x token tiles).
inline size_t partial_slot_bytes(const KernelConfig& c) {
  return size_t(c.warps) * c.row_tiles * c.n_tiles * 4 * 32 * sizeof(float);
}

// Threads of a config's CTA: its warps, plus the producer warp of the bulk pipeline.
inline int launch_threads(const KernelConfig& c) { return (c.warps + (c.pipeline == kBulk ? 1 : 0)) * 32; }

// Everything a launch needs, from the shape, the config table and the (cached) device facts. Fails with
// the rule on bad shapes or configs, and with "device: ..." on a device fp4kit cannot run on.
Status make_plan(int64_t m, const PackedWeight& w, DType act, int config, DecodePlan* plan);

// CTAs of `kernel` (threads, dynamic shared memory smem) resident per SM on the current device, cached per
// (device, kernel); also the device and its SM count (either may be null).
Status resident_per_sm(const void* kernel, int threads, int smem, int* dev, int* sms, int* blocks);

// gemm_validate's checks; on success `plan` holds the launch plan (gemm() validates and plans once).
Status validate(const GemmArgs& a, DecodePlan* plan);

}  // namespace detail
}  // namespace fp4kit
