// test_prefill_gpu.cu: the Hopper prefill GEMM (kernels/prefill_gemm_sm90.cuh via detail::launch_prefill)
// against the spec-level oracle of gemm_test_util.h (dequantize with formats.h, fp64 GEMM).
//
// Fresh random data each run (seed printed), NaN-poisoned outputs with a guard region past Y, every token
// tile (64/128/256), both formats and activation dtypes, bias, m and N and K off every tile, one real
// shape, determinism. The first case checks the one assumption the kernel cannot derive from a document
// we can test offline: that wgmma's register A fragment of each warp is laid out like mma.m16n8k16's;
// if it fails, one-hot probes print where a weight landed.
//
// FP4KIT_PREFILL_BENCH=1: instead of the tests, time the kernel on Llama-3.3-70B layers (CUDA events,
// median of 20, warm L2) and print us and TFLOP/s per (layer, m, format, token tile).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "gemm_test_util.h"
#include "prefill.h"
#include "testing.h"

using namespace fp4kit;
using fp4test::CkptWeight;
using fp4test::rng;

namespace {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    CHECK_MSG(_e == cudaSuccess, #expr << ": " << cudaGetErrorString(_e)); \
  } while (0)

bool quick() { return std::getenv("FP4KIT_TEST_QUICK") != nullptr; }

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T) + 16);
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

struct DeviceWeight {
  PackedWeight pw;
  void* buf = nullptr;
  ~DeviceWeight() { cudaFree(buf); }
};

// GPU prepack into a poisoned buffer (test_gemm_gpu checks it byte for byte against the CPU prepack).
void prepack(const CkptWeight& w, DeviceWeight& dw) {
  PackedLayout l;
  CHECK_OK(packed_layout(w.format, w.n, w.k, &l));
  uint8_t* dp = to_device(w.packed);
  uint8_t* ds = to_device(w.scales);
  float* dts = to_device(std::vector<float>{w.tensor_scale});
  CUDA_OK(cudaMalloc(&dw.buf, l.total_bytes));
  CUDA_OK(cudaMemset(dw.buf, 0xA5, l.total_bytes));
  PrepackArgs a;
  a.format = w.format;
  a.n = w.n;
  a.k = w.k;
  a.packed = dp;
  a.scales = ds;
  if (w.format == Format::kNVFP4) a.tensor_scale = dts;
  a.dst = dw.buf;
  CHECK_OK(prepack_gpu(a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(dp);
  cudaFree(ds);
  cudaFree(dts);
  dw.pw = PackedWeight{w.format, w.n, w.k, dw.buf};
}

constexpr int64_t kGuard = 4096;  // elements past Y that must stay poisoned

struct RunOut {
  std::vector<uint16_t> bits;  // [m, n]
  std::vector<float> y;
  bool ok = false;
};

// One launch with a poisoned Y (0xFFFF: NaN in bf16 and fp16) and a poisoned guard region after it.
RunOut run_prefill(const DeviceWeight& dw, const std::vector<float>& x, const std::vector<float>* bias, int64_t m,
                   bool bf16, int token_tile) {
  const int64_t n = dw.pw.n, k = dw.pw.k;
  std::vector<uint16_t> xb(size_t(m * k)), bb;
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = fp4test::to_bits(x[i], bf16);
  if (bias)
    for (float v : *bias) bb.push_back(fp4test::to_bits(v, bf16));
  uint16_t* dx = to_device(xb);
  uint16_t* db = bias ? to_device(bb) : nullptr;
  uint16_t* dy = nullptr;
  const size_t ny = size_t(m * n) + kGuard;
  RunOut out;
  CUDA_OK(cudaMalloc(&dy, ny * 2));
  CUDA_OK(cudaMemset(dy, 0xFF, ny * 2));
  GemmArgs a;
  a.m = m;
  a.act = bf16 ? DType::kBF16 : DType::kF16;
  a.x = dx;
  a.w = dw.pw;
  a.bias = db;
  a.y = dy;
  detail::PrefillConfig cfg;
  cfg.token_tile = token_tile;
  const Status st = detail::launch_prefill(a, cfg, nullptr);
  CHECK_MSG(st.ok(), st.message());
  const cudaError_t e = cudaDeviceSynchronize();
  CHECK_MSG(e == cudaSuccess, "prefill kernel: " << cudaGetErrorString(e));
  std::vector<uint16_t> all(ny);
  CUDA_OK(cudaMemcpy(all.data(), dy, ny * 2, cudaMemcpyDeviceToHost));
  int64_t guard_bad = 0;
  for (size_t i = size_t(m * n); i < ny; ++i) guard_bad += all[i] != 0xFFFF;
  CHECK_MSG(guard_bad == 0, guard_bad << " elements written past Y (m=" << m << " n=" << n << ")");
  all.resize(size_t(m * n));
  out.bits = std::move(all);
  out.y.resize(out.bits.size());
  for (size_t i = 0; i < out.y.size(); ++i) out.y[i] = fp4test::from_bits(out.bits[i], bf16);
  out.ok = st.ok() && e == cudaSuccess;
  cudaFree(dx);
  cudaFree(db);
  cudaFree(dy);
  return out;
}

std::vector<float> random_x(int64_t m, int64_t k, bool bf16) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(m * k));
  for (auto& v : x) v = fp4test::from_bits(fp4test::to_bits(nd(rng()), bf16), bf16);  // exact in act dtype
  return x;
}

