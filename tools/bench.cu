// fp4kit-bench: the GEMM benchmark (decode and prefill kernels) against cuBLASLt BF16, same run, same
// method.
//
// Contract
//   fp4kit-bench [--suite llama70b|llama70b-prefill|llama8b|tp8|gptoss|all] [--m 1,2,4,...]
//                [--formats nvfp4,mxfp4] [--act bf16|fp16] [--config ID|all] [--json PATH] [--commit SHA]
//                [--replays N] [--tune PATH] [--layer NAME] [--compare auto|on|off] [--ceiling on|off]
//                [--rounds N] [--energy on|off]
//   For every (shape, m): fp4kit (each format) and cuBLASLt BF16 (best of its heuristic's top algorithms,
//   re-timed beside each format's configs in the same rounds, so both run under the same thermal and power
//   history) are timed the same way: a CUDA graph of several calls over rotating weight copies (together > 2x the
//   L2, so every call streams cold weights), median over N >= 100 replays, per-call time = replay / calls;
//   calls whose graph takes over 2 ms (large m) get fewer replays (about 0.15 s of them, at least 5) and
//   graphs of fewer calls (at least 2): each row records its replays and calls per graph. Eager per-call
//   time (one launch per call, event-timed) is reported beside it. Inputs are random, never zeros.
//   With several configs per row (--config all, --tune, --compare) every config is timed in each of
//   --rounds rounds (default 2 with --config all or --tune, else 1), each round in the reverse order of the one before,
//   and its time is the median of its rounds: a config's place in one sequence must not decide a close
//   race (JSON "rounds").
//   Rows are marked with what dispatch picks (dispatch: true); --config all also times every other config
//   that applies (decode configs up to twice the n_tiles m needs, the 64-token ones up to m = 256, the
//   64-token default above; prefill configs of the device's family (wgmma on Hopper, mma.sync with --as-cc 8) whose token tile is at most max(64, 2m), split variants only
//   where they split), and --compare (default: on for the *-prefill suites) times the other kernel's
//   analytic default beside dispatch's pick. Every row is checked: one call at its m on the last weight
//   copy, its first min(m, 256) tokens against cuBLAS on the dequantized weights (check_rel_l2; BF16 only).
//   --as-cc 8 dispatches as a device of compute capability 8.x would (the Ampere / Ada path, forced on
//   this GPU: the decode kernel up to 64 tokens, the mma.sync prefill kernel above; --config all times the
//   configs such a device runs, --compare the other of those two kernels); the JSON records "as_cc".
//   --ceiling on also times, the same way, an empty kernel (the launch floor of a call in these graphs) and
//   a pure read of each prepacked weight (read_stream_kernel: what streaming those bytes costs with
//   nothing else to do), and with m = 1 in the list cuBLAS's m = 1 time over that read: the most any
//   kernel streaming the weights once could gain over cuBLAS there.
//   --energy on also runs dispatch's pick and cuBLAS back to back, ~1 s each in the order cuBLAS, fp4kit,
//   fp4kit, cuBLAS (power_probe.cuh), and adds to the pick's row what NVML saw, the mean of the two runs:
//   energy_mj per call, watts, sm_mhz and capped (share of samples at the software power cap), and the
//   same with a cublas_ prefix. Under the board's power limit the time per call follows the energy per call.
//   JSON: {device, commit, date, l2_bytes, sms, method, [empty_kernel_us, read_ceiling: [...]], rows: [...]}.
//
//   fp4kit-tune --out PATH [--suite ...] [--m LIST] [--formats LIST] [--act bf16|fp16] [--layer NAME]
//   The same binary under the name fp4kit-tune (a link the build makes): --config all over the shapes
//   and m, a progress bar on stderr, and the fastest config per (format, act, n, k, m) written to PATH as
//   a tuning table (fp4kit/tuning.h; load it with FP4KIT_TUNING_TABLE=PATH). fp4kit-bench --tune PATH
//   does the same with the benchmark's output.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "configs.h"
#include "gemm_internal.h"
#include "fp4kit/formats.h"
#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "fp4kit/tuning.h"
#include "bench_common.cuh"
#include "power_probe.cuh"

using namespace fp4kit;

