// routing_cpu.cpp: route_validate() and route_cpu(), the spec-level reference of fp4kit/routing.h,
// written from the definitions there (stable sorts, fp32 throughout), not from the device kernel.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "fp4kit/routing.h"
#include "quant_common.h"  // load_elem: exact bf16 / fp16 -> fp32
#include "routing_common.h"

namespace fp4kit {

namespace {

float logit_at(const Routing& r, int64_t i) {
  switch (r.logits_dtype) {
    case DType::kBF16: return quant_detail::load_elem<DType::kBF16>(r.logits, i);
    case DType::kF16: return quant_detail::load_elem<DType::kF16>(r.logits, i);
    default: return quant_detail::load_elem<DType::kF32>(r.logits, i);
  }
}

// Indices of `key` by descending value, ties to the lower index (a stable sort).
std::vector<int> order_desc(const std::vector<float>& key) {
  std::vector<int> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[size_t(a)] > key[size_t(b)]; });
  return idx;
}

void route_token(const Routing& r, const float* lg, int E, int k, int32_t* ids, float* w) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int e = 0; e < E; ++e) {
    if (std::isnan(lg[e])) {
      for (int j = 0; j < k; ++j) {
        ids[j] = -1;
        w[j] = nan;
      }
      return;
    }
  }
  if (r.mode == RoutingMode::kSoftmaxTopK) {
    const std::vector<float> key(lg, lg + E);
    const std::vector<int> top = order_desc(key);
    // Softmax over all experts (or, renormalized, over the chosen ones), shifted by the largest logit.
    const float m = key[size_t(top[0])];
    float sum = 0.0f;
    const int over = r.renormalize ? k : E;
    for (int j = 0; j < over; ++j) sum += std::exp(key[size_t(top[size_t(j)])] - m);
    for (int j = 0; j < k; ++j) {
      ids[j] = top[size_t(j)];
      w[j] = std::exp(key[size_t(top[size_t(j)])] - m) / sum;
    }
    return;
  }
  std::vector<float> score(size_t(E), 0.0f), key(size_t(E), 0.0f);
  for (int e = 0; e < E; ++e) {
    score[size_t(e)] = 1.0f / (1.0f + std::exp(-lg[e]));
    key[size_t(e)] = score[size_t(e)] + (r.correction_bias ? r.correction_bias[e] : 0.0f);
  }
  const int gsize = E / r.n_group;
  std::vector<float> gkey(size_t(r.n_group), 0.0f);
  for (int g = 0; g < r.n_group; ++g) {
    std::vector<float> v(key.begin() + g * gsize, key.begin() + (g + 1) * gsize);
    std::sort(v.begin(), v.end(), std::greater<float>());
    gkey[size_t(g)] = gsize == 1 ? v[0] : v[0] + v[1];
  }
  const std::vector<int> groups = order_desc(gkey);
  std::vector<bool> keep(size_t(r.n_group), false);
  for (int j = 0; j < r.topk_group; ++j) keep[size_t(groups[size_t(j)])] = true;
  std::vector<float> masked(key);
  for (int e = 0; e < E; ++e)
    if (!keep[size_t(e / gsize)]) masked[size_t(e)] = -std::numeric_limits<float>::infinity();
  const std::vector<int> top = order_desc(masked);
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += score[size_t(top[size_t(j)])];
  for (int j = 0; j < k; ++j) {
    ids[j] = top[size_t(j)];
    const float s = score[size_t(top[size_t(j)])];
    w[j] = (r.renormalize ? s / sum : s) * r.routed_scaling_factor;
  }
}

}  // namespace

Status route_validate(const RouteArgs& a) { return detail::check_route_args(a); }

Status route_cpu(const RouteArgs& a) {
  FP4KIT_RETURN_IF_ERROR(detail::check_route_args(a));
  const int E = a.num_experts, k = a.top_k;
  std::vector<float> lg(size_t(E), 0.0f);
  for (int64_t t = 0; t < a.tokens; ++t) {
    for (int e = 0; e < E; ++e) lg[size_t(e)] = logit_at(a.routing, t * E + e);
    route_token(a.routing, lg.data(), E, k, a.topk_ids + t * k, a.topk_weights + t * k);
  }
  return Status::Ok();
}

}  // namespace fp4kit