// The tokens the oracle checks: all when m * n * k is small, else the tile edges plus random ones.
std::vector<int64_t> sample_tokens(int64_t m, int64_t n, int64_t k) {
  std::vector<int64_t> t;
  if (m * n * k <= int64_t(1) << 31 || m <= 64) {
    for (int64_t i = 0; i < m; ++i) t.push_back(i);
    return t;
  }
  for (int64_t e : {0, 1, 7, 8, 63, 64, 127, 128, 255, 256, 511, 512})
    if (e < m) t.push_back(e);
  t.push_back(m - 1);
  t.push_back(m - 2);
  std::uniform_int_distribution<int64_t> ud(0, m - 1);
  while (t.size() < 48) t.push_back(ud(rng()));
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

// fp64 oracle for the listed tokens x all rows, spread over the host's cores.
std::vector<double> reference_rows(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias,
                                   const std::vector<int64_t>& toks, int64_t n, int64_t k) {
  std::vector<double> y(toks.size() * size_t(n));
  const int nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int p = 0; p < nt; ++p)
    th.emplace_back([&, p] {
      for (int64_t r = p; r < n; r += nt)
        for (size_t ti = 0; ti < toks.size(); ++ti) {
          const float* xr = &x[size_t(toks[ti] * k)];
          const float* wr = &w[size_t(r * k)];
          double s = bias ? double((*bias)[size_t(r)]) : 0.0;
          for (int64_t c = 0; c < k; ++c) s += double(xr[c]) * double(wr[c]);
          y[ti * size_t(n) + size_t(r)] = s;
        }
    });
  for (auto& t : th) t.join();
  return y;
}

// Runs one case and checks it against the oracle; returns the output bits (for determinism checks).
std::vector<uint16_t> check_case(Format f, int64_t m, int64_t n, int64_t k, bool bf16, int token_tile, bool with_bias,
                                 const CkptWeight* given = nullptr) {
  CkptWeight w = given ? *given : fp4test::random_weight(f, n, k, rng());
  DeviceWeight dw;
  prepack(w, dw);
  const auto x = random_x(m, k, bf16);
  std::vector<float> bias;
  if (with_bias) {
    std::uniform_real_distribution<float> ud(-2, 2);
    for (int64_t i = 0; i < n; ++i) bias.push_back(fp4test::from_bits(fp4test::to_bits(ud(rng()), bf16), bf16));
  }
  const RunOut got = run_prefill(dw, x, with_bias ? &bias : nullptr, m, bf16, token_tile);
  if (!got.ok) return {};
  int64_t nonfinite_all = 0;  // every output must be written (poison is NaN), sampled or not
  for (float v : got.y) nonfinite_all += !std::isfinite(v);
  const auto toks = sample_tokens(m, n, k);
  const auto ref = reference_rows(x, fp4test::dequant(w), with_bias ? &bias : nullptr, toks, n, k);
  std::vector<float> sel(ref.size());
  for (size_t ti = 0; ti < toks.size(); ++ti)
    std::memcpy(&sel[ti * size_t(n)], &got.y[size_t(toks[ti] * n)], size_t(n) * sizeof(float));
  const auto c = fp4test::compare(ref, sel);
  const double tol = bf16 ? 1e-2 : 2e-3;
  CHECK_MSG(nonfinite_all == 0 && c.rel_l2 < tol && c.cosine > 0.999,
            format_name(f) << (bf16 ? " bf16" : " fp16") << " m=" << m << " n=" << n << " k=" << k
                           << " tile=" << token_tile << " bias=" << with_bias << ": rel_l2=" << c.rel_l2
                           << " cos=" << c.cosine << " nonfinite=" << nonfinite_all << " (tokens checked "
                           << toks.size() << ")");
  return got.bits;
}

