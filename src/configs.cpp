#include "configs.h"

namespace fp4kit {

namespace {
// id, name, n_tiles, row_tiles/warp, warps, min CTAs/SM
constexpr KernelConfig kTable[] = {
    {0, "m8_r1_w8", 1, 1, 8, 1},
    {1, "m16_r1_w8", 2, 1, 8, 1},
    {2, "m32_r1_w8", 4, 1, 8, 1},
    {3, "m64_r1_w8", 8, 1, 8, 1},
    {4, "m16_r2_w8", 2, 2, 8, 1},
};
constexpr int kCount = int(sizeof(kTable) / sizeof(kTable[0]));
}  // namespace

const KernelConfig* kernel_configs(int* count) {
  if (count) *count = kCount;
  return kTable;
}

const KernelConfig* find_config(int id) {
  for (const auto& c : kTable)
    if (c.id == id) return &c;
  return nullptr;
}

int pick_config(int64_t m, int64_t n, int64_t k, std::string* why) {
  (void)n;
  (void)k;
  const int64_t mb = m > 64 ? 64 : m;  // larger m runs in blocks of 64 tokens
  for (const auto& c : kTable) {
    if (8 * c.n_tiles >= mb) {
      if (why)
        *why = "m=" + std::to_string(m) + ": " + c.name + " (smallest n_tiles with 8*n_tiles >= " +
               std::to_string(mb) + (m > 64 ? ", 64-token blocks" : "") + ")";
      return c.id;
    }
  }
  return kTable[kCount - 1].id;
}

}  // namespace fp4kit