#define CKB(expr)                                                                                  \
  do {                                                                                             \
    cublasStatus_t _s = (expr);                                                                    \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #expr, int(_s));     \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)
namespace {
using namespace fp4bench;

// --ceiling: what streaming the same bytes costs with nothing else to do. One pass over n16 16-byte words
// with the decode kernel's load (read-only path, no L1 allocation), eight loads in flight per thread, a
// full SM of threads; the XOR keeps every load live (the store practically never happens).
__global__ void read_stream_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  auto ld = [](const uint4* q) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(q));
    return v;
  };
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = ld(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = ld(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}
// --ceiling: the per-call cost of a launch that does nothing, in the same graphs.
__global__ void empty_kernel() {}

struct Shape {
  std::string model, layer;
  int64_t n, k;
};

std::vector<Shape> suite(const std::string& name) {
  std::vector<Shape> s;
  auto add = [&](const char* model, std::initializer_list<std::pair<const char*, std::pair<int64_t, int64_t>>> l) {
    for (auto& e : l) s.push_back({model, e.first, e.second.first, e.second.second});
  };
  if (name == "llama70b" || name == "llama70b-prefill" || name == "all")
    add("llama-3.3-70b", {{"qkv", {10240, 8192}}, {"o", {8192, 8192}}, {"gate_up", {57344, 8192}}, {"down", {8192, 28672}}});
  if (name == "llama8b" || name == "all")
    add("llama-3.1-8b", {{"qkv", {6144, 4096}}, {"o", {4096, 4096}}, {"gate_up", {28672, 4096}}, {"down", {4096, 14336}}});
  if (name == "tp8" || name == "all")
    add("llama-3.3-70b-tp8", {{"qkv", {1280, 8192}}, {"o", {8192, 1024}}, {"gate_up", {7168, 8192}}, {"down", {8192, 3584}}});
  if (name == "gptoss" || name == "all") add("gpt-oss-attn", {{"qkv", {5120, 2880}}, {"o", {2880, 4096}}});
  return s;
}

// The m list of the *-prefill suites (when --m is not given): decode sizes, the crossover, prefill to 16384.
const char* kPrefillMs = "1,16,32,64,128,256,512,1024,2048,4096,8192,16384";

const char* kernel_of(const KernelConfig& c) { return is_prefill(c) ? "prefill" : "decode"; }
const char* pipeline_of(const KernelConfig& c) {
  return c.pipeline == kWgmma ? "wgmma" : c.pipeline == kMma ? "mma" : c.pipeline == kBulk ? "bulk"
         : c.pipeline == kCluster ? "cluster" : "ring";
}

// cuBLASLt: Y[m, n] (row-major) = X[m, k] W[n, k]^T, i.e. column-major C[n, m] = W^T(op T) * X.
struct Lt {
  cublasLtHandle_t h;
  void* ws = nullptr;
  size_t ws_bytes = 64 << 20;
  Lt() {
    CKB(cublasLtCreate(&h));
    CK(cudaMalloc(&ws, ws_bytes));
  }
  ~Lt() {
    cudaFree(ws);
    cublasLtDestroy(h);
  }
  struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
  };
  Plan plan(int64_t m, int64_t n, int64_t k, cudaDataType_t t) {
    Plan p;
    CKB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CKB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CKB(cublasLtMatrixLayoutCreate(&p.a, t, k, n, k));
    CKB(cublasLtMatrixLayoutCreate(&p.b, t, k, m, k));
    CKB(cublasLtMatrixLayoutCreate(&p.c, t, n, m, n));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    p.algos.resize(8);
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(h, p.op, p.a, p.b, p.c, p.c, pref, 8, p.algos.data(), &found));
    p.algos.resize(size_t(found));
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
  }
  void run(const Plan& p, int ai, const void* w, const void* x, void* y, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    CKB(cublasLtMatmul(h, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algos[size_t(ai)].algo, ws,
                       ws_bytes, s));
  }
};

}  // namespace

// --energy on: the pick's row fields (power_probe.cuh), fp4kit's then cuBLAS's.
std::string energy_fields(const Sustained& f, const Sustained& c) {
  std::ostringstream o;
  o << ", \"energy_mj\": " << f.mj << ", \"watts\": " << f.watts << ", \"sm_mhz\": " << f.mhz << ", \"capped\": "
    << f.capped << ", \"sustained_us\": " << f.us << ", \"cublas_energy_mj\": " << c.mj << ", \"cublas_watts\": "
    << c.watts << ", \"cublas_sm_mhz\": " << c.mhz << ", \"cublas_capped\": " << c.capped
    << ", \"cublas_sustained_us\": " << c.us;
  return o.str();
}

