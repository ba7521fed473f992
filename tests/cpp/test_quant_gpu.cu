// test_quant_gpu.cu: quantize_gpu against quantize_cpu, bit for bit (packed bytes, scale bytes, tensor
// scale bits), for NVFP4 and MXFP4, fp32/bf16/fp16 inputs, odd and real shapes, and data that reaches
// every branch of the recipes: blocks of very different size (subnormal and underflowing E4M3 scales),
// zero blocks, NaN/Inf blocks, exact ties. Also: guard bytes around the outputs stay untouched, a reused
// workspace, a given (and aliased) tensor scale, and a run captured in a CUDA graph. Exits 77 without a GPU.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4kit/quant.h"
#include "testing.h"

using namespace fp4kit;

namespace {

#define CUDA_TRY(expr)                                                                         \
  do {                                                                                         \
    const cudaError_t _e = (expr);                                                             \
    CHECK_MSG(_e == cudaSuccess, #expr << ": " << cudaGetErrorString(_e));                     \
    if (_e != cudaSuccess) return false;                                                       \
  } while (0)

constexpr size_t kGuard = 64;   // poisoned bytes after every output buffer
constexpr uint8_t kPoison = 0xCD;

using fp4test::test_seed;

struct DevBuf {
  void* p = nullptr;
  ~DevBuf() { cudaFree(p); }
  bool alloc(size_t bytes, int fill) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) return false;
    return cudaMemset(p, fill, bytes) == cudaSuccess;
  }
  template <class T> T* as() const { return static_cast<T*>(p); }
};

struct Result {
  std::vector<uint8_t> packed, scales;  // with the guard bytes on the GPU side
  uint32_t ts_bits = 0;
};

uint16_t to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

// Test data: per 16-value chunk one of several regimes, so every branch of both recipes is reached.
std::vector<float> make_data(int64_t n, int64_t k, DType dt, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  // fp16 has a narrow range: keep the magnitudes inside it.
  const float big = dt == DType::kF16 ? 100.0f : 1.0e4f;
  std::vector<float> w(size_t(n * k));
  for (size_t c = 0; c < w.size(); c += 16) {
    const float r = uni(rng);
    float* v = &w[c];
    if (r < 0.50f) {  // dense data, row-ish magnitudes over 4 decades
      const float mag = big * std::pow(10.0f, -4.0f * uni(rng));
      for (int i = 0; i < 16; ++i) v[i] = normal(rng) * mag;
    } else if (r < 0.62f) {  // amax / tensor amax around 1e-6..1e-5: subnormal E4M3 scales
      const float mag = big * std::pow(10.0f, -5.5f + 1.2f * uni(rng));
      for (int i = 0; i < 16; ++i) v[i] = normal(rng) * mag;
    } else if (r < 0.67f) {  // tinier: the E4M3 scale underflows to 0
      for (int i = 0; i < 16; ++i) v[i] = normal(rng) * big * 1e-8f;
    } else if (r < 0.71f) {  // the bottom of fp32 (subnormals): the MXFP4 exponent clamps to 0
      for (int i = 0; i < 16; ++i) v[i] = normal(rng) * 1e-38f;
    } else if (r < 0.77f) {  // zeros, with some -0
      for (int i = 0; i < 16; ++i) v[i] = (i & 1) ? -0.0f : 0.0f;
    } else if (r < 0.80f) {  // a NaN or an Inf in an otherwise normal block
      for (int i = 0; i < 16; ++i) v[i] = normal(rng);
      v[rng() % 16] = rng() & 1 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
    } else {  // small multiples of 1/4: many exact E2M1 ties
      for (int i = 0; i < 16; ++i) v[i] = float(int(rng() % 49) - 24) * 0.25f;
    }
  }
  return w;
}

