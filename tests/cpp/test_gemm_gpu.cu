// test_gemm_gpu.cu: the decode GEMM against the spec-level oracle (dequantize with formats.h, fp64 GEMM).
//
// Fresh random data each run (seed printed), NaN-poisoned outputs, shapes that miss every tile, every
// config of the table, both formats and both activation dtypes, bias, grid-exact inputs (bit-exact),
// special scales (-0 codes, subnormal/negative E4M3, E8M0 0 and 255, E4M3 NaN), determinism, the
// GPU prepack against the CPU prepack, and the errors only a device can check.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "configs.h"
#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "gemm_internal.h"
#include "gemm_test_util.h"
#include "testing.h"

using namespace fp4kit;
using fp4test::CkptWeight;

namespace {

// FP4KIT_TEST_QUICK=1 (sanitizer runs) keeps one m per case family.
bool quick() { return std::getenv("FP4KIT_TEST_QUICK") != nullptr; }

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
  PrepackArgs c = a;
  c.packed = w.packed.data();
  c.scales = w.scales.data();
  c.tensor_scale = (w.format == Format::kNVFP4 && !row_ts) ? &w.tensor_scale : nullptr;
  c.row_tensor_scale = row_ts ? row_ts->data() : nullptr;
  c.dst = cpu.data();
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
};

// Runs the GEMM with a poisoned output; returns the result.
RunOut run(const DeviceWeight& dw, const std::vector<float>& x, const std::vector<float>* bias, int64_t m,
           bool bf16, int config) {
  const int64_t n = dw.pw.n, k = dw.pw.k;
  std::vector<uint16_t> xb(size_t(m * k)), bb;
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = fp4test::to_bits(x[i], bf16);
  if (bias) for (float v : *bias) bb.push_back(fp4test::to_bits(v, bf16));
  uint16_t* dx = to_device(xb);
  uint16_t* db = bias ? to_device(bb) : nullptr;
  uint16_t* dy = nullptr;
  CUDA_OK(cudaMalloc(&dy, size_t(m * n) * 2));
  CUDA_OK(cudaMemset(dy, 0xFF, size_t(m * n) * 2));  // NaN in both bf16 and fp16
  const DType act = bf16 ? DType::kBF16 : DType::kF16;
  size_t ws_bytes = 0;
  CHECK_OK(gemm_workspace_bytes(m, dw.pw, act, &ws_bytes, config));
  void* ws = nullptr;
  if (ws_bytes) {
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaMemset(ws, 0, ws_bytes));
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
  CHECK_OK(gemm(a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  RunOut out;
  out.bits.resize(size_t(m * n));
  CUDA_OK(cudaMemcpy(out.bits.data(), dy, out.bits.size() * 2, cudaMemcpyDeviceToHost));
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

void check_case(Format f, int64_t m, int64_t n, int64_t k, bool bf16, int config, bool with_bias) {
  CkptWeight w = fp4test::random_weight(f, n, k, rng());
  DeviceWeight dw;
  prepack_both(w, dw);
  const auto x = random_x(m, k, bf16);
  std::vector<float> bias;
  if (with_bias) {
    std::uniform_real_distribution<float> ud(-2, 2);
    for (int64_t i = 0; i < n; ++i) bias.push_back(fp4test::from_bits(fp4test::to_bits(ud(rng()), bf16), bf16));
  }
  const auto ref = fp4test::reference(x, fp4test::dequant(w), with_bias ? &bias : nullptr, m, n, k);
  const auto got = run(dw, x, with_bias ? &bias : nullptr, m, bf16, config);
  const auto c = fp4test::compare(ref, got.y);
  const double tol = bf16 ? 1e-2 : 2e-3;
  CHECK_MSG(c.nonfinite == 0 && c.rel_l2 < tol && c.cosine > 0.999,
            format_name(f) << (bf16 ? " bf16" : " fp16") << " m=" << m << " n=" << n << " k=" << k << " cfg=" << config
                           << " bias=" << with_bias << ": rel_l2=" << c.rel_l2 << " cos=" << c.cosine
                           << " nonfinite=" << c.nonfinite);
}

}  // namespace

// Every config, every m the issue names, shapes off every tile; both formats and dtypes.
TEST(gemm_matches_reference_all_configs) {
  int count = 0;
  const KernelConfig* cfgs = kernel_configs(&count);
  std::vector<int64_t> ms = {1, 2, 3, 7, 16, 17, 33, 63, 64};
  if (quick()) ms = {3, 17};
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  for (int ci = 0; ci < count; ++ci) {
    if (!config_supported(cfgs[ci], major)) {
      std::printf("  [skip] config %s: needs compute capability 9.x, this device is %d.x\n", cfgs[ci].name, major);
      continue;
    }
    for (int64_t m : ms)
      for (Format f : {Format::kNVFP4, Format::kMXFP4})
        for (bool bf16 : {true, false}) {
          const int64_t n = 200 + 16 * (m % 3), k = f == Format::kNVFP4 ? 1040 : 1056;  // off-tile N and K
          check_case(f, m, n, k, bf16, cfgs[ci].id, m % 2 == 1);
        }
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
}

// m beyond one launch (64-token blocks).
TEST(gemm_large_m) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    check_case(f, 65, 96, 512, true, -1, true);
    check_case(f, 257, 160, 256, false, -1, false);
  }
}

// Grid-exact inputs: codes on the E2M1 grid with power-of-two scales and small-integer activations make
// every product and partial sum exact in fp32, so the output must equal the rounded reference bit for bit.
TEST(gemm_grid_exact_bitwise) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4})
    for (bool bf16 : {true, false})
      for (int64_t m : {1, 16, 33}) {
        const int64_t n = 144, k = 2048;
        CkptWeight w = fp4test::random_weight(f, n, k, rng(), fp4test::ScaleMode::kPow2);
        DeviceWeight dw;
        prepack_both(w, dw);
        std::vector<float> x(size_t(m * k));
        std::uniform_int_distribution<int> small(-3, 3);
        for (auto& v : x) v = float(small(rng()));
        const auto ref = fp4test::reference(x, fp4test::dequant(w), nullptr, m, n, k);
        const auto got = run(dw, x, nullptr, m, bf16, -1);
        int64_t diff = 0;
        for (size_t i = 0; i < ref.size(); ++i) diff += got.bits[i] != fp4test::to_bits(float(ref[i]), bf16);
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
