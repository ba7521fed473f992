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
  int chunks;       // 16-byte records loaded per row tile before computing (8: a whole K slice; 4: half)
};

// The table. Kernels are instantiated from it at compile time (gemm.cu), so it is the only place a
// config is written down.
// id, name, n_tiles, row_tiles/warp, warps, min CTAs/SM, chunks per load
// Order matters: for each n_tiles the first entry is the dispatcher's default.
inline constexpr KernelConfig kKernelConfigs[] = {
    {0, "m8_r1_w8_b3_c8", 1, 1, 8, 3, 8},
    {1, "m8_r1_w8_b4_c4", 1, 1, 8, 4, 4},
    {2, "m16_r2_w8_b2_c8", 2, 2, 8, 2, 8},
    {3, "m16_r1_w8_b3_c8", 2, 1, 8, 3, 8},
    {4, "m16_r1_w8_b4_c4", 2, 1, 8, 4, 4},
    {5, "m32_r2_w8_b2_c4", 4, 2, 8, 2, 4},
    {6, "m64_r2_w8_b1_c8", 8, 2, 8, 1, 8},
    {7, "m64_r1_w8_b2_c4", 8, 1, 8, 2, 4},
};
inline constexpr int kNumKernelConfigs = int(sizeof(kKernelConfigs) / sizeof(kKernelConfigs[0]));

// The table (static storage, `count` entries).
const KernelConfig* kernel_configs(int* count);
const KernelConfig* find_config(int id);

// Analytic default: the smallest n_tiles that covers m (m > 64 runs in 64-token blocks), then the entry
// the table lists first for it. `why` (optional) receives a one-line explanation.
int pick_config(int64_t m, int64_t n, int64_t k, std::string* why = nullptr);

}  // namespace fp4kit
