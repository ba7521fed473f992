// launch.h: kernel launches, optionally with programmatic dependent launch (PDL).
//
// With PDL a kernel may be scheduled while the previous kernel of the stream drains: its CTAs become
// resident as the previous one's leave, request their weights (which no kernel writes) and wait
// (griddepcontrol.wait, decode_gemm.cuh) only before touching X, the workspace or Y. It is opt-in:
// FP4KIT_PDL=1 in the environment, on compute capability 9.x. Kernels launched without it are unaffected
// (their wait returns at once); a non-PDL kernel after a PDL one waits for it as usual.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace fp4kit {
namespace detail {

// FP4KIT_PDL=1 (read once) and a device of compute capability 9.x; the second form asks about the current
// device (cached per device; false where it cannot be queried).
bool pdl_enabled(int cc_major);
bool pdl_enabled_here();

// A failed launch is also the thread's last CUDA error: callers check cudaGetLastError() once after their
// launches.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*fn)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, fn, std::forward<Args>(args)...);
}

}  // namespace detail
}  // namespace fp4kit
