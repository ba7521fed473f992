// configs.h: the one table of decode-GEMM kernel configs.
//
// The dispatcher, the tests (every entry is tested), the benchmark and the tuner all read this table.
// An entry is instantiated for {NVFP4, MXFP4} x {BF16, FP16}; keep it short: each one costs compile time
// and must earn its place in a benchmark.
#pragma once
#include <cstdint>
#include <string>

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
                    // whole K slices into a shared-memory ring with cp.async.bulk + mbarriers (sm_90)
};

enum Pipeline : int { kRing = 0, kBulk = 1 };

// Whether a device of compute capability major.minor runs the config (the bulk pipeline is built for
// sm_90a only).
constexpr bool config_supported(const KernelConfig& c, int cc_major) { return c.pipeline == kRing || cc_major == 9; }

// The table. Kernels are instantiated from it at compile time (gemm.cu), so it is the only place a
// config is written down.
// id, name, n_tiles, row_tiles/warp, warps (consumer warps for kBulk), min CTAs/SM, chunks per stage, stages, pipeline
// Order matters: for each n_tiles the first entry is the dispatcher's default, except on large layers
// (see pick_config).
inline constexpr KernelConfig kKernelConfigs[] = {
    {0, "m8_r1_w8_b3_c8x1", 1, 1, 8, 3, 8, 1, kRing},
    {1, "m8_r1_w8_b3_c4x2", 1, 1, 8, 3, 4, 2, kRing},
    {2, "m8_r1_w8_b3_c2x4", 1, 1, 8, 3, 2, 4, kRing},
    {4, "m16_r1_w8_b2_c4x2", 2, 1, 8, 2, 4, 2, kRing},
    {3, "m16_r2_w8_b2_c4x2", 2, 2, 8, 2, 4, 2, kRing},
    {5, "m16_r1_w8_b3_c4x2", 2, 1, 8, 3, 4, 2, kRing},
    {6, "m32_r2_w8_b2_c2x2", 4, 2, 8, 2, 2, 2, kRing},
    {7, "m32_r1_w8_b2_c4x2", 4, 1, 8, 2, 4, 2, kRing},
    {8, "m64_r2_w8_b1_c4x2", 8, 2, 8, 1, 4, 2, kRing},
    {9, "m64_r2_w8_b1_c8x1", 8, 2, 8, 1, 8, 1, kRing},
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
};
inline constexpr int kNumKernelConfigs = int(sizeof(kKernelConfigs) / sizeof(kKernelConfigs[0]));

// The table (static storage, `count` entries).
const KernelConfig* kernel_configs(int* count);
const KernelConfig* find_config(int id);

// Analytic default: the smallest n_tiles that covers m (m > 64 runs in 64-token blocks), then the entry
// the table lists first for it; on layers of >= 2^28 weights the first entry with the most row tiles per
// warp (B fragments reused over two row tiles pay where row groups are plentiful: measured on Llama-70B
// gate_up at m = 16, 104 vs 111 us; on every smaller layer one row tile per warp was faster). `why` (optional) receives a one-line explanation.
// Only entries the device runs are considered (cc_major: the device's compute capability major).
int pick_config(int64_t m, int64_t n, int64_t k, std::string* why = nullptr, int cc_major = 9);

}  // namespace fp4kit
