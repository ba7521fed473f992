// bench_common.cuh: what fp4kit's benchmark tools share: error macros, reproducible random device data
// (never zeros), and the timing method (CUDA graphs of several calls, median of replays; eager per call).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "fp4kit/formats.h"
#include "fp4kit/repack.h"
#include "fp4kit/status.h"

namespace fp4bench {
using namespace fp4kit;

#define CK(expr)                                                                                   \
  do {                                                                                             \
    cudaError_t _e = (expr);                                                                       \
    if (_e != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e));   \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)
#define CKS(expr)                                                                                  \
  do {                                                                                             \
    Status _st = (expr);                                                                           \
    if (!_st.ok()) {                                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, _st.message().c_str());    \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)


// ---- random device data (a counter-based hash: reproducible, never zeros) -------------------------
__device__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31; x *= 0xBF58476D1CE4E5B9ull; x ^= x >> 27; x *= 0x94D049BB133111EBull; x ^= x >> 31;
  return uint32_t(x);
}
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(hash32(i, seed));
}
__global__ void fill_scales(uint8_t* p, size_t n, uint32_t seed, int nvfp4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i, seed);
    p[i] = nvfp4 ? uint8_t(0x30 + h % 0x18) : uint8_t(120 + h % 8);  // E4M3 0.5..~6, E8M0 2^-7..2^0
  }
}
// Activations and BF16/FP16 weights: small values in [-1, 1] (never zero), in the 16-bit dtype T.
template <typename T>
__global__ void fill_act(T* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = T(float(int(hash32(i, seed) % 2001) - 1000) * 1e-3f + 1e-4f);
}
// Spec dequantization (formats.h) to BF16, for the cuBLAS check GEMM.
__global__ void dequant_bf16(Format f, const uint8_t* packed, const uint8_t* scales, const float* ts, int64_t n,
                             int64_t k, __nv_bfloat16* out) {
  const int g = f == Format::kNVFP4 ? 16 : 32;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * k; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / k, c = i % k;
    const uint8_t b = packed[r * (k / 2) + c / 2];
    const uint8_t code = (c & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
    out[i] = __float2bfloat16(dequant_element(f, code, scales[r * (k / g) + c / g], ts ? *ts : 1.0f));
  }
}

template <typename K, typename... A>
void launch_fill(K kernel, A... args) {
  kernel<<<1024, 256>>>(args...);
  CK(cudaGetLastError());
}

__global__ void sub_bytes(uint8_t* p, size_t n, int d) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(p[i] - d);
}

// A random checkpoint weight, prepacked into dst: codes from seed_codes, block scales from seed_scales
// (fill_scales), MXFP4 exponents lowered by mx_scale_shift when given, the NVFP4 tensor scale *ts (device).
// packed [n, k/2] and scales [n, k/group] are the caller's scratch. The fills and the prepack run in order on
// the legacy default stream (the next call may refill the scratch); the caller synchronises before another
// stream reads dst.
inline void prepack_random(Format f, int64_t n, int64_t k, uint8_t* packed, uint8_t* scales, const float* ts,
                           uint32_t seed_codes, uint32_t seed_scales, void* dst, int mx_scale_shift = 0) {
  const size_t nscales = size_t(n * (k / group_size(f)));
  launch_fill(fill_bytes, packed, size_t(n * k / 2), seed_codes);
  launch_fill(fill_scales, scales, nscales, seed_scales, int(f == Format::kNVFP4));
  if (f == Format::kMXFP4 && mx_scale_shift) launch_fill(sub_bytes, scales, nscales, mx_scale_shift);
  PrepackArgs a;
  a.format = f;
  a.n = n;
  a.k = k;
  a.packed = packed;
  a.scales = scales;
  a.tensor_scale = f == Format::kNVFP4 ? ts : nullptr;
  a.dst = dst;
  CKS(prepack_gpu(a, nullptr));
}

