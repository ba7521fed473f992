// test_route_kernel_host.cpp: the routing kernel's own source (kernels/moe_routing.cuh) run on the host,
// one std::thread per lane of a warp, against route_cpu. Shuffles, votes and __syncwarp become exchanges
// through a barrier of the 32 threads, which is exact for this kernel: every warp-wide call sits on
// control flow that all lanes of a warp take together (the kernel relies on that on the device too). So
// the kernel's logic (strides, argmax, group masks, weights) is tested without a GPU; test_moe_gpu runs
// the compiled kernel on the device against the same definitions.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp4kit/routing.h"
#include "testing.h"

// ---- a host warp: CUDA's spellings for what the kernel uses --------------------------------------------
#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#undef __shared__
#define __shared__
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace hostwarp {
struct Index {
  unsigned x = 0, y = 0, z = 0;
};
thread_local Index thread_idx, block_idx;

// A reusable barrier of the 32 lanes.
class Barrier {
 public:
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const unsigned gen = gen_;
    if (++count_ == 32) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  unsigned count_ = 0, gen_ = 0;
};
Barrier barrier;
uint32_t slots[32];

inline uint32_t exchange(uint32_t v, int src) {
  const unsigned lane = thread_idx.x % 32;
  barrier.wait();
  slots[lane] = v;
  barrier.wait();
  const uint32_t r = slots[src & 31];
  barrier.wait();
  return r;
}
// Every lane's value (one barrier round for a whole-warp reduction or vote).
inline void gather(uint32_t v, uint32_t (&out)[32]) {
  const unsigned lane = thread_idx.x % 32;
  barrier.wait();
  slots[lane] = v;
  barrier.wait();
  for (int l = 0; l < 32; ++l) out[l] = slots[l];
  barrier.wait();
}
inline uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
inline float from(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
}  // namespace hostwarp

#define threadIdx hostwarp::thread_idx
#define blockIdx hostwarp::block_idx
inline float __shfl_xor_sync(unsigned, float v, int off) {
  return hostwarp::from(hostwarp::exchange(hostwarp::bits(v), int(threadIdx.x % 32) ^ off));
}
inline int __shfl_xor_sync(unsigned, int v, int off) {
  return int(hostwarp::exchange(uint32_t(v), int(threadIdx.x % 32) ^ off));
}
inline float __shfl_sync(unsigned, float v, int src) { return hostwarp::from(hostwarp::exchange(hostwarp::bits(v), src)); }
inline bool __any_sync(unsigned, bool p) {
  uint32_t all[32];
  hostwarp::gather(p ? 1u : 0u, all);
  bool any = false;
  for (uint32_t v : all) any |= v != 0;
  return any;
}
inline void __syncwarp() { hostwarp::barrier.wait(); }
inline float __int_as_float(int v) { return hostwarp::from(uint32_t(v)); }
inline float __frcp_rn(float x) { return 1.0f / x; }  // both correctly rounded
inline uint32_t __float_as_uint(float v) { return hostwarp::bits(v); }
inline float __uint_as_float(uint32_t u) { return hostwarp::from(u); }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  uint32_t all[32];
  hostwarp::gather(v, all);
  return *std::max_element(all, all + 32);
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
  uint32_t all[32];
  hostwarp::gather(v, all);
  return *std::min_element(all, all + 32);
}
inline int __float2int_rz(float x) { return int(x); }  // truncation

namespace fp4kit {
namespace kernels {
float route_smem[1 << 15];  // one block's dynamic shared memory (the kernel's `extern __shared__`)
}  // namespace kernels
}  // namespace fp4kit

#include "kernels/moe_routing.cuh"

// ---- the test -----------------------------------------------------------------------------------------
using namespace fp4kit;

namespace {

// Runs the kernel for every token: block b, warp w as threads (w * 32 + lane) of the block.
template <typename L>
void run_kernel(const kernels::RouteParams& p) {
  const int blocks = (p.tokens + kernels::kRouteWarps - 1) / kernels::kRouteWarps;
  for (int b = 0; b < blocks; ++b)
    for (int w = 0; w < kernels::kRouteWarps; ++w) {
      std::vector<std::thread> lanes;
      for (int lane = 0; lane < 32; ++lane)
        lanes.emplace_back([&, lane] {
          hostwarp::block_idx.x = unsigned(b);
          hostwarp::thread_idx.x = unsigned(w * 32 + lane);
          kernels::route_kernel<L>(p.experts)(p);
        });
      for (auto& t : lanes) t.join();
    }
}

}  // namespace

