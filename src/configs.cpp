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

int pick_config(int64_t m, int64_t n, int64_t k, std::string* why) {
  (void)n;
  (void)k;
  const int64_t mb = m > 64 ? 64 : m;  // larger m runs in blocks of 64 tokens
  for (int i = 0; i < kNumKernelConfigs; ++i) {
    const KernelConfig& c = kKernelConfigs[i];
    if (8 * c.n_tiles >= mb) {
      if (why)
        *why = "m=" + std::to_string(m) + ": " + c.name + " (smallest n_tiles with 8*n_tiles >= " +
               std::to_string(mb) + (m > 64 ? ", 64-token blocks" : "") + ")";
      return c.id;
    }
  }
  return kKernelConfigs[kNumKernelConfigs - 1].id;
}

}  // namespace fp4kit
