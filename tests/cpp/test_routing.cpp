// test_routing.cpp: the routing reference (route_cpu) on hand-worked cases and on random logits against
// the definitions of fp4kit/routing.h, and every routing argument rule with its exact message. No device
// needed (the device kernel is compared with route_cpu in test_moe_gpu).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fp4kit/fp4kit.h"
#include "fp4kit/routing.h"
#include "testing.h"

using namespace fp4kit;

namespace {

struct Out {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

RouteArgs args(const void* logits, DType dt, int64_t T, int E, int k, Out& o) {
  o.ids.assign(size_t(T * k), 12345);
  o.w.assign(size_t(T * k), NAN);  // poisoned
  RouteArgs a;
  a.tokens = T;
  a.num_experts = E;
  a.top_k = k;
  a.routing.mode = RoutingMode::kSoftmaxTopK;
  a.routing.logits = logits;
  a.routing.logits_dtype = dt;
  a.topk_ids = o.ids.data();
  a.topk_weights = o.w.data();
  return a;
}

uint16_t to_bf16(float v) {  // exact for the values used here
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return uint16_t(b >> 16);
}
uint16_t to_f16(float v) {  // small integers only
  if (v == 0.0f) return 0;
  const int e = int(std::floor(std::log2(std::fabs(v))));
  const float m = std::fabs(v) / std::ldexp(1.0f, e) - 1.0f;
  return uint16_t((v < 0 ? 0x8000 : 0) | ((e + 15) << 10) | int(m * 1024.0f));
}

bool near(float a, double b, double tol = 1e-6) { return std::fabs(double(a) - b) <= tol * std::max(1.0, std::fabs(b)); }

}  // namespace

TEST(route_softmax_hand_worked) {
  const float lg[8] = {1, 3, 2, 3,   // token 0: a tie between experts 1 and 3
                       0, 0, 0, 5};  // token 1
  Out o;
  RouteArgs a = args(lg, DType::kF32, 2, 4, 2, o);
  CHECK_OK(route_cpu(a));
  CHECK_EQ(o.ids[0], 1);  // ties go to the lower id
  CHECK_EQ(o.ids[1], 3);
  CHECK(near(o.w[0], 0.5) && near(o.w[1], 0.5));
  CHECK_EQ(o.ids[2], 3);
  CHECK_EQ(o.ids[3], 0);
  const double e5 = std::exp(5.0);
  CHECK(near(o.w[2], e5 / (e5 + 1)) && near(o.w[3], 1 / (e5 + 1)));
  // Without renormalization: softmax over all four experts.
  a.routing.renormalize = false;
  CHECK_OK(route_cpu(a));
  const double d0 = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(near(o.w[0], std::exp(3.0) / d0) && near(o.w[1], std::exp(3.0) / d0));
  CHECK(near(o.w[2], e5 / (e5 + 3)) && near(o.w[3], 1 / (e5 + 3)));
  // The same logits as bfloat16 and float16: read exactly, the same result.
  for (DType dt : {DType::kBF16, DType::kF16}) {
    uint16_t h[8];
    for (int i = 0; i < 8; ++i) h[i] = dt == DType::kBF16 ? to_bf16(lg[i]) : to_f16(lg[i]);
    Out o2;
    RouteArgs b = args(h, dt, 2, 4, 2, o2);
    b.routing.renormalize = false;
    CHECK_OK(route_cpu(b));
    CHECK(o2.ids == o.ids);
    CHECK(o2.w == o.w);
  }
}

TEST(route_sigmoid_grouped_hand_worked) {
  // 8 experts in 4 groups of 2, keep 2 groups, pick 2. Scores: expert 0 sigmoid(ln 3) = 0.75, the rest
  // sigmoid(0) = 0.5. Keys (score + bias): 0.85 0.5 | 0.8 0.5 | 0.7 0.75 | 0.5 0.5; group keys 1.35,
  // 1.3, 1.45, 1.0 -> groups 2 and 0 -> experts 0 (0.85) and 5 (0.75). Expert 2 (0.8) is the second best
  // overall but its group is dropped.
  float lg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  lg[0] = std::log(3.0f);
  const float bias[8] = {0.1f, 0.0f, 0.3f, 0.0f, 0.2f, 0.25f, 0.0f, 0.0f};
  Out o;
  RouteArgs a = args(lg, DType::kF32, 1, 8, 2, o);
  a.routing.mode = RoutingMode::kSigmoidGroupedTopK;
  a.routing.n_group = 4;
  a.routing.topk_group = 2;
  a.routing.routed_scaling_factor = 2.5f;
  a.routing.correction_bias = bias;
  CHECK_OK(route_cpu(a));
  CHECK_EQ(o.ids[0], 0);
  CHECK_EQ(o.ids[1], 5);
  CHECK(near(o.w[0], 0.75 / 1.25 * 2.5, 1e-6) && near(o.w[1], 0.5 / 1.25 * 2.5, 1e-6));
  a.routing.renormalize = false;
  CHECK_OK(route_cpu(a));
  CHECK(near(o.w[0], 0.75 * 2.5, 1e-6) && near(o.w[1], 0.5 * 2.5, 1e-6));
  // Every group kept: the plain top-2 of the keys, experts 0 and 2.
  a.routing.topk_group = 4;
  CHECK_OK(route_cpu(a));
  CHECK_EQ(o.ids[0], 0);
  CHECK_EQ(o.ids[1], 2);
  // Groups of one: a group's key is its expert's key.
  a.routing.n_group = 8;
  a.routing.topk_group = 3;
  a.top_k = 3;
  o.ids.assign(3, 0);
  o.w.assign(3, 0.0f);
  a.topk_ids = o.ids.data();
  a.topk_weights = o.w.data();
  CHECK_OK(route_cpu(a));
  CHECK_EQ(o.ids[0], 0);
  CHECK_EQ(o.ids[1], 2);
  CHECK_EQ(o.ids[2], 5);
}

TEST(route_nan_logit_gives_invalid_ids) {
  const float lg[6] = {1, NAN, 2, 0, 1, 2};
  Out o;
  RouteArgs a = args(lg, DType::kF32, 2, 3, 2, o);
  CHECK_OK(route_cpu(a));
  CHECK(o.ids[0] == -1 && o.ids[1] == -1 && std::isnan(o.w[0]) && std::isnan(o.w[1]));
  CHECK(o.ids[2] == 2 && o.ids[3] == 1 && !std::isnan(o.w[2]));  // the next token is routed normally
}

// Random logits: the properties the definitions imply, checked independently of how route_cpu sorts.
TEST(route_random_properties) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int E : {1, 8, 128, 256, 1024}) {
    for (int k : {1, 2, 4, 8, 32}) {
      if (k > E) continue;
      const int T = 5;
      std::vector<float> lg(size_t(T * E));
      for (auto& v : lg) v = nd(fp4test::rng());
      Out o;
      RouteArgs a = args(lg.data(), DType::kF32, T, E, k, o);
      a.routing.renormalize = (E + k) % 2 == 0;
      CHECK_OK(route_cpu(a));
      bool ok = true;
      for (int t = 0; t < T; ++t) {
        const float* l = lg.data() + t * E;
        std::vector<bool> taken(size_t(E), false);
        double sum_all = 0, sum_sel = 0;
        const float mx = *std::max_element(l, l + E);
        for (int e = 0; e < E; ++e) sum_all += std::exp(double(l[e]) - mx);
        for (int j = 0; j < k; ++j) sum_sel += std::exp(double(l[o.ids[size_t(t * k + j)]]) - mx);
        for (int j = 0; j < k; ++j) {
          const int id = o.ids[size_t(t * k + j)];
          ok &= id >= 0 && id < E && !taken[size_t(id)];
          if (!(id >= 0 && id < E)) break;
          taken[size_t(id)] = true;
          if (j > 0) ok &= l[o.ids[size_t(t * k + j - 1)]] >= l[id];
          const double want = std::exp(double(l[id]) - mx) / (a.routing.renormalize ? sum_sel : sum_all);
          // fp32 sums of up to E terms (the reference's) against fp64: relative.
          ok &= std::fabs(o.w[size_t(t * k + j)] - want) <= 1e-4 * want;
        }
        const float kth = l[o.ids[size_t(t * k + k - 1)]];
        for (int e = 0; e < E; ++e) ok &= taken[size_t(e)] || l[e] <= kth;
      }
      CHECK_MSG(ok, "E=" << E << " k=" << k);
    }
  }
}

