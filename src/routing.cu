// routing.cu: route() (fp4kit/routing.h) and the launch fused_moe shares; the kernel is
// kernels/moe_routing.cuh, the reference routing_cpu.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "fp4kit/routing.h"
#include "kernels/moe_routing.cuh"
#include "launch.h"
#include "routing_common.h"
#include "routing_internal.h"

namespace fp4kit {
namespace detail {

cudaError_t launch_route(const Routing& r, int64_t tokens, int experts, int top_k, int32_t* ids, float* weights,
                         cudaStream_t stream, bool pdl) {
  const kernels::RouteParams p = kernels::route_params(r, tokens, experts, top_k, ids, weights);
  const dim3 grid(unsigned((tokens + kernels::kRouteWarps - 1) / kernels::kRouteWarps));
  const dim3 block(kernels::kRouteWarps * 32);
  const size_t smem = kernels::kRouteWarps * kernels::route_smem_floats_per_warp(experts, p.n_group) * sizeof(float);
  switch (r.logits_dtype) {
    case DType::kBF16: return launch_kernel(kernels::route_kernel<__nv_bfloat16>(experts), grid, block, smem, stream, pdl, p);
    case DType::kF16: return launch_kernel(kernels::route_kernel<__half>(experts), grid, block, smem, stream, pdl, p);
    default: return launch_kernel(kernels::route_kernel<float>(experts), grid, block, smem, stream, pdl, p);
  }
}

}  // namespace detail

Status route(const RouteArgs& a, cudaStream_t stream) {
  FP4KIT_RETURN_IF_ERROR(detail::check_route_args(a));
  const cudaError_t e =
      detail::launch_route(a.routing, a.tokens, a.num_experts, a.top_k, a.topk_ids, a.topk_weights, stream, false);
  if (e != cudaSuccess) return Status(Code::kCudaError, std::string("route launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace fp4kit