// One weight row r0, one K k0 set to exactly 1 (all else 0), X[tok][k] = k + 1: Y[0][r] is k0 + 1 at
// r = r0 and 0 elsewhere. Prints where the value landed when it did not.
bool probe_one_hot(int64_t r0, int64_t k0, int64_t n, int64_t k, int token_tile) {
  CkptWeight w{Format::kNVFP4, n, k, std::vector<uint8_t>(size_t(n * k / 2), 0),
               std::vector<uint8_t>(size_t(n * k / 16), 0x38), 1.0f};  // scales 1.0, codes +0
  w.packed[size_t(r0 * (k / 2) + k0 / 2)] = uint8_t(k0 % 2 ? 0x20 : 0x02);  // E2M1 code 2 = 1.0
  DeviceWeight dw;
  prepack(w, dw);
  const int64_t m = 8;
  std::vector<float> x(size_t(m * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c) x[size_t(i * k + c)] = float(c + 1);
  const RunOut got = run_prefill(dw, x, nullptr, m, true, token_tile);
  bool ok = got.ok;
  std::string where;
  for (int64_t r = 0; r < n; ++r) {
    const float v = got.y[size_t(r)];
    const float want = r == r0 ? float(k0 + 1) : 0.0f;
    if (v != want) {
      ok = false;
      if (v != 0.0f && where.size() < 300)
        where += " row " + std::to_string(r) + " got " + std::to_string(v) + " (= X k " + std::to_string(int(v) - 1) + ")";
    }
  }
  if (!ok)
    std::printf("  probe W[%lld][%lld] = 1: expected Y[0][%lld] = %lld;%s\n", (long long)r0, (long long)k0,
                (long long)r0, (long long)(k0 + 1), where.empty() ? " nothing nonzero arrived" : where.c_str());
  return ok;
}

}  // namespace

// FIRST: one CTA tile, exact inputs (E2M1 grid, power-of-two scales, small-integer X: every product and
// partial sum is exact in fp32), so any fragment-layout error shows as a bitwise mismatch.
TEST(prefill_fragment_layout_one_tile) {
  bool all_ok = true;
  for (int tile : {64, 256})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      const int64_t n = 128, k = 512, m = tile;
      CkptWeight w = fp4test::random_weight(f, n, k, rng(), fp4test::ScaleMode::kPow2);
      DeviceWeight dw;
      prepack(w, dw);
      std::vector<float> x(size_t(m * k));
      std::uniform_int_distribution<int> small(-3, 3);
      for (auto& v : x) v = float(small(rng()));
      const auto ref = fp4test::reference(x, fp4test::dequant(w), nullptr, m, n, k);
      const RunOut got = run_prefill(dw, x, nullptr, m, true, tile);
      int64_t diff = 0;
      for (size_t i = 0; i < ref.size() && got.ok; ++i) diff += got.bits[i] != fp4test::to_bits(float(ref[i]), true);
      CHECK_MSG(got.ok && diff == 0, "wgmma register-A fragment layout assumption (rows g, g+8; k 2t, 2t+8 per warp, "
                                     "as mma.m16n8k16) or the B-tile K order FAILED: "
                                         << format_name(f) << " tile " << tile << ": " << diff << " of " << ref.size()
                                         << " outputs differ");
      all_ok = all_ok && got.ok && diff == 0;
    }
  if (!all_ok) {
    std::printf("  one-hot probes (NVFP4, bf16, token tile 64):\n");
    for (auto rk : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {0, 8}, {0, 16}, {0, 17}, {1, 0}, {8, 0},
                                                    {16, 0}, {64, 0}, {5, 37}, {127, 511}})
      probe_one_hot(rk.first, rk.second, 128, 512, 64);
  }
}

