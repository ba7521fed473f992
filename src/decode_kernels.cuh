// decode_kernels.cuh: config-table entry -> decode kernel instance, and its launch shape (gemm.cu, moe.cu).
#pragma once
#include <cstddef>

#include "configs.h"
#include "kernels/decode_gemm.cuh"
#include "kernels/decode_gemm_bulk.cuh"

namespace fp4kit {
namespace detail {

using DecodeKernelFn = void (*)(const kernels::DecodeParams);

// Entry I of kKernelConfigs as a kernel for (format, activation dtype), dense or grouped (MoE); null for
// the prefill entries (kWgmma, kMma: prefill.cu instantiates their kernels, one per token tile).
template <Format F, typename T, size_t I, bool kGrouped = false>
DecodeKernelFn decode_kernel_of() {
  constexpr KernelConfig c = kKernelConfigs[I];
  if constexpr (c.pipeline == kWgmma || c.pipeline == kMma)
    return nullptr;
  else if constexpr (c.pipeline == kCluster)
    return &kernels::decode_gemm_kernel<F, T, c.n_tiles, c.row_tiles, c.warps, c.min_blocks, c.chunks, c.stages,
                                        kGrouped, true>;
  else if constexpr (c.pipeline == kBulk)
    return &kernels::decode_gemm_bulk_kernel<F, T, c.n_tiles, c.row_tiles, c.warps, c.min_blocks, c.chunks, c.stages,
                                             kGrouped>;
  else
    return &kernels::decode_gemm_kernel<F, T, c.n_tiles, c.row_tiles, c.warps, c.min_blocks, c.chunks, c.stages,
                                        kGrouped>;
}

// Dynamic shared memory of a config's launch (grouped ring launches keep their scale records in registers).
inline int launch_smem_bytes(const KernelConfig& c, bool grouped = false) {
  if (c.pipeline == kBulk) return kernels::bulk_smem_bytes(c.warps, c.row_tiles, c.stages, c.n_tiles);
  return kernels::x_stage_bytes_for(c.n_tiles) + (grouped ? 0 : kernels::scale_stage_bytes_for(c.warps, c.row_tiles));
}

}  // namespace detail
}  // namespace fp4kit
