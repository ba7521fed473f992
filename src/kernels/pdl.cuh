// pdl.cuh: programmatic dependent launch from inside a kernel (launch.h sets it up on the host).
#pragma once

namespace fp4kit {
namespace kernels {

// ---- Programmatic dependent launch (sm_90; no-ops elsewhere and when the launch did not ask for it) ---
// A kernel launched with the programmatic-stream-serialisation attribute may start while the previous
// kernel in the stream still runs: it must call griddep_wait() before it reads anything a previous kernel
// wrote or writes anything a previous kernel reads; data that no kernel writes (the prepacked weights) may
// be read before. griddep_launch_dependents() lets the next such kernel start as soon as every CTA of
// this one has called it (its own wait still waits for this grid's completion and memory).
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The dependents may launch before this kernel's wait, or (late) only once it has returned: every kernel
// before this one is then complete when a dependent starts, so the dependent may read those kernels'
// outputs before its own wait (moe.cu: BF16 experts' early_w, kernels::OneToken::early_down).
__device__ __forceinline__ void griddep_trigger_and_wait(bool late) {
  if (!late) griddep_launch_dependents();
  griddep_wait();
  if (late) griddep_launch_dependents();
}

}  // namespace kernels
}  // namespace fp4kit