// `copies` copies of a prepacked weight of layout l, straight in the prepacked layout: random codes and
// block scales (fill_bytes, fill_scales: NVFP4 E4M3 codes for an NVFP4 layout) and a constant out_scale of
// 1e-3 (the timeline tools: the values only have to be finite and not zero). The caller frees them.
inline std::vector<void*> random_prepacked_copies(const PackedLayout& l, int copies) {
  std::vector<void*> wp(static_cast<size_t>(copies));
  const std::vector<float> out_scale(l.out_scale_bytes / sizeof(float), 1e-3f);
  for (size_t c = 0; c < wp.size(); ++c) {
    uint8_t* p = nullptr;
    CK(cudaMalloc(&p, l.total_bytes));
    launch_fill(fill_bytes, p + l.weights_offset, l.weights_bytes, uint32_t(c + 1));
    launch_fill(fill_scales, p + l.scales_offset, l.scales_bytes, uint32_t(c + 101), int(l.format == Format::kNVFP4));
    CK(cudaMemcpy(p + l.out_scale_offset, out_scale.data(), out_scale.size() * sizeof(float), cudaMemcpyHostToDevice));
    wp[c] = p;
  }
  return wp;
}

// Fill a 16-bit buffer of the benchmark's activation dtype.
void fill16(void* p, size_t n, uint32_t seed, bool bf16) {
  if (bf16) launch_fill(fill_act<__nv_bfloat16>, static_cast<__nv_bfloat16*>(p), n, seed);
  else launch_fill(fill_act<__half>, static_cast<__half*>(p), n, seed);
}

