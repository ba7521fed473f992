// test_gemm_gpu.cu: gemm() against the spec-level oracle (dequantize with formats.h, fp64 GEMM), for
// every config of the table: the decode kernels and, on a Hopper device, the prefill kernel.
//
// Fresh random data each run (seed printed), NaN-poisoned outputs with a guard region past Y, shapes that
// miss every tile, every config of the table, both formats and both activation dtypes, bias, grid-exact
// inputs (bit-exact; for the prefill kernel also the check of its one layout assumption, the wgmma
// register-A fragment, and of the split-K sum), special scales (-0 codes, subnormal/negative E4M3, E8M0 0
// and 255, E4M3 NaN), determinism, the GPU prepack against the CPU prepack, dispatch, and the errors only
// a device can check. Large outputs are checked on sampled tokens (tile edges and random ones).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "fp4kit/tuning.h"
#include "gemm_internal.h"
#include "gemm_test_util.h"
#include "testing.h"

using namespace fp4kit;
using fp4test::CkptWeight;

namespace {

// FP4KIT_TEST_QUICK=1 (sanitizer runs) keeps one m per case family.
bool quick() { return std::getenv("FP4KIT_TEST_QUICK") != nullptr; }

int device_major() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major;
}

// The table's entries of one kernel kind that this device runs (the decode kernel's; the prefill kernels'
// (wgmma and mma.sync); the wgmma kernel's only); the others are skipped visibly.
enum class Kind { kDecode, kPrefill, kWgmma };
std::vector<const KernelConfig*> configs_of(Kind kind) {
  int count = 0;
  const KernelConfig* cfgs = kernel_configs(&count);
  std::vector<const KernelConfig*> out;
  const int major = device_major();
  for (int ci = 0; ci < count; ++ci) {
    const bool want = kind == Kind::kDecode    ? !is_prefill(cfgs[ci])
                      : kind == Kind::kPrefill ? is_prefill(cfgs[ci])
                                               : cfgs[ci].pipeline == kWgmma;
    if (!want) continue;
    if (config_supported(cfgs[ci], major)) out.push_back(&cfgs[ci]);
    else std::printf("  [skip] config %s: needs compute capability 9.x, this device is %d.x\n", cfgs[ci].name, major);
  }
  return out;
}

// The device's SM count (the prefill schedule's wave size).
int64_t device_sms() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// Whether this device runs the wgmma prefill kernel (a Hopper device must; elsewhere the configs print why
// not).
bool prefill_here() {
  if (!configs_of(Kind::kWgmma).empty()) return true;
  CHECK(device_major() != 9);
  return false;
}
int config_id(const char* name) {
  int count = 0;
  const KernelConfig* cfgs = kernel_configs(&count);
  for (int ci = 0; ci < count; ++ci)
    if (std::string(cfgs[ci].name) == name) return cfgs[ci].id;
  return -2;
}

using fp4test::rng;

#define CUDA_OK(expr)                                                                \
  do {                                                                               \
    cudaError_t _e = (expr);                                                         \
    CHECK_MSG(_e == cudaSuccess, #expr << ": " << cudaGetErrorString(_e));           \
  } while (0)

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T) + 16);
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

// A weight prepacked on the GPU (and checked byte-exact against the CPU prepack).
struct DeviceWeight {
  PackedWeight pw;
  void* buf = nullptr;
  ~DeviceWeight() { cudaFree(buf); }
};