// The m values of the issue, every token tile, both formats and dtypes; N and K off every tile (N = 272:
// 17 row tiles, the last CTA has one; NVFP4 K = 1040: 17 chunks, odd, the last one partial; MXFP4
// K = 1056: k_pad 1152, a short last slice).
TEST(prefill_m_sweep) {
  std::vector<int64_t> ms = {128, 129, 255, 256, 1000};
  if (quick()) ms = {129, 256};
  for (int64_t m : ms)
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      for (bool bf16 : {true, false})
        for (int tile : {64, 128, 256}) {
          if (tile == 64 && m > 256) continue;
          const int64_t n = 272, k = f == Format::kNVFP4 ? 1040 : 1056;
          check_case(f, m, n, k, bf16, tile, m % 2 == 1);
        }
}

// Small m (the decode kernel's side of the crossover) and the dispatcher-free default tile choice.
TEST(prefill_small_m_default_tile) {
  for (int64_t m : {1, 17, 32, 33, 64})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) check_case(f, m, 144, 2048, m % 2 == 0, 0, m == 33);
}

// Off-tile N and K of real size: N = 8192 + 16, K = 2880 (gpt-oss).
TEST(prefill_off_tile_large) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    check_case(f, 129, 8192 + 16, 2880, true, 0, true);
    if (!quick()) check_case(f, 1000, 8192 + 16, 2880, false, 256, false);
  }
}

// One real shape: Llama-70B o_proj, 8192 x 8192 (sampled tokens).
TEST(prefill_real_shape) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) check_case(f, 256, 8192, 8192, true, 0, false);
  if (!quick()) check_case(Format::kNVFP4, 512, 8192, 8192, false, 256, true);
}

// Same inputs, same bits (no split-K, no atomics: this guards against a race in the ring).
TEST(prefill_deterministic) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t m = 300, n = 4096 + 48, k = 4096 + 64;
    const CkptWeight w = fp4test::random_weight(f, n, k, rng());
    DeviceWeight dw;
    prepack(w, dw);
    const auto x = random_x(m, k, true);
    for (int tile : {128, 256}) {
      const RunOut a = run_prefill(dw, x, nullptr, m, true, tile), b = run_prefill(dw, x, nullptr, m, true, tile);
      CHECK_MSG(a.ok && b.ok && a.bits == b.bits, format_name(f) << " tile " << tile << ": two runs differ");
    }
  }
}

// Argument errors the launcher reports instead of launching.
TEST(prefill_errors) {
  CkptWeight w = fp4test::random_weight(Format::kNVFP4, 256, 512, rng());
  DeviceWeight dw;
  prepack(w, dw);
  void *x = nullptr, *y = nullptr;
  cudaMalloc(&x, 64 * 512 * 2 + 64);
  cudaMalloc(&y, 64 * 256 * 2 + 64);
  GemmArgs a;
  a.m = 64;
  a.x = x;
  a.y = y;
  a.w = dw.pw;
  detail::PrefillConfig cfg;
  cfg.token_tile = 96;
  CHECK_ERROR(detail::launch_prefill(a, cfg, nullptr), "token_tile: must be 64, 128 or 256");
  cfg.token_tile = 0;
  a.x = static_cast<char*>(x) + 8;
  CHECK_ERROR(detail::launch_prefill(a, cfg, nullptr), "x: must be 16-byte aligned");
  a.x = x;
  a.m = 0;
  CHECK_ERROR(detail::launch_prefill(a, cfg, nullptr), "m: must be >= 1");
  cudaFree(x);
  cudaFree(y);
}

// ---- timing mode ------------------------------------------------------------------------------------

namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(z ^ (z >> 31));
}
// bytes[i] = (hash & and_mask) + add
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, uint8_t and_mask, uint8_t add) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t((hash32(i, seed) & and_mask) + add);
}
// bf16 in [-1, 1)
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = float(int(hash32(i, seed) & 0xFFFF) - 32768) / 32768.0f;
    p[i] = uint16_t(__float_as_uint(v) >> 16);
  }
}

