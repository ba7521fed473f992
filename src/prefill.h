// prefill.h: the prefill GEMMs' host side (Hopper: kernels/prefill_gemm_sm90.cuh; sm_80+:
// kernels/prefill_gemm_sm80.cuh): their part of the launch plan and their launch. gemm() runs them when
// the chosen config is a kWgmma or kMma entry of the config table.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/status.h"
#include "gemm_internal.h"
#include "kernels/one_token.h"

namespace fp4kit {
namespace detail {

// make_plan's prefill part, for the kWgmma or kMma entry `cfg`: kernel, block, shared memory, token tiles,
// the split tail (prefill_schedule for the device's `sms`), grid and workspace (split K: arrival counters
// and the partial tiles; wgmma: X in lane order). Fails with kNotSupported when this build carries no sm_90a
// code for a wgmma kernel.
Status plan_prefill(int64_t m, const PackedWeight& w, DType act, const KernelConfig& cfg, int sms, DecodePlan* plan);

// A planned prefill GEMM over all m tokens (a validated GemmArgs and its plan). wgmma: per pass of
// plan.pass_m tokens, X into lane order in the workspace, then one launch with X as a TMA tensor map built
// on the host and passed by value, so graph capture works. mma.sync: one launch reading X in place. No
// allocation, no host synchronisation.
Status launch_prefill(const GemmArgs& a, const DecodePlan& plan, cudaStream_t stream);

// The grouped (MoE) prefill GEMM: every expert's product over its contiguous rows of X in one launch.
struct GroupedPrefillPlan {
  const void* kernel = nullptr;
  bool mma = false;         // an mma.sync kernel (X in natural order, rows k long)
  bool bf16_wgmma = false;  // BF16 experts' wgmma kernel (X in natural order, rows k long)
                            // neither: the FP4 wgmma kernel (X in lane order, rows k_pad long)
  int threads = 0, smem_bytes = 0, bn = 0;
  int row_blocks = 0;  // of 128 weight rows
  int sms = 0;          // of the device
  PackedLayout layout;  // of one expert's matrix
};
// For experts of (format, n, k) with `act` activations, through the kWgmma or kMma table entry `cfg` (token
// tile 8 * cfg.n_tiles: 64, 128 or 256 (wgmma), 64 or 128 (mma.sync); no K split). kNotSupported when this
// build has no sm_90a code for a wgmma entry.
Status plan_prefill_grouped(Format f, DType act, int64_t n, int64_t k, const KernelConfig& cfg,
                            GroupedPrefillPlan* out);

// For BF16 experts [n, k] (plain row-major bfloat16) with bn-token tiles: with `wgmma` (the caller's choice:
// a Hopper device whose build carries sm_90a code) kernels/moe_bf16_wgmma.cuh, bn 64, 128 or 256; else
// kernels/moe_bf16_mma.cuh (every sm_80+ device), bn 64 or 128. X in natural order, rows k long; the
// layout holds only n and k (no prepack: every offset 0).
Status plan_grouped_bf16(int64_t n, int64_t k, int bn, bool wgmma, GroupedPrefillPlan* out);

struct GroupedPrefillArgs {
  const void* x = nullptr;  // [rows, k_pad] of act in lane order (layout::natural_pair; the mma.sync kernel:
                            // [rows, k] in natural order), the experts' rows one expert after another
  void* y = nullptr;        // [rows, n] of act, same row order
  int64_t rows = 0;
  // The token tiles of plan.bn rows, on the device (the MoE schedule's entries, moe_align.cuh): their
  // count, each one's expert and first row, and after the last tile's first row the rows of the pass.
  const int* n_tiles = nullptr;      // [1]
  const int* tile_expert = nullptr;  // [max_tiles]
  const int* tile_row = nullptr;     // [max_tiles + 1]
  int experts = 0;
  int max_tiles = 0;                 // the most token tiles any routing of the pass can need: the grid
  const void* base = nullptr;        // expert e's prepacked matrix at base + e * stride
  size_t stride = 0;
  const void* bias = nullptr;        // [experts, n] or null
  DType act = DType::kBF16;
  bool pdl = false;  // the wgmma kernel launched with programmatic dependent launch (launch.h)
  bool x_split = false;  // BF16 experts: x is launch_split_rows' rows (FP16 activations as hi and lo), act BF16
  // BF16 experts' wgmma kernel launched with PDL where every kernel that writes the schedule (n_tiles,
  // tile_expert, tile_row) has completed before this launch may start (the gather before gate_up triggers
  // after its wait; the activation before down starts only after gate_up has passed its own wait): the
  // kernel then reads the schedule and requests its first stages' weights before griddepcontrol.wait.
  bool early_w = false;
  // BF16 experts' wgmma kernel: its dependents may launch once its griddepcontrol.wait has returned (the
  // schedule's writers are then complete, which the next wgmma launch's early_w needs), not only at its end.
  bool early_trigger = false;
  // BF16 experts' wgmma kernel: one.ids non-null: a one-token pass (kernels/one_token.h; for gate_up, x is
  // the token's row).
  kernels::OneToken one{};
};
Status launch_prefill_grouped(const GroupedPrefillPlan& plan, const GroupedPrefillArgs& a, cudaStream_t stream);

// The launch of a kernel over rows of row_vecs 16-byte vectors, one vector per thread of kRowVectorThreads
// (lane order, the MoE's element-wise kernels): grid y covers a row's vectors, x strides over at most
// max_rows rows, up to 16 CTAs per SM in all (2048 threads). Few rows (a decode step's) still get a
// thread per vector.
constexpr int kRowVectorThreads = 128;
dim3 row_vector_grid(int64_t max_rows, int64_t row_vecs, int sms);

// Rows of X into lane order (kernels/lane_order.cuh): dst row r = src row map[r] (map null: row r) for
// r < rows, or < *n_rows when n_rows is given (read on the device; rows then bounds it), permuted and
// k_pad long; the grid is row_vector_grid(rows, ...); pdl: launched with programmatic dependent launch;
// natural: the rows as they are (k_pad = k), a gather only; late_trigger: the next kernel may launch only
// after this one's griddepcontrol.wait (GroupedPrefillArgs::early_w).
cudaError_t launch_lane_order(const void* src, const int* map, const int* n_rows, int64_t rows, Format f, int64_t k,
                              int64_t k_pad, void* dst, int sms, cudaStream_t stream, bool pdl, bool natural = false,
                              bool late_trigger = false);
// The same gather for BF16 experts with FP16 activations (kernels/lane_order.cuh, split_rows_kernel): FP16
// rows of k values into BF16 rows of split_x_row(k) values, each 64-K chunk's hi terms then its lo terms.
cudaError_t launch_split_rows(const void* src, const int* map, const int* n_rows, int64_t rows, int64_t k, void* dst,
                              int sms, cudaStream_t stream, bool pdl, bool late_trigger);
// A split X row's length: two terms of k rounded up to 64 (the kernels' stage K).
constexpr int64_t split_x_row(int64_t k) { return 2 * ((k + 63) / 64 * 64); }

// Whether this build runs the prefill kernel on the current device (sm_90a code present); cached. Where a
// Hopper device lacks it, make_plan dispatches as an sm_80-89 device would (no wgmma, no cluster entries).
bool prefill_runs_here();
// Whether this build runs sm_90 code of `kernel` on the current device (a compute_80 image JIT-compiled for
// Hopper has the sm_90-only paths compiled out). Checked once per device and kernel.
bool sm90_code_here(const void* kernel);

// Dynamic shared memory of a kMma entry's kernel (0 for other entries): make_plan's dispatch takes the
// 64-token entries where a device's shared memory per block is smaller.
int mma_prefill_smem(const KernelConfig& cfg);

}  // namespace detail
}  // namespace fp4kit