TEST(route_argument_rules) {
  float lg[64] = {};
  Out o;
  auto good = [&] { return args(lg, DType::kF32, 2, 8, 2, o); };
  RouteArgs a = good();
  CHECK_OK(route_validate(a));
  a.routing.mode = RoutingMode::kNone;
  CHECK_ERROR(route_validate(a), "routing.mode: must be RoutingMode::kSoftmaxTopK or kSigmoidGroupedTopK (got 0)");
  a = good();
  a.tokens = 0;
  CHECK_ERROR(route_validate(a), "tokens: must be >= 1 (got 0)");
  a = good();
  a.num_experts = 1025;
  CHECK_ERROR(route_validate(a), "num_experts: routing takes 1 to 1024 experts (got 1025)");
  a = good();
  a.top_k = 9;
  CHECK_ERROR(route_validate(a), "top_k: routing takes 1 to min(num_experts = 8, 32) (got 9)");
  a = good();
  a.routing.logits = nullptr;
  CHECK_ERROR(route_validate(a), "routing.logits: must not be null");
  a = good();
  a.routing.logits = reinterpret_cast<const char*>(lg) + 2;
  CHECK_ERROR(route_validate(a), "routing.logits: must be aligned to 4 bytes for float32");
  a = good();
  a.routing.logits_dtype = DType(7);
  CHECK_ERROR(route_validate(a), "routing.logits_dtype: must be float32, bfloat16 or float16 (got 7)");
  a = good();
  a.routing.n_group = 2;
  CHECK_ERROR(route_validate(a), "routing.n_group: applies to RoutingMode::kSigmoidGroupedTopK only");
  a = good();
  a.routing.correction_bias = lg;
  CHECK_ERROR(route_validate(a), "routing.correction_bias: applies to RoutingMode::kSigmoidGroupedTopK only");
  a = good();
  a.routing.routed_scaling_factor = 2.0f;
  CHECK_ERROR(route_validate(a), "routing.routed_scaling_factor: applies to RoutingMode::kSigmoidGroupedTopK only");
  a = good();
  a.routing.mode = RoutingMode::kSigmoidGroupedTopK;
  a.routing.n_group = 3;
  CHECK_ERROR(route_validate(a), "routing.n_group: must divide num_experts = 8 (got 3)");
  a.routing.n_group = 4;
  a.routing.topk_group = 5;
  CHECK_ERROR(route_validate(a), "routing.topk_group: must be in [1, n_group = 4] (got 5)");
  a.routing.topk_group = 1;
  a.top_k = 3;
  CHECK_ERROR(route_validate(a), "top_k: must be <= topk_group * experts per group = 1 * 2 (got 3)");
  a.top_k = 2;
  CHECK_OK(route_validate(a));
  a.routing.routed_scaling_factor = 0.0f;
  CHECK_ERROR(route_validate(a), "routing.routed_scaling_factor: must be positive and finite");
  a.routing.routed_scaling_factor = INFINITY;
  CHECK_ERROR(route_validate(a), "routing.routed_scaling_factor: must be positive and finite");
  a.routing.routed_scaling_factor = 1.0f;
  a.routing.correction_bias = reinterpret_cast<const float*>(reinterpret_cast<const char*>(lg) + 2);
  CHECK_ERROR(route_validate(a), "routing.correction_bias: must be 4-byte aligned");
  a = good();
  a.topk_ids = nullptr;
  CHECK_ERROR(route_validate(a), "topk_ids: must be a non-null, 4-byte aligned pointer");
  a = good();
  a.topk_weights = nullptr;
  CHECK_ERROR(route_validate(a), "topk_weights: must be a non-null, 4-byte aligned pointer");
  a = good();
  a.topk_weights = reinterpret_cast<float*>(o.ids.data());
  CHECK_ERROR(route_validate(a), "topk_weights: must not overlap topk_ids");
  a = good();
  a.topk_ids = reinterpret_cast<int32_t*>(lg);
  CHECK_ERROR(route_validate(a), "topk_ids: must not overlap routing.logits");
  // route() validates before it touches the device: the same message without a GPU.
  a = good();
  a.tokens = -1;
  CHECK_ERROR(route(a, nullptr), "tokens: must be >= 1 (got -1)");
  CHECK_ERROR(route_cpu(a), "tokens: must be >= 1 (got -1)");
}