// The median of v (the mean of the two middle values for an even count); 0 for none.
template <typename V>
double median(std::vector<V> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median milliseconds of `iters` runs of launch(r) on stream s, each between its own pair of events.
template <typename Launch>
double median_event_ms(cudaStream_t s, int iters, Launch launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < iters; ++r) {
    CK(cudaEventRecord(a, s));
    launch(r);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

// The item at place o of round rd over n items, odd rounds in reverse (forward, reverse, forward, ...): timed
// so, no item always runs first or after the same neighbour, and a slow drift of the clocks under the
// board's power limit falls on every item alike.
inline int alternating(int rd, int o, int n) { return rd % 2 ? n - 1 - o : o; }

// fn(0 .. calls - 1) captured in one CUDA graph on stream s, instantiated; launch() replays it on s.
class CallGraph {
 public:
  template <typename Fn>
  CallGraph(cudaStream_t s, int calls, Fn fn) : s_(s) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) fn(i);
    CK(cudaStreamEndCapture(s, &graph_));
    CK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CallGraph(const CallGraph&) = delete;
  CallGraph& operator=(const CallGraph&) = delete;
  ~CallGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void launch() { CK(cudaGraphLaunch(exec_, s_)); }

 private:
  cudaStream_t s_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Time `calls` invocations of fn(i) captured in one graph; returns per-call us (median of replays, after
// `warmups` untimed replays).
template <typename Fn>
double graph_time_us(cudaStream_t s, int calls, int replays, Fn fn, int warmups = 3) {
  CallGraph g(s, calls, fn);
  for (int w = 0; w < warmups; ++w) g.launch();
  const double ms = median_event_ms(s, replays, [&](int) { g.launch(); });
  return ms * 1000.0 / calls;
}

// Eager per-call time: each call between its own events (after `warmups` untimed calls).
template <typename Fn>
double eager_time_us(cudaStream_t s, int copies, int iters, Fn fn, int warmups = 3) {
  for (int w = 0; w < warmups; ++w) fn(w % copies);
  return median_event_ms(s, iters, [&](int r) { fn(r % copies); }) * 1000.0;
}

// Sustained load before timing: calls of fn for at least `ms` of GPU time. Clocks under a long weight
// stream settle below where they start after an idle moment; without this, whatever is timed first
// after a pause (allocation, fills, the host's check) ran faster than the same kernel timed later (up to
// ~10% on the largest Llama-70B layer, config-dependent). Every measurement starts from that steady state.
constexpr double kWarmMs = 150.0;
template <typename Fn>
void warm_up(cudaStream_t s, Fn fn, double call_us, double ms = kWarmMs) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int batch = std::max(1, std::min(64, int(ms * 1e3 / 4 / std::max(1.0, call_us))));
  CK(cudaEventRecord(a, s));
  float el = 0;
  for (int i = 0; el < ms;) {
    for (int j = 0; j < batch; ++j) fn(i++);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&el, a, b));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
}

// A graph-timed and an eager-timed measurement with the counts it used. Calls run over rotating weight
// copies (fn(i) uses copy i % copies, all of them together > 2x the L2: every call streams cold weights).
// Short calls (a graph of max(copies, 8) calls under 2 ms): that graph, `replays_max` replays and as many
// eager calls, 3 warm-ups each (the decode method, unchanged). Long calls (large m, where the weights are
// re-read from L2 many times per call and a cold start matters little): a graph of max(copies, 8) calls
// or fewer (>= 2, <= ~25 ms), replays for ~kBudgetMs of graph time (>= 5), eager calls for ~kBudgetMs / 4
// (>= 3), one warm-up each. Both after warm_up's sustained load. The row records the counts.
struct Measured {
  double us = 0, eager_us = 0;
  int calls = 0, replays = 0, eager_iters = 0;
};
constexpr double kBudgetMs = 150.0;
template <typename Fn>
Measured measure(cudaStream_t s, int copies, int replays_max, Fn fn, bool eager = true) {
  Measured r;
  const double probe_us = std::max(1.0, eager_time_us(s, copies, 1, fn, 1));  // one warm-up, one timed call
  r.calls = std::max(copies, 8);
  const bool long_call = probe_us * r.calls > 2e3;
  r.replays = replays_max;
  r.eager_iters = replays_max;
  if (long_call) {
    if (probe_us * r.calls > 25e3) r.calls = std::max(2, std::min(r.calls, int(25e3 / probe_us)));
    r.replays = std::max(5, std::min(replays_max, int(kBudgetMs * 1e3 / (probe_us * r.calls))));
    r.eager_iters = std::max(3, std::min(replays_max, int(kBudgetMs * 1e3 / 4 / probe_us)));
  }
  warm_up(s, fn, probe_us);
  r.us = graph_time_us(s, r.calls, r.replays, fn, long_call ? 1 : 3);
  if (eager) r.eager_us = eager_time_us(s, copies, r.eager_iters, fn, long_call ? 1 : 3);
  else r.eager_iters = 0;
  return r;
}

// sums[0] += sum (a - b)^2, sums[1] += sum b^2 over n BF16 elements (the benchmark's self-check).
__global__ void rel_l2_sums(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, double* sums) {
  double num = 0, den = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  for (int o = 16; o > 0; o >>= 1) {
    num += __shfl_down_sync(0xFFFFFFFFu, num, o);
    den += __shfl_down_sync(0xFFFFFFFFu, den, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&sums[0], num);
    atomicAdd(&sums[1], den);
  }
}
// rel_l2(a, b) = ||a - b|| / ||b|| of n BF16 device elements (1e9 when not finite).
inline double rel_l2_device(const void* a, const void* b, size_t n, cudaStream_t s) {
  double* d = nullptr;
  CK(cudaMalloc(&d, 2 * sizeof(double)));
  CK(cudaMemsetAsync(d, 0, 2 * sizeof(double), s));
  rel_l2_sums<<<512, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), n, d);
  CK(cudaGetLastError());
  double h[2] = {0, 0};
  CK(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaFree(d));
  const double r = std::sqrt(h[0] / std::max(h[1], 1e-30));
  return std::isfinite(r) ? r : 1e9;
}

// ---- command line and JSON ---------------------------------------------------------------------------
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Writes `text` to `path`; false (and a line naming `tool` and the path on stderr) when it cannot.
inline bool write_file(const std::string& path, const std::string& text, const char* tool) {
  FILE* f = std::fopen(path.c_str(), "w");
  const bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) std::fclose(f);
  if (!ok) std::fprintf(stderr, "%s: cannot write %s\n", tool, path.c_str());
  else std::printf("wrote %s\n", path.c_str());
  return ok;
}

inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return o;
}

// Now, UTC, ISO 8601 (the "date" of a result file).
inline std::string utc_now() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

}  // namespace fp4bench