void prepack_both(const CkptWeight& w, DeviceWeight& dw, const std::vector<float>* row_ts = nullptr) {
  PackedLayout l;
  CHECK_OK(packed_layout(w.format, w.n, w.k, &l));
  uint8_t* dp = to_device(w.packed);
  uint8_t* ds = to_device(w.scales);
  float* dts = to_device(std::vector<float>{w.tensor_scale});
  float* drow = row_ts ? to_device(*row_ts) : nullptr;
  CUDA_OK(cudaMalloc(&dw.buf, l.total_bytes));
  CUDA_OK(cudaMemset(dw.buf, 0xA5, l.total_bytes));  // poison: every byte the GEMM reads must be written
  PrepackArgs a;
  a.format = w.format;
  a.n = w.n;
  a.k = w.k;
  a.packed = dp;
  a.scales = ds;
  if (w.format == Format::kNVFP4) (row_ts ? a.row_tensor_scale : a.tensor_scale) = row_ts ? drow : dts;
  a.dst = dw.buf;
  CHECK_OK(prepack_gpu(a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  // CPU prepack of the same input: the regions the GEMM reads must match byte for byte.
  std::vector<uint8_t> cpu(l.total_bytes, 0), gpu(l.total_bytes);
  PrepackArgs c = fp4test::prepack_args(w, cpu.data());
  if (row_ts) {
    c.tensor_scale = nullptr;
    c.row_tensor_scale = row_ts->data();
  }
  CHECK_OK(prepack_cpu(c));
  CUDA_OK(cudaMemcpy(gpu.data(), dw.buf, l.total_bytes, cudaMemcpyDeviceToHost));
  auto same = [&](size_t off, size_t bytes) { return std::memcmp(cpu.data() + off, gpu.data() + off, bytes) == 0; };
  CHECK_MSG(same(l.weights_offset, l.weights_bytes), "weights region differs");
  CHECK_MSG(same(l.scales_offset, l.scales_bytes), "scales region differs");
  CHECK_MSG(same(l.out_scale_offset, l.out_scale_bytes), "out_scale region differs");
  cudaFree(dp);
  cudaFree(ds);
  cudaFree(dts);
  cudaFree(drow);
  dw.pw = PackedWeight{w.format, w.n, w.k, dw.buf};
}

struct RunOut {
  std::vector<float> y;  // [m, n] as float
  std::vector<uint16_t> bits;
  bool ok = false;       // the call and the kernel succeeded
};

constexpr int64_t kGuard = 4096;  // elements past Y that must stay poisoned

// Runs the GEMM with a poisoned output (0xFFFF: NaN in bf16 and fp16) and a poisoned guard region after
// it; returns the result.
// dirty_ws: the workspace is 0xFF garbage except its leading gemm_workspace_zero_bytes() (the contract's
// minimum); otherwise all zero.
RunOut run(const DeviceWeight& dw, const std::vector<float>& x, const std::vector<float>* bias, int64_t m,
           bool bf16, int config, bool dirty_ws = false) {
  const int64_t n = dw.pw.n, k = dw.pw.k;
  std::vector<uint16_t> xb(size_t(m * k)), bb;
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = fp4test::to_bits(x[i], bf16);
  if (bias) for (float v : *bias) bb.push_back(fp4test::to_bits(v, bf16));
  uint16_t* dx = to_device(xb);
  uint16_t* db = bias ? to_device(bb) : nullptr;
  uint16_t* dy = nullptr;
  const size_t ny = size_t(m * n) + kGuard;
  CUDA_OK(cudaMalloc(&dy, ny * 2));
  CUDA_OK(cudaMemset(dy, 0xFF, ny * 2));
  const DType act = bf16 ? DType::kBF16 : DType::kF16;
  size_t ws_bytes = 0;
  CHECK_OK(gemm_workspace_bytes(m, dw.pw, act, &ws_bytes, config));
  void* ws = nullptr;
  if (ws_bytes) {
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    size_t zero_bytes = ws_bytes;
    if (dirty_ws) {
      CHECK_OK(gemm_workspace_zero_bytes(m, dw.pw, act, &zero_bytes, config));
      CHECK_MSG(zero_bytes <= ws_bytes, "zero bytes " << zero_bytes << " > workspace bytes " << ws_bytes);
      CUDA_OK(cudaMemset(ws, 0xFF, ws_bytes));
    }
    CUDA_OK(cudaMemset(ws, 0, std::min(zero_bytes, ws_bytes)));
  }
  GemmArgs a;
  a.m = m;
  a.act = act;
  a.x = dx;
  a.w = dw.pw;
  a.bias = db;
  a.y = dy;
  a.workspace = ws;
  a.workspace_bytes = ws_bytes;
  a.config = config;
  const Status st = gemm(a, nullptr);
  CHECK_MSG(st.ok(), st.message());
  const cudaError_t e = cudaDeviceSynchronize();
  CHECK_MSG(e == cudaSuccess, "gemm kernel (config " << config << "): " << cudaGetErrorString(e));
  RunOut out;
  out.ok = st.ok() && e == cudaSuccess;
  out.bits.resize(ny);
  CUDA_OK(cudaMemcpy(out.bits.data(), dy, ny * 2, cudaMemcpyDeviceToHost));
  int64_t guard_bad = 0;
  for (size_t i = size_t(m * n); i < ny; ++i) guard_bad += out.bits[i] != 0xFFFF;
  CHECK_MSG(guard_bad == 0, guard_bad << " elements written past Y (m=" << m << " n=" << n << " cfg=" << config << ")");
  out.bits.resize(size_t(m * n));
  out.y.resize(out.bits.size());
  for (size_t i = 0; i < out.y.size(); ++i) out.y[i] = fp4test::from_bits(out.bits[i], bf16);
  if (ws) {  // the arrival counters must come back zeroed
    detail::DecodePlan plan;
    CHECK_OK(detail::make_plan(m, dw.pw, act, config, &plan));
    const size_t cb = plan.counters_bytes;
    std::vector<int> counters(cb / 4 + 1);
    CUDA_OK(cudaMemcpy(counters.data(), ws, cb, cudaMemcpyDeviceToHost));
    bool zero = true;
    for (size_t i = 0; i < cb / 4; ++i) zero = zero && counters[i] == 0;
    CHECK_MSG(zero, "workspace counters not reset");
  }
  cudaFree(dx);
  cudaFree(db);
  cudaFree(dy);
  cudaFree(ws);
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
  const int nt = int(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
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

// Runs one case and checks it against the oracle (every output must be written: the poison is NaN);
// returns the output bits (for determinism checks).
std::vector<uint16_t> check_case(Format f, int64_t m, int64_t n, int64_t k, bool bf16, int config, bool with_bias,
                                 const CkptWeight* given = nullptr) {
  CkptWeight w = given ? *given : fp4test::random_weight(f, n, k, rng());
  DeviceWeight dw;
  prepack_both(w, dw);
  const auto x = random_x(m, k, bf16);
  std::vector<float> bias;
  if (with_bias) {
    std::uniform_real_distribution<float> ud(-2, 2);
    for (int64_t i = 0; i < n; ++i) bias.push_back(fp4test::from_bits(fp4test::to_bits(ud(rng()), bf16), bf16));
  }
  const auto got = run(dw, x, with_bias ? &bias : nullptr, m, bf16, config);
  if (!got.ok) return {};
  int64_t nonfinite_all = 0;
  for (float v : got.y) nonfinite_all += !std::isfinite(v);
  const auto toks = sample_tokens(m, n, k);
  const auto ref = reference_rows(x, fp4test::dequant(w), with_bias ? &bias : nullptr, toks, n, k);
  std::vector<float> sel(ref.size());
  for (size_t ti = 0; ti < toks.size(); ++ti)
    std::memcpy(&sel[ti * size_t(n)], &got.y[size_t(toks[ti] * n)], size_t(n) * sizeof(float));
  const auto c = fp4test::compare(ref, sel);
  const double tol = bf16 ? 1e-2 : 2e-3;
  CHECK_MSG(nonfinite_all == 0 && c.rel_l2 < tol && c.cosine > 0.999,
            format_name(f) << (bf16 ? " bf16" : " fp16") << " m=" << m << " n=" << n << " k=" << k << " cfg="
                           << kernel_config_name(config) << " bias=" << with_bias << ": rel_l2=" << c.rel_l2
                           << " cos=" << c.cosine << " nonfinite=" << nonfinite_all << " (tokens checked "
                           << toks.size() << ")");
  return got.bits;
}

// The launch plan gemm() makes for this problem on this device.
detail::DecodePlan plan_of(int64_t m, Format f, int64_t n, int64_t k, int config) {
  detail::DecodePlan plan;
  CHECK_OK(detail::make_plan(m, PackedWeight{f, n, k, nullptr}, DType::kBF16, config, &plan));
  return plan;
}

// Grid-exact inputs: codes on the E2M1 grid with power-of-two scales and small-integer activations make
// every product and partial sum exact in fp32, so the output must equal the rounded reference bit for
// bit; returns the number of outputs that differ (-1: the call failed).
int64_t grid_exact_diff(Format f, int64_t m, int64_t n, int64_t k, bool bf16, int config) {
  CkptWeight w = fp4test::random_weight(f, n, k, rng(), fp4test::ScaleMode::kPow2);
  DeviceWeight dw;
  prepack_both(w, dw);
  std::vector<float> x(size_t(m * k));
  std::uniform_int_distribution<int> small(-3, 3);
  for (auto& v : x) v = float(small(rng()));
  const auto ref = fp4test::reference(x, fp4test::dequant(w), nullptr, m, n, k);
  const auto got = run(dw, x, nullptr, m, bf16, config);
  if (!got.ok) return -1;
  int64_t diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) diff += got.bits[i] != fp4test::to_bits(float(ref[i]), bf16);
  return diff;
}

// One weight row r0, one K k0 set to exactly 1 (all else 0), X[tok][k] = k + 1: Y[0][r] is k0 + 1 at
// r = r0 and 0 elsewhere. Prints where the value landed when it did not (prefill fragment diagnosis).
bool probe_one_hot(int64_t r0, int64_t k0, int64_t n, int64_t k, int config) {
  CkptWeight w{Format::kNVFP4, n, k, std::vector<uint8_t>(size_t(n * k / 2), 0),
               std::vector<uint8_t>(size_t(n * k / 16), 0x38), 1.0f};  // scales 1.0, codes +0
  w.packed[size_t(r0 * (k / 2) + k0 / 2)] = uint8_t(k0 % 2 ? 0x20 : 0x02);  // E2M1 code 2 = 1.0
  DeviceWeight dw;
  prepack_both(w, dw);
  const int64_t m = 8;
  std::vector<float> x(size_t(m * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c) x[size_t(i * k + c)] = float(c + 1);
  const RunOut got = run(dw, x, nullptr, m, true, config);
  bool ok = got.ok;
  std::string where;
  for (int64_t r = 0; r < n && got.ok; ++r) {
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

// Every decode config, every m it serves in one launch, shapes off every tile; both formats and dtypes.
TEST(gemm_matches_reference_all_configs) {
  std::vector<int64_t> ms = {1, 2, 3, 7, 16, 17, 33, 63, 64};
  if (quick()) ms = {3, 17};
  for (const KernelConfig* cfg : configs_of(Kind::kDecode))
    for (int64_t m : ms)
      for (Format f : {Format::kNVFP4, Format::kMXFP4})
        for (bool bf16 : {true, false}) {
          const int64_t n = 200 + 16 * (m % 3), k = f == Format::kNVFP4 ? 1040 : 1056;  // off-tile N and K
          check_case(f, m, n, k, bf16, cfg->id, m % 2 == 1);
        }
}

// Cluster mode (sm_90): clusters of up to 16 CTAs (non-portable above 8), K slices split unevenly (17 over
// 16), a partial last row group; the cluster reduction's sum is in rank order: bitwise deterministic.
TEST(gemm_cluster_configs) {
  if (device_major() != 9) {
    std::printf("  [skip] cluster configs: need compute capability 9.x\n");
    return;
  }
  for (const char* name : {"m8_r1_w8_b3_c8x1_cl", "m16_r1_w8_b2_c8x2_cl"})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      const int id = config_id(name);
      const int64_t n = 300, k = 16 * 512 + 32;  // 3 row groups (the last of 44 rows), 17 K slices
      detail::DecodePlan plan;
      CHECK_OK(detail::make_plan(1, PackedWeight{f, n, k, nullptr}, DType::kBF16, id, &plan));
      CHECK_MSG(plan.cluster == 16 && plan.grid == 3 * 16 && plan.workspace_bytes == 0,
                name << ": cluster " << plan.cluster << " grid " << plan.grid << " workspace " << plan.workspace_bytes);
      for (int64_t m : {int64_t(1), int64_t(5), int64_t(8), int64_t(16)})
        if (m <= 8 * find_config(id)->n_tiles) check_case(f, m, n, k, m != 5, id, m % 2 == 1);
      CkptWeight w = fp4test::random_weight(f, n, k, rng());
      DeviceWeight dw;
      prepack_both(w, dw);
      const int64_t m = 8 * find_config(id)->n_tiles;
      const auto x = random_x(m, k, true);
      const auto a = run(dw, x, nullptr, m, true, id), b = run(dw, x, nullptr, m, true, id);
      CHECK_MSG(a.bits == b.bits, name << " m=" << m << ": not bitwise deterministic");
      // Few slices: the cluster shrinks to the K slices (2 here), one slice per CTA.
      check_case(f, 3, 4096 + 16, 1024, true, id, true);
    }
}

// FIRST for the prefill kernel: one CTA tile with exact inputs, so any error in its one layout
// assumption (wgmma's register A fragment of each warp is laid out like mma.m16n8k16's: rows g, g+8, k
// 2t, 2t+8) shows as a bitwise mismatch; one-hot probes print where a weight landed if it fails. Then the
// split-K sum: partial sums of exact inputs are exact, so split configs must be bit-exact too.
TEST(gemm_prefill_grid_exact_bitwise) {
  if (!prefill_here()) return;
  bool all_ok = true;
  for (const char* name : {"p64_w8_s8", "p64_w8_s4_b2", "p256_w8_s3"})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      const int64_t tile = std::string(name).rfind("p64", 0) == 0 ? 64 : 256;
      const int64_t diff = grid_exact_diff(f, tile, 128, 512, true, config_id(name));
      CHECK_MSG(diff == 0, "wgmma register-A fragment layout assumption (rows g, g+8; k 2t, 2t+8 per warp, as "
                           "mma.m16n8k16) or the B-tile K order FAILED: "
                               << format_name(f) << " " << name << ": " << diff << " outputs differ");
      all_ok = all_ok && diff == 0;
    }
  if (!all_ok) {
    std::printf("  one-hot probes (NVFP4, bf16, p64_w8_s8):\n");
    for (auto rk : std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {0, 8}, {0, 16}, {0, 17}, {1, 0}, {8, 0},
                                                    {16, 0}, {64, 0}, {5, 37}, {127, 511}})
      probe_one_hot(rk.first, rk.second, 128, 512, config_id("p64_w8_s8"));
  }
  // Split K: 3 x 2 tiles of p128 (6 CTAs' worth) split over the 4 slices of K = 2048.
  for (const char* name : {"p64_w8_s8_k8", "p64_w8_s4_b2_k8", "p128_w8_s5_k8", "p256_w8_s3_k8"})
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      for (bool bf16 : {true, false}) {
        const int64_t m = 129, n = 272, k = 2048;
        CHECK_MSG(plan_of(m, f, n, k, config_id(name)).splits > 1, name << ": expected a split-K plan");
        const int64_t diff = grid_exact_diff(f, m, n, k, bf16, config_id(name));
        CHECK_MSG(diff == 0, format_name(f) << " " << name << " bf16=" << bf16 << ": " << diff << " outputs differ");
      }
  // Narrow last tiles of the dense BN = 64 entries: m64n16 / m64n32 wgmmas on a quarter / half X box, as the
  // only tile (m = 16, 17, 32), after a whole tile (m = 80, 96), and split K (m = 20).
  for (const char* name : {"p64_w8_s8", "p64_w8_s4_b2", "p64_w8_s8_k8"})
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      for (int64_t m : {16, 17, 20, 32, 80, 96}) {
        const bool split = std::string(name).find("_k8") != std::string::npos;
        if (split != (m == 20)) continue;
        const int64_t n = 272, k = 2048;
        if (split) CHECK_MSG(plan_of(m, f, n, k, config_id(name)).splits > 1, name << ": expected a split-K plan");
        const int64_t diff = grid_exact_diff(f, m, n, k, m % 2 == 0, config_id(name));
        CHECK_MSG(diff == 0, format_name(f) << " " << name << " narrow m=" << m << ": " << diff << " outputs differ");
      }
  // The split tail: one wave + 8 tiles of p64 over K = 2048 run one whole-K wave, then the last 8 tiles
  // split K. A wave is every resident CTA: sms, or 2 x sms for the two-CTA entry.
  for (const char* name : {"p64_w8_s8_k8", "p64_w8_s4_b2_k8"})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      const int64_t wave = device_sms() * find_config(config_id(name))->min_blocks;
      const int64_t m = 64, n = (wave + 8) * 128, k = 2048;
      const detail::DecodePlan plan = plan_of(m, f, n, k, config_id(name));
      CHECK_MSG(plan.splits > 1 && plan.split_tiles == 8 && plan.units == wave + 8,
                name << ": expected a split tail of 8 tiles, got " << plan.split_tiles << " x " << plan.splits << " of "
                     << plan.units);
      const int64_t diff = grid_exact_diff(f, m, n, k, true, config_id(name));
      CHECK_MSG(diff == 0, format_name(f) << " " << name << " split tail: " << diff << " outputs differ");
    }
}

// Two splits in a pair (prefill_gemm_sm90.cuh, "split K in a pair"): a split tile's two CTAs are one 2-CTA
// cluster and finish it through each other's shared memory, and whole-K waves before a paired tail run in
// clusters too. The shapes are the first N (in 128-row steps) where the schedule splits two ways, with no
// whole-K tile or an even number of them (the pair condition); grid-exact inputs, so a misplaced half, a
// half summed twice or a partial missed shows. Pairs are planned for 128- and 256-token tiles; the BN = 64
// entries, and every entry with pairs off (detail::set_prefill_pairs(0), what FP4KIT_PREFILL_PAIRS=0 does),
// run the same shapes through the workspace.
TEST(gemm_prefill_pairs_bitwise) {
  if (!prefill_here()) return;
  struct Case {
    const char* name;
    int64_t m, k;
    bool tail;  // whole-K waves first
  };
  for (int on : {1, 0}) {
    detail::set_prefill_pairs(on);
    for (const Case& c : {Case{"p128_w8_s5_k8", 257, 2048, false}, Case{"p128_w8_s5_k8", 64, 2048, true},
                          Case{"p256_w8_s3_k8", 64, 4096, true}, Case{"p64_w8_s8_k8", 129, 2048, false},
                          Case{"p64_w8_s4_b2_k8", 129, 2048, true}}) {
      int64_t n = 0;
      detail::DecodePlan plan;
      for (int64_t cand = 128; cand <= 48 * 1024 && n == 0; cand += 128) {
        plan = plan_of(c.m, Format::kNVFP4, cand, c.k, config_id(c.name));
        const int64_t from = plan.units - plan.split_tiles;
        if (plan.splits == 2 && (c.tail ? from > 0 && from % 2 == 0 : from == 0)) n = cand;
      }
      CHECK_MSG(n > 0, c.name << " m=" << c.m << " k=" << c.k << ": no N up to 48K splits two ways "
                              << (c.tail ? "after an even number of whole-K tiles" : "with no whole-K tile"));
      if (n == 0) continue;
      const int want = on && find_config(config_id(c.name))->n_tiles >= 16 ? 2 : 0;  // BN >= 128
      CHECK_MSG(plan.cluster == want, c.name << " pairs " << on << ": plan.cluster " << plan.cluster << ", expected "
                                             << want);
      for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
        if (quick() && c.tail && f == Format::kMXFP4) continue;  // the large reference, once per shape
        if (!on && f == Format::kMXFP4) continue;                // the workspace path: one format per shape
        const bool bf16 = f == Format::kNVFP4;
        const int64_t diff = grid_exact_diff(f, c.m, n, c.k, bf16, config_id(c.name));
        CHECK_MSG(diff == 0, format_name(f) << " " << c.name << " pairs " << on << " m=" << c.m << " n=" << n
                                            << " k=" << c.k << " (" << plan.units - plan.split_tiles
                                            << " whole-K tiles, " << plan.split_tiles << " split): " << diff
                                            << " outputs differ");
      }
    }
  }
  detail::set_prefill_pairs(-1);
}

// Every prefill config (wgmma on Hopper, mma.sync everywhere) at the m of the issue and at small m (a prefill config chosen for m = 1
// must still be right): N = 272 (17 row tiles, the last 128-row block has one), NVFP4 K = 1040 (17
// chunks, odd, the last partial), MXFP4 K = 1056 (k_pad 1152, a short last slice); the dtype alternates
// with m, bias on odd m. Small tile counts make the _k8 configs split K (2-3 ways here).
TEST(gemm_prefill_all_configs) {
  std::vector<int64_t> ms = {1, 17, 64, 128, 129, 255, 256, 1000, 4097};
  if (quick()) ms = {17, 129, 256};
  int i = 0;
  for (const KernelConfig* cfg : configs_of(Kind::kPrefill))
    for (int64_t m : ms) {
      ++i;
      for (Format f : {Format::kNVFP4, Format::kMXFP4})
        check_case(f, m, 272, f == Format::kNVFP4 ? 1040 : 1056, i % 2 == 0, cfg->id, m % 2 == 1);
    }
  // Both dtypes at one m for every config.
  for (const KernelConfig* cfg : configs_of(Kind::kPrefill))
    for (bool bf16 : {true, false}) check_case(Format::kMXFP4, 129, 144, 2048, bf16, cfg->id, true);
  // N % 8 != 0 (N = 267, odd): the epilogue stores element by element instead of in 16-byte segments.
  for (const KernelConfig* cfg : configs_of(Kind::kPrefill))
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      check_case(f, 129, 267, f == Format::kNVFP4 ? 1040 : 1056, f == Format::kNVFP4, cfg->id, true);
}

// The mma.sync prefill kernel (sm_80+, forced on Hopper): exact inputs bit for bit over several CTA tiles
// (129 tokens: a partial token tile; 272 rows: a partial row block), whole K and split K (exact partial
// sums: the split order cannot show); real shapes through the configs an Ampere device's dispatch picks;
// two runs the same bits.
TEST(gemm_mma_prefill) {
  for (const KernelConfig* cfg : configs_of(Kind::kPrefill)) {
    if (cfg->pipeline != kMma) continue;
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      for (bool bf16 : {true, false}) {
        const int64_t m = 129, n = 272, k = 2048;
        CHECK_MSG(cfg->max_splits == 1 || plan_of(m, f, n, k, cfg->id).splits > 1, cfg->name << ": expected a split-K plan");
        const int64_t diff = grid_exact_diff(f, m, n, k, bf16, cfg->id);
        CHECK_MSG(diff == 0, format_name(f) << " " << cfg->name << " bf16=" << bf16 << ": " << diff << " outputs differ");
      }
  }
  const int sms = int(device_sms());
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int o = pick_config(256, 8192, 8192, nullptr, 8, sms), gptoss = pick_config(1000, 8192 + 16, 2880, nullptr, 8, sms);
    CHECK_MSG(find_config(o)->pipeline == kMma && find_config(gptoss)->pipeline == kMma, "cc 8 dispatch: not mma.sync");
    check_case(f, 256, 8192, 8192, true, o, false);
    check_case(f, 1000, 8192 + 16, 2880, false, gptoss, true);
    if (!quick()) check_case(f, 4097, 1024 + 16, 1024 + 64 * (f == Format::kNVFP4), true, config_id("a128_w8_s4"), true);
  }
  for (const char* name : {"a128_w8_s4_k8", "a64_w8_s4", "a64_w8_s3_b2_k8"}) {
    const Format f = Format::kMXFP4;
    const int64_t m = 300, n = 1024 + 48, k = 4096 + 64;
    CkptWeight w = fp4test::random_weight(f, n, k, rng());
    DeviceWeight dw;
    prepack_both(w, dw);
    const auto x = random_x(m, k, true);
    const RunOut a = run(dw, x, nullptr, m, true, config_id(name)), b = run(dw, x, nullptr, m, true, config_id(name));
    CHECK_MSG(a.ok && b.ok && a.bits == b.bits, name << ": two runs differ");
  }
}