TEST(route_kernel_source_matches_route_cpu) {
  struct RC {
    RoutingMode mode;
    int E, k, n_group, topk_group;
    bool bias, renorm;
  };
  const RC rcs[] = {{RoutingMode::kSoftmaxTopK, 128, 4, 1, 1, false, true},
                    {RoutingMode::kSoftmaxTopK, 8, 2, 1, 1, false, false},
                    {RoutingMode::kSoftmaxTopK, 40, 32, 1, 1, false, true},
                    {RoutingMode::kSoftmaxTopK, 3, 3, 1, 1, false, false},
                    {RoutingMode::kSigmoidGroupedTopK, 256, 8, 8, 4, true, true},
                    {RoutingMode::kSigmoidGroupedTopK, 64, 6, 64, 6, true, false},
                    {RoutingMode::kSigmoidGroupedTopK, 40, 3, 5, 2, true, true},
                    {RoutingMode::kSigmoidGroupedTopK, 96, 4, 48, 48, false, true},
                    {RoutingMode::kSoftmaxTopK, 384, 8, 1, 1, false, true},    // 12 keys per lane (sorted as 16)
                    {RoutingMode::kSoftmaxTopK, 1024, 32, 1, 1, false, false}};  // 32 keys per lane
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> ub(-0.5f, 0.5f);
  for (const RC& rc : rcs)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int T = 6, E = rc.E, k = rc.k;
      // Logits on a grid of 1/16 (exact in bf16): keys are well apart or exactly equal (ties to the lower
      // id on both sides), so the ids must agree exactly.
      std::vector<float> lg(size_t(T * E));
      for (auto& v : lg) v = std::round(nd(fp4test::rng()) * 16.0f) / 16.0f;
      for (int e = 0; e < E; ++e) lg[size_t(e)] = float((e * 7) % 5);  // token 0: exact ties
      lg[size_t(3 * E + E / 2)] = NAN;                                  // token 3: a NaN logit
      std::vector<__nv_bfloat16> lgb(lg.size());
      for (size_t i = 0; i < lg.size(); ++i) lgb[i] = __float2bfloat16_rn(lg[i]);
      std::vector<float> bias(static_cast<size_t>(E));
      for (auto& v : bias) v = std::round(ub(fp4test::rng()) * 8.0f) / 8.0f;

      RouteArgs a;
      a.tokens = T;
      a.num_experts = E;
      a.top_k = k;
      a.routing.mode = rc.mode;
      a.routing.logits = dt == DType::kF32 ? static_cast<const void*>(lg.data()) : lgb.data();
      a.routing.logits_dtype = dt;
      a.routing.renormalize = rc.renorm;
      if (rc.mode == RoutingMode::kSigmoidGroupedTopK) {
        a.routing.n_group = rc.n_group;
        a.routing.topk_group = rc.topk_group;
        a.routing.routed_scaling_factor = 2.5f;
        a.routing.correction_bias = rc.bias ? bias.data() : nullptr;
      }
      std::vector<int32_t> rids(size_t(T * k)), kids(size_t(T * k), 7777);
      std::vector<float> rw(size_t(T * k)), kw(size_t(T * k), -1.0f);
      a.topk_ids = rids.data();
      a.topk_weights = rw.data();
      CHECK_OK(route_cpu(a));

      kernels::RouteParams p = kernels::route_params(a.routing, T, E, k, kids.data(), kw.data());
      CHECK(kernels::kRouteWarps * kernels::route_smem_floats_per_warp(E, p.n_group) <= sizeof(kernels::route_smem) / 4);
      if (dt == DType::kF32) run_kernel<float>(p);
      else run_kernel<__nv_bfloat16>(p);

      int bad = 0;
      for (size_t i = 0; i < kids.size(); ++i) {
        const bool same_id = kids[i] == rids[i];
        const bool both_nan = std::isnan(kw[i]) && std::isnan(rw[i]);
        // Relative: the softmax denominators are fp32 sums of up to 1024 terms in different orders (the
        // kernel's lanes and tree, the reference's sequence); the numerators are the same.
        const bool close = std::fabs(kw[i] - rw[i]) <= 1e-4f * std::fabs(rw[i]);
        bad += same_id && (both_nan || close) ? 0 : 1;
      }
      CHECK_MSG(bad == 0, "mode " << int(rc.mode) << " E=" << E << " k=" << k << " groups " << rc.n_group << "/"
                                  << rc.topk_group << " " << dtype_name(dt) << ": " << bad << " of " << kids.size()
                                  << " slots differ from route_cpu");
    }
}

TEST_MAIN()