// The progress line of a sweep: "[#####     ] done/total what", redrawn in place on a terminal, one line
// per step otherwise (logs).
void progress(int done, int total, const std::string& what) {
  constexpr int kWidth = 30;
  const int fill = total > 0 ? int(int64_t(kWidth) * done / total) : kWidth;
  const bool tty = isatty(fileno(stderr)) != 0;
  std::fprintf(stderr, "%s[%s%s] %d/%d %s%s", tty ? "\r" : "", std::string(size_t(fill), '#').c_str(),
               std::string(size_t(kWidth - fill), ' ').c_str(), done, total, what.c_str(),
               tty ? (done == total ? "\n" : "\x1b[K") : "\n");
  std::fflush(stderr);
}

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {{"suite", "llama70b"}, {"m", ""},
                                            {"formats", "nvfp4,mxfp4"}, {"act", "bf16"}, {"config", "-1"},
                                            {"json", ""}, {"commit", "unknown"}, {"replays", "100"},
                                            {"tune", ""}, {"layer", ""}, {"compare", "auto"},
                                            {"ceiling", "off"}, {"as-cc", ""}, {"rounds", ""},
                                            {"energy", "off"}};
  // Called as fp4kit-tune: the tuner (see the contract on top): --out is --tune, and the options that only
  // shape the benchmark's report (--config, --json, --compare, --ceiling, --energy) are not its own.
  const std::string prog = argc > 0 ? std::string(argv[0]) : std::string();
  const bool tuner = prog.size() >= 11 && prog.compare(prog.size() - 11, 11, "fp4kit-tune") == 0;
  const char* me = tuner ? "fp4kit-tune" : "fp4kit-bench";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "-h" || a == "--help") && tuner) {
      std::printf("usage: fp4kit-tune --out PATH [--suite llama70b|llama70b-prefill|llama8b|tp8|gptoss|all]\n"
                  "                   [--m LIST] [--formats LIST] [--act bf16|fp16] [--layer NAME] [--replays N]\n"
                  "                   [--rounds N]\n"
                  "  times every config of the table on each shape and m (N rounds, default 2, each in the\n"
                  "  previous round's reverse order; a config's time is its median) and writes the fastest per\n"
                  "  (format, act, n, k, m) to PATH; load it with FP4KIT_TUNING_TABLE=PATH\n");
      return 0;
    }
    if (a == "-h" || a == "--help") {
      std::printf("usage: fp4kit-bench [--suite llama70b|llama70b-prefill|llama8b|tp8|gptoss|all] [--m LIST]\n"
                  "                    [--formats LIST] [--act bf16|fp16] [--config ID|all] [--json PATH]\n"
                  "                    [--commit SHA] [--replays N]\n"
                  "                    [--rounds N]    (time the configs of a row N times, alternating forward and\n"
                  "                                    reverse order, and report each one's median; default 2\n"
                  "                                    with --config all or --tune, else 1)\n"
                  "                    [--tune PATH]   (time every config, write the fastest as a tuning table)\n"
                  "                    [--layer NAME]  (only that layer of the suite, e.g. o)\n"
                  "                    [--compare auto|on|off]  (also time the other kernel's default; auto: on\n"
                  "                                    for the *-prefill suites)\n"
                  "                    [--ceiling on|off]  (also time an empty launch and a pure read of each\n"
                  "                                    prepacked weight: what streaming its bytes costs)\n"
                  "                    [--as-cc 8]     (dispatch as a compute capability 8.x device would)\n"
                  "                    [--energy on|off]  (also run the dispatch pick and cuBLAS back to back for\n"
                  "                                    ~1 s each, twice, and report mJ per call, board watts, SM\n"
                  "                                    clock and power-capped share from NVML)\n"
                  "  --m defaults to 1,2,4,8,16,32,64 (%s for the *-prefill suites)\n", kPrefillMs);
      return 0;
    }
    std::string key = a.rfind("--", 0) == 0 ? a.substr(2) : std::string();
    if (tuner && key == "out") key = "tune";
    else if (tuner && (key == "tune" || key == "config" || key == "json" || key == "compare" || key == "ceiling" ||
                    key == "energy"))
      key.clear();
    if (key.empty() || i + 1 >= argc || !opt.count(key)) {
      std::fprintf(stderr, "%s: unknown or incomplete option '%s' (see --help)\n", me, a.c_str());
      return 2;
    }
    opt[key] = argv[++i];
  }
  if (tuner && opt["tune"].empty()) {
    std::fprintf(stderr, "fp4kit-tune: --out PATH is required (the tuning table to write)\n");
    return 2;
  }
  for (const std::string& fname : split(opt["formats"]))
    if (fname != "nvfp4" && fname != "mxfp4") {
      std::fprintf(stderr, "%s: --formats lists nvfp4 and/or mxfp4 (got '%s')\n", me, fname.c_str());
      return 2;
    }
  if (!opt["rounds"].empty() && (opt["rounds"].size() != 1 || opt["rounds"][0] < '1' || opt["rounds"][0] > '9')) {
    std::fprintf(stderr, "%s: --rounds must be 1 to 9 (got '%s')\n", me, opt["rounds"].c_str());
    return 2;
  }
  for (const char* onoff : {"ceiling", "energy"})
    if (opt[onoff] != "on" && opt[onoff] != "off") {
      std::fprintf(stderr, "%s: --%s must be on or off (got '%s')\n", me, onoff, opt[onoff].c_str());
      return 2;
    }
  if (opt["act"] != "bf16" && opt["act"] != "fp16") {
    std::fprintf(stderr, "%s: --act must be bf16 or fp16 (got '%s')\n", me, opt["act"].c_str());
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    // The benchmark has nothing to report and says so; the tuner cannot write its table: a failure.
    std::printf("No CUDA GPU found: %s needs an NVIDIA GPU (sm_80 or newer)\n", me);
    return tuner ? 1 : 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int cc = opt["as-cc"].empty() ? prop.major : std::atoi(opt["as-cc"].c_str());
  if (cc != prop.major && cc != 8) {
    std::fprintf(stderr, "%s: --as-cc must be 8 (got '%s')\n", me, opt["as-cc"].c_str());
    return 2;
  }
  const bool bf16 = opt["act"] != "fp16";
  const DType act = bf16 ? DType::kBF16 : DType::kF16;
  // --config all times every applicable config; --tune PATH does the same and writes the fastest per
  // (format, act, n, k, m) as a tuning table the dispatcher loads (fp4kit/tuning.h).
  const bool sweep = opt["config"] == "all" || !opt["tune"].empty();
  const int config = sweep ? -1 : std::atoi(opt["config"].c_str());
  const int replays = std::max(100, std::atoi(opt["replays"].c_str()));
  const int rounds = opt["rounds"].empty() ? (sweep ? 2 : 1) : std::atoi(opt["rounds"].c_str());
  const bool prefill_suite = opt["suite"].size() > 8 && opt["suite"].rfind("-prefill") == opt["suite"].size() - 8;
  const bool compare = opt["compare"] == "on" || (opt["compare"] == "auto" && prefill_suite);
  if (opt["m"].empty()) opt["m"] = prefill_suite ? kPrefillMs : "1,2,4,8,16,32,64";
  std::vector<int64_t> ms;
  for (auto& s : split(opt["m"])) ms.push_back(std::atoll(s.c_str()));
  if (ms.empty() || *std::min_element(ms.begin(), ms.end()) < 1) {
    std::fprintf(stderr, "fp4kit-bench: --m must list m >= 1\n");
    return 2;
  }
  const int sms = prop.multiProcessorCount;
  auto shapes = suite(opt["suite"]);
  if (!shapes.empty() && !opt["layer"].empty()) {
    std::vector<Shape> keep;
    for (const Shape& sh : shapes)
      if (sh.layer == opt["layer"]) keep.push_back(sh);
    if (keep.empty()) {
      std::fprintf(stderr, "fp4kit-bench: suite %s has no layer '%s'\n", opt["suite"].c_str(), opt["layer"].c_str());
      return 2;
    }
    shapes = keep;
  }
  if (shapes.empty()) {
    std::fprintf(stderr, "fp4kit-bench: --suite must be llama70b, llama70b-prefill, llama8b, tp8, gptoss or all\n");
    return 2;
  }
  const size_t l2 = size_t(prop.l2CacheSize);
  const size_t rotate_bytes = 2 * l2 + (64u << 20);  // rotating copies together exceed 2x L2

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Lt lt;
  const bool energy = opt["energy"] == "on";
  PowerProbe probe(energy);
  if (energy && !probe.ok()) {
    std::fprintf(stderr, "fp4kit-bench: --energy on needs NVML: %s\n", probe.why().c_str());
    return 2;
  }
  const int64_t m_max = *std::max_element(ms.begin(), ms.end());
  std::ostringstream rows, tuning;
  int nrows = 0;
  // --ceiling on: the launch floor and, per shape and format, a pure read of the prepacked weight (JSON
  // "empty_kernel_us" and "read_ceiling"; the same method as every row).
  const bool ceiling = opt["ceiling"] == "on";
  uint32_t* sink = nullptr;
  double empty_us = 0;
  std::vector<std::string> read_rows;
  if (ceiling) {
    CK(cudaMalloc(&sink, size_t(sms) * 8 * sizeof(uint32_t)));
    const Measured e = measure(s, 8, replays, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); });
    empty_us = e.us;
    std::printf("empty kernel: %.2f us per call in a graph of %d\n", e.us, e.calls);
  }
  const std::string date = utc_now();
  // The JSON, rewritten after every (shape, format) with "complete": false, so a run cut short still
  // leaves its rows.
  auto write_json = [&](bool complete) {
    if (opt["json"].empty()) return true;
    FILE* fjson = std::fopen(opt["json"].c_str(), "w");
    if (!fjson) {
      std::fprintf(stderr, "fp4kit-bench: cannot write %s\n", opt["json"].c_str());
      return false;
    }
    std::ostringstream ceilings;  // --ceiling on: its fields, before the rows
    if (ceiling) {
      ceilings << "  \"empty_kernel_us\": " << empty_us << ",\n  \"read_ceiling\": [\n";
      for (size_t i = 0; i < read_rows.size(); ++i) ceilings << read_rows[i] << (i + 1 < read_rows.size() ? ",\n" : "\n");
      ceilings << "  ],\n";
    }
    std::fprintf(fjson,
                 "{\n  \"tool\": \"fp4kit-bench\",\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %zu,\n"
                 "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"suite\": \"%s\",\n  \"complete\": %s,\n"
                 "  \"method\": \"after %.0f ms of the same calls (steady clocks), CUDA graph of >= 8 calls over rotating "
                 "weight copies (> 2x L2), median of %d replays; "
                 "where a graph takes over 2 ms (large m) fewer calls (>= 2) and replays for about %.0f ms (>= 5), one "
                 "warm-up: each row's replays, graph_calls, eager_iters (cublas_replays, cublas_graph_calls) say; "
                 "cuBLASLt best of heuristic top-8 (cublas_algo: its rank), picked after the same warm-up by the median of 3 "
                 "short timings per algorithm in alternating order, then timed beside "
                 "each row's configs in the same rounds (first in forward rounds, last in reverse ones; the median)\",\n  \"copy_ceiling_tbps\": 4.25,\n  \"as_cc\": %d,\n%s  \"rows\": [\n%s\n  ]\n}\n",
                 json_escape(prop.name).c_str(), prop.multiProcessorCount, l2, json_escape(opt["commit"]).c_str(),
                 date.c_str(), json_escape(opt["suite"]).c_str(), complete ? "true" : "false", kWarmMs, replays, kBudgetMs,
                 cc, ceilings.str().c_str(), rows.str().c_str());
    std::fclose(fjson);
    return true;
  };
  const int steps = int(shapes.size() * split(opt["formats"]).size() * ms.size());
  int step = 0;
  std::printf("%-18s %-8s %-6s %5s %9s %9s %9s %8s %8s %7s %8s %7s %s\n", "model", "layer", "format", "m", "us",
              "eager_us", "cublas_us", "speedup", "TB/s", "roof", "TFLOP/s", "check", "config (* = dispatch)");

  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k;
    // Activations and outputs (shared by both libraries).
    __nv_bfloat16* x;
    void* y;
    CK(cudaMalloc(&x, size_t(m_max * k) * 2));
    CK(cudaMalloc(&y, size_t(m_max * n) * 2));
    fill16(x, size_t(m_max * k), 7u, bf16);

    // cuBLAS BF16/FP16 weights, rotating copies.
    const size_t wbytes16 = size_t(n * k) * 2;
    const int copies16 = int(std::max<size_t>(2, (rotate_bytes + wbytes16 - 1) / wbytes16));
    std::vector<void*> w16(static_cast<size_t>(copies16));
    for (int c = 0; c < copies16; ++c) {
      CK(cudaMalloc(&w16[size_t(c)], wbytes16));
      fill16(w16[size_t(c)], size_t(n * k), 100u + c, bf16);
    }
    // Per m: cuBLASLt's plan and the algorithm picked (algo: its rank in the heuristic's list, 0 its first).
    // Its time is taken beside the FP4 rows (below), with time_cublas.
    struct CublasPick {
      Lt::Plan plan;
      int algo = 0;
    };
    std::map<int64_t, CublasPick> cublas;
    auto time_cublas = [&](int64_t m) {
      const CublasPick& c = cublas[m];
      return measure(s, copies16, replays, [&](int i) { lt.run(c.plan, c.algo, w16[size_t(i % copies16)], x, y, s); },
                     false);
    };
    for (int64_t m : ms) {
      const Lt::Plan& plan = cublas[m].plan = lt.plan(m, n, k, bf16 ? CUDA_R_16BF : CUDA_R_16F);
      if (plan.algos.empty()) {
        std::fprintf(stderr, "fp4kit-bench: cuBLASLt has no algorithm for m=%lld n=%lld k=%lld\n", (long long)m,
                     (long long)n, (long long)k);
        return 2;
      }
      // Pick by short graph timings (20 replays; fewer, at least 3, where a graph takes over 3 ms) in
      // kPickRounds rounds over the heuristic's algorithms, each round in the reverse order of the one
      // before, the fastest median winning; after the same sustained load as every measurement (picked right
      // after an idle moment, the fastest algorithm under burst clocks need not be the fastest under load).
      // One pass in one order was not enough under the board's power limit: it took Llama-3.3-70B qkv's
      // algorithm 6 at m = 256 (81.9 us) where algorithm 2 runs 71.6 us, which flattered fp4kit by 14%.
      constexpr int kPickRounds = 3;
      const double probe = eager_time_us(s, copies16, 1, [&](int i) { lt.run(plan, 0, w16[size_t(i % copies16)], x, y, s); }, 1);
      warm_up(s, [&](int i) { lt.run(plan, 0, w16[size_t(i % copies16)], x, y, s); }, probe);
      const int sel = std::max(3, std::min(20, int(60e3 / std::max(1.0, probe * copies16))));
      const int na = int(plan.algos.size());
      std::vector<std::vector<double>> algo_times(static_cast<size_t>(na));
      for (int rd = 0; rd < kPickRounds; ++rd)
        for (int o = 0; o < na; ++o) {
          const int ai = alternating(rd, o, na);
          algo_times[size_t(ai)].push_back(graph_time_us(
              s, copies16, sel, [&](int i) { lt.run(plan, ai, w16[size_t(i % copies16)], x, y, s); }, sel < 20 ? 1 : 3));
        }
      double best = 1e30;
      int best_ai = 0;
      for (int ai = 0; ai < na; ++ai) {
        const double t = median(algo_times[size_t(ai)]);
        if (t < best) { best = t; best_ai = ai; }
      }
      cublas[m].algo = best_ai;
    }

    for (const std::string& fname : split(opt["formats"])) {
      const Format f = fname == "mxfp4" ? Format::kMXFP4 : Format::kNVFP4;
      const int g = group_size(f);
      const size_t ckpt_bytes = size_t(n * k / 2) + size_t(n * (k / g)) + (f == Format::kNVFP4 ? 4 : 0);
      PackedLayout l;
      CKS(packed_layout(f, n, k, &l));
      const int copies = int(std::max<size_t>(2, (rotate_bytes + l.total_bytes - 1) / l.total_bytes));
      uint8_t *packed, *scales;
      float* ts;
      CK(cudaMalloc(&packed, size_t(n * k / 2)));
      CK(cudaMalloc(&scales, size_t(n * (k / g))));
      CK(cudaMalloc(&ts, 4));
      const float ts_h = 0.02f;
      CK(cudaMemcpy(ts, &ts_h, 4, cudaMemcpyHostToDevice));
      std::vector<void*> wp(static_cast<size_t>(copies));
      for (int c = 0; c < copies; ++c) {
        CK(cudaMalloc(&wp[size_t(c)], l.total_bytes));
        prepack_random(f, n, k, packed, scales, ts, 300u + c, 400u + c, wp[size_t(c)]);
      }
      CK(cudaDeviceSynchronize());  // the copies and the last copy's checkpoint tensors, before stream s reads them
      if (ceiling) {
        const size_t n16 = l.total_bytes / 16;
        const Measured r = measure(s, copies, replays, [&](int i) {
          read_stream_kernel<<<sms * 8, 256, 0, s>>>(static_cast<const uint4*>(wp[size_t(i % copies)]), n16, sink);
        });
        const double tbps = double(l.total_bytes) / (r.us * 1e-6) / 1e12;
        const double cb1 = cublas.count(1) ? time_cublas(1).us : 0.0;
        std::printf("read ceiling %-18s %-8s %-6s %.1f MB: %.1f us (%.2f TB/s)%s\n", sh.model.c_str(), sh.layer.c_str(),
                    fname.c_str(), l.total_bytes / 1e6, r.us, tbps,
                    cb1 > 0 ? (", cuBLAS m=1 / read: " + std::to_string(cb1 / r.us).substr(0, 4) + "x").c_str() : "");
        std::ostringstream row;
        row << "    {\"model\": \"" << sh.model << "\", \"layer\": \"" << sh.layer << "\", \"format\": \"" << fname
            << "\", \"n\": " << n << ", \"k\": " << k << ", \"bytes\": " << l.total_bytes << ", \"read_us\": " << r.us
            << ", \"read_tbps\": " << tbps << ", \"cublas_m1_us\": " << cb1
            << ", \"max_speedup_m1\": " << (cb1 > 0 ? cb1 / r.us : 0.0) << "}";
        read_rows.push_back(row.str());
      }
      // Self-check reference: cuBLAS on the last copy's dequantized weights, first m_ref tokens (BF16 only).
      const int64_t m_ref = std::min<int64_t>(256, m_max);
      void* yref = nullptr;
      if (bf16) {
        __nv_bfloat16* wd;
        CK(cudaMalloc(&wd, size_t(n * k) * 2));
        CK(cudaMalloc(&yref, size_t(m_ref * n) * 2));
        dequant_bf16<<<4096, 256, 0, s>>>(f, packed, scales, f == Format::kNVFP4 ? ts : nullptr, n, k, wd);
        auto plan = lt.plan(m_ref, n, k, CUDA_R_16BF);
        lt.run(plan, 0, wd, x, yref, s);
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(wd));
      }

      for (int64_t m : ms) {
      int ncfg = 0;
      const KernelConfig* table = kernel_configs(&ncfg);
      std::vector<int> cfgs;
      const int picked = config >= 0 ? config : dispatch_config(f, act, m, n, k, prop.name, nullptr, cc, sms);
      const int decode64 = kKernelConfigs[first_ring_index(8)].id;  // the decode kernel's 64-token default
      // What --config all times besides the pick (see the contract on top).
      auto applies = [&](const KernelConfig& c) {
        if (!config_supported(c, cc)) return false;
        if (is_prefill(c) && c.pipeline != native_prefill(cc)) return false;
        if (is_prefill(c))
          return 8 * c.n_tiles <= std::max<int64_t>(64, 2 * m) && (c.max_splits <= 1 || prefill_schedule(c, m, n, k, sms).splits > 1);
        if (m <= 64) {
          const int need = int((m + 7) / 8);
          return c.n_tiles >= need && c.n_tiles <= 2 * need;
        }
        if (m <= 256) return c.n_tiles == 8;
        return c.id == decode64;  // the decode kernel's 64-token default (in 64-token launches)
      };
      cfgs.push_back(picked);
      if (sweep) {
        for (int ci = 0; ci < ncfg; ++ci)
          if (table[ci].id != picked && applies(table[ci])) cfgs.push_back(table[ci].id);
      } else if (compare) {  // the other kernel's analytic default
        // The decode kernel's default (as on an sm_80 device; past 64 tokens the 64-token entry in blocks)
        // against the prefill family's least-cost entry.
        const int decode = pick_config(m, n, k, nullptr, 8, sms);
        const int other = is_prefill(*find_config(picked)) ? (is_prefill(*find_config(decode)) ? decode64 : decode)
                                                           : pick_prefill_config(m, n, k, cc, sms);
        if (other >= 0 && other != picked) cfgs.push_back(other);
      }
      int best_cfg = picked;
      double best_us = 1e30;
      // cuBLAS is timed again in the same rounds as the configs, first in the forward rounds and last in the
      // reverse ones, and its time is the median of those: the two libraries then run under the same thermal
      // and power history. (Under a sustained load the H200 reaches its power limit on large calls and the
      // SM clock drops, the more the longer it has been busy: cuBLAS's time for one call moved by up to ~17%
      // with it, Llama-3.3-70B qkv at m = 256 71.6 and 83.7 us in two runs; docs/prefill-notes.md.)
      Measured cb;  // its first round's counts, the median of its rounds' times
      std::vector<double> cb_times;
      auto cublas_round = [&] {
        const Measured r = time_cublas(m);
        if (cb_times.empty()) cb = r;
        cb_times.push_back(r.us);
      };
      // Every config's plan and workspace first; then `rounds` timing rounds over all of them, each in the
      // reverse order of the one before, so that no config always runs first or after the same neighbour
      // (single passes in one order ranked configs within ~5% of each other either way); a config's time is
      // the median of its rounds (eager time, replays and calls from the first).
      const size_t nc = cfgs.size();
      std::vector<detail::DecodePlan> plans(nc);
      std::vector<size_t> wsbs(nc, 0);
      std::vector<void*> wss(nc, nullptr);
      for (size_t ci = 0; ci < nc; ++ci) {
        CKS(detail::make_plan(m, PackedWeight{f, n, k, wp[0]}, act, cfgs[ci], &plans[ci]));
        CKS(gemm_workspace_bytes(m, PackedWeight{f, n, k, wp[0]}, act, &wsbs[ci], cfgs[ci]));
        if (wsbs[ci]) { CK(cudaMalloc(&wss[ci], wsbs[ci])); CK(cudaMemset(wss[ci], 0, wsbs[ci])); }
      }
      auto call_cfg = [&](size_t ci, void* w) {
        GemmArgs ga;
        ga.m = m; ga.act = act; ga.x = x; ga.w = PackedWeight{f, n, k, w}; ga.y = y;
        ga.workspace = wss[ci]; ga.workspace_bytes = wsbs[ci]; ga.config = cfgs[ci];
        CKS(gemm(ga, s));
      };
      std::vector<Measured> first(nc);
      std::vector<std::vector<double>> times(nc);
      for (int rd = 0; rd < rounds; ++rd) {
        if (rd % 2 == 0) cublas_round();
        for (size_t o = 0; o < nc; ++o) {
          const size_t ci = size_t(alternating(rd, int(o), int(nc)));
          const Measured r = measure(s, copies, replays, [&](int i) { call_cfg(ci, wp[size_t(i % copies)]); },
                                     rd == 0);
          if (rd == 0) first[ci] = r;
          times[ci].push_back(r.us);
        }
        if (rd % 2 == 1) cublas_round();
      }
      cb.us = median(cb_times);
      // --energy on: the pick (cfgs[0]) and cuBLAS sustained, cuBLAS, fp4kit, fp4kit, cuBLAS; the mean of each.
      Sustained ef, ec;
      if (energy) {
        const CublasPick& c = cublas[m];
        auto cub = [&] {
          return probe.sustain(s, copies16, [&](int i) { lt.run(c.plan, c.algo, w16[size_t(i % copies16)], x, y, s); },
                               1000.0);
        };
        auto fp4 = [&] { return probe.sustain(s, copies, [&](int i) { call_cfg(0, wp[size_t(i % copies)]); }, 1000.0); };
        const Sustained c1 = cub(), f1 = fp4(), f2 = fp4(), c2 = cub();
        ef = mean(f1, f2);
        ec = mean(c1, c2);
        std::printf("energy %s %s %s m=%lld: fp4kit %.3f mJ/call (%.1f us, %.0f W, %.0f MHz, capped %.0f%%), cuBLAS %.3f "
                    "mJ/call (%.1f us, %.0f W, %.0f MHz, capped %.0f%%): energy ratio %.3f\n",
                    sh.model.c_str(), sh.layer.c_str(), fname.c_str(), (long long)m, ef.mj, ef.us, ef.watts, ef.mhz,
                    100 * ef.capped, ec.mj, ec.us, ec.watts, ec.mhz, 100 * ec.capped, ef.mj / ec.mj);
        std::fflush(stdout);
      }
      for (size_t ci = 0; ci < nc; ++ci) {
        const int cfg = cfgs[ci];
        const KernelConfig& kc = *find_config(cfg);
        const detail::DecodePlan& plan = plans[ci];
        const size_t wsb = wsbs[ci];
        const Measured& r = first[ci];
        const double us = median(times[ci]);
        if (us < best_us) { best_us = us; best_cfg = cfg; }
        double check = -1;
        if (bf16) {  // this config at this m on the last copy; its first min(m, m_ref) tokens
          call_cfg(ci, wp.back());
          check = rel_l2_device(y, yref, size_t(std::min(m, m_ref) * n), s);
        }
        CK(cudaFree(wss[ci]));
        const double tbps = double(ckpt_bytes) / (us * 1e-6) / 1e12;
        const double speedup = cb.us / us;
        const double tflops = 2.0 * double(m) * double(n) * double(k) / (us * 1e-6) / 1e12;
        const double cublas_tflops = 2.0 * double(m) * double(n) * double(k) / (cb.us * 1e-6) / 1e12;
        std::string cfgname = kc.name;
        std::printf("%-18s %-8s %-6s %5lld %9.1f %9.1f %9.1f %7.2fx %8.2f %6.0f%% %8.1f %7.4f %s%s\n", sh.model.c_str(),
                    sh.layer.c_str(), fname.c_str(), (long long)m, us, r.eager_us, cb.us, speedup, tbps,
                    100 * tbps / 4.25, tflops, check, cfgname.c_str(), cfg == picked ? " *" : "");
        std::fflush(stdout);
        rows << (nrows++ ? ",\n" : "") << "    {\"op\": \"gemm\", \"model\": \"" << sh.model << "\", \"layer\": \""
             << sh.layer << "\", \"format\": \"" << fname << "\", \"act\": \"" << (bf16 ? "bf16" : "fp16")
             << "\", \"m\": " << m << ", \"n\": " << n << ", \"k\": " << k << ", \"config\": \"" << cfgname
             << "\", \"kernel\": \"" << kernel_of(kc) << "\", \"pipeline\": \"" << pipeline_of(kc)
             << "\", \"dispatch\": " << (cfg == picked ? "true" : "false") << ", \"grid\": " << plan.grid
             << ", \"splits\": " << plan.splits << ", \"split_tiles\": " << plan.split_tiles
             << ", \"workspace_bytes\": " << wsb << ", \"us\": " << us
             << ", \"eager_us\": " << r.eager_us << ", \"cublas_us\": " << cb.us << ", \"cublas_algo\": " << cublas[m].algo
             << ", \"speedup\": " << speedup
             << ", \"tflops\": " << tflops << ", \"cublas_tflops\": " << cublas_tflops
             << ", \"weight_bytes\": " << ckpt_bytes << ", \"weight_tbps\": " << tbps
             << ", \"roofline_frac\": " << tbps / 4.25 << ", \"check_rel_l2\": " << check
             << (energy && ci == 0 ? energy_fields(ef, ec) : std::string())
             << ", \"replays\": " << r.replays << ", \"rounds\": " << rounds << ", \"graph_calls\": " << r.calls << ", \"eager_iters\": "
             << r.eager_iters << ", \"cublas_replays\": " << cb.replays << ", \"cublas_graph_calls\": " << cb.calls
             << "}";
      }
      tuning << fname << " " << (bf16 ? "bf16" : "fp16") << " " << n << " " << k << " " << m << " "
             << find_config(best_cfg)->name << "\n";
      if (!opt["tune"].empty())
        progress(++step, steps, sh.model + " " + sh.layer + " " + fname + " m=" + std::to_string(m) + ": " +
                                    find_config(best_cfg)->name);
      }
      if (yref) CK(cudaFree(yref));
      if (!write_json(false)) return 2;
      for (void* p : wp) CK(cudaFree(p));
      CK(cudaFree(packed));
      CK(cudaFree(scales));
      CK(cudaFree(ts));
    }
    for (void* p : w16) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }

  if (!opt["tune"].empty()) {
    const std::string table = std::string("fp4kit-tuning 1\n# written by ") + (tuner ? "fp4kit-tune" : "fp4kit-bench --tune") +
                              " (commit " + opt["commit"] + ")\ndevice " + prop.name + "\n" + tuning.str();
    if (!write_file(opt["tune"], table, "fp4kit-bench")) return 2;
    std::printf("load the tuning table with FP4KIT_TUNING_TABLE=%s\n", opt["tune"].c_str());
  }
  if (sink) CK(cudaFree(sink));
  if (!opt["json"].empty()) {
    if (!write_json(true)) return 2;
    std::printf("wrote %s\n", opt["json"].c_str());
  }
  return 0;
}