// The C ABI: the same rules through a status code and fp4kit_last_error() (no device needed to fail).
TEST(route_c_abi_rules) {
  float lg[16] = {};
  int32_t ids[4];
  float w[4];
  CHECK_EQ(fp4kit_route(static_cast<fp4kit_routing_mode>(0), 2, 8, 2, lg, FP4KIT_F32, 1, 1, 1, 1.0f, nullptr, ids, w,
                        nullptr),
           1);
  CHECK(std::string(fp4kit_last_error()).find("mode: not a valid enumerator") != std::string::npos);
  CHECK_EQ(fp4kit_route(FP4KIT_ROUTE_SOFTMAX, 2, 8, 2, lg, static_cast<fp4kit_dtype>(5), 1, 1, 1, 1.0f, nullptr, ids,
                        w, nullptr),
           1);
  CHECK(std::string(fp4kit_last_error()).find("logits_dtype: not a valid enumerator") != std::string::npos);
  CHECK_EQ(fp4kit_route(FP4KIT_ROUTE_SOFTMAX, 2, 8, 9, lg, FP4KIT_F32, 1, 1, 1, 1.0f, nullptr, ids, w, nullptr), 1);
  CHECK(std::string(fp4kit_last_error()).find("top_k: routing takes 1 to min(num_experts = 8, 32) (got 9)") !=
        std::string::npos);
  CHECK_EQ(fp4kit_route(FP4KIT_ROUTE_SIGMOID_GROUPED, 2, 8, 2, lg, FP4KIT_F32, 1, 3, 1, 1.0f, nullptr, ids, w, nullptr),
           1);
  CHECK(std::string(fp4kit_last_error()).find("routing.n_group: must divide num_experts = 8 (got 3)") !=
        std::string::npos);
}

TEST_MAIN()
