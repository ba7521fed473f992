#include "configs.h"

namespace fp4kit {

const KernelConfig* kernel_configs(int* count) {
  if (count) *count = kNumKernelConfigs;
  return kKernelConfigs;
}

const KernelConfig* find_config(int id) {
  for (int i = 0; i < kNumKernelConfigs; ++i)
    if (kKernelConfigs[i].id == id) return &kKernelConfigs[i];
  return nullptr;
}

int pick_config(int64_t m, int64_t n, int64_t k, std::string* why, int cc_major) {
  const int64_t mb = m > 64 ? 64 : m;  // larger m runs in blocks of 64 tokens
  const bool large = n * k >= (int64_t(1) << 28);
  int nt = 0;
  for (int i = 0; i < kNumKernelConfigs; ++i)
    if (config_supported(kKernelConfigs[i], cc_major) && 8 * kKernelConfigs[i].n_tiles >= mb &&
        (nt == 0 || kKernelConfigs[i].n_tiles < nt))
      nt = kKernelConfigs[i].n_tiles;
  if (nt == 0) return kKernelConfigs[kNumKernelConfigs - 1].id;
  const KernelConfig* pick = nullptr;
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (c.n_tiles != nt || !config_supported(c, cc_major)) continue;
    if (!pick || (large && c.row_tiles > pick->row_tiles)) pick = &c;
  }
  if (why)
    *why = "m=" + std::to_string(m) + ": " + pick->name + " (smallest n_tiles with 8*n_tiles >= " + std::to_string(mb) +
           (m > 64 ? ", 64-token blocks" : "") +
           (large ? "; >= 2^28 weights: most row tiles per warp" : "; first entry") + ")";
  return pick->id;
}

}  // namespace fp4kit
