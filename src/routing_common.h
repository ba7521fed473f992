// routing_common.h: the routing argument rules (fp4kit/routing.h), shared by route(), route_cpu() and
// fused_moe's routing from logits. Host only, no device query.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "fp4kit/routing.h"
#include "quant_common.h"   // quant_detail::aligned
#include "repack_common.h"  // detail::str

namespace fp4kit {
namespace detail {

using quant_detail::aligned;

// Whether the byte ranges [a, a + na) and [b, b + nb) share a byte.
inline bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return pa < pb + nb && pb < pa + na;
}
// The bytes of router logits [tokens, experts].
inline size_t logits_bytes(const Routing& r, int64_t tokens, int experts) {
  return size_t(tokens) * size_t(experts) * size_t(dtype_bytes(r.logits_dtype));
}

// The rules that size things: the mode, and the expert and slot counts routing takes.
inline Status check_routing_shape(RoutingMode mode, int experts, int top_k, const std::string& nm) {
  if (mode != RoutingMode::kSoftmaxTopK && mode != RoutingMode::kSigmoidGroupedTopK)
    return Status::Invalid(nm + ".mode: must be RoutingMode::kSoftmaxTopK or kSigmoidGroupedTopK (got " +
                           std::to_string(int(mode)) + ")");
  if (experts < 1 || experts > kRoutingMaxExperts)
    return Status::Invalid("num_experts: routing takes 1 to " + std::to_string(kRoutingMaxExperts) + " experts (got " +
                           std::to_string(experts) + ")");
  if (top_k < 1 || top_k > experts || top_k > kRoutingMaxTopK)
    return Status::Invalid("top_k: routing takes 1 to min(num_experts = " + std::to_string(experts) + ", " +
                           std::to_string(kRoutingMaxTopK) + ") (got " + std::to_string(top_k) + ")");
  return Status::Ok();
}

// Every rule on `r` for T tokens, E experts and top_k slots; `nm` prefixes the field names ("routing").
inline Status check_routing(const Routing& r, int64_t tokens, int experts, int top_k, const std::string& nm) {
  FP4KIT_RETURN_IF_ERROR(check_routing_shape(r.mode, experts, top_k, nm));
  if (tokens < 1) return Status::Invalid("tokens: must be >= 1 (got " + str(tokens) + ")");
  if (tokens > INT32_MAX) return Status::Invalid("tokens: must be < 2^31 (got " + str(tokens) + ")");
  if (r.logits_dtype != DType::kF32 && r.logits_dtype != DType::kBF16 && r.logits_dtype != DType::kF16)
    return Status::Invalid(nm + ".logits_dtype: must be float32, bfloat16 or float16 (got " +
                           std::to_string(int(r.logits_dtype)) + ")");
  if (!r.logits) return Status::Invalid(nm + ".logits: must not be null ([tokens, num_experts])");
  if (!aligned(r.logits, size_t(dtype_bytes(r.logits_dtype))))
    return Status::Invalid(nm + ".logits: must be aligned to " + std::to_string(dtype_bytes(r.logits_dtype)) +
                           " bytes for " + dtype_name(r.logits_dtype));
  if (r.mode == RoutingMode::kSoftmaxTopK) {
    const char* only = ": applies to RoutingMode::kSigmoidGroupedTopK only (leave it at its default with kSoftmaxTopK)";
    if (r.n_group != 1) return Status::Invalid(nm + ".n_group" + only);
    if (r.topk_group != 1) return Status::Invalid(nm + ".topk_group" + only);
    if (r.routed_scaling_factor != 1.0f) return Status::Invalid(nm + ".routed_scaling_factor" + only);
    if (r.correction_bias) return Status::Invalid(nm + ".correction_bias" + only);
    return Status::Ok();
  }
  if (r.n_group < 1 || r.n_group > experts || experts % r.n_group != 0)
    return Status::Invalid(nm + ".n_group: must divide num_experts = " + std::to_string(experts) + " (got " +
                           std::to_string(r.n_group) + ")");
  if (r.topk_group < 1 || r.topk_group > r.n_group)
    return Status::Invalid(nm + ".topk_group: must be in [1, n_group = " + std::to_string(r.n_group) + "] (got " +
                           std::to_string(r.topk_group) + ")");
  const int per_group = experts / r.n_group;
  if (top_k > r.topk_group * per_group)
    return Status::Invalid("top_k: must be <= topk_group * experts per group = " + std::to_string(r.topk_group) +
                           " * " + std::to_string(per_group) + " (got " + std::to_string(top_k) + ")");
  if (!(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0.0f))
    return Status::Invalid(nm + ".routed_scaling_factor: must be positive and finite");
  if (r.correction_bias && !aligned(r.correction_bias, 4))
    return Status::Invalid(nm + ".correction_bias: must be 4-byte aligned (float32 [num_experts])");
  return Status::Ok();
}

inline Status check_route_args(const RouteArgs& a) {
  FP4KIT_RETURN_IF_ERROR(check_routing(a.routing, a.tokens, a.num_experts, a.top_k, "routing"));
  if (!a.topk_ids || !aligned(a.topk_ids, 4))
    return Status::Invalid("topk_ids: must be a non-null, 4-byte aligned pointer (int32 [tokens, top_k])");
  if (!a.topk_weights || !aligned(a.topk_weights, 4))
    return Status::Invalid("topk_weights: must be a non-null, 4-byte aligned pointer (float32 [tokens, top_k])");
  const size_t out = size_t(a.tokens) * size_t(a.top_k) * 4;
  const void* lg = a.routing.logits;
  const size_t lg_bytes = logits_bytes(a.routing, a.tokens, a.num_experts);
  if (overlaps(a.topk_ids, out, a.topk_weights, out)) return Status::Invalid("topk_weights: must not overlap topk_ids");
  if (overlaps(a.topk_ids, out, lg, lg_bytes)) return Status::Invalid("topk_ids: must not overlap routing.logits");
  if (overlaps(a.topk_weights, out, lg, lg_bytes))
    return Status::Invalid("topk_weights: must not overlap routing.logits");
  return Status::Ok();
}

}  // namespace detail
}  // namespace fp4kit