// Off-tile N and K of real size: N = 8192 + 16, K = 2880 (gpt-oss), through dispatch and explicit configs;
// a split tail over random data: sms + 2 row blocks (the last one 16 rows) of 128-token tiles, m = 100.
TEST(gemm_prefill_off_tile_large) {
  if (!prefill_here()) return;
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t n_tail = (device_sms() + 1) * 128 + 16;
    CHECK_MSG(plan_of(100, f, n_tail, 2880, config_id("p128_w8_s5_k8")).split_tiles == 2, "expected a split tail");
    check_case(f, 100, n_tail, 2880, f == Format::kNVFP4, config_id("p128_w8_s5_k8"), true);
    check_case(f, 129, 8192 + 16, 2880, true, -1, true);
    if (!quick()) {
      check_case(f, 1000, 8192 + 16, 2880, false, config_id("p256_w8_s3"), false);
      check_case(f, 300, 8192 + 16, 2880, true, config_id("p128_w8_s5_k8"), true);
    }
  }
}

// Prefill in several passes (X into lane order through a workspace of at most lane_x_pass_bytes, lowered
// here): m = 1000 in 4 passes of 256 tokens with p64 (whole K), and in 2 passes of 512 with split K, the
// last pass shorter; the counters come back zeroed between the passes (check_case).
TEST(gemm_prefill_passes) {
  if (!prefill_here()) return;
  const int64_t saved = detail::lane_x_pass_bytes;
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t k = f == Format::kNVFP4 ? 1040 : 1056, k_pad = f == Format::kNVFP4 ? 1088 : 1152;
    detail::lane_x_pass_bytes = 300 * k_pad * 2;  // room for 300 rows: 4 passes of 256 tokens (p64)
    check_case(f, 1000, 272, k, true, config_id("p64_w8_s8"), true);
    detail::lane_x_pass_bytes = 600 * k_pad * 2;  // room for 600 rows: 512 + 488 tokens (p128, split K)
    check_case(f, 1000, 272 + 16, k, false, config_id("p128_w8_s5_k8"), false);
  }
  detail::lane_x_pass_bytes = saved;
}

