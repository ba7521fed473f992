// fp4kit-bench: decode GEMM benchmark against cuBLASLt BF16, same run, same method.
//
// Contract
//   fp4kit-bench [--suite llama70b|llama8b|tp8|gptoss|all] [--m 1,2,4,...] [--formats nvfp4,mxfp4]
//                [--act bf16|fp16] [--config ID|all] [--json PATH] [--commit SHA] [--replays N]
//                [--tune PATH]
//   For every (shape, m): fp4kit (each format) and cuBLASLt BF16 (best of its heuristic's top algorithms)
//   are timed the same way: a CUDA graph of several calls over rotating weight copies (together > 2x the
//   L2, so every call streams cold weights), median over >= 100 replays, per-call time = replay / calls.
//   Eager per-call time (one launch per call, event-timed) is reported beside it. Inputs are random, never
//   zeros. Each (shape, format) is also checked at m = 16 against cuBLAS on the dequantized weights
//   (check_rel_l2). JSON: {device, commit, date, l2_bytes, sms, rows: [...]}.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
#include "fp4kit/formats.h"
#include "fp4kit/gemm.h"
#include "fp4kit/repack.h"
#include "fp4kit/tuning.h"
#include "bench_common.cuh"

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

struct Shape {
  std::string model, layer;
  int64_t n, k;
};

