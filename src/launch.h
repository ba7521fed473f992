// launch.h: kernel launches, optionally with programmatic dependent launch (PDL).
//
// With PDL a kernel may be scheduled while the previous kernel of the stream drains: its CTAs become
// resident as the previous one's leave, request their weights (which no kernel writes) and wait
// (griddepcontrol.wait, decode_gemm.cuh) only before touching X, the workspace or Y. Compute capability
// 9.x only; pdl_enabled below says when. Kernels launched without it are unaffected (their wait returns
// at once); a non-PDL kernel after a PDL one waits for it as usual.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace fp4kit {
namespace detail {

// Whether launches use PDL: a device of compute capability 9.x, and FP4KIT_PDL=1, or FP4KIT_PDL unset
// (or neither 0 nor 1) where the caller's default is on; FP4KIT_PDL=0 turns it off everywhere. The
// defaults: on for the fused MoE with FP4 experts and for dense prefill calls of one pass and at most one
// wave of CTAs, off for the other dense GEMMs and BF16 experts (README). The second form asks about the
// current device (false where it cannot be queried).
bool pdl_enabled(int cc_major, bool by_default);
bool pdl_enabled_here(bool by_default);

// A failed launch is also the thread's last CUDA error: callers check cudaGetLastError() once after their
// launches. `cluster` > 1: the grid in clusters of that many CTAs along x (sm_90).
template <typename... Params, typename... Args>
cudaError_t launch_kernel_cluster(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                  bool pdl, int cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(cluster);
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, fn, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
  return launch_kernel_cluster(fn, grid, block, smem, stream, pdl, 1, std::forward<Args>(args)...);
}

}  // namespace detail
}  // namespace fp4kit