// One real shape, Llama-70B o_proj 8192 x 8192 (sampled tokens): dispatch's pick at m = 256 (split K on
// an H200) and a whole-K config.
TEST(gemm_prefill_real_shape) {
  if (!prefill_here()) return;
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) check_case(f, 256, 8192, 8192, true, -1, false);
  if (!quick()) check_case(Format::kNVFP4, 512, 8192, 8192, false, config_id("p256_w8_s3"), true);
}

// Same inputs, same bits: the split-K partials are summed in split order whatever the arrival order (and
// the ring has no race).
TEST(gemm_prefill_deterministic) {
  if (!prefill_here()) return;
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t m = 300, n = 1024 + 48, k = 4096 + 64;
    CkptWeight w = fp4test::random_weight(f, n, k, rng());
    DeviceWeight dw;
    prepack_both(w, dw);
    const auto x = random_x(m, k, true);
    for (const char* name : {"p128_w8_s5_k8", "p256_w8_s3"}) {
      if (std::string(name) == "p128_w8_s5_k8")
        CHECK_MSG(plan_of(m, f, n, k, config_id(name)).splits > 1, name << ": expected a split-K plan");
      const RunOut a = run(dw, x, nullptr, m, true, config_id(name)), b = run(dw, x, nullptr, m, true, config_id(name));
      CHECK_MSG(a.ok && b.ok && a.bits == b.bits, format_name(f) << " " << name << ": two runs differ");
    }
  }
}