std::vector<uint8_t> to_bytes(const std::vector<float>& w, DType dt) {
  std::vector<uint8_t> out(w.size() * size_t(dtype_bytes(dt)));
  for (size_t i = 0; i < w.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(&out[4 * i], &w[i], 4);
    } else {
      const uint16_t h = dt == DType::kBF16 ? to_bf16(w[i]) : __half_as_ushort(__float2half_rn(w[i]));
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

QuantizeArgs make_args(Format f, DType dt, int64_t n, int64_t k) {
  QuantizeArgs a;
  a.format = f;
  a.w_dtype = dt;
  a.n = n;
  a.k = k;
  return a;
}

bool run_cpu(QuantizeArgs a, const std::vector<uint8_t>& w, const float* given, Result* r) {
  r->packed.assign(size_t(a.n * a.k / 2), 0);
  r->scales.assign(size_t(a.n * a.k / group_size(a.format)), 0);
  float ts = 0.0f;
  a.w = w.data();
  a.packed = r->packed.data();
  a.scales = r->scales.data();
  a.tensor_scale = &ts;
  a.given_tensor_scale = given;
  const Status s = quantize_cpu(a);
  CHECK_MSG(s.ok(), s.message());
  std::memcpy(&r->ts_bits, &ts, 4);
  return s.ok();
}

// Runs quantize_gpu (optionally twice on one workspace, or inside a CUDA graph) and copies back the
// outputs with their guard bytes. `prior` is quantized first on the same workspace when non-empty.
struct GpuOptions {
  const float* given = nullptr;  // host value, copied to the device
  bool alias_given = false;      // given_tensor_scale == tensor_scale
  bool graph = false;
  const std::vector<uint8_t>* prior = nullptr;
};

bool run_gpu(QuantizeArgs a, const std::vector<uint8_t>& w, const GpuOptions& o, Result* r) {
  const size_t np = size_t(a.n * a.k / 2), ns = size_t(a.n * a.k / group_size(a.format));
  DevBuf dw, dprior, dp, ds, dts, dws;
  if (!dw.alloc(w.size(), 0) || !dp.alloc(np + kGuard, kPoison) || !ds.alloc(ns + kGuard, kPoison) ||
      !dts.alloc(3 * sizeof(float), kPoison) || !dws.alloc(quantize_workspace_bytes(), kPoison)) {
    CHECK_MSG(false, "cudaMalloc/cudaMemset failed");
    return false;
  }
  CUDA_TRY(cudaMemcpy(dw.p, w.data(), w.size(), cudaMemcpyHostToDevice));
  float* ts_out = dts.as<float>() + 1;  // floats 0 and 2 are guards
  if (o.given) CUDA_TRY(cudaMemcpy(ts_out + (o.alias_given ? 0 : 1), o.given, 4, cudaMemcpyHostToDevice));
  // A copy from pageable host memory may return before its DMA lands, and the non-blocking stream below
  // does not wait for the legacy stream: finish every copy and fill first.
  CUDA_TRY(cudaDeviceSynchronize());
  cudaStream_t stream;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  a.packed = dp.as<uint8_t>();
  a.scales = ds.as<uint8_t>();
  a.tensor_scale = ts_out;
  a.given_tensor_scale = o.given ? ts_out + (o.alias_given ? 0 : 1) : nullptr;
  bool ok = true;
  if (o.prior) {
    QuantizeArgs p = a;
    if (!dprior.alloc(o.prior->size(), 0)) ok = false;
    ok = ok && cudaMemcpy(dprior.p, o.prior->data(), o.prior->size(), cudaMemcpyHostToDevice) == cudaSuccess;
    ok = ok && cudaDeviceSynchronize() == cudaSuccess;  // as above
    p.w = dprior.p;
    const Status s = quantize_gpu(p, dws.p, stream);
    CHECK_MSG(s.ok(), s.message());
    ok = ok && s.ok();
  }
  a.w = dw.p;
  if (o.graph) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    // Global capture mode refuses any call that would synchronise or allocate during the capture.
    CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status s = quantize_gpu(a, dws.p, stream);
    CHECK_MSG(s.ok(), s.message());
    CUDA_TRY(cudaStreamEndCapture(stream, &graph));
    CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_TRY(cudaGraphLaunch(exec, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    ok = ok && s.ok();
  } else {
    const Status s = quantize_gpu(a, dws.p, stream);
    CHECK_MSG(s.ok(), s.message());
    ok = ok && s.ok();
  }
  CUDA_TRY(cudaStreamSynchronize(stream));
  CUDA_TRY(cudaStreamDestroy(stream));
  CUDA_TRY(cudaGetLastError());
  r->packed.resize(np + kGuard);
  r->scales.resize(ns + kGuard);
  uint32_t ts3[3];
  CUDA_TRY(cudaMemcpy(r->packed.data(), dp.p, np + kGuard, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(r->scales.data(), ds.p, ns + kGuard, cudaMemcpyDeviceToHost));
  CUDA_TRY(cudaMemcpy(ts3, dts.p, sizeof(ts3), cudaMemcpyDeviceToHost));
  r->ts_bits = ts3[1];
  const uint32_t poison4 = 0x01010101u * kPoison;
  CHECK_MSG(ts3[0] == poison4, "write before tensor_scale");
  if (!o.given || o.alias_given) CHECK_MSG(ts3[2] == poison4, "write after tensor_scale");
  if (a.format == Format::kMXFP4) CHECK_MSG(ts3[1] == poison4, "mxfp4 wrote tensor_scale");
  return ok;
}

// Compares the GPU result (with guards) to the CPU one; returns the number of mismatching bytes.
int compare(const Result& cpu, const Result& gpu, bool has_ts, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < gpu.packed.size(); ++i) {
    const int want = i < cpu.packed.size() ? cpu.packed[i] : kPoison;
    if (gpu.packed[i] != want && bad++ < 5)
      std::fprintf(stderr, "%s: packed[%zu] gpu %02x cpu %02x\n", what.c_str(), i, gpu.packed[i], want);
  }
  for (size_t i = 0; i < gpu.scales.size(); ++i) {
    const int want = i < cpu.scales.size() ? cpu.scales[i] : kPoison;
    if (gpu.scales[i] != want && bad++ < 5)
      std::fprintf(stderr, "%s: scales[%zu] gpu %02x cpu %02x\n", what.c_str(), i, gpu.scales[i], want);
  }
  if (has_ts && gpu.ts_bits != cpu.ts_bits) {
    std::fprintf(stderr, "%s: tensor scale bits gpu %08x cpu %08x\n", what.c_str(), gpu.ts_bits, cpu.ts_bits);
    ++bad;
  }
  return bad;
}

struct Shape { int64_t n, k; };

void check_case(Format f, DType dt, Shape s, const GpuOptions& o, std::mt19937_64& rng) {
  const std::vector<uint8_t> w = to_bytes(make_data(s.n, s.k, dt, rng), dt);
  const QuantizeArgs a = make_args(f, dt, s.n, s.k);
  Result cpu, gpu;
  const std::string what = std::string(format_name(f)) + " " + dtype_name(dt) + " " + std::to_string(s.n) + "x" +
                           std::to_string(s.k) + (o.given ? " given" : "") + (o.alias_given ? " aliased" : "") +
                           (o.graph ? " graph" : "") + (o.prior ? " reused-workspace" : "");
  if (!run_cpu(a, w, o.given, &cpu) || !run_gpu(a, w, o, &gpu)) return;
  CHECK_MSG(compare(cpu, gpu, f == Format::kNVFP4, what) == 0, what);
}

const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

}  // namespace

TEST(nvfp4_gpu_matches_cpu_bit_exact) {
  std::mt19937_64 rng(test_seed());
  for (DType dt : kDTypes)
    for (Shape s : {Shape{1, 16}, Shape{3, 48}, Shape{127, 2880}, Shape{64, 1024}, Shape{7, 4096}})
      check_case(Format::kNVFP4, dt, s, GpuOptions{}, rng);
}

TEST(mxfp4_gpu_matches_cpu_bit_exact) {
  std::mt19937_64 rng(test_seed() + 1);
  for (DType dt : kDTypes)
    for (Shape s : {Shape{1, 32}, Shape{3, 96}, Shape{127, 2880}, Shape{64, 1024}, Shape{7, 4096}})
      check_case(Format::kMXFP4, dt, s, GpuOptions{}, rng);
}

TEST(nvfp4_gpu_given_tensor_scale) {
  std::mt19937_64 rng(test_seed() + 2);
  for (const float given : {0.0375f, 1.0f, 3.0e-7f}) {
    GpuOptions o;
    o.given = &given;
    for (DType dt : kDTypes) check_case(Format::kNVFP4, dt, Shape{33, 512}, o, rng);
    o.alias_given = true;  // tensor_scale == given_tensor_scale
    check_case(Format::kNVFP4, DType::kF32, Shape{5, 256}, o, rng);
  }
}

TEST(gpu_workspace_reuse_and_graph_capture) {
  std::mt19937_64 rng(test_seed() + 3);
  // A larger tensor quantized first leaves a larger amax in the workspace: it must be reset.
  std::vector<float> big = make_data(9, 2880, DType::kF32, rng);
  for (float& x : big) x *= 1000.0f;
  const std::vector<uint8_t> prior = to_bytes(big, DType::kF32);
  GpuOptions o;
  o.prior = &prior;
  check_case(Format::kNVFP4, DType::kF32, Shape{9, 2880}, o, rng);
  GpuOptions g;
  g.graph = true;
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) check_case(f, DType::kBF16, Shape{64, 1024}, g, rng);
}

TEST(gpu_rejects_bad_arguments_before_launch) {
  QuantizeArgs a = make_args(Format::kMXFP4, DType::kF32, 3, 48);
  uint8_t* dummy = reinterpret_cast<uint8_t*>(uintptr_t(256));  // never dereferenced: validation fails first
  a.w = dummy;
  a.packed = dummy;
  a.scales = dummy;
  CHECK_ERROR(quantize_gpu(a, nullptr, nullptr), "k: must be a multiple of the group size 32 for mxfp4 (got 48)");
  a.format = Format::kNVFP4;
  a.tensor_scale = reinterpret_cast<float*>(dummy);
  CHECK_ERROR(quantize_gpu(a, nullptr, nullptr), "workspace: must not be null");
  a.scales = nullptr;
  CHECK_ERROR(quantize_gpu(a, dummy, nullptr), "scales: must not be null");
  CHECK_EQ(int(cudaGetLastError()), int(cudaSuccess));
}

int main(int argc, char** argv) {
  FP4KIT_REQUIRE_GPU();
  return fp4test::run_all(argc, argv);
}
