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
};

// The table (static storage, `count` entries).
const KernelConfig* kernel_configs(int* count);
const KernelConfig* find_config(int id);

// Analytic default: the smallest n_tiles that covers m (m > 64 runs in 64-token blocks), then the entry
// the table lists first for it. `why` (optional) receives a one-line explanation.
int pick_config(int64_t m, int64_t n, int64_t k, std::string* why = nullptr);

}  // namespace fp4kit