int bench() {
  struct Layer {
    const char* name;
    int64_t n, k;
  };
  const Layer layers[] = {{"qkv", 10240, 8192}, {"o", 8192, 8192}, {"gate_up", 57344, 8192}, {"down", 8192, 28672}};
  const int64_t ms[] = {256, 1024, 4096};
  std::printf("prefill bench (Llama-3.3-70B layers, warm L2, median of 20; TFLOP/s = 2 m n k / t)\n");
  std::printf("%-8s %6s %6s %6s %6s %10s %9s %12s\n", "layer", "n", "k", "m", "format", "tile", "us", "TFLOP/s");
  for (const Layer& L : layers)
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      const int g = group_size(f);
      uint8_t *packed = nullptr, *scales = nullptr;
      cudaMalloc(&packed, size_t(L.n * L.k / 2));
      cudaMalloc(&scales, size_t(L.n * L.k / g));
      fill_bytes<<<1024, 256>>>(packed, size_t(L.n * L.k / 2), 1, 0xFF, 0);
      if (f == Format::kNVFP4) fill_bytes<<<1024, 256>>>(scales, size_t(L.n * L.k / g), 2, 0x0F, 0x30);  // E4M3 ~1..2
      else fill_bytes<<<1024, 256>>>(scales, size_t(L.n * L.k / g), 2, 0x07, 120);
      PackedLayout l;
      packed_layout(f, L.n, L.k, &l);
      void* buf = nullptr;
      cudaMalloc(&buf, l.total_bytes);
      PrepackArgs pa;
      pa.format = f;
      pa.n = L.n;
      pa.k = L.k;
      pa.packed = packed;
      pa.scales = scales;
      pa.dst = buf;
      Status st = prepack_gpu(pa, nullptr);
      if (!st.ok()) {
        std::printf("prepack failed: %s\n", st.message().c_str());
        return 1;
      }
      cudaFree(packed);
      cudaFree(scales);
      for (int64_t m : ms) {
        uint16_t *x = nullptr, *y = nullptr;
        cudaMalloc(&x, size_t(m * L.k) * 2);
        cudaMalloc(&y, size_t(m * L.n) * 2);
        fill_bf16<<<1024, 256>>>(x, size_t(m * L.k), 3);
        GemmArgs a;
        a.m = m;
        a.act = DType::kBF16;
        a.x = x;
        a.w = PackedWeight{f, L.n, L.k, buf};
        a.y = y;
        for (int tile : {0, 128, 256}) {
          detail::PrefillConfig cfg;
          cfg.token_tile = tile;
          cudaEvent_t e0, e1;
          cudaEventCreate(&e0);
          cudaEventCreate(&e1);
          for (int i = 0; i < 3; ++i) st = detail::launch_prefill(a, cfg, nullptr);
          if (!st.ok()) {
            std::printf("launch failed: %s\n", st.message().c_str());
            return 1;
          }
          std::vector<float> t;
          for (int i = 0; i < 20; ++i) {
            cudaEventRecord(e0);
            detail::launch_prefill(a, cfg, nullptr);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms_ = 0;
            cudaEventElapsedTime(&ms_, e0, e1);
            t.push_back(ms_ * 1000.0f);
          }
          const cudaError_t e = cudaDeviceSynchronize();
          if (e != cudaSuccess) {
            std::printf("kernel failed: %s\n", cudaGetErrorString(e));
            return 1;
          }
          std::sort(t.begin(), t.end());
          const double us = t[t.size() / 2];
          int sms = 0;
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
          const int shown = tile ? tile : detail::default_prefill_config(m, L.n, sms).token_tile;
          std::printf("%-8s %6lld %6lld %6lld %6s %6d%4s %9.1f %12.1f\n", L.name, (long long)L.n, (long long)L.k,
                      (long long)m, format_name(f), shown, tile ? "" : "(d)", us, 2.0 * m * L.n * L.k / (us * 1e-6) / 1e12);
          cudaEventDestroy(e0);
          cudaEventDestroy(e1);
        }
        cudaFree(x);
        cudaFree(y);
      }
      cudaFree(buf);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  FP4KIT_REQUIRE_GPU();
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9) {
    std::printf("SKIPPED: the prefill kernel needs an sm_90 (Hopper) device; this one is sm_%d%d\n", major, minor);
    return 77;
  }
  if (std::getenv("FP4KIT_PREFILL_BENCH")) return bench();
  return fp4test::run_all(argc, argv);
}
