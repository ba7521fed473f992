// routing_internal.h: the routing kernel's launch, shared by route() and fused_moe (not public API).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fp4kit/routing.h"

namespace fp4kit {
namespace detail {

// Launches kernels/moe_route_kernel for checked arguments (routing_common.h); returns the launch error.
cudaError_t launch_route(const Routing& r, int64_t tokens, int experts, int top_k, int32_t* ids, float* weights,
                         cudaStream_t stream, bool pdl);

}  // namespace detail
}  // namespace fp4kit