std::vector<Shape> suite(const std::string& name) {
  std::vector<Shape> s;
  auto add = [&](const char* model, std::initializer_list<std::pair<const char*, std::pair<int64_t, int64_t>>> l) {
    for (auto& e : l) s.push_back({model, e.first, e.second.first, e.second.second});
  };
  if (name == "llama70b" || name == "all")
    add("llama-3.3-70b", {{"qkv", {10240, 8192}}, {"o", {8192, 8192}}, {"gate_up", {57344, 8192}}, {"down", {8192, 28672}}});
  if (name == "llama8b" || name == "all")
    add("llama-3.1-8b", {{"qkv", {6144, 4096}}, {"o", {4096, 4096}}, {"gate_up", {28672, 4096}}, {"down", {4096, 14336}}});
  if (name == "tp8" || name == "all")
    add("llama-3.3-70b-tp8", {{"qkv", {1280, 8192}}, {"o", {8192, 1024}}, {"gate_up", {7168, 8192}}, {"down", {8192, 3584}}});
  if (name == "gptoss" || name == "all") add("gpt-oss-attn", {{"qkv", {5120, 2880}}, {"o", {2880, 4096}}});
  return s;
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

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {{"suite", "llama70b"}, {"m", "1,2,4,8,16,32,64"},
                                            {"formats", "nvfp4,mxfp4"}, {"act", "bf16"}, {"config", "-1"},
                                            {"json", ""}, {"commit", "unknown"}, {"replays", "100"},
                                            {"tune", ""}, {"layer", ""}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: fp4kit-bench [--suite llama70b|llama8b|tp8|gptoss|all] [--m LIST] [--formats LIST]\n"
                  "                    [--act bf16|fp16] [--config ID|all] [--json PATH] [--commit SHA] [--replays N]\n"
                  "                    [--tune PATH]   (time every config, write the fastest as a tuning table)\n"
                  "                    [--layer NAME]  (only that layer of the suite, e.g. o)\n");
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc || !opt.count(a.substr(2))) {
      std::fprintf(stderr, "fp4kit-bench: unknown or incomplete option '%s' (see --help)\n", a.c_str());
      return 2;
    }
    opt[a.substr(2)] = argv[++i];
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("No CUDA GPU found: fp4kit-bench needs an NVIDIA GPU (sm_80 or newer)\n");
    return 0;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const bool bf16 = opt["act"] != "fp16";
  const DType act = bf16 ? DType::kBF16 : DType::kF16;
  // --config all times every applicable config; --tune PATH does the same and writes the fastest per
  // (format, act, n, k, m) as a tuning table the dispatcher loads (fp4kit/tuning.h).
  const bool sweep = opt["config"] == "all" || !opt["tune"].empty();
  const int config = sweep ? -1 : std::atoi(opt["config"].c_str());
  const int replays = std::max(100, std::atoi(opt["replays"].c_str()));
  std::vector<int64_t> ms;
  for (auto& s : split(opt["m"])) ms.push_back(std::atoll(s.c_str()));
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
    std::fprintf(stderr, "fp4kit-bench: --suite must be llama70b, llama8b, tp8, gptoss or all\n");
    return 2;
  }
  const size_t l2 = size_t(prop.l2CacheSize);
  const size_t rotate_bytes = 2 * l2 + (64u << 20);  // rotating copies together exceed 2x L2

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Lt lt;
  const int64_t m_max = *std::max_element(ms.begin(), ms.end());
  std::ostringstream rows, tuning;
  int nrows = 0;
  std::printf("%-18s %-8s %-6s %4s %7s %9s %9s %9s %8s %8s %7s\n", "model", "layer", "format", "m", "us",
              "eager_us", "cublas_us", "speedup", "TB/s", "roof", "check");

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
    std::map<int64_t, double> cublas_us;
    for (int64_t m : ms) {
      auto plan = lt.plan(m, n, k, bf16 ? CUDA_R_16BF : CUDA_R_16F);
      double best = 1e30;
      int best_ai = 0;
      for (int ai = 0; ai < int(plan.algos.size()); ++ai) {  // pick by a short graph timing
        const double t = graph_time_us(s, copies16, 20, [&](int i) { lt.run(plan, ai, w16[size_t(i % copies16)], x, y, s); });
        if (t < best) { best = t; best_ai = ai; }
      }
      cublas_us[m] = graph_time_us(s, std::max(copies16, 8), replays,
                                   [&](int i) { lt.run(plan, best_ai, w16[size_t(i % copies16)], x, y, s); });
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
        launch_fill(fill_bytes, packed, size_t(n * k / 2), 300u + c);
        launch_fill(fill_scales, scales, size_t(n * (k / g)), 400u + c, int(f == Format::kNVFP4));
        CK(cudaMalloc(&wp[size_t(c)], l.total_bytes));
        PrepackArgs pa;
        pa.format = f;
        pa.n = n;
        pa.k = k;
        pa.packed = packed;
        pa.scales = scales;
        pa.tensor_scale = f == Format::kNVFP4 ? ts : nullptr;
        pa.dst = wp[size_t(c)];
        CKS(prepack_gpu(pa, s));
      }
      // Check: the last copy's checkpoint data against cuBLAS on its dequantized weights, at m = min(16, m_max).
      double check = -1;
      {
        const int64_t mc = std::min<int64_t>(16, m_max);
        __nv_bfloat16* wd;
        void* yref;
        CK(cudaMalloc(&wd, size_t(n * k) * 2));
        CK(cudaMalloc(&yref, size_t(mc * n) * 2));
        dequant_bf16<<<4096, 256, 0, s>>>(f, packed, scales, f == Format::kNVFP4 ? ts : nullptr, n, k, wd);
        if (bf16) {
          auto plan = lt.plan(mc, n, k, CUDA_R_16BF);
          lt.run(plan, 0, wd, x, yref, s);
          size_t wsb = 0;
          CKS(gemm_workspace_bytes(mc, PackedWeight{f, n, k, wp.back()}, act, &wsb, config));
          void* ws = nullptr;
          if (wsb) { CK(cudaMalloc(&ws, wsb)); CK(cudaMemsetAsync(ws, 0, wsb, s)); }
          GemmArgs ga;
          ga.m = mc; ga.act = act; ga.x = x; ga.w = PackedWeight{f, n, k, wp.back()}; ga.y = y;
          ga.workspace = ws; ga.workspace_bytes = wsb; ga.config = config;
          CKS(gemm(ga, s));
          CK(cudaStreamSynchronize(s));
          std::vector<__nv_bfloat16> a(size_t(mc * n)), b(size_t(mc * n));
          CK(cudaMemcpy(a.data(), y, a.size() * 2, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(b.data(), yref, b.size() * 2, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (size_t i = 0; i < a.size(); ++i) {
            const double d = double(__bfloat162float(a[i])) - double(__bfloat162float(b[i]));
            num += d * d;
            den += double(__bfloat162float(b[i])) * double(__bfloat162float(b[i]));
          }
          check = std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : 1e9;
          cudaFree(ws);
        }
        cudaFree(wd);
        cudaFree(yref);
      }

      for (int64_t m : ms) {
      int ncfg = 0;
      const KernelConfig* table = kernel_configs(&ncfg);
      std::vector<int> cfgs;
      const int picked = config >= 0 ? config : dispatch_config(f, act, m, n, k, prop.name, nullptr, prop.major);
      int best_cfg = picked;
      double best_us = 1e30;
      cfgs.push_back(picked);
      if (sweep)
        for (int ci = 0; ci < ncfg; ++ci) {
          const int need = int((std::min<int64_t>(m, 64) + 7) / 8);
          if (table[ci].id != picked && table[ci].n_tiles >= need && table[ci].n_tiles <= 2 * need &&
              config_supported(table[ci], prop.major))
            cfgs.push_back(table[ci].id);
        }
      for (int cfg : cfgs) {
        size_t wsb = 0;
        CKS(gemm_workspace_bytes(m, PackedWeight{f, n, k, wp[0]}, act, &wsb, cfg));
        void* ws = nullptr;
        if (wsb) { CK(cudaMalloc(&ws, wsb)); CK(cudaMemset(ws, 0, wsb)); }
        auto call = [&](int i) {
          GemmArgs ga;
          ga.m = m; ga.act = act; ga.x = x; ga.w = PackedWeight{f, n, k, wp[size_t(i % copies)]}; ga.y = y;
          ga.workspace = ws; ga.workspace_bytes = wsb; ga.config = cfg;
          CKS(gemm(ga, s));
        };
        const double us = graph_time_us(s, std::max(copies, 8), replays, call);
        if (us < best_us) { best_us = us; best_cfg = cfg; }
        const double eager = eager_time_us(s, copies, replays, call);
        CK(cudaFree(ws));
        const double tbps = double(ckpt_bytes) / (us * 1e-6) / 1e12;
        const double speedup = cublas_us[m] / us;
        std::string cfgname = find_config(cfg)->name;
        std::printf("%-18s %-8s %-6s %4lld %7.1f %9.1f %9.1f %8.2fx %8.2f %7.0f%% %7.4f %s%s\n", sh.model.c_str(),
                    sh.layer.c_str(), fname.c_str(), (long long)m, us, eager, cublas_us[m], speedup, tbps,
                    100 * tbps / 4.25, check, cfgname.c_str(), cfg == picked ? " *" : "");
        std::fflush(stdout);
        rows << (nrows++ ? ",\n" : "") << "    {\"op\": \"gemm\", \"model\": \"" << sh.model << "\", \"layer\": \""
             << sh.layer << "\", \"format\": \"" << fname << "\", \"act\": \"" << (bf16 ? "bf16" : "fp16")
             << "\", \"m\": " << m << ", \"n\": " << n << ", \"k\": " << k << ", \"config\": \"" << cfgname
             << "\", \"dispatch\": " << (cfg == picked ? "true" : "false") << ", \"us\": " << us << ", \"eager_us\": " << eager << ", \"cublas_us\": " << cublas_us[m]
             << ", \"speedup\": " << speedup << ", \"weight_bytes\": " << ckpt_bytes << ", \"weight_tbps\": " << tbps
             << ", \"roofline_frac\": " << tbps / 4.25 << ", \"check_rel_l2\": " << check << "}";
      }
      tuning << fname << " " << (bf16 ? "bf16" : "fp16") << " " << n << " " << k << " " << std::min<int64_t>(m, 64)
             << " " << find_config(best_cfg)->name << "\n";
      }
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
    FILE* ft = std::fopen(opt["tune"].c_str(), "w");
    if (!ft) {
      std::fprintf(stderr, "fp4kit-bench: cannot write %s\n", opt["tune"].c_str());
      return 2;
    }
    std::fprintf(ft, "fp4kit-tuning 1\n# written by fp4kit-bench --tune (commit %s)\ndevice %s\n%s",
                 opt["commit"].c_str(), prop.name, tuning.str().c_str());
    std::fclose(ft);
    std::printf("wrote tuning table %s (load it with FP4KIT_TUNING_TABLE=%s)\n", opt["tune"].c_str(), opt["tune"].c_str());
  }
  if (!opt["json"].empty()) {
    FILE* fjson = std::fopen(opt["json"].c_str(), "w");
    if (!fjson) {
      std::fprintf(stderr, "fp4kit-bench: cannot write %s\n", opt["json"].c_str());
      return 2;
    }
    std::fprintf(fjson,
                 "{\n  \"tool\": \"fp4kit-bench\",\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %zu,\n"
                 "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"suite\": \"%s\",\n  \"method\": \"CUDA graph of "
                 ">= 8 calls over rotating weight copies (> 2x L2), median of %d replays; cuBLASLt best of "
                 "heuristic top-8\",\n  \"copy_ceiling_tbps\": 4.25,\n  \"rows\": [\n%s\n  ]\n}\n",
                 json_escape(prop.name).c_str(), prop.multiProcessorCount, l2, json_escape(opt["commit"]).c_str(),
                 utc_now().c_str(), json_escape(opt["suite"]).c_str(), replays, rows.str().c_str());
    std::fclose(fjson);
    std::printf("wrote %s\n", opt["json"].c_str());
  }
  return 0;
}