// Dispatch on this device: on Hopper the decode kernel up to m = 8, the wgmma prefill kernel from
// kPrefillMinM on and from kCrossoverMinM where the models make it faster (8192 x 8192 on 128+ SMs); on
// sm_80-89 the mma.sync prefill kernel from kMmaPrefillMinM on; and the workspace query agrees with the plan.
TEST(gemm_dispatch_by_m) {
  const int major = device_major();
  const int64_t sms = device_sms();
  for (int64_t m : {int64_t(1), int64_t(16), int64_t(32), kPrefillMinM, int64_t(64), int64_t(256), int64_t(4096)}) {
    const detail::DecodePlan plan = plan_of(m, Format::kNVFP4, 8192, 8192, -1);
    const bool want_prefill =
        major == 9 ? m >= kPrefillMinM || (m >= kCrossoverMinM && sms >= 128) : m >= kMmaPrefillMinM;
    CHECK_MSG(plan.cfg && is_prefill(*plan.cfg) == want_prefill,
              "m=" << m << ": dispatch picked " << (plan.cfg ? plan.cfg->name : "nothing"));
    size_t ws = 0;
    CHECK_OK(gemm_workspace_bytes(m, PackedWeight{Format::kNVFP4, 8192, 8192, nullptr}, DType::kBF16, &ws));
    CHECK_EQ(ws, plan.workspace_bytes);
  }
}

