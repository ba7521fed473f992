// fp4kit/routing.h: Mixture-of-Experts routing, router logits [T, E] -> top-k expert ids and weights.
//
//   kSoftmaxTopK (gpt-oss, Mixtral, Qwen3-MoE):
//     ids     = the top_k experts with the largest logits, by descending logit, ties to the lower id;
//     weights = softmax(logits) at those experts; renormalize: divided by their sum (the same as a
//               softmax over the selected logits, gpt-oss's formulation).
//   kSigmoidGroupedTopK (DeepSeek-V3):
//     score = sigmoid(logit); the selection key is score + correction_bias[e] (0 without a bias);
//     the E experts form n_group groups of E / n_group consecutive ids, a group's key is the sum of its
//     two largest selection keys (the largest alone in groups of one); the topk_group groups with the
//     largest keys are kept (ties to the lower group), and the top_k experts of the kept groups with the
//     largest selection keys are chosen (by descending key, ties to the lower id);
//     weights = their scores (without the bias), renormalize: divided by their sum; then times
//     routed_scaling_factor.
//   All arithmetic in fp32; logits may be float32, bfloat16 or float16 (read exactly). A token with a NaN
//   logit gets ids -1 and NaN weights in every slot (fused_moe then makes its output row NaN: an id
//   outside [0, E) does).
//
// route() runs one warp per token on the device (no host synchronisation, CUDA-graph safe, no
// workspace); route_cpu() is the spec-level reference on host memory. fused_moe() routes from logits
// itself when MoEArgs::routing.mode is not kNone (fp4kit/moe.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/formats.h"
#include "fp4kit/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace fp4kit {

enum class RoutingMode : int {
  kNone = 0,               // no routing: fused_moe takes topk_ids / topk_weights as given
  kSoftmaxTopK = 1,        // softmax, then top-k (optionally renormalized)
  kSigmoidGroupedTopK = 2, // DeepSeek-V3: sigmoid, grouped top-k, renormalization, routed scaling factor
};

// Limits of route() and route_cpu() (and of fused_moe's routing).
constexpr int kRoutingMaxExperts = 1024;
constexpr int kRoutingMaxTopK = 32;

// How router logits become top-k ids and weights (fields past `renormalize`: kSigmoidGroupedTopK only,
// left at their defaults with kSoftmaxTopK).
struct Routing {
  RoutingMode mode = RoutingMode::kNone;
  const void* logits = nullptr;      // [T, E] row-major, logits_dtype
  DType logits_dtype = DType::kF32;  // kF32, kBF16 or kF16
  bool renormalize = true;
  int n_group = 1;                   // groups of E / n_group consecutive experts
  int topk_group = 1;                // groups kept per token
  float routed_scaling_factor = 1.0f;
  const float* correction_bias = nullptr;  // [E] fp32, or null
};

struct RouteArgs {
  int64_t tokens = 0;   // T
  int num_experts = 0;  // E, <= kRoutingMaxExperts
  int top_k = 0;        // <= kRoutingMaxTopK
  Routing routing;
  int32_t* topk_ids = nullptr;    // [T, top_k] out
  float* topk_weights = nullptr;  // [T, top_k] out
};

// Checks every argument (no device needed; messages name the argument and the rule).
Status route_validate(const RouteArgs& a);
// Device pointers; asynchronous on `stream`.
Status route(const RouteArgs& a, cudaStream_t stream);
// Host pointers: the reference.
Status route_cpu(const RouteArgs& a);

}  // namespace fp4kit
