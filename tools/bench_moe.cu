// fp4kit-bench-moe: the fused MoE layer (fp4kit/moe.h) on real MoE shapes, decode and prefill token counts.
//
//   fp4kit-bench-moe [--model gpt-oss-120b|gpt-oss-20b|qwen3-30b-a3b|deepseek-v3|mixtral-8x7b|all]
//                    [--t 1,4,16,64,256,512,2048,8192] [--formats mxfp4,nvfp4,bf16] [--json PATH] [--commit SHA]
//                    [--replays N] [--act bf16|f16] [--path auto|decode|tc] [--tile 0|64|128|256]
//                    [--routing given|logits]
//
// Method: random FP4 experts (checkpoint layout from a hash, prepacked on the GPU) or random BF16 experts
// (plain row-major [n, k], fp4kit's BF16 expert path, the baseline), R = 16 different
// random routings (top-k distinct experts per token, uniform), one CUDA graph of R calls (call i uses
// routing i, so consecutive calls touch different experts and read them from HBM), median of the
// replays, per-call time, after 150 ms of the same calls (bench_common's warm_up: steady clocks). A model's
// experts are made in every format first; each T is then timed for every format in turn, the order reversed
// from one T to the next, so that the formats compared at a T run under the same thermal and power history.
// T > 64 (bench_common's measure(), one probe call first): when R calls take over
// 2 ms, one warm-up replay; over 25 ms, a graph of fewer calls (>= 2, ~25 ms); replays for ~150 ms of
// graph time (>= 5, <= --replays). Each row records its calls per graph and replays.
// TFLOP/s = 2 T top_k (H 2I + I H) / time (the layer's useful flops), against ~790 TFLOP/s (an H200's BF16
// tensor-core ceiling, docs/prefill-plan.md). The op runs T in passes (kMoEDecodePassTokens on the FP4 decode
// path, kMoEBF16PassTokens for BF16 experts, kMoETensorCorePassTokens on the tensor-core path; fp4kit/moe.h), each pass streaming the experts its tokens touch: streamed_bytes counts them per pass (what the kernels read
// from memory, up to L2 hits), touched_bytes once per call (what a single pass over all T would read).
// The bytes a call must read are its touched experts' prepacked bytes (counted per routing, averaged over
// the routings the graph used); weight_tbps = those bytes / time, roofline_frac against 4.25 TB/s (at
// T > 64 both understate what the passes stream: see streamed_tbps). BF16 experts' bytes are counted the
// same way (n * k * 2 per matrix). --path forces fused_moe's path (MoEArgs::path; each row records the path
// taken and `gemm_kernel` the GEMM kernel it ran (decode, bf16 gemv, wgmma, mma.sync, bf16
// wgmma, bf16 mma.sync), and passes and streamed bytes follow that path's pass size; on the decode path `clusters` gives the
// CTAs per cluster of the gate_up and down GEMMs, 0 where they run stream-K). --tile sets MoEArgs::token_tile, the
// tensor-core path's token tile (0: chosen; rows record it as token_tile). --act f16: FP16 activations (BF16 experts: FP16 x and y, BF16 intermediates, the tensor-core path). When bf16 is among the formats, every FP4 row
// carries speedup_vs_bf16 = BF16 us / FP4 us for the same model and T (same routings: the routing RNG is
// re-seeded per model and format). --routing logits: each routing is random router logits (float32 [T, E],
// normal), routed inside the layer (MoEArgs::routing, the model's routing: DeepSeek-V3 sigmoid grouped top-k
// with 8 groups, 4 kept, scaling 2.5 and a correction bias; the others softmax top-k, renormalized); the
// touched experts are counted from route_cpu's ids, and route_us times route() alone the same way.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "fp4kit/moe.h"
#include "fp4kit/repack.h"
#include "fp4kit/routing.h"
#include "moe_internal.h"

using namespace fp4kit;
using namespace fp4bench;