// Aligned, aligned +- one group, and real shapes (K = 2880 gpt-oss, tensor-parallel shards).
TEST(gemm_shapes) {
  struct S { int64_t n, k; };
  const S shapes[] = {{256, 1024}, {272, 1024 - 32}, {240, 1024 + 32}, {4096, 512}, {1280, 8192},
                      {512, 2880}, {2880, 4096}, {1024, 7392}, {464, 3584}, {17, 64}, {1, 32}};
  for (const S& s : shapes) {
    if (quick() && s.n * s.k > 4096 * 1024) continue;
    for (Format f : {Format::kNVFP4, Format::kMXFP4})
      for (int64_t m : {1, 16, 64}) check_case(f, m, s.n, s.k, true, -1, m == 16);
  }
  check_case(Format::kMXFP4, 16, 10944 / 8, 2880, false, -1, true);
  // More units than resident CTAs, so the balanced grid of the m <= 16 default is smaller than the
  // resident count (132 SMs: 260 CTAs of 4 units, not 264 of 3-4): every row group still summed once.
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const detail::DecodePlan plan = plan_of(16, f, 8192 + 16, 8192, config_id("m16_r1_w8_b2_c8x2"));
    CHECK(plan.cfg && plan.cfg->balanced);
    const int64_t per_cta = (plan.units + plan.grid - 1) / plan.grid;
    // The smallest grid that gives no CTA more than per_cta units (the plain grid, 264, would give 4 too).
    CHECK_MSG(per_cta * (plan.grid - 1) < plan.units, "grid " << plan.grid << " for " << plan.units << " units is not balanced");
    check_case(f, 16, 8192 + 16, 8192, f == Format::kNVFP4, config_id("m16_r1_w8_b2_c8x2"), true);
  }
}

// m beyond one decode launch: dispatch's pick (the prefill kernel on Hopper), and the decode kernel in
// 64-token blocks explicitly.
TEST(gemm_large_m) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    check_case(f, 65, 96, 512, true, -1, true);
    check_case(f, 257, 160, 256, false, -1, false);
    check_case(f, 257, 160, 256, true, config_id("m64_r2_w8_b1_c4x2"), true);
  }
}

// Grid-exact inputs through the decode kernel (dispatch's pick at m <= 64): bit for bit.
TEST(gemm_grid_exact_bitwise) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4})
    for (bool bf16 : {true, false})
      for (int64_t m : {1, 16, 33}) {
        const int64_t diff = grid_exact_diff(f, m, 144, 2048, bf16, -1);
        CHECK_MSG(diff == 0, format_name(f) << " m=" << m << " bf16=" << bf16 << ": " << diff << " outputs differ");
      }
}