namespace {

struct MoEShape {
  std::string model;
  int E, top_k;
  int64_t H, I;
  MoEActivation act;
  GateUpLayout layout;
  bool bias;
  bool grouped_routing = false;  // DeepSeek-V3's sigmoid grouped top-k (--routing logits); else softmax top-k
};

std::vector<MoEShape> models(const std::string& name) {
  const std::vector<MoEShape> all = {
      {"gpt-oss-120b", 128, 4, 2880, 2880, MoEActivation::kSwigluOAI, GateUpLayout::kInterleaved, true},
      {"gpt-oss-20b", 32, 4, 2880, 2880, MoEActivation::kSwigluOAI, GateUpLayout::kInterleaved, true},
      {"qwen3-30b-a3b", 128, 8, 2048, 768, MoEActivation::kSiluAndMul, GateUpLayout::kConcatenated, false},
      {"deepseek-v3", 256, 8, 7168, 2048, MoEActivation::kSiluAndMul, GateUpLayout::kConcatenated, false, true},
      {"mixtral-8x7b", 8, 2, 4096, 14336, MoEActivation::kSiluAndMul, GateUpLayout::kConcatenated, false},
  };
  std::vector<MoEShape> out;
  for (const auto& m : all)
    if (name == "all" || name == m.model) out.push_back(m);
  return out;
}

// E experts of [n, k], random checkpoint data prepacked on the GPU into one stacked buffer.
struct Stack {
  void* buf = nullptr;
  size_t stride = 0, bytes_per_expert = 0;
  void* bias = nullptr;
};

// E BF16 experts: random row-major [n, k] bf16 matrices, contiguous ([E, n, k], stride n * k * 2).
Stack make_bf16_stack(int E, int64_t n, int64_t k, bool bias, uint32_t seed) {
  Stack s;
  s.stride = size_t(n * k) * 2;
  s.bytes_per_expert = s.stride;
  CK(cudaMalloc(&s.buf, s.stride * E));
  fill16(s.buf, size_t(n * k) * E, seed, true);
  if (bias) {
    CK(cudaMalloc(&s.bias, size_t(E * n) * 2));
    fill16(s.bias, size_t(E * n), seed + 7777, true);
  }
  CK(cudaDeviceSynchronize());
  return s;
}

struct Row {
  std::string model, format;
  int E, top_k;
  int64_t H, I, T;
  double us, touched, bytes, tbps;
  int64_t nonfinite;
  double streamed, tflops;  // bytes the passes stream; useful TFLOP/s
  int calls, replays;       // the timing's graph size and replay count
  bool tc;                  // the tensor-core path ran
  std::string kernel;       // the GEMM kernel (detail::moe_gemm_kernel)
  int gu_cluster, dn_cluster;  // decode path: CTAs per cluster of the grouped GEMMs (0: stream-K)
  double route_us;             // --routing logits: route() alone (0 otherwise)
};

// The model's routing from router logits (--routing logits).
Routing routing_of(const MoEShape& sh, const void* logits, const float* bias) {
  Routing r;
  r.logits = logits;
  r.logits_dtype = DType::kF32;
  r.renormalize = true;
  if (sh.grouped_routing) {
    r.mode = RoutingMode::kSigmoidGroupedTopK;
    r.n_group = 8;
    r.topk_group = 4;
    r.routed_scaling_factor = 2.5f;
    r.correction_bias = bias;
  } else {
    r.mode = RoutingMode::kSoftmaxTopK;
  }
  return r;
}

constexpr int kShortT = 64;           // T up to this: the decode-sized timing method (one graph of all routings)
// Tokens per pass of fused_moe (fp4kit/moe.h): tensor-core path, FP4 decode path, BF16 experts.
int64_t pass_tokens_of(bool tc, bool bf16) {
  return tc ? kMoETensorCorePassTokens : bf16 ? kMoEBF16PassTokens : kMoEDecodePassTokens;
}
constexpr double kTensorPeak = 790.0; // TFLOP/s, BF16 tensor cores of an H200 (dense, measured ceiling)

// FP16 runs: MXFP4 block scales 2^-6 lower (E8M0 2^-13 .. 2^-6; the BF16 runs keep 2^-7 .. 2^0), so that the
// random layers' h, activations and outputs stay inside the FP16 range (NVFP4's tensor scale 0.01 already
// keeps them there).
constexpr int kFp16MxScaleShift = 6;

Stack make_stack(Format f, int E, int64_t n, int64_t k, bool bias, uint32_t seed, bool act_bf16) {
  PackedLayout l;
  CKS(packed_layout(f, n, k, &l));
  Stack s;
  s.stride = (l.total_bytes + 255) / 256 * 256;
  s.bytes_per_expert = l.total_bytes;
  CK(cudaMalloc(&s.buf, s.stride * E));
  CK(cudaMemset(s.buf, 0, s.stride * E));
  const int g = group_size(f);
  uint8_t *packed, *scales;
  float* ts;
  CK(cudaMalloc(&packed, size_t(n * k / 2)));
  CK(cudaMalloc(&scales, size_t(n * (k / g))));
  CK(cudaMalloc(&ts, sizeof(float)));
  const float one = 0.01f;
  CK(cudaMemcpy(ts, &one, sizeof(float), cudaMemcpyHostToDevice));
  for (int e = 0; e < E; ++e)
    prepack_random(f, n, k, packed, scales, ts, seed + 2 * e, seed + 2 * e + 1, static_cast<uint8_t*>(s.buf) + s.stride * e,
                   act_bf16 ? 0 : kFp16MxScaleShift);
  CK(cudaDeviceSynchronize());
  cudaFree(packed);
  cudaFree(scales);
  cudaFree(ts);
  if (bias) {
    CK(cudaMalloc(&s.bias, size_t(E * n) * 2));
    fill16(s.bias, size_t(E * n), seed + 7777, act_bf16);  // biases are of the activation dtype
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = {{"model", "gpt-oss-120b"}, {"t", "1,4,16,64,256,512,2048,8192"},
                                            {"formats", "mxfp4,nvfp4,bf16"},
                                            {"json", ""}, {"commit", "unknown"}, {"replays", "100"}, {"act", "bf16"},
                                            {"path", "auto"}, {"tile", "0"}, {"routing", "given"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: fp4kit-bench-moe [--model NAME|all] [--t LIST] [--formats mxfp4,nvfp4,bf16] [--json PATH] [--commit SHA]"
                  " [--replays N] [--act bf16|f16] [--path auto|decode|tc] [--tile 0|64|128|256]"
                  " [--routing given|logits]\n");
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc || !opt.count(a.substr(2))) {
      std::fprintf(stderr, "fp4kit-bench-moe: unknown or incomplete option '%s' (see --help)\n", a.c_str());
      return 2;
    }
    opt[a.substr(2)] = argv[++i];
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("No CUDA GPU found: fp4kit-bench-moe needs an NVIDIA GPU (sm_80 or newer)\n");
    return 0;
  }
  const auto shapes = models(opt["model"]);
  if (shapes.empty()) {
    std::fprintf(stderr, "fp4kit-bench-moe: unknown --model %s\n", opt["model"].c_str());
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int replays = std::max(20, std::atoi(opt["replays"].c_str()));
  if (opt["act"] != "bf16" && opt["act"] != "f16") {
    std::fprintf(stderr, "fp4kit-bench-moe: --act must be bf16 or f16 (got %s)\n", opt["act"].c_str());
    return 2;
  }
  const bool act_bf16 = opt["act"] == "bf16";
  if (opt["path"] != "auto" && opt["path"] != "decode" && opt["path"] != "tc") {
    std::fprintf(stderr, "fp4kit-bench-moe: --path must be auto, decode or tc (got %s)\n", opt["path"].c_str());
    return 2;
  }
  const MoEPath path = opt["path"] == "tc" ? MoEPath::kTensorCore : opt["path"] == "decode" ? MoEPath::kDecode : MoEPath::kAuto;
  const int tile = std::atoi(opt["tile"].c_str());  // MoEArgs::token_tile (0: chosen); fused_moe checks it
  if (opt["routing"] != "given" && opt["routing"] != "logits") {
    std::fprintf(stderr, "fp4kit-bench-moe: --routing must be given or logits (got %s)\n", opt["routing"].c_str());
    return 2;
  }
  const bool from_logits = opt["routing"] == "logits";
  constexpr int kRoutings = 16;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<Row> rows;
  std::printf("%-14s %-6s %5s %10s %8s %10s %8s %6s %12s %8s %5s %s\n", "model", "format", "T", "us", "experts",
              "MB touched", "TB/s", "roof", "tokens/s", "TFLOP/s", "calls", "path");
  for (const std::string& fname : split(opt["formats"]))
    if (fname != "nvfp4" && fname != "mxfp4" && fname != "bf16") {
      std::fprintf(stderr, "fp4kit-bench-moe: unknown format %s (nvfp4, mxfp4, bf16)\n", fname.c_str());
      return 2;
    }
  // One model's experts in every format at once, and each T timed for every format in turn, the order
  // reversed from one T to the next: the formats of a T run seconds apart, under the same thermal and power
  // history (format by format, the BF16 baseline ran minutes after the FP4 rows, on a hotter board).
  struct FormatRun {
    std::string name;
    bool bf16;
    Format f;
    Stack gu, dn;
    std::mt19937 rng;  // seeded alike for every format, advanced alike: the same routings for each
  };
  for (const MoEShape& sh : shapes) {
    std::vector<FormatRun> runs;
    for (const std::string& fname : split(opt["formats"])) {
      const bool bf16 = fname == "bf16";
      const Format f = fname == "nvfp4" ? Format::kNVFP4 : Format::kMXFP4;
      runs.push_back(FormatRun{fname, bf16, f,
                               bf16 ? make_bf16_stack(sh.E, 2 * sh.I, sh.H, sh.bias, 11)
                                    : make_stack(f, sh.E, 2 * sh.I, sh.H, sh.bias, 11, act_bf16),
                               bf16 ? make_bf16_stack(sh.E, sh.H, sh.I, sh.bias, 977)
                                    : make_stack(f, sh.E, sh.H, sh.I, sh.bias, 977, act_bf16),
                               std::mt19937(1234)});
    }
    const std::vector<std::string> t_list = split(opt["t"]);
    for (size_t ti = 0; ti < t_list.size(); ++ti) {
      const int64_t T = std::atoll(t_list[ti].c_str());
      for (size_t o = 0; o < runs.size(); ++o) {
        FormatRun& run = runs[size_t(alternating(int(ti), int(o), int(runs.size())))];
        const std::string& fname = run.name;
        const bool bf16 = run.bf16;
        const Format f = run.f;
        const Stack& gu = run.gu;
        const Stack& dn = run.dn;
        std::mt19937& rng = run.rng;
        MoEArgs a;
        a.tokens = T;
        a.hidden = sh.H;
        a.inter = sh.I;
        a.num_experts = sh.E;
        a.top_k = sh.top_k;
        a.gate_up = ExpertWeights{f, 2 * sh.I, sh.H, gu.buf, gu.stride, gu.bias};
        a.down = ExpertWeights{f, sh.H, sh.I, dn.buf, dn.stride, dn.bias};
        if (bf16) a.gate_up.kind = a.down.kind = ExpertKind::kBF16;
        a.activation = sh.act;
        a.layout = sh.layout;
        a.act = act_bf16 ? DType::kBF16 : DType::kF16;
        a.path = path;
        a.token_tile = tile;
        MoEPath taken = MoEPath::kDecode;
        CKS(moe_path(a, &taken));
        const bool tc = taken == MoEPath::kTensorCore;
        int gu_cluster = 0, dn_cluster = 0;
        CKS(fp4kit::detail::moe_decode_clusters(a, &gu_cluster, &dn_cluster));
        const char* gemm_kernel = "";
        CKS(fp4kit::detail::moe_gemm_kernel(a, &gemm_kernel));
        const int64_t pass_tokens = pass_tokens_of(tc, bf16);
        // Routings and their touched experts (per call, and per pass).
        std::vector<void*> ids_d(kRoutings), wts_d(kRoutings), logits_d(kRoutings, nullptr);
        std::vector<double> touched_of(kRoutings, 0.0), pass_experts_of(kRoutings, 0.0);
        std::vector<int> perm(size_t(sh.E));
        // --routing logits: a correction bias for the grouped routing, small against the scores.
        std::vector<float> cbias(size_t(sh.E));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : cbias) v = 0.05f * nd(rng);
        float* cbias_d = nullptr;
        if (from_logits) {
          CK(cudaMalloc(&cbias_d, cbias.size() * 4));
          CK(cudaMemcpy(cbias_d, cbias.data(), cbias.size() * 4, cudaMemcpyHostToDevice));
        }
        for (int r = 0; r < kRoutings; ++r) {
          std::vector<int32_t> ids(size_t(T * sh.top_k));
          std::vector<float> wts(ids.size());
          if (from_logits) {  // random logits; the ids (for counting touched experts) from the host reference
            std::vector<float> lg(size_t(T * sh.E));
            for (auto& v : lg) v = nd(rng);
            RouteArgs ra;
            ra.tokens = T;
            ra.num_experts = sh.E;
            ra.top_k = sh.top_k;
            ra.routing = routing_of(sh, lg.data(), cbias.data());
            ra.topk_ids = ids.data();
            ra.topk_weights = wts.data();
            CKS(route_cpu(ra));
            CK(cudaMalloc(&logits_d[size_t(r)], lg.size() * 4));
            CK(cudaMemcpy(logits_d[size_t(r)], lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
          }
          std::set<int> used, used_pass;
          for (int64_t t = 0; t < T; ++t) {
            if (t % pass_tokens == 0) {
              pass_experts_of[size_t(r)] += double(used_pass.size());
              used_pass.clear();
            }
            if (!from_logits) {
              for (int e = 0; e < sh.E; ++e) perm[size_t(e)] = e;
              std::shuffle(perm.begin(), perm.end(), rng);
            }
            for (int j = 0; j < sh.top_k; ++j) {
              const size_t slot = size_t(t * sh.top_k + j);
              if (!from_logits) {
                ids[slot] = perm[size_t(j)];
                wts[slot] = 1.0f / float(sh.top_k);
              }
              used.insert(ids[slot]);
              used_pass.insert(ids[slot]);
            }
          }
          pass_experts_of[size_t(r)] += double(used_pass.size());
          touched_of[size_t(r)] = double(used.size());
          CK(cudaMalloc(&ids_d[size_t(r)], ids.size() * 4));
          CK(cudaMemcpy(ids_d[size_t(r)], ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
          CK(cudaMalloc(&wts_d[size_t(r)], wts.size() * 4));
          CK(cudaMemcpy(wts_d[size_t(r)], wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
        }
        void *x, *y, *ws;
        CK(cudaMalloc(&x, size_t(T * sh.H) * 2));
        CK(cudaMalloc(&y, size_t(T * sh.H) * 2));
        fill16(x, size_t(T * sh.H), 4242, act_bf16);
        a.x = x;
        a.y = y;
        if (from_logits) a.routing = routing_of(sh, logits_d[0], cbias_d);  // sizes the workspace for routing
        size_t wsb = 0;
        CKS(moe_workspace_bytes(a, &wsb));
        CK(cudaMalloc(&ws, wsb));
        CK(cudaMemset(ws, 0, wsb));
        a.workspace = ws;
        a.workspace_bytes = wsb;
        auto call = [&](int i) {
          MoEArgs c = a;
          if (from_logits) {
            c.routing.logits = logits_d[size_t(i % kRoutings)];
          } else {
            c.topk_ids = static_cast<const int32_t*>(ids_d[size_t(i % kRoutings)]);
            c.topk_weights = static_cast<const float*>(wts_d[size_t(i % kRoutings)]);
          }
          CKS(fused_moe(c, stream));
        };
        // route() alone, into the routing's id and weight buffers (--routing logits).
        auto route_call = [&](int i) {
          RouteArgs ra;
          ra.tokens = T;
          ra.num_experts = sh.E;
          ra.top_k = sh.top_k;
          ra.routing = routing_of(sh, logits_d[size_t(i % kRoutings)], cbias_d);
          ra.topk_ids = static_cast<int32_t*>(ids_d[size_t(i % kRoutings)]);
          ra.topk_weights = static_cast<float*>(wts_d[size_t(i % kRoutings)]);
          CKS(route(ra, stream));
        };
        call(0);
        CK(cudaStreamSynchronize(stream));
        // Output sanity: finite.
        std::vector<uint16_t> yb(size_t(T * sh.H));
        CK(cudaMemcpy(yb.data(), y, yb.size() * 2, cudaMemcpyDeviceToHost));
        int64_t nonfinite = 0;
        const uint16_t exp_mask = act_bf16 ? 0x7F80 : 0x7C00;  // all-ones exponent: inf or NaN
        for (uint16_t b : yb) nonfinite += ((b & exp_mask) == exp_mask) ? 1 : 0;
        // T <= 64 (one pass): the decode method (a graph of all R routings, --replays replays, after warm_up).
        // Larger T: measure() sizes the graph and the replays to the call's length (see the header).
        Measured m;
        if (T <= kShortT) {
          m.calls = kRoutings;
          m.replays = replays;
          warm_up(stream, call, 0.0);  // bench_common: time from a steady state
          m.us = graph_time_us(stream, kRoutings, replays, call);
        } else {
          m = measure(stream, kRoutings, replays, call, /*eager=*/false);
        }
        const double us = m.us;
        double route_us = 0.0;
        if (from_logits) route_us = measure(stream, kRoutings, replays, route_call, /*eager=*/false).us;
        // Averages over the routings the graph used (calls 0 .. m.calls - 1 use routings 0 .. m.calls - 1).
        const int used_routings = std::max(1, std::min(kRoutings, m.calls));
        double touched = 0, pass_experts = 0;
        for (int r = 0; r < used_routings; ++r) {
          touched += touched_of[size_t(r)] / used_routings;
          pass_experts += pass_experts_of[size_t(r)] / used_routings;
        }
        const double per_expert = double(gu.bytes_per_expert + dn.bytes_per_expert);
        const double bytes = touched * per_expert;
        const double tbps = bytes / us * 1e-6;
        const double flops = 2.0 * double(T) * sh.top_k * double(sh.H * 2 * sh.I + sh.I * sh.H);
        const double tflops = flops / (us * 1e-6) / 1e12;
        std::printf("%-14s %-6s %5lld %10.1f %8.1f %10.1f %8.2f %5.0f%% %12.0f %8.1f %5d %s%s\n", sh.model.c_str(),
                    fname.c_str(), (long long)T, us, touched, bytes * 1e-6, tbps, 100 * tbps / 4.25,
                    double(T) / us * 1e6, tflops, m.calls,
                    (std::string(tc ? "tc" : gu_cluster || dn_cluster ? "decode cl " + std::to_string(gu_cluster) + "/" +
                                                                             std::to_string(dn_cluster)
                                                                       : "decode") +
                     (from_logits ? " + routing (alone " + std::to_string(route_us).substr(0, 5) + " us)" : ""))
                        .c_str(),
                    nonfinite ? "  NONFINITE" : "");
        std::fflush(stdout);
        rows.push_back(Row{sh.model, fname, sh.E, sh.top_k, sh.H, sh.I, T, us, touched, bytes, tbps, nonfinite,
                           pass_experts * per_expert, tflops, m.calls, m.replays, tc, gemm_kernel, gu_cluster,
                           dn_cluster, route_us});
        for (int r = 0; r < kRoutings; ++r) {
          cudaFree(ids_d[size_t(r)]);
          cudaFree(wts_d[size_t(r)]);
          cudaFree(logits_d[size_t(r)]);
        }
        cudaFree(cbias_d);
        cudaFree(x);
        cudaFree(y);
        cudaFree(ws);
      }
    }
    for (FormatRun& run : runs) {
      cudaFree(run.gu.buf);
      cudaFree(run.gu.bias);
      cudaFree(run.dn.buf);
      cudaFree(run.dn.bias);
    }
  }
  // Rows as before, format by format within a model (runs timed them T by T): a stable sort on the format's
  // place in --formats keeps the models' and the T's order.
  {
    const std::vector<std::string> order = split(opt["formats"]);
    auto place = [&](const std::string& f) { return std::find(order.begin(), order.end(), f) - order.begin(); };
    std::map<std::string, size_t> model_at;  // a model's place: where its first row is
    for (size_t i = 0; i < rows.size(); ++i) model_at.emplace(rows[i].model, i);
    std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      const size_t ma = model_at[a.model], mb = model_at[b.model];
      return ma != mb ? ma < mb : place(a.format) < place(b.format);
    });
  }
  // FP4 speedup over the BF16 experts of the same model and T.
  auto bf16_us = [&](const Row& r) {
    for (const Row& b : rows)
      if (b.format == "bf16" && b.model == r.model && b.T == r.T) return b.us;
    return 0.0;
  };
  bool any_speedup = false;
  for (const Row& r : rows) {
    const double base = bf16_us(r);
    if (r.format == "bf16" || base <= 0) continue;
    if (!any_speedup) std::printf("\nFP4 speedup over fp4kit's BF16 experts (same layers, same routings):\n");
    any_speedup = true;
    std::printf("%-14s %-6s %4lld %8.2fx  (bf16 %.1f us, %s %.1f us)\n", r.model.c_str(), r.format.c_str(),
                (long long)r.T, base / r.us, base, r.format.c_str(), r.us);
  }
  std::ostringstream js;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double base = r.format == "bf16" ? 0.0 : bf16_us(r);
    js << (i ? ",\n" : "") << "    {\"op\": \"fused_moe\", \"model\": \"" << r.model << "\", \"format\": \"" << r.format
       << "\", \"act\": \"" << opt["act"] << "\", \"E\": " << r.E << ", \"top_k\": " << r.top_k << ", \"H\": " << r.H
       << ", \"I\": " << r.I << ", \"T\": " << r.T << ", \"us\": " << r.us << ", \"touched_experts\": " << r.touched
       << ", \"touched_bytes\": " << r.bytes << ", \"weight_tbps\": " << r.tbps << ", \"roofline_frac\": " << r.tbps / 4.25
       << ", \"tokens_per_s\": " << double(r.T) / r.us * 1e6 << ", \"nonfinite_outputs\": " << r.nonfinite
       << ", \"path\": \"" << (r.tc ? "tensor_core" : "decode") << "\", \"gemm_kernel\": \"" << r.kernel << "\""
       << ", \"token_tile\": " << tile
       << ", \"passes\": " << (r.T + pass_tokens_of(r.tc, r.format == "bf16") - 1) / pass_tokens_of(r.tc, r.format == "bf16") << ", \"streamed_bytes\": " << r.streamed
       << ", \"streamed_tbps\": " << r.streamed / r.us * 1e-6 << ", \"tflops\": " << r.tflops
       << ", \"tflops_frac\": " << r.tflops / kTensorPeak << ", \"calls_per_graph\": " << r.calls
       << ", \"replays\": " << r.replays << ", \"clusters\": [" << r.gu_cluster << ", " << r.dn_cluster << "]"
       << ", \"routing\": \"" << opt["routing"] << "\"";
    if (r.route_us > 0) js << ", \"route_us\": " << r.route_us;
    if (base > 0) js << ", \"bf16_us\": " << base << ", \"speedup_vs_bf16\": " << base / r.us;
    js << "}";
  }
  if (!opt["json"].empty()) {
    FILE* fj = std::fopen(opt["json"].c_str(), "w");
    if (!fj) {
      std::fprintf(stderr, "fp4kit-bench-moe: cannot write %s\n", opt["json"].c_str());
      return 2;
    }
    std::fprintf(fj,
                 "{\n  \"tool\": \"fp4kit-bench-moe\",\n  \"device\": \"%s\",\n  \"commit\": \"%s\",\n  \"date\": \"%s\",\n"
                 "  \"method\": \"after %.0f ms of the same calls (steady clocks), CUDA graph of %d calls with "
                 "different random routings, median of %d replays "
                 "(long calls, large T: fewer calls per graph and replays, see each row's calls_per_graph and replays); "
                 "touched bytes = distinct experts per call x bytes per expert (FP4: prepacked; bf16: n x k x 2 per matrix); "
                 "streamed bytes = the same per pass (%lld tokens on the FP4 decode path, %lld for BF16 experts, %lld on the tensor-core path: see each row's path and passes), summed over the passes; "
                 "TFLOP/s = 2 T top_k (H 2I + I H) / time, against %.0f (BF16 tensor-core ceiling); "
                 "bf16 rows are fp4kit's BF16 expert path on the same layers and routings; each T timed for every format in turn, the order reversed from one T to the next\",\n  \"rows\": [\n%s\n  ]\n}\n",
                 json_escape(prop.name).c_str(), json_escape(opt["commit"]).c_str(), utc_now().c_str(), kWarmMs, kRoutings,
                 replays, static_cast<long long>(kMoEDecodePassTokens), static_cast<long long>(kMoEBF16PassTokens),
                 static_cast<long long>(kMoETensorCorePassTokens), kTensorPeak, js.str().c_str());
    std::fclose(fj);
    std::printf("wrote %s\n", opt["json"].c_str());
  }
  return 0;
}