// Special values: a NaN block scale poisons exactly its row; E8M0 0 (2^-127) and 254; -0 codes;
// negative and subnormal E4M3 scales are part of the random draws above, forced here on a whole row.
TEST(gemm_special_scales) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t m = 5, n = 48, k = 512;
    CkptWeight w = fp4test::random_weight(f, n, k, rng());
    const int64_t groups = k / group_size(f);
    w.scales[size_t(3 * groups + 2)] = f == Format::kNVFP4 ? 0x7F : 0xFF;  // row 3: NaN block
    w.scales[size_t(4 * groups + 1)] = f == Format::kNVFP4 ? 0xFF : 0xFF;  // row 4: NaN (negative E4M3 NaN)
    for (int64_t gi = 0; gi < groups; ++gi) {
      if (f == Format::kNVFP4) {
        w.scales[size_t(5 * groups + gi)] = uint8_t(0x80 | (gi % 7 + 1));  // row 5: negative subnormals
        w.scales[size_t(6 * groups + gi)] = uint8_t(gi % 8);               // row 6: subnormals and zero
      } else {
        w.scales[size_t(5 * groups + gi)] = uint8_t(gi % 2 ? 0 : 1);       // row 5: 2^-127, 2^-126
        w.scales[size_t(6 * groups + gi)] = uint8_t(gi == 3 ? 247 : 200);  // row 6: one huge block
      }
    }
    for (int64_t c = 0; c < k / 2; ++c) w.packed[size_t(7 * (k / 2) + c)] = 0x88;  // row 7: all -0
    DeviceWeight dw;
    prepack_both(w, dw);
    auto x = random_x(m, k, true);
    for (auto& v : x) v = fp4test::from_bits(fp4test::to_bits(v * 1e-3f, true), true);  // small, exact in bf16
    const auto ref = fp4test::reference(x, fp4test::dequant(w), nullptr, m, n, k);
    const auto got = run(dw, x, nullptr, m, true, -1);
    int bad = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < n; ++r) {
        const float y = got.y[size_t(i * n + r)];
        const double e = ref[size_t(i * n + r)];
        bool ok;
        if (r == 3 || r == 4) ok = std::isnan(y);
        else if (r == 7) ok = y == 0.0f;
        else if (f == Format::kMXFP4 && r == 6) ok = std::fabs(y - e) <= 1e-2 * std::fabs(e);  // ~2^120
        else ok = std::fabs(y - e) <= 2e-2 * (std::fabs(e) + 1e-3);
        if (!ok && bad < 8) std::printf("  %s token %lld row %lld: got %g want %g\n", format_name(f), (long long)i, (long long)r, y, e);
        bad += !ok;
      }
    CHECK_MSG(bad == 0, format_name(f) << ": " << bad << " outputs wrong");
  }
}

// Fused projections whose parts carry different tensor scales: one scale per row.
TEST(gemm_row_tensor_scales) {
  const int64_t m = 3, n = 96, k = 256;
  CkptWeight w = fp4test::random_weight(Format::kNVFP4, n, k, rng());
  std::vector<float> row_ts(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) row_ts[size_t(r)] = r < 64 ? 0.01f : 0.37f;
  DeviceWeight dw;
  prepack_both(w, dw, &row_ts);
  auto wf = fp4test::dequant(w);  // with tensor scale w.tensor_scale: rescale per row
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) wf[size_t(r * k + c)] = wf[size_t(r * k + c)] / w.tensor_scale * row_ts[size_t(r)];
  const auto x = random_x(m, k, true);
  const auto c = fp4test::compare(fp4test::reference(x, wf, nullptr, m, n, k), run(dw, x, nullptr, m, true, -1).y);
  CHECK_MSG(c.rel_l2 < 1e-2 && c.nonfinite == 0, "rel_l2=" << c.rel_l2);
}

// Same inputs, same bits: split row groups are summed in a fixed order.
TEST(gemm_deterministic) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t m = 16, n = 4096 + 48, k = 4096 + 64;
    CkptWeight w = fp4test::random_weight(f, n, k, rng());
    DeviceWeight dw;
    prepack_both(w, dw);
    const auto x = random_x(m, k, true);
    const auto a = run(dw, x, nullptr, m, true, -1), b = run(dw, x, nullptr, m, true, -1);
    CHECK(a.bits == b.bits);
  }
}

// A fresh workspace needs only its leading gemm_workspace_zero_bytes() cleared: the rest (stream-K and
// split-K partials, prefill's lane-ordered X) is written before it is read. Garbage there must give the
// same bits as a zeroed workspace: decode with split row groups, prefill with and without K splits.
TEST(gemm_workspace_only_counters_zeroed) {
  struct Case { int64_t m, n, k; };
  for (const Case& c : {Case{1, 4096 + 48, 4096 + 64}, Case{16, 8192 + 16, 2880}, Case{100, 1024 + 16, 8192},
                        Case{300, 4096 + 48, 1024}})
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      if (c.m >= 33 && !prefill_here()) continue;
      CkptWeight w = fp4test::random_weight(f, c.n, c.k, rng());
      DeviceWeight dw;
      prepack_both(w, dw);
      const auto x = random_x(c.m, c.k, true);
      const auto clean = run(dw, x, nullptr, c.m, true, -1), dirty = run(dw, x, nullptr, c.m, true, -1, true);
      const detail::DecodePlan plan = plan_of(c.m, f, c.n, c.k, -1);
      CHECK_MSG(clean.ok && dirty.ok && clean.bits == dirty.bits,
                format_name(f) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " (" << plan.cfg->name
                               << ", workspace " << plan.workspace_bytes << " bytes, zeroed " << plan.counters_bytes
                               << "): garbage past the counters changed the result");
    }
}

// Two dependent GEMMs issued back to back with no host synchronisation: Y1 = X W1^T, then Y2 = Y1 W2^T.
// With FP4KIT_PDL=1 (the ctest entry test_gemm_gpu_pdl) the second kernel may start while the first
// drains and must wait for Y1 before it reads it: Y1 and Y2 are NaN-poisoned first, so a read too early
// shows. The reference for Y2 is computed from the Y1 the device wrote.
TEST(gemm_dependent_chain) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4})
    for (int64_t m : {1, 16, 64}) {
      // Y1 [m, n1] is the second GEMM's X, so n1 is its K: a multiple of 32 (MXFP4's group), not of 64.
      const int64_t k1 = 1024, n1 = 2048 + 32, n2 = 1536;
      CkptWeight w1 = fp4test::random_weight(f, n1, k1, rng()), w2 = fp4test::random_weight(f, n2, n1, rng());
      DeviceWeight d1, d2;
      prepack_both(w1, d1);
      prepack_both(w2, d2);
      const auto x = random_x(m, k1, true);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = fp4test::to_bits(x[i], true);
      uint16_t* dx = to_device(xb);
      void *dy1 = nullptr, *dy2 = nullptr, *ws = nullptr;
      CUDA_OK(cudaMalloc(&dy1, size_t(m * n1) * 2));
      CUDA_OK(cudaMalloc(&dy2, size_t(m * n2) * 2));
      CUDA_OK(cudaMemset(dy1, 0xFF, size_t(m * n1) * 2));  // NaN
      CUDA_OK(cudaMemset(dy2, 0xFF, size_t(m * n2) * 2));
      size_t b1 = 0, b2 = 0;
      CHECK_OK(gemm_workspace_bytes(m, d1.pw, DType::kBF16, &b1));
      CHECK_OK(gemm_workspace_bytes(m, d2.pw, DType::kBF16, &b2));
      const size_t wsb = std::max<size_t>(std::max(b1, b2), 256);
      CUDA_OK(cudaMalloc(&ws, wsb));
      CUDA_OK(cudaMemset(ws, 0, wsb));
      cudaStream_t s;
      CUDA_OK(cudaStreamCreate(&s));
      GemmArgs a;
      a.m = m;
      a.workspace = ws;  // one workspace for both: stream order (and the programmatic wait) keep them apart
      a.workspace_bytes = wsb;
      a.x = dx;
      a.y = dy1;
      a.w = d1.pw;
      CHECK_OK(gemm(a, s));
      a.x = dy1;
      a.y = dy2;
      a.w = d2.pw;
      CHECK_OK(gemm(a, s));
      CUDA_OK(cudaStreamSynchronize(s));
      std::vector<uint16_t> y1b(size_t(m * n1)), y2b(size_t(m * n2));
      CUDA_OK(cudaMemcpy(y1b.data(), dy1, y1b.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(y2b.data(), dy2, y2b.size() * 2, cudaMemcpyDeviceToHost));
      std::vector<float> y1(y1b.size()), y2(y2b.size());
      for (size_t i = 0; i < y1.size(); ++i) y1[i] = fp4test::from_bits(y1b[i], true);
      for (size_t i = 0; i < y2.size(); ++i) y2[i] = fp4test::from_bits(y2b[i], true);
      const auto c1 = fp4test::compare(fp4test::reference(x, fp4test::dequant(w1), nullptr, m, n1, k1), y1);
      const auto c2 = fp4test::compare(fp4test::reference(y1, fp4test::dequant(w2), nullptr, m, n2, n1), y2);
      CHECK_MSG(c1.nonfinite == 0 && c1.rel_l2 < 1e-2 && c1.cosine > 0.999,
                format_name(f) << " m=" << m << " first GEMM: rel_l2=" << c1.rel_l2 << " nonfinite=" << c1.nonfinite);
      CHECK_MSG(c2.nonfinite == 0 && c2.rel_l2 < 1e-2 && c2.cosine > 0.999,
                format_name(f) << " m=" << m << " dependent GEMM: rel_l2=" << c2.rel_l2 << " nonfinite=" << c2.nonfinite);
      cudaStreamDestroy(s);
      cudaFree(dx);
      cudaFree(dy1);
      cudaFree(dy2);
      cudaFree(ws);
    }
}

// Errors that need a device (plan-dependent): workspace rules and config ids.
TEST(gemm_device_errors) {
  CkptWeight w = fp4test::random_weight(Format::kNVFP4, 4096, 4096, rng());
  DeviceWeight dw;
  prepack_both(w, dw);
  size_t need = 0;
  CHECK_OK(gemm_workspace_bytes(16, dw.pw, DType::kBF16, &need));
  CHECK(need > 0);
  void *x = nullptr, *y = nullptr, *ws = nullptr;
  cudaMalloc(&x, 16 * 4096 * 2);
  cudaMalloc(&y, 16 * 4096 * 2);
  cudaMalloc(&ws, need + 32);
  GemmArgs a;
  a.m = 16;
  a.x = x;
  a.y = y;
  a.w = dw.pw;
  CHECK_ERROR(gemm(a, nullptr), "workspace: must not be null");
  a.workspace = ws;
  a.workspace_bytes = need - 1;
  CHECK_ERROR(gemm(a, nullptr), "workspace_bytes: must be >=");
  a.workspace = static_cast<char*>(ws) + 8;
  a.workspace_bytes = need;
  CHECK_ERROR(gemm(a, nullptr), "workspace: must be 16-byte aligned");
  a.workspace = ws;
  a.config = 99;
  CHECK_ERROR(gemm(a, nullptr), "config: 99 is not in the kernel config table");
  if (device_major() != 9) {
    a.config = config_id("p256_w8_s3");
    CHECK_ERROR(gemm(a, nullptr), "config: p256_w8_s3 needs a compute capability 9.x (Hopper) device");
  }
  a.config = -1;
  a.y = x;
  CHECK_ERROR(gemm(a, nullptr), "y: must not overlap x");
  cudaFree(x);
  cudaFree(y);
  cudaFree(ws);
}

int main(int argc, char** argv) {
  FP4KIT_REQUIRE_GPU();
  return fp4test::run_all(argc, argv);
}
