// test_moe_gpu.cu: the fused MoE layer (fp4kit/moe.h) against a spec-level reference: experts
// dequantized with formats.h, fp64 GEMMs, the activation in fp64, and the same roundings the op documents
// (h, a and each expert output rounded to the activation dtype, then the fp32 weighted sum in slot order;
// FP16: h and a saturated at +-65504).
//
// Fresh random data each run (seed printed), NaN-poisoned outputs, shapes off every tile, both FP4 formats
// and BF16 experts (plain row-major [n, k], tight and padded expert strides), both activations and
// gate/up layouts, biases, skewed and single-expert routing, experts with no tokens, T = 1 .. 100 (BF16
// experts: more than one 64-token pass), T = 300 on the FP4 decode path (two passes, experts split into
// several schedule entries), top-k 1 .. 8, bad and duplicate ids (NaN rows), determinism, and the
// validator's messages. FP16 activations (FP4 experts): both formats and activations, biases, T = 1 .. 100,
// the gpt-oss shape, and gate/up values past the FP16 range (saturation), against the dense FP16 GEMM
// tests' gate (rel-L2 < 2e-3, cosine > 0.999). The tensor-core path (sm_90a; skipped with the reason
// elsewhere): forced at T = 1 .. kMoETensorCorePassTokens + 8 (two passes), top-k 1 .. 8, skewed and one-expert
// routing, FP16, the gpt-oss shape, and chosen automatically past kMoEDecodePassTokens with bad ids.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "fp4kit/fp4kit.h"
#include "fp4kit/moe.h"
#include "fp4kit/repack.h"
#include "fp4kit/routing.h"
#include "gemm_test_util.h"
#include "moe_internal.h"
#include "prefill.h"
#include "testing.h"

using namespace fp4kit;
using fp4test::CkptWeight;
using fp4test::rng;

namespace {

// FP4KIT_TEST_QUICK=1 (sanitizer runs) keeps a few cases.
bool quick() { return std::getenv("FP4KIT_TEST_QUICK") != nullptr; }

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    CHECK_MSG(_e == cudaSuccess, #expr << ": " << cudaGetErrorString(_e)); \
  } while (0)

float bf16_round(double v) { return fp4test::from_bits(fp4test::to_bits(float(v), true), true); }
float f16_round(double v) { return fp4test::from_bits(fp4test::to_bits(float(v), false), false); }
// The op's FP16 saturation (fp4kit/moe.h): +-inf and values past +-65504 become +-65504, NaN stays NaN.
double f16_sat(double v) { return v > 65504.0 ? 65504.0 : v < -65504.0 ? -65504.0 : v; }

// E experts of [n, k], prepacked on the host, stacked `stride` bytes apart on the device.
struct Experts {
  std::vector<std::vector<float>> w;  // dequantized [n, k] per expert
  std::vector<float> bias;            // [E, n] (exact in the activation dtype) or empty
  ExpertWeights dev;
  void* buf = nullptr;
  void* dbias = nullptr;
  ~Experts() {
    cudaFree(buf);
    cudaFree(dbias);
  }
};

// BF16 experts: bf16-exact random [n, k] matrices (the reference uses the same values), row-major,
// `pad` extra bytes (a multiple of 16) between consecutive experts.
void make_bf16_experts(Experts& ex, int E, int64_t n, int64_t k, size_t pad) {
  const size_t stride = size_t(n * k) * 2 + pad;
  std::vector<uint16_t> host(stride / 2 * size_t(E), 0x7FC0);  // padding: NaN, must never be read
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(k)));
  for (int e = 0; e < E; ++e) {
    std::vector<float> w(size_t(n * k));
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = fp4test::to_bits(nd(rng()), true);
      host[stride / 2 * size_t(e) + i] = b;
      w[i] = fp4test::from_bits(b, true);
    }
    ex.w.push_back(std::move(w));
  }
  CUDA_OK(cudaMalloc(&ex.buf, host.size() * 2));
  CUDA_OK(cudaMemcpy(ex.buf, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  ex.dev = ExpertWeights{Format::kMXFP4, n, k, ex.buf, stride, nullptr};
  ex.dev.kind = ExpertKind::kBF16;
}

// Biases in [-1, 1] of the activation dtype; `huge(row)` (optional) overrides a row's value in every expert
// (the saturation test: +-65504, the largest finite fp16).
void make_bias(Experts& ex, int E, int64_t n, bool bf16 = true, float (*huge)(int64_t, int64_t) = nullptr,
               int64_t huge_arg = 0) {
  std::uniform_real_distribution<float> ud(-1, 1);
  std::vector<uint16_t> bits;
  for (int64_t i = 0; i < E * n; ++i) {
    float v = ud(rng());
    if (huge && huge(i % n, huge_arg) != 0.0f) v = huge(i % n, huge_arg);
    bits.push_back(fp4test::to_bits(v, bf16));
    ex.bias.push_back(fp4test::from_bits(bits.back(), bf16));
  }
  CUDA_OK(cudaMalloc(&ex.dbias, bits.size() * 2));
  CUDA_OK(cudaMemcpy(ex.dbias, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  ex.dev.bias = ex.dbias;
}

// rms_target > 0: every expert's weights are rescaled to about that rms (MXFP4: all block scales shifted by
// one power of two; NVFP4: the tensor scale), keeping the random spread of block scales. The FP16 cases need
// it: the raw random weights (MXFP4 rms ~15) would take h, a and o past the FP16 range.
void rescale(CkptWeight& w, double rms_target) {
  const auto d = fp4test::dequant(w);
  double ss = 0;
  for (float v : d) ss += double(v) * v;
  const double rms = std::sqrt(ss / double(std::max<size_t>(1, d.size())));
  if (!(rms > 0)) return;
  if (w.format == Format::kNVFP4) {
    w.tensor_scale = float(w.tensor_scale * rms_target / rms);
  } else {
    const int shift = int(std::lround(std::log2(rms_target / rms)));
    for (auto& s : w.scales) s = uint8_t(std::min(254, std::max(0, int(s) + shift)));
  }
}

void make_experts(Experts& ex, Format f, int E, int64_t n, int64_t k, bool with_bias, double rms_target = 0,
                  bool bf16 = true) {
  PackedLayout l;
  CHECK_OK(packed_layout(f, n, k, &l));
  const size_t stride = (l.total_bytes + 255) / 256 * 256;
  std::vector<uint8_t> host(stride * E, 0);
  for (int e = 0; e < E; ++e) {
    CkptWeight w = fp4test::random_weight(f, n, k, rng());
    if (rms_target > 0) rescale(w, rms_target);
    CHECK_OK(prepack_cpu(fp4test::prepack_args(w, host.data() + stride * e)));
    ex.w.push_back(fp4test::dequant(w));
  }
  CUDA_OK(cudaMalloc(&ex.buf, host.size()));
  CUDA_OK(cudaMemcpy(ex.buf, host.data(), host.size(), cudaMemcpyHostToDevice));
  ex.dev = ExpertWeights{f, n, k, ex.buf, stride, nullptr};
  if (with_bias) make_bias(ex, E, n, bf16);
}

struct Case {
  Format f = Format::kMXFP4;
  bool f16 = false;    // FP16 activations (x, y; FP4 experts: biases, intermediates); default BF16
  bool huge_bias = false;  // FP16: gate_up bias rows at +-65504 (h past the FP16 range, see huge_row)
  bool bf16 = false;   // BF16 experts (f ignored)
  size_t bf16_pad = 0; // extra bytes between BF16 experts
  int E = 8, top_k = 2;
  int64_t T = 1, H = 160, I = 96;
  MoEActivation act = MoEActivation::kSiluAndMul;
  GateUpLayout layout = GateUpLayout::kConcatenated;
  bool bias = false;
  enum Routing { kRandom, kSkewed, kOneExpert, kCounts } routing = kRandom;
  std::vector<int> counts;  // kCounts (top_k = 1): expert e gets counts[e] tokens, T = their sum
  std::vector<std::pair<int, int>> bad;  // (pair index, id) overrides
  MoEPath path = MoEPath::kAuto;
  int token_tile = 0;  // MoEArgs::token_tile (tensor-core path)
  bool one_token_twin = false;  // also run with the one-token pass off (the align schedule): the same bits
  double tol = 0;  // the rel-L2 gate; 0: the one of the case's dtypes (check_case)
};

double act_ref(double g, double u, const Case& c) {
  if (c.act == MoEActivation::kSwigluOAI) {
    g = std::min(g, 7.0);
    u = std::min(std::max(u, -7.0), 7.0);
    return g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
  }
  return g / (1.0 + std::exp(-g)) * u;
}

std::vector<int32_t> make_ids(const Case& c) {
  std::vector<int32_t> ids(size_t(c.T * c.top_k));
  if (c.routing == Case::kCounts) {  // top_k = 1: each expert's count of tokens, in shuffled token order
    ids.clear();
    for (int e = 0; e < int(c.counts.size()); ++e) ids.insert(ids.end(), size_t(c.counts[size_t(e)]), e);
    std::shuffle(ids.begin(), ids.end(), rng());
    return ids;
  }
  std::vector<int> perm(size_t(c.E));
  for (int64_t t = 0; t < c.T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    if (c.routing == Case::kSkewed) {  // most tokens pick from the first few experts
      std::shuffle(perm.begin(), perm.begin() + std::min(c.E, c.top_k + 2), rng());
    } else if (c.routing == Case::kRandom) {
      std::shuffle(perm.begin(), perm.end(), rng());
    }  // kOneExpert: every token's slot 0 is expert 0 (and slots 1.. experts 1..)
    for (int j = 0; j < c.top_k; ++j) ids[size_t(t * c.top_k + j)] = perm[size_t(j)];
  }
  for (auto& b : c.bad) ids[size_t(b.first)] = b.second;
  return ids;
}

// The case's shapes, dtype, activation and layout as MoEArgs (expert formats and shapes, no pointers).
MoEArgs case_args(const Case& c) {
  MoEArgs a;
  a.tokens = c.T;
  a.hidden = c.H;
  a.inter = c.I;
  a.num_experts = c.E;
  a.top_k = c.top_k;
  a.act = c.f16 ? DType::kF16 : DType::kBF16;
  a.layout = c.layout;
  a.activation = c.act;
  a.gate_up = ExpertWeights{c.f, 2 * c.I, c.H, nullptr, 0, nullptr};
  a.down = ExpertWeights{c.f, c.H, c.I, nullptr, 0, nullptr};
  if (c.bf16) a.gate_up.kind = a.down.kind = ExpertKind::kBF16;
  return a;
}

struct Result {
  std::vector<uint16_t> bits;
  std::vector<float> y;
};

Result run_moe(const Case& c, const Experts& gu, const Experts& dn, const std::vector<uint16_t>& xb,
               const std::vector<int32_t>& ids, const std::vector<float>& wts) {
  void *dx, *dy, *dids, *dw, *ws;
  CUDA_OK(cudaMalloc(&dx, xb.size() * 2));
  CUDA_OK(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&dy, xb.size() * 2));
  CUDA_OK(cudaMemset(dy, 0xFF, xb.size() * 2));  // NaN poison
  CUDA_OK(cudaMalloc(&dids, ids.size() * 4));
  CUDA_OK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&dw, wts.size() * 4));
  CUDA_OK(cudaMemcpy(dw, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
  MoEArgs a = case_args(c);
  a.x = dx;
  a.topk_ids = static_cast<const int32_t*>(dids);
  a.topk_weights = static_cast<const float*>(dw);
  a.gate_up = gu.dev;
  a.down = dn.dev;
  a.path = c.path;
  a.token_tile = c.token_tile;
  a.y = dy;
  size_t bytes = 0;
  CHECK_OK(moe_workspace_bytes(a, &bytes));
  CUDA_OK(cudaMalloc(&ws, bytes));
  CUDA_OK(cudaMemset(ws, 0xFF, bytes));  // the workspace needs no initialisation (fp4kit/moe.h)
  a.workspace = ws;
  a.workspace_bytes = bytes;
  CHECK_OK(fused_moe(a, nullptr));
  CHECK_OK(fused_moe(a, nullptr));  // twice: the workspace must come back ready for the next call
  CUDA_OK(cudaDeviceSynchronize());
  Result r;
  r.bits.resize(xb.size());
  CUDA_OK(cudaMemcpy(r.bits.data(), dy, xb.size() * 2, cudaMemcpyDeviceToHost));
  for (uint16_t b : r.bits) r.y.push_back(fp4test::from_bits(b, !c.f16));
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dids);
  cudaFree(dw);
  cudaFree(ws);
  return r;
}

// The saturation case's gate_up bias rows (arg: I << 2 | interleaved << 1 | swiglu): swiglu_oai: every
// third row (gate or up) at +-65504, so about half of them overflow to +-inf in the gate_up epilogue and
// every one is clamped to +-limit; silu: every third gate row at -65504 (silu of it is 0). Both are exact
// under the op's saturation (fp4kit/moe.h); without it a gate at -inf would make NaN.
float huge_row(int64_t r, int64_t arg) {
  const int64_t inter = arg >> 2;
  const bool il = (arg >> 1) & 1, swiglu = arg & 1;
  if (r % 3 != 0) return 0.0f;
  if (swiglu) return (r / 3) % 2 ? 65504.0f : -65504.0f;
  const bool gate = il ? r % 2 == 0 : r < inter;
  return gate ? -65504.0f : 0.0f;
}

void check_case(const Case& c) {
  Experts gu, dn;
  // FP16 intermediates: FP16 activations with FP4 experts (BF16 experts keep BF16 ones, and BF16 biases).
  const bool f16_mid = c.f16 && !c.bf16;
  const bool split_x = c.f16 && c.bf16;
  if (f16_mid) {
    // Weights of rms 2 / sqrt(H) (gate_up) and 1 / sqrt(I) (down): h ~ 2 for x ~ N(0, 1), as in real layers.
    make_experts(gu, c.f, c.E, 2 * c.I, c.H, false, 2.0 / std::sqrt(double(c.H)));
    make_experts(dn, c.f, c.E, c.H, c.I, false, 1.0 / std::sqrt(double(c.I)));
    if (c.bias || c.huge_bias) {
      const int64_t arg = c.I << 2 | int64_t(c.layout == GateUpLayout::kInterleaved) << 1 |
                          int64_t(c.act == MoEActivation::kSwigluOAI);
      make_bias(gu, c.E, 2 * c.I, false, c.huge_bias ? huge_row : nullptr, arg);
      make_bias(dn, c.E, c.H, false);
    }
  } else if (c.bf16) {
    make_bf16_experts(gu, c.E, 2 * c.I, c.H, c.bf16_pad);
    make_bf16_experts(dn, c.E, c.H, c.I, c.bf16_pad);
    if (c.bias) {
      make_bias(gu, c.E, 2 * c.I);
      make_bias(dn, c.E, c.H);
    }
  } else {
    make_experts(gu, c.f, c.E, 2 * c.I, c.H, c.bias);
    make_experts(dn, c.f, c.E, c.H, c.I, c.bias);
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> xb(size_t(c.T * c.H));
  std::vector<float> x(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) {
    xb[i] = fp4test::to_bits(nd(rng()), !c.f16);
    x[i] = fp4test::from_bits(xb[i], !c.f16);
  }
  // The op's roundings: BF16, or FP16 with h and a saturated (o is not: see fp4kit/moe.h).
  auto round_h = [&](double v) { return f16_mid ? float(f16_sat(f16_round(v))) : bf16_round(v); };
  auto round_a = [&](double v) { return f16_mid ? f16_round(f16_sat(v)) : bf16_round(v); };
  auto round_o = [&](double v) { return f16_mid ? f16_round(v) : bf16_round(v); };
  const auto ids = make_ids(c);
  std::vector<float> wts(ids.size());
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  for (auto& v : wts) v = ud(rng());

  // Reference.
  std::vector<double> ref(size_t(c.T * c.H), 0.0);
  std::vector<bool> nan_row(size_t(c.T), false);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<double> acc(size_t(c.H), 0.0);
    for (int j = 0; j < c.top_k; ++j) {
      const int e = ids[size_t(t * c.top_k + j)];
      bool dup = false;
      for (int jj = 0; jj < j; ++jj) dup = dup || ids[size_t(t * c.top_k + jj)] == e;
      if (e < 0 || e >= c.E || dup) {
        nan_row[size_t(t)] = true;
        continue;
      }
      const auto& wg = gu.w[size_t(e)];
      const auto& wd = dn.w[size_t(e)];
      std::vector<float> h(size_t(2 * c.I)), av(size_t(c.I));
      for (int64_t r = 0; r < 2 * c.I; ++r) {
        double s = gu.bias.empty() ? 0.0 : gu.bias[size_t(e * 2 * c.I + r)];
        for (int64_t kk = 0; kk < c.H; ++kk) s += double(x[size_t(t * c.H + kk)]) * wg[size_t(r * c.H + kk)];
        h[size_t(r)] = round_h(s);
      }
      for (int64_t i = 0; i < c.I; ++i) {
        const bool il = c.layout == GateUpLayout::kInterleaved;
        const double g = h[size_t(il ? 2 * i : i)], u = h[size_t(il ? 2 * i + 1 : c.I + i)];
        av[size_t(i)] = round_a(act_ref(g, u, c));
      }
      for (int64_t r = 0; r < c.H; ++r) {
        double s = dn.bias.empty() ? 0.0 : dn.bias[size_t(e * c.H + r)];
        for (int64_t i = 0; i < c.I; ++i) s += double(av[size_t(i)]) * wd[size_t(r * c.I + i)];
        acc[size_t(r)] += double(wts[size_t(t * c.top_k + j)]) * round_o(s);
      }
    }
    // BF16 experts with FP16 activations: y rounded to FP16 as the op rounds it, so that the gate below can be
    // tight enough to see x used exactly (the split into two BF16 terms) rather than rounded to BF16.
    for (int64_t r = 0; r < c.H; ++r) ref[size_t(t * c.H + r)] = split_x ? f16_round(acc[size_t(r)]) : acc[size_t(r)];
  }

  const Result got = run_moe(c, gu, dn, xb, ids, wts);
  std::vector<double> ref_ok;
  std::vector<float> got_ok;
  int64_t nan_ok = 0, nan_bad = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t r = 0; r < c.H; ++r) {
      const float v = got.y[size_t(t * c.H + r)];
      if (nan_row[size_t(t)]) {
        nan_ok += std::isnan(v) ? 1 : 0;
      } else {
        ref_ok.push_back(ref[size_t(t * c.H + r)]);
        got_ok.push_back(v);
        nan_bad += std::isfinite(v) ? 0 : 1;
      }
    }
  const auto cmp = fp4test::compare(ref_ok, got_ok);
  int64_t n_nan_rows = 0;
  for (bool b : nan_row) n_nan_rows += b;
  // The dense GEMM tests' gates (test_gemm_gpu), BF16 intermediates 1e-2; the split X 1e-3: only rounding
  // flips of h, o and y differ (measured up to 2.1e-4 at K = 168; a model of the pipeline with fp32-level
  // accumulation noise: 2-4e-4), where x rounded to BF16 instead gives ~4e-3 (the same model).
  const double tol = c.tol > 0 ? c.tol : split_x ? 1e-3 : f16_mid ? 2e-3 : 1e-2;
  CHECK_MSG(nan_bad == 0 && (ref_ok.empty() || (cmp.rel_l2 < tol && cmp.cosine > 0.999)) &&
                nan_ok == n_nan_rows * c.H,
            (c.bf16 ? "bf16" : format_name(c.f)) << (c.f16 ? " fp16" : " bf16-act") << (c.huge_bias ? " huge-bias" : "")
                             << " path=" << int(c.path)
                             << " E=" << c.E << " k=" << c.top_k << " T=" << c.T << " H=" << c.H << " I=" << c.I
                             << " act=" << int(c.act) << " layout=" << int(c.layout) << " bias=" << c.bias
                             << " routing=" << int(c.routing) << ": rel_l2=" << cmp.rel_l2 << " cos=" << cmp.cosine
                             << " nonfinite=" << nan_bad << " nan rows " << nan_ok / std::max<int64_t>(1, c.H) << "/"
                             << n_nan_rows);

  // Determinism: the same routing again, bitwise.
  const Result again = run_moe(c, gu, dn, xb, ids, wts);
  CHECK_MSG(std::memcmp(got.bits.data(), again.bits.data(), got.bits.size() * 2) == 0,
            "fused_moe is not deterministic (T=" << c.T << ")");
  if (c.one_token_twin) {
    detail::set_moe_one_token(0);
    const Result twin = run_moe(c, gu, dn, xb, ids, wts);
    detail::set_moe_one_token(-1);
    CHECK_MSG(std::memcmp(got.bits.data(), twin.bits.data(), got.bits.size() * 2) == 0,
              "the one-token pass and the align schedule's differ (T=" << c.T << " H=" << c.H << ")");
  }
}

}  // namespace

TEST(moe_matches_reference) {
  const std::vector<int64_t> ts = quick() ? std::vector<int64_t>{5, 37} : std::vector<int64_t>{1, 5, 37, 64, 100};
  const std::vector<int> ks = quick() ? std::vector<int>{2, 4} : std::vector<int>{1, 2, 4, 8};
  for (Format f : {Format::kMXFP4, Format::kNVFP4})
    for (int64_t T : ts)
      for (int k : ks) {
        Case c;
        c.f = f;
        c.T = T;
        c.top_k = k;
        c.E = k == 8 ? 32 : 8 + 4 * k;
        c.act = (T + k) % 2 ? MoEActivation::kSwigluOAI : MoEActivation::kSiluAndMul;
        c.layout = (T / 2 + k) % 2 ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
        c.bias = k % 2 == 0;
        c.routing = T == 37 ? Case::kSkewed : T == 5 ? Case::kOneExpert : Case::kRandom;
        check_case(c);
      }
  // The decode path forced past one pass (kMoEDecodePassTokens): 300 tokens in two passes, skewed and
  // all-on-k-experts routing, so that experts with many more rows than the mean take several schedule
  // entries (blocks of the kernel's token tiles).
  for (Format f : {Format::kMXFP4, Format::kNVFP4})
    for (Case::Routing r : {Case::kSkewed, Case::kOneExpert}) {
      Case c;
      c.f = f;
      c.path = MoEPath::kDecode;
      c.T = kMoEDecodePassTokens + 44;
      c.top_k = 4;
      c.E = 24;
      c.routing = r;
      c.bias = r == Case::kSkewed;
      check_case(c);
      if (quick()) break;
    }
}

// BF16 experts' GEMV (forced: kAuto takes the wgmma kernel on Hopper; the tensor-core kernels
// have tests of their own below): H = 168 and I = 104 leave a partial 16-row tile (down, n = H) and a
// partial 32-wide K step (both K); the expert stride is tight or padded (padding holds NaN, so a stray read
// shows).
TEST(moe_bf16_matches_reference) {
  const std::vector<int64_t> ts = quick() ? std::vector<int64_t>{5, 37} : std::vector<int64_t>{1, 5, 37, 64, 100};
  const std::vector<int> ks = quick() ? std::vector<int>{2, 4} : std::vector<int>{1, 2, 4, 8};
  for (int64_t T : ts)
    for (int k : ks) {
      Case c;
      c.bf16 = true;
      c.path = MoEPath::kDecode;
      c.bf16_pad = (T + k) % 3 == 0 ? 48 : 0;
      c.T = T;
      c.top_k = k;
      c.H = 168;
      c.I = 104;
      c.E = k == 8 ? 32 : 8 + 4 * k;
      c.act = (T + k) % 2 ? MoEActivation::kSwigluOAI : MoEActivation::kSiluAndMul;
      c.layout = (T / 2 + k) % 2 ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
      c.bias = k % 2 == 0 || T == 1;
      c.routing = T == 37 ? Case::kSkewed : T == 5 ? Case::kOneExpert : Case::kRandom;
      check_case(c);
    }
}

// The gpt-oss layer shape: H = I = 2880 (not a multiple of 512), SwiGLU, interleaved gate/up, biases,
// 8 experts, top-4, 3 tokens.
static Case gpt_oss_case() {
  Case c;
  c.E = 8;
  c.top_k = 4;
  c.T = 3;
  c.H = 2880;
  c.I = 2880;
  c.act = MoEActivation::kSwigluOAI;
  c.layout = GateUpLayout::kInterleaved;
  c.bias = true;
  return c;
}

TEST(moe_bf16_gpt_oss_shape) {  // BF16 experts, T = 1 and 16 tokens
  for (int64_t T : {int64_t(1), int64_t(16)}) {
    Case c = gpt_oss_case();
    c.bf16 = true;
    c.T = T;
    c.routing = T == 16 ? Case::kSkewed : Case::kRandom;
    check_case(c);
    if (quick()) break;
  }
}

// The BF16 GEMV with 1, 2, 4 and 8 warps per tile (forced; the plan caps the split at K's 32-wide steps): the
// gpt-oss shape (90 steps: ranges of 45 / 22-23 / 11-12), and H = 168 / I = 104 (6 and 4 steps, the last one
// partial, so some splits are capped and some warps' ranges end on the partial step), top-4, skewed and
// one-expert routing, biases; each against the reference, and bitwise against a second run of itself.
TEST(moe_bf16_gemv_splits) {
  struct P { int64_t T, H, I; Case::Routing r; };
  const std::vector<P> ps = {{1, 2880, 2880, Case::kRandom}, {3, 2880, 2880, Case::kSkewed}, {5, 168, 104, Case::kOneExpert},
                             {37, 168, 104, Case::kSkewed}};
  for (const P& pt : ps) {
    Case c = gpt_oss_case();
    c.bf16 = true;
    c.path = MoEPath::kDecode;
    c.T = pt.T;
    c.H = pt.H;
    c.I = pt.I;
    c.routing = pt.r;
    for (int split : {1, 2, 4, 8}) {
      detail::set_moe_bf16_split(split);
      check_case(c);
    }
    if (quick() && pt.T > 1) break;
  }
  detail::set_moe_bf16_split(-1);
}

// The tensor-core path's kernels this device runs, each made current in turn by body(mma): wgmma (Hopper
// with sm_90a code), and mma.sync, which every sm_80+ device runs (forced on Hopper: detail::set_moe_mma).
template <class Body>
void for_each_tensor_core_kernel(Body body) {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  for (int mma : {0, 1}) {
    if (mma == 0 && major != 9) continue;  // elsewhere the path is the mma.sync kernel already
    detail::set_moe_mma(mma);
    body(mma == 1 || major != 9);
  }
  detail::set_moe_mma(-1);
}

// A forced tensor-core case of the token-count / top-k / routing sweeps below: experts 8 + 4k (32 at
// top-8), the activation, gate/up layout and biases varied with T and k.
struct TcPoint { int64_t T; int k; Case::Routing r; bool f16 = false; };
Case tensor_core_case(const TcPoint& t, int token_tile) {
  Case c;
  c.path = MoEPath::kTensorCore;
  c.token_tile = token_tile;
  c.f16 = t.f16;
  c.T = t.T;
  c.top_k = t.k;
  c.E = t.k == 8 ? 32 : 8 + 4 * t.k;
  c.routing = t.r;
  c.act = (t.T + t.k) % 2 ? MoEActivation::kSwigluOAI : MoEActivation::kSiluAndMul;
  c.layout = t.k % 4 == 0 ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
  c.bias = t.k != 2;
  return c;
}

// BF16 experts on the tensor-core path (forced), through each kernel the device runs (moe_bf16_wgmma.cuh on
// Hopper with sm_90a code, moe_bf16_mma.cuh on every sm_80+ device): H = 168 and I = 104 (partial 128-row
// blocks, K of 2.6 / 1.6 64-K stages), token tiles chosen, 64, 128 and (wgmma) 256 in turn; one row,
// partial tiles, skewed routing, every token on experts 0..k-1 (one expert with T rows: many tiles), padded
// expert strides (NaN in the padding), the gpt-oss shape, and (full run) two passes.
// BF16 experts through one tensor-core kernel (mma: the mma.sync one, whose tiles are 64 and 128): each point
// at H = 168 and I = 104 with the token tiles chosen, 64, 128 and (wgmma) 256 in turn and every other expert
// stride padded.
void bf16_tensor_core_points(const std::vector<TcPoint>& cases, bool mma) {
  int n = 0;
  for (const TcPoint& t : cases) {
    const int tiles[4] = {0, 64, 128, 256};
    Case c = tensor_core_case(t, tiles[n % (mma ? 3 : 4)]);
    c.bf16 = true;
    c.bf16_pad = n++ % 2 ? 48 : 0;
    c.H = 168;
    c.I = 104;
    check_case(c);
  }
}

TEST(moe_bf16_tensor_core_matches_reference) {
  std::vector<TcPoint> cases = {{1, 4, Case::kRandom}, {37, 2, Case::kSkewed}, {300, 4, Case::kRandom},
                                {300, 8, Case::kOneExpert}, {1000, 1, Case::kRandom}};
  if (!quick()) {
    cases.push_back({130, 1, Case::kOneExpert});
    cases.push_back({kMoETensorCorePassTokens + 8, 2, Case::kRandom});  // two passes
  }
  for_each_tensor_core_kernel([&](bool mma) {
    bf16_tensor_core_points(cases, mma);
    Case g = gpt_oss_case();  // K = 2880 (45 stages), n = 5760 and 2880
    g.bf16 = true;
    g.path = MoEPath::kTensorCore;
    g.T = 70;
    g.routing = Case::kSkewed;
    check_case(g);
  });
}

// Every token tile of the BF16 tensor-core kernels on experts whose rows leave exactly BN / 4 + 1 and BN / 2
// + 1 (the wgmma kernel's narrow widths), one row after whole tiles, no rows at all, and whole tiles; then
// one expert alone (small: the sanitizer runs it).
TEST(moe_bf16_tensor_core_tiles) {
  for_each_tensor_core_kernel([&](bool mma) {
    for (int bn : {64, 128, 256}) {
      if (mma && bn == 256) continue;  // the mma.sync kernel's tiles are 64 and 128
      Case c;
      c.bf16 = true;
      c.path = MoEPath::kTensorCore;
      c.token_tile = bn;
      c.top_k = 1;
      c.E = 7;
      c.counts = {bn / 2 + 1, bn + 1, 1, 0, bn, 3, bn / 4 + 1};
      c.T = 0;
      for (int v : c.counts) c.T += v;
      c.routing = Case::kCounts;
      c.bias = true;
      check_case(c);
    }
    Case one;  // a single expert: the weights' tensor map without an expert stride
    one.bf16 = true;
    one.path = MoEPath::kTensorCore;
    one.E = 1;
    one.top_k = 1;
    one.T = 70;
    one.bias = true;
    check_case(one);
  });
}

// BF16 experts with FP16 activations: the tensor-core path with X gathered as two BF16 terms (hi + lo),
// through each kernel the device runs: K = 168 and 104 (the split's halves padded to 192 and 128), token
// tiles chosen, 64, 128 and (wgmma) 256, biases (BF16), one row, skewed routing, one expert with many rows;
// kAuto (which takes the tensor-core path) on the gpt-oss shape. check_case's gate for the short-K cases (1e-3
// against a reference rounded as the op rounds) fails if x is rounded to BF16 instead of split (~4e-3); at
// K = 2880 the accumulation flips more of the BF16 roundings of h and o (measured 8e-4), so the gpt-oss case
// takes the BF16 gate. Then the path rules.
TEST(moe_bf16_fp16_activations) {
  const std::vector<TcPoint> cases = {{1, 4, Case::kRandom, true}, {37, 2, Case::kSkewed, true},
                                      {300, 4, Case::kRandom, true}, {200, 8, Case::kOneExpert, true}};
  for_each_tensor_core_kernel([&](bool mma) {
    bf16_tensor_core_points(cases, mma);
    Case g = gpt_oss_case();  // kAuto
    g.bf16 = true;
    g.f16 = true;
    g.T = quick() ? 3 : 70;
    g.routing = Case::kSkewed;
    g.tol = 1e-2;
    check_case(g);
  });
  Case c;
  c.bf16 = true;
  c.f16 = true;
  c.E = 1;
  c.top_k = 1;
  c.T = 1;
  c.H = 64;
  c.I = 32;
  MoEArgs a = case_args(c);
  MoEPath path = MoEPath::kDecode;
  CHECK_OK(moe_path(a, &path));
  CHECK_MSG(path == MoEPath::kTensorCore, "BF16 experts with FP16 activations: kAuto takes the tensor-core path");
  a.path = MoEPath::kDecode;
  CHECK_ERROR(moe_path(a, &path), "path: BF16 experts with float16 activations run on the tensor-core path only "
                                  "(MoEPath::kAuto or kTensorCore; got kDecode)");
}

TEST(moe_bf16_bad_ids_give_nan_rows) {
  Case c;
  c.bf16 = true;
  c.T = 6;
  c.top_k = 2;
  c.E = 8;
  c.H = 64;
  c.I = 32;
  c.bad = {{2 * 1 + 1, 8}, {2 * 3 + 0, -1}, {2 * 4 + 1, 0}};
  c.routing = Case::kOneExpert;  // slot 0 = 0: token 4's slot 1 = 0 is a duplicate
  check_case(c);
}

// FP16 activations with FP4 experts (BF16 experts: moe_bf16_fp16_activations). Both formats and activations,
// biases on most cases, T = 1 (one token), 37 (skewed routing), 64 (one full pass) and 100 (two passes).
TEST(moe_fp16_matches_reference) {
  const std::vector<int64_t> ts = quick() ? std::vector<int64_t>{1, 37} : std::vector<int64_t>{1, 37, 64, 100};
  for (Format f : {Format::kMXFP4, Format::kNVFP4})
    for (int64_t T : ts)
      for (MoEActivation act : {MoEActivation::kSiluAndMul, MoEActivation::kSwigluOAI}) {
        Case c;
        c.f16 = true;
        c.f = f;
        c.T = T;
        c.top_k = T == 1 ? 4 : T == 37 ? 2 : T == 64 ? 8 : 4;
        c.E = c.top_k == 8 ? 32 : 8 + 4 * c.top_k;
        c.act = act;
        c.layout = act == MoEActivation::kSwigluOAI ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
        c.bias = act == MoEActivation::kSwigluOAI || T % 2 == 1;
        c.routing = T == 37 ? Case::kSkewed : Case::kRandom;
        check_case(c);
      }
}

// FP16 with gate/up values past the FP16 range (bias rows at +-65504, see huge_row): the saturation of
// fp4kit/moe.h keeps every output finite and equal to the reference's.
TEST(moe_fp16_saturates_out_of_range_gate_up) {
  for (Format f : {Format::kMXFP4, Format::kNVFP4})
    for (MoEActivation act : {MoEActivation::kSwigluOAI, MoEActivation::kSiluAndMul}) {
      Case c;
      c.f16 = true;
      c.huge_bias = true;
      c.f = f;
      c.T = 9;
      c.top_k = 2;
      c.E = 8;
      c.act = act;
      c.layout = act == MoEActivation::kSwigluOAI ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
      check_case(c);
      if (quick()) break;
    }
}

// top_k past the align kernel's token-per-thread form (kAlignMaxSlots = 8): its pair-per-thread loop, with
// a repeated and an out-of-range id.
TEST(moe_top_k_past_eight) {
  Case c;
  c.T = 37;
  c.top_k = 10;
  c.E = 16;
  c.bad = {{10 * 3 + 4, 16}, {10 * 7 + 9, -1}};
  check_case(c);
}

TEST(moe_fp16_gpt_oss_shape) {  // FP16 activations, both formats
  for (Format f : {Format::kMXFP4, Format::kNVFP4}) {
    Case c = gpt_oss_case();
    c.f16 = true;
    c.f = f;
    check_case(c);
    if (quick()) break;
  }
}

TEST(moe_gpt_oss_shape) {
  check_case(gpt_oss_case());
}

TEST(moe_bad_and_duplicate_ids_give_nan_rows) {
  Case c;
  c.T = 6;
  c.top_k = 2;
  c.E = 8;
  c.bad = {{2 * 1 + 1, 8}, {2 * 3 + 0, -1}, {2 * 4 + 1, -7}};
  check_case(c);
  Case d = c;  // duplicate: token 2 routes twice to one expert
  d.bad.clear();
  d.routing = Case::kOneExpert;  // slot 0 = 0, slot 1 = 1
  d.bad = {{2 * 2 + 1, 0}};
  check_case(d);
}

// A one-token layer whose gate_up runs in cluster mode and whose down runs stream-K on the H200: H = 2560,
// I = 1600, 6 experts, top-4, concatenated silu rows, biases.
static Case cluster_stream_k_case() {
  Case c;
  c.T = 1;
  c.top_k = 4;
  c.E = 6;
  c.H = 2560;
  c.I = 1600;
  c.bias = true;
  return c;
}

// Cluster mode of the one-token grouped GEMMs (sm_90): at T = 1 every row group the schedule can hold gets
// a cluster of CTAs that split its K (two or three slices each). Shapes: gpt-oss (gate_up 180 row groups
// over 6 K slices: clusters of 2; down 92 over 6, the last one partial: clusters of 3) and H = 2560,
// I = 1600 (gate_up 100 row groups over 5 slices: clusters of 3 with 1, 2 and 2 slices; down 80 over 4:
// one slice per CTA, stream-K). With interleaved gate/up rows gate_up's reduction also applies the
// activation (no activation launch): SwiGLU with bias (gpt-oss), silu, FP16 with gate_up outputs past
// the FP16 range (saturated as the activation kernel does), a duplicate id (a NaN row; the schedule then
// holds fewer entries than the grid covers, so whole clusters leave); concatenated rows keep the
// activation launch. The plan's choices are asserted where the device runs clusters.
TEST(moe_cluster_mode) {
  detail::set_moe_one_token(0);  // the align schedule (moe_one_token_pass: the one-token pass)
  int dev = 0, major = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  Case big = gpt_oss_case();  // interleaved SwiGLU, bias
  big.T = 1;
  Case odd = cluster_stream_k_case();  // concatenated silu: cluster mode, activation launch kept
  struct Want { Case c; int gu, dn; bool act; };
  std::vector<Want> cases = {{big, 2, 3, true}, {odd, 3, 0, false}};
  Case f16 = big;
  f16.f16 = true;
  f16.huge_bias = true;
  f16.f = Format::kNVFP4;
  cases.push_back({f16, 2, 3, true});
  Case dup = odd;
  dup.f = Format::kNVFP4;
  dup.layout = GateUpLayout::kInterleaved;
  dup.routing = Case::kOneExpert;  // slot j -> expert j; slot 3 -> expert 0 again below
  dup.bad = {{3, 0}};
  cases.push_back({dup, 3, 0, true});
  if (!quick()) {
    Case b2 = big;
    b2.f = Format::kNVFP4;
    cases.push_back({b2, 2, 3, true});
    Case o2 = odd;
    o2.layout = GateUpLayout::kInterleaved;
    o2.act = MoEActivation::kSwigluOAI;
    o2.f16 = true;
    cases.push_back({o2, 3, 0, true});
  }
  for (const Want& w : cases) {
    const MoEArgs a = case_args(w.c);
    int gu = -1, dn = -1;
    bool act = false;
    CHECK_OK(detail::moe_decode_clusters(a, &gu, &dn, &act));
    if (major >= 9) {
      CHECK_MSG(gu == w.gu && dn == w.dn && act == w.act,
                "H=" << w.c.H << " I=" << w.c.I << ": clusters of " << gu << " / " << dn << " CTAs, activation in gate_up "
                     << act << "; expected " << w.gu << " / " << w.dn << ", " << w.act);
    } else {
      CHECK_MSG(gu == 0 && dn == 0 && !act, "no clusters before sm_90 (got " << gu << " / " << dn << ")");
    }
    check_case(w.c);
  }
  detail::set_moe_one_token(-1);
  if (major < 9) std::printf("  [note] moe_cluster_mode: compute capability %d: stream-K only (no clusters)\n", major);
}

// One-token passes (kernels::OneToken): at T = 1, where both GEMMs run in cluster mode, the pairs are the
// schedule and no align launch runs; gate_up writes the rows and each pair's row (the workspace is
// poisoned, so anything the call relied on but did not write would show). Against the reference, and bit
// for bit against the same call through the align schedule (each cluster's K split does not depend on the
// order of the entries): the gpt-oss shape with 4 experts (interleaved SwiGLU, bias), a duplicate id (the
// pair's token NaN; its expert's rows computed twice), bad ids (out of range: expert 0 computes the row,
// the token NaN), FP16 (full set); and concatenated rows with down in stream-K (H = 2560, I = 1600): the
// align step runs. Routing from logits at T = 1 (a route launch, then the one-token pass) is in
// moe_routes_from_logits; moe_cluster_mode runs cluster mode through the align schedule.
TEST(moe_one_token_pass) {
  int dev = 0, major = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  Case big = gpt_oss_case();
  big.T = 1;
  big.E = 4;
  big.one_token_twin = true;
  Case dup = big;
  dup.f = Format::kNVFP4;
  dup.routing = Case::kOneExpert;  // slot j -> expert j, then slot 3 -> expert 1 again
  dup.bad = {{3, 1}};
  Case bad = big;
  bad.bad = {{0, 4}, {2, -3}};
  const Case odd = cluster_stream_k_case();
  struct Want { Case c; bool one; };
  std::vector<Want> cases = {{big, true}, {dup, true}, {bad, true}, {odd, false}};
  if (!quick()) {
    Case f16 = big;
    f16.f16 = true;
    f16.f = Format::kNVFP4;
    cases.push_back({f16, true});
  }
  for (const Want& w : cases) {
    const MoEArgs a = case_args(w.c);
    int gu = -1, dn = -1;
    bool one = false;
    CHECK_OK(detail::moe_decode_clusters(a, &gu, &dn, nullptr, &one));
    CHECK_MSG(one == (gu > 0 && dn > 0), "H=" << w.c.H << ": one-token pass " << one << " with clusters of " << gu << " / " << dn);
    if (major >= 9) CHECK_MSG(one == w.one, "H=" << w.c.H << ": one-token pass " << one << ", expected " << w.one << " on sm_90");
    check_case(w.c);
  }
  if (major < 9) std::printf("  [note] moe_one_token_pass: compute capability %d: no clusters, so the align step runs\n", major);
}

// BF16 experts' one-token pass (the wgmma kernel, BF16 activations): no align or gather launch, the pair ids
// are the schedule and gate_up reads x's row itself. The gpt-oss shape on 4 experts (interleaved, biases),
// a duplicate id, ids out of range, and concatenated rows with top-1 and top-8 on a small shape: each
// against the reference and bit for bit against the same call through the align schedule (the pass off).
// FP16 activations keep the gather (their X is split), so no pass. Hopper with sm_90a code only.
TEST(moe_bf16_one_token_pass) {
  if (!detail::prefill_runs_here()) {
    std::printf("  [skip] moe_bf16_one_token_pass: the wgmma kernel runs on Hopper with sm_90a code only\n");
    return;
  }
  Case big = gpt_oss_case();
  big.bf16 = true;
  big.T = 1;
  big.E = 4;
  big.one_token_twin = true;
  Case dup = big;
  dup.routing = Case::kOneExpert;  // slot j -> expert j, then slot 3 -> expert 1 again
  dup.bad = {{3, 1}};
  Case bad = big;
  bad.bad = {{0, 4}, {2, -3}};
  Case top1;
  top1.bf16 = true;
  top1.top_k = 1;
  top1.bias = true;
  top1.one_token_twin = true;
  Case top8 = top1;
  top8.top_k = 8;
  top8.E = 12;
  top8.act = MoEActivation::kSwigluOAI;
  Case f16 = big;
  f16.f16 = true;
  f16.one_token_twin = false;
  f16.tol = 1e-2;
  struct Want { Case c; bool one; };
  for (const Want& w : {Want{big, true}, Want{dup, true}, Want{bad, true}, Want{top1, true}, Want{top8, true},
                        Want{f16, false}}) {
    int gu = -1, dn = -1;
    bool one = false;
    CHECK_OK(detail::moe_decode_clusters(case_args(w.c), &gu, &dn, nullptr, &one));
    CHECK_MSG(one == w.one, "k=" << w.c.top_k << (w.c.f16 ? " fp16" : "") << ": one-token pass " << one);
    check_case(w.c);
  }
}

// The cluster rule on the gpt-oss shape at T = 1 and 2 (H200 figures), with cluster mode on and off
// (detail::set_moe_clusters, what FP4KIT_MOE_CLUSTERS=0 does): at T = 1 gate_up in pairs with the
// activation in its reduction and down in threes; at T = 2 stream-K for both (gate_up: one row group per
// CTA already; down: 368 CTAs in pairs would fill 93% of the wave, measured 2-3.5% slower).
TEST(moe_cluster_rule_gpt_oss) {
  int dev = 0, major = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (int on : {0, 1}) {
    detail::set_moe_clusters(on);
    for (int64_t T : {int64_t(1), int64_t(2)}) {
      const Format f = T == 1 ? Format::kNVFP4 : Format::kMXFP4;
      Case c = gpt_oss_case();
      c.T = T;
      c.f = f;
      const MoEArgs a = case_args(c);
      int gu = -1, dn = -1;
      bool act = false;
      CHECK_OK(detail::moe_decode_clusters(a, &gu, &dn, &act));
      const bool clusters = on && T == 1;
      if (major >= 9 && sms == 132) {
        CHECK_MSG(gu == (clusters ? 2 : 0) && dn == (clusters ? 3 : 0) && act == clusters,
                  "cluster mode " << on << ", T=" << T << ": gate_up " << gu << ", down " << dn
                                  << ", activation in gate_up " << act);
      } else {
        CHECK(gu >= 0 && dn >= 0);
        std::printf("  [note] moe_cluster_rule_gpt_oss: plan figures asserted on a 132-SM sm_90 device only (here cc %d, "
                    "%d SMs)\n", major, sms);
      }
      check_case(c);
    }
  }
  detail::set_moe_clusters(-1);
}

// ---- the tensor-core path (sm_90a): grouped wgmma GEMMs over the experts' gathered rows -------------

// A one-token layer of 4 MXFP4 experts, H = I = 64, shapes only (no data).
MoEArgs small_shapes() {
  MoEArgs a;
  a.tokens = 1;
  a.hidden = 64;
  a.inter = 64;
  a.num_experts = 4;
  a.top_k = 2;
  a.gate_up = ExpertWeights{Format::kMXFP4, 128, 64, nullptr, 0, nullptr};
  a.down = ExpertWeights{Format::kMXFP4, 64, 64, nullptr, 0, nullptr};
  return a;
}

// Whether this device and build run the tensor-core path; prints the reason when they do not.
bool tensor_core_path_here(const char* test) {
  MoEArgs a = small_shapes();
  a.path = MoEPath::kTensorCore;
  size_t bytes = 0;
  const Status st = moe_workspace_bytes(a, &bytes);
  if (!st.ok()) std::printf("  [skip] %s: %s\n", test, st.message().c_str());
  return st.ok();
}


// Forced tensor-core path against the reference. Shapes: H = 160 (gate_up K of 2.5 64-K chunks:
// NVFP4's odd last stage) and I = 96 (down K = 96), n = 192 and 160 (partial 128-row blocks). Tokens:
// 1 (one row), 37 and 300 (partial token tiles; skewed: several tiles per expert), kOneExpert (every
// token on experts 0..k-1: one expert with T rows, many tiles), T = 1000 with top-1 (128-token tiles),
// and kMoETensorCorePassTokens + 8 tokens (two passes). The cases cycle through the token tiles (chosen, 64, 128, 256).
TEST(moe_tensor_core_matches_reference) {
  if (!tensor_core_path_here("moe_tensor_core_matches_reference")) return;
  std::vector<TcPoint> cases = {{1, 4, Case::kRandom, false}, {37, 2, Case::kSkewed, false}, {300, 4, Case::kRandom, false},
                                {300, 8, Case::kOneExpert, true}, {1000, 1, Case::kRandom, false}};
  if (!quick()) {
    cases.push_back({300, 2, Case::kSkewed, true});
    cases.push_back({130, 1, Case::kOneExpert, false});
    cases.push_back({kMoETensorCorePassTokens + 8, 2, Case::kRandom, false});  // two passes
  }
  for_each_tensor_core_kernel([&](bool mma) {
  int n = 0;
  for (Format f : {Format::kMXFP4, Format::kNVFP4})
    for (const TcPoint& t : cases) {
      const int tiles[4] = {0, 64, 128, 256};  // chosen, then each token tile forced in turn (mma.sync: to 128)
      Case c = tensor_core_case(t, tiles[n++ % (mma ? 3 : 4)]);
      c.f = f;
      check_case(c);
    }
  });
}

// Every token-tile width of the grouped prefill kernel (prefill_gemm_sm90.cuh: a tile of at most BN / 4 or
// BN / 2 valid tokens runs m64n(BN/4) or m64n(BN/2)): experts whose last tile holds exactly BN / 4, BN / 4 + 1,
// BN / 2, BN / 2 + 1, BN / 4 (after a whole tile), 1 (after a whole tile) and 1 token, and one expert
// without tokens, for each forced token tile.
TEST(moe_tensor_core_narrow_tiles) {
  if (!tensor_core_path_here("moe_tensor_core_narrow_tiles")) return;
  for_each_tensor_core_kernel([&](bool mma) {
  for (int bn : {64, 128, 256})
    for (Format f : {Format::kMXFP4, Format::kNVFP4}) {
      if (mma && bn == 256) continue;
      Case c;
      c.path = MoEPath::kTensorCore;
      c.token_tile = bn;
      c.f = f;
      c.top_k = 1;
      c.E = 9;
      c.counts = {bn / 4, bn / 4 + 1, bn / 2, bn / 2 + 1, bn + bn / 4, bn + 1, 1, 0, bn};
      c.T = 0;
      for (int v : c.counts) c.T += v;
      c.routing = Case::kCounts;
      c.bias = true;
      check_case(c);
    }
  });
}

// kAuto's rule (fp4kit/moe.h), as moe_path reports it: FP4 experts take the decode path while one pass holds
// the tokens and its token tiles for the mean rows per expert stay at 16 tokens (wgmma here) or below 64
// (the mma.sync kernel: devices without sm_90a code, or forced); BF16 experts take the tensor cores past one
// pass of their GEMV (kMoEBF16PassTokens), where experts average >= 8 rows, and at T = 1.
TEST(moe_auto_path_rule) {
  if (!tensor_core_path_here("moe_auto_path_rule")) return;
  bool wgmma = false;  // which kernel the tensor-core path runs here (FP4KIT_MOE_MMA=1 forces mma.sync)
  {
    MoEArgs a = small_shapes();
    a.path = MoEPath::kTensorCore;
    const char* kernel = "";
    CHECK_OK(detail::moe_gemm_kernel(a, &kernel));
    wgmma = std::string(kernel) == "wgmma";
  }
  constexpr MoEPath D = MoEPath::kDecode, C = MoEPath::kTensorCore;
  struct P { int64_t T; int E, k; bool bf16; MoEPath want, want_mma; };  // want_mma: mma.sync devices
  const std::vector<P> cases = {
      {1, 128, 4, false, D, D},
      {63, 4, 2, false, C, D},     // 31.5 rows per expert; mma.sync: below kMoETensorCoreMinTokens
      {96, 128, 4, false, D, D},   // gpt-oss-120b: 3 rows per expert (8-token decode tiles)
      {128, 128, 4, false, C, D},  // 4 rows (16-token tiles)
      {256, 128, 4, false, C, D},  // one pass, 8 rows per expert
      {257, 128, 4, false, C, C},  // two passes
      {12, 8, 2, false, D, D},     // Mixtral: 3 rows per expert
      {16, 8, 2, false, C, D},     // 4 rows
      {32, 8, 2, false, C, D},     // 8 rows
      {64, 8, 2, false, C, D},     // 16 rows
      {128, 8, 2, false, C, C},    // 32 rows
      {48, 128, 8, false, D, D},   // Qwen3-30B-A3B: 3 rows
      {128, 128, 8, false, C, D},  // 8 rows
      {24, 32, 4, false, D, D},    // gpt-oss-20b: 3 rows
      {64, 32, 4, false, C, D},    // 8 rows
      // BF16 experts: the wgmma kernel at every T; mma.sync past one GEMV pass or from 8 rows per expert
      {1, 128, 4, true, C, D},  {2, 128, 4, true, C, D},
      {64, 128, 4, true, C, D},   // 2 rows per expert
      {16, 8, 2, true, C, D},     // 4
      {32, 8, 2, true, C, C},     // 8
      {65, 128, 4, true, C, C}, {4096, 8, 2, true, C, C}};
  for (const P& p : cases) {
    P c = p;
    if (!wgmma) c.want = c.want_mma;
    MoEArgs a = small_shapes();
    a.tokens = c.T;
    a.num_experts = c.E;
    a.top_k = c.k;
    if (c.bf16) a.gate_up.kind = a.down.kind = ExpertKind::kBF16;
    MoEPath got = MoEPath::kAuto;
    CHECK_OK(moe_path(a, &got));
    CHECK_MSG(got == c.want, "T=" << c.T << " E=" << c.E << " top_k=" << c.k << (c.bf16 ? " bf16" : " fp4") << ": path "
                                  << int(got) << ", expected " << int(c.want));
    const char* kernel = "";
    CHECK_OK(detail::moe_gemm_kernel(a, &kernel));
    const bool tc = c.want == MoEPath::kTensorCore;
    const std::string want = c.bf16 ? (tc ? (wgmma ? "bf16 wgmma" : "bf16 mma.sync") : "bf16 gemv") : (tc ? "wgmma" : "decode");
    const bool fp4_mma = !c.bf16 && tc && std::string(kernel) == "mma.sync";  // a device without sm_90a code
    CHECK_MSG(want == kernel || fp4_mma, "T=" << c.T << ": kernel " << kernel << ", expected " << want);
  }
}

// Passes of many pairs (detail::moe_align_grid) build the schedule from a grid of CTAs (moe_align.cuh:
// counts per CTA, then every CTA's rows after the CTAs before it). T = 1100 at top-4 (4400 pairs: 5 CTAs of
// 256 tokens, the last partial) with skewed routing and bad and duplicate ids in the first, a middle and the
// last CTA; top-10 (the per-pair form) at T = 420; one expert holding every token's slot 0 (1100 rows, from
// every CTA). The tensor-core path (the decode path's passes stay below the threshold), BF16 experts too.
TEST(moe_align_grid) {
  if (!tensor_core_path_here("moe_align_grid")) return;
  CHECK_MSG(detail::moe_align_grid(1100, 4) == 5 && detail::moe_align_grid(420, 10) == 2 &&
                detail::moe_align_grid(1000, 1) == 0 && detail::moe_align_grid(256, 8) == 0,
            "moe_align_grid: " << detail::moe_align_grid(1100, 4) << ", " << detail::moe_align_grid(420, 10));
  for (int variant = 0; variant < (quick() ? 3 : 4); ++variant) {
    Case c;
    c.path = MoEPath::kTensorCore;
    c.H = 64;
    c.I = 64;
    c.E = 16;
    c.f = variant % 2 ? Format::kNVFP4 : Format::kMXFP4;
    if (variant == 1) {
      c.T = 420;
      c.top_k = 10;
      c.routing = Case::kRandom;
      c.bad = {{10 * 3 + 4, 16}, {10 * 300 + 9, -1}, {10 * 419 + 2, 0}};
    } else {
      c.T = 1100;
      c.top_k = 4;
      c.routing = variant == 2 ? Case::kOneExpert : Case::kSkewed;
      // Bad ids (16, -1, 99) and a duplicate (token 700's slots 2 and 3; token 600's slot 3 repeats
      // expert 0 of its slot 0 with kOneExpert).
      c.bad = {{4 * 2 + 1, 16}, {4 * 1099 + 0, 99}, {4 * 700 + 2, 5}, {4 * 700 + 3, 5}};
      c.bad.push_back(variant == 2 ? std::make_pair(4 * 600 + 3, 0) : std::make_pair(4 * 600 + 3, -1));
      c.act = MoEActivation::kSwigluOAI;
      c.layout = GateUpLayout::kInterleaved;
      c.bias = true;
    }
    c.bf16 = variant == 3;
    check_case(c);
  }
}

// Automatic choice past kMoEDecodePassTokens (the tensor-core path here), with bad and duplicate ids.
TEST(moe_tensor_core_bad_ids_give_nan_rows) {
  if (!tensor_core_path_here("moe_tensor_core_bad_ids_give_nan_rows")) return;
  Case c;
  c.T = kMoEDecodePassTokens + 3;
  c.top_k = 2;
  c.E = 8;
  c.routing = Case::kOneExpert;  // slot 0 = 0, slot 1 = 1
  c.bad = {{2 * 1 + 1, 8}, {2 * 3 + 0, -1}, {2 * 40 + 1, 0}, {2 * 129 + 0, 1}};
  check_case(c);
}

// The gpt-oss layer shape on the tensor-core path (K = 2880: 5.6 slices of 512; n = 5760 and 2880).
TEST(moe_tensor_core_gpt_oss_shape) {
  if (!tensor_core_path_here("moe_tensor_core_gpt_oss_shape")) return;
  for_each_tensor_core_kernel([&](bool) {
    for (Format f : {Format::kMXFP4, Format::kNVFP4}) {
      Case c = gpt_oss_case();
      c.path = MoEPath::kTensorCore;
      c.f = f;
      c.T = 9;
      c.routing = Case::kSkewed;
      check_case(c);
      if (quick()) break;
    }
  });
}

// The mma.sync kernel's tensor-core path takes no 256-token tiles: a clear error, not a silent change.
TEST(moe_mma_token_tile_rule) {
  detail::set_moe_mma(1);
  MoEArgs a = small_shapes();
  a.path = MoEPath::kTensorCore;
  a.token_tile = 256;
  size_t bytes = 0;
  const Status st = moe_workspace_bytes(a, &bytes);
  CHECK_MSG(!st.ok() && st.message().find("token_tile: 256-token tiles need the wgmma kernel") != std::string::npos,
            "got: " << st.message());
  a.token_tile = 128;
  CHECK_OK(moe_workspace_bytes(a, &bytes));
  detail::set_moe_mma(-1);
}

// BF16 experts' mma.sync kernel has no 256-token tiles: a clear error (forced where the wgmma kernel runs,
// which has them).
TEST(moe_bf16_token_tile_rule) {
  MoEArgs a = small_shapes();
  a.gate_up.kind = a.down.kind = ExpertKind::kBF16;
  a.gate_up.stride = size_t(a.gate_up.n * a.gate_up.k * 2);
  a.down.stride = size_t(a.down.n * a.down.k * 2);
  a.path = MoEPath::kTensorCore;
  a.token_tile = 256;
  size_t bytes = 0;
  detail::set_moe_mma(1);
  const Status st = moe_workspace_bytes(a, &bytes);
  CHECK_MSG(!st.ok() && st.message().find("token_tile: 256-token tiles need the wgmma kernel (sm_90a); BF16 experts' "
                                          "tensor-core path here runs the mma.sync kernel") != std::string::npos,
            "got: " << st.message());
  a.token_tile = 128;
  CHECK_OK(moe_workspace_bytes(a, &bytes));
  detail::set_moe_mma(-1);
  if (detail::prefill_runs_here()) {
    a.token_tile = 256;
    CHECK_OK(moe_workspace_bytes(a, &bytes));
    const char* kernel = "";
    CHECK_OK(detail::moe_gemm_kernel(a, &kernel));
    CHECK_MSG(std::string(kernel) == "bf16 wgmma", "kernel " << kernel);
  }
}

TEST(moe_validator_messages) {
  const MoEArgs a = small_shapes();
  CHECK_ERROR(moe_validate(a), "gate_up.data: must not be null");
  MoEArgs b = a;
  b.top_k = 5;
  CHECK_ERROR(moe_validate(b), "top_k: must be in [1, num_experts = 4]");
  b = a;
  b.tokens = 0;
  CHECK_ERROR(moe_validate(b), "tokens: must be >= 1");
  b = a;
  b.path = static_cast<MoEPath>(7);
  CHECK_ERROR(moe_validate(b), "path: must be MoEPath::kAuto, kDecode or kTensorCore (got 7)");
  b = a;
  b.token_tile = 96;
  CHECK_ERROR(moe_validate(b), "token_tile: must be 0 (chosen), 64, 128 or 256 (got 96)");
  b = a;
  b.act = DType::kF32;
  CHECK_ERROR(moe_validate(b), "act: must be bfloat16 or float16 (got float32)");
  b = a;
  b.act = DType::kF16;  // FP4 experts take FP16 activations: the next rule is the data pointer's
  CHECK_ERROR(moe_validate(b), "gate_up.data: must not be null");
  size_t bytes = 0;
  CHECK_OK(moe_workspace_bytes(b, &bytes));
  CHECK(bytes > 0);
  b = a;
  b.down.n = 32;
  CHECK_ERROR(moe_validate(b), "down: shape must be [64, 64] per expert");
  b = a;
  b.hidden = 60;
  b.gate_up.k = 60;
  b.down.n = 60;
  CHECK_ERROR(moe_validate(b), "hidden, inter: must be multiples of 8");
}

TEST(moe_bf16_validator_messages) {
  alignas(256) static uint8_t fake[256];  // never dereferenced: moe_validate only looks at the pointers
  MoEArgs a;
  a.tokens = 1;
  a.hidden = 64;
  a.inter = 32;
  a.num_experts = 4;
  a.top_k = 2;
  a.gate_up = ExpertWeights{Format::kMXFP4, 64, 64, nullptr, 64 * 64 * 2, nullptr};
  a.gate_up.kind = ExpertKind::kBF16;
  a.down = ExpertWeights{Format::kNVFP4, 64, 32, nullptr, 64 * 32 * 2, nullptr};  // format ignored for BF16
  a.down.kind = ExpertKind::kBF16;
  size_t bytes = 0;
  CHECK_OK(moe_workspace_bytes(a, &bytes));  // shapes only: BF16 experts need no split-K scratch
  CHECK(bytes > 0);
  CHECK_ERROR(moe_validate(a), "gate_up.data: must not be null (the experts' bf16 [E, n, k] weights)");
  a.gate_up.data = fake;
  a.down.data = fake;
  a.x = fake;
  a.y = fake + 128;
  a.topk_ids = reinterpret_cast<const int32_t*>(fake);
  a.topk_weights = reinterpret_cast<const float*>(fake);
  MoEArgs b = a;
  b.down.kind = ExpertKind::kFP4;
  CHECK_ERROR(moe_validate(b), "down.kind: both expert sets must be of the same kind (gate_up is kBF16)");
  b = a;
  b.gate_up.kind = static_cast<ExpertKind>(7);
  CHECK_ERROR(moe_validate(b), "gate_up.kind: must be ExpertKind::kFP4 or ExpertKind::kBF16 (got 7)");
  b = a;
  b.gate_up.data = fake + 8;
  CHECK_ERROR(moe_validate(b), "gate_up.data: BF16 experts must be 16-byte aligned");
  b = a;
  b.down.stride = 64 * 32 * 2 - 16;
  CHECK_ERROR(moe_validate(b),
              "down.stride: BF16 experts need a multiple of 16 bytes >= n * k * 2 = 4096 (one row-major [64, 32] "
              "bf16 matrix; got 4080)");
  b = a;
  b.gate_up.stride = 64 * 64 * 2 + 8;
  CHECK_ERROR(moe_validate(b), "gate_up.stride: BF16 experts need a multiple of 16 bytes");
  b = a;
  b.down.bias = fake + 1;
  CHECK_ERROR(moe_validate(b), "down.bias: must be 2-byte aligned");
  b = a;
  b.down.k = 64;
  CHECK_ERROR(moe_validate(b), "down: shape must be [64, 32] per expert (got [64, 64])");
  b = a;
  b.act = DType::kF16;  // FP16 activations: the tensor-core path, not the GEMV
  CHECK_OK(moe_workspace_bytes(b, &bytes));
  b.path = MoEPath::kDecode;
  CHECK_ERROR(moe_validate(b), "path: BF16 experts with float16 activations run on the tensor-core path only "
                               "(MoEPath::kAuto or kTensorCore; got kDecode)");
  CHECK_ERROR(moe_workspace_bytes(b, &bytes), "path: BF16 experts with float16 activations run on the tensor-core "
                                              "path only");
  b = a;
  b.act = DType::kF32;
  CHECK_ERROR(moe_validate(b), "act: must be bfloat16 or float16 (got float32)");
  b = a;
  b.workspace = nullptr;
  CHECK_ERROR(moe_validate(b), "workspace: must be a non-null, 16-byte aligned pointer");
}

// ---- routing from router logits (fp4kit/routing.h) ---------------------------------------------------

// Whether (ids, w) of one token is a correct routing of logits `lg` under `r` (fp4kit/routing.h), checked
// from the definitions in fp64, independently of any sort: selection keys may tie within `eps` (the
// kernel's fp32 sigmoid against fp64), where either choice is right. Appends what is wrong to `why`.
bool routing_valid(const Routing& r, const std::vector<double>& lg, int k, const int32_t* ids, const float* w,
                   std::string* why) {
  const int E = int(lg.size());
  const double eps = 1e-5;
  std::ostringstream os;
  std::vector<bool> taken(size_t(E), false);
  for (int j = 0; j < k; ++j) {
    if (ids[j] < 0 || ids[j] >= E || taken[size_t(ids[j])]) {
      os << "slot " << j << ": id " << ids[j] << " out of range or repeated";
      *why = os.str();
      return false;
    }
    taken[size_t(ids[j])] = true;
  }
  const bool sg = r.mode == RoutingMode::kSigmoidGroupedTopK;
  std::vector<double> key(lg.size()), score(lg.size());
  for (int e = 0; e < E; ++e) {
    score[size_t(e)] = sg ? 1.0 / (1.0 + std::exp(-lg[size_t(e)])) : lg[size_t(e)];
    key[size_t(e)] = score[size_t(e)] + (sg && r.correction_bias ? double(r.correction_bias[e]) : 0.0);
  }
  const double tol = sg ? eps : 0.0;  // softmax keys are the exact logits
  // Groups: every chosen expert in a group no worse than the topk_group-th; experts of groups surely kept
  // (better than every dropped one by eps) compete with the chosen ones.
  const int ng = sg ? r.n_group : 1, gsize = E / ng, keep = sg ? r.topk_group : 1;
  std::vector<double> gkey(static_cast<size_t>(ng));
  for (int g = 0; g < ng; ++g) {
    std::vector<double> v(key.begin() + g * gsize, key.begin() + (g + 1) * gsize);
    std::sort(v.begin(), v.end(), std::greater<double>());
    gkey[size_t(g)] = gsize == 1 ? v[0] : v[0] + v[1];
  }
  std::vector<double> gs(gkey);
  std::sort(gs.begin(), gs.end(), std::greater<double>());
  const double g_cut = gs[size_t(keep - 1)];
  const double g_next = keep < ng ? gs[size_t(keep)] : -INFINITY;
  double min_chosen = INFINITY;
  for (int j = 0; j < k; ++j) {
    const int e = ids[j];
    if (gkey[size_t(e / gsize)] < g_cut - 2 * tol) os << "slot " << j << ": expert " << e << " of a dropped group; ";
    if (j > 0 && (key[size_t(e)] > key[size_t(ids[j - 1])] + tol ||
                  (tol == 0.0 && key[size_t(e)] == key[size_t(ids[j - 1])] && e < ids[j - 1])))
      os << "slot " << j << ": not in descending order (ties to the lower id); ";
    min_chosen = std::min(min_chosen, key[size_t(e)]);
  }
  for (int e = 0; e < E; ++e) {
    const bool surely_kept = gkey[size_t(e / gsize)] > g_next + 2 * tol;
    if (!taken[size_t(e)] && surely_kept && key[size_t(e)] > min_chosen + tol)
      os << "expert " << e << " (key " << key[size_t(e)] << ") beats a chosen one (" << min_chosen << "); ";
  }
  // Weights from the chosen ids.
  double sum = 0.0;
  if (sg) {
    for (int j = 0; j < k; ++j) sum += score[size_t(ids[j])];
  } else {
    const double mx = *std::max_element(lg.begin(), lg.end());
    for (int e = 0; e < E; ++e)
      if (!r.renormalize || taken[size_t(e)]) sum += std::exp(lg[size_t(e)] - mx);
    for (int j = 0; j < k; ++j) score[size_t(ids[j])] = std::exp(lg[size_t(ids[j])] - mx);
  }
  for (int j = 0; j < k; ++j) {
    const double s = score[size_t(ids[j])];
    const double want = (sg ? (r.renormalize ? s / sum : s) * r.routed_scaling_factor : s / sum);
    if (!(std::fabs(double(w[j]) - want) <= 1e-5 * std::max(1.0, std::fabs(want))))
      os << "slot " << j << ": weight " << w[j] << ", expected " << want << "; ";
  }
  *why = os.str();
  return why->empty();
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DevBuf() { cudaFree(p); }
  template <typename T> T* as() const { return static_cast<T*>(p); }
};

// Random logits of `dt` (normal, sd 2; token 0 of each call also gets exact ties), one NaN token where
// T > 3; route() against the definitions, and against route_cpu where the keys are exact (softmax).
TEST(route_matches_definitions) {
  struct RC { RoutingMode mode; int E, k, n_group, topk_group; bool bias, renorm; float rsf; };
  std::vector<RC> rcs = {
      {RoutingMode::kSoftmaxTopK, 128, 4, 1, 1, false, true, 1.0f},     // gpt-oss
      {RoutingMode::kSoftmaxTopK, 8, 2, 1, 1, false, true, 1.0f},       // Mixtral
      {RoutingMode::kSoftmaxTopK, 128, 8, 1, 1, false, false, 1.0f},    // Qwen3 without renormalization
      {RoutingMode::kSoftmaxTopK, 1024, 32, 1, 1, false, true, 1.0f},   // the limits
      {RoutingMode::kSoftmaxTopK, 384, 8, 1, 1, false, true, 1.0f},     // Kimi-K2-sized: 12 keys per lane
      {RoutingMode::kSoftmaxTopK, 3, 1, 1, 1, false, false, 1.0f},
      {RoutingMode::kSigmoidGroupedTopK, 256, 8, 8, 4, true, true, 2.5f},  // DeepSeek-V3
      {RoutingMode::kSigmoidGroupedTopK, 256, 8, 8, 8, false, true, 1.0f}, // every group kept
      {RoutingMode::kSigmoidGroupedTopK, 64, 6, 64, 6, true, false, 1.5f}, // groups of one
      {RoutingMode::kSigmoidGroupedTopK, 1024, 32, 32, 3, true, true, 1.0f},
      {RoutingMode::kSigmoidGroupedTopK, 40, 3, 5, 2, true, true, 16.0f}};  // n_group not a power of two
  const std::vector<int64_t> Ts = quick() ? std::vector<int64_t>{1, 37} : std::vector<int64_t>{1, 5, 37, 1001};
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> ub(-0.5f, 0.5f);
  for (const RC& rc : rcs)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (int64_t T : Ts) {
        const int E = rc.E, k = rc.k;
        std::vector<float> lgf(size_t(T * E));
        for (auto& v : lgf) v = nd(rng());
        for (int e = 0; e < E; ++e) lgf[size_t(e)] = float((e * 7) % 5);  // token 0: ties everywhere
        if (T > 3) lgf[size_t(2 * E + E / 2)] = NAN;                      // token 2: a NaN logit
        std::vector<uint16_t> lgh(lgf.size());
        std::vector<double> lgd(lgf.size());
        for (size_t i = 0; i < lgf.size(); ++i) {
          if (dt == DType::kF32) {
            lgd[i] = lgf[i];
          } else {
            lgh[i] = fp4test::to_bits(lgf[i], dt == DType::kBF16);
            lgd[i] = fp4test::from_bits(lgh[i], dt == DType::kBF16);
          }
        }
        std::vector<float> bias(static_cast<size_t>(E));
        for (auto& v : bias) v = ub(rng());
        const size_t lg_bytes = lgf.size() * size_t(dtype_bytes(dt));
        DevBuf dlg(lg_bytes), dbias(size_t(E) * 4), dids(size_t(T * k) * 4), dw(size_t(T * k) * 4);
        CUDA_OK(cudaMemcpy(dlg.p, dt == DType::kF32 ? static_cast<const void*>(lgf.data()) : lgh.data(), lg_bytes,
                           cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dbias.p, bias.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(dids.p, 0x7F, size_t(T * k) * 4));  // poisoned
        CUDA_OK(cudaMemset(dw.p, 0xFF, size_t(T * k) * 4));
        RouteArgs a;
        a.tokens = T;
        a.num_experts = E;
        a.top_k = k;
        a.routing.mode = rc.mode;
        a.routing.logits = dlg.p;
        a.routing.logits_dtype = dt;
        a.routing.renormalize = rc.renorm;
        if (rc.mode == RoutingMode::kSigmoidGroupedTopK) {
          a.routing.n_group = rc.n_group;
          a.routing.topk_group = rc.topk_group;
          a.routing.routed_scaling_factor = rc.rsf;
          a.routing.correction_bias = rc.bias ? dbias.as<float>() : nullptr;
        }
        a.topk_ids = dids.as<int32_t>();
        a.topk_weights = dw.as<float>();
        CHECK_OK(route(a, nullptr));
        std::vector<int32_t> ids(size_t(T * k));
        std::vector<float> w(size_t(T * k));
        CUDA_OK(cudaMemcpy(ids.data(), dids.p, ids.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost));
        // The reference on the host copy.
        Routing hr = a.routing;
        hr.logits = dt == DType::kF32 ? static_cast<const void*>(lgf.data()) : lgh.data();
        hr.correction_bias = a.routing.correction_bias ? bias.data() : nullptr;
        std::vector<int32_t> rids(ids.size());
        std::vector<float> rw(w.size());
        RouteArgs ha = a;
        ha.routing = hr;
        ha.topk_ids = rids.data();
        ha.topk_weights = rw.data();
        CHECK_OK(route_cpu(ha));
        int bad = 0;
        std::string first;
        for (int64_t t = 0; t < T; ++t) {
          const int32_t* ti = ids.data() + t * k;
          const float* tw = w.data() + t * k;
          const std::vector<double> tl(lgd.begin() + t * E, lgd.begin() + (t + 1) * E);
          bool ok;
          std::string why;
          if (std::any_of(tl.begin(), tl.end(), [](double v) { return std::isnan(v); })) {
            ok = std::all_of(ti, ti + k, [](int32_t v) { return v == -1; }) &&
                 std::all_of(tw, tw + k, [](float v) { return std::isnan(v); });
            why = "a NaN logit must give ids -1 and NaN weights";
          } else {
            ok = routing_valid(hr, tl, k, ti, tw, &why);
            // Softmax keys are exact: the same ids as the reference, bit for bit.
            if (rc.mode == RoutingMode::kSoftmaxTopK && !std::equal(ti, ti + k, rids.data() + t * k)) {
              ok = false;
              why += " ids differ from route_cpu";
            }
          }
          if (!ok && bad++ == 0) first = "token " + std::to_string(t) + ": " + why;
        }
        CHECK_MSG(bad == 0, "mode " << int(rc.mode) << " E=" << E << " k=" << k << " groups " << rc.n_group << "/"
                                    << rc.topk_group << " dtype " << dtype_name(dt) << " T=" << T << ": " << bad
                                    << " tokens wrong; first " << first);
      }
}

// The hand-worked grouped case of test_routing (a group drop that changes the answer) on the device.
TEST(route_grouped_hand_worked) {
  std::vector<float> lg(8, 0.0f);
  lg[0] = std::log(3.0f);
  const std::vector<float> bias = {0.1f, 0.0f, 0.3f, 0.0f, 0.2f, 0.25f, 0.0f, 0.0f};
  DevBuf dlg(32), dbias(32), dids(8), dw(8);
  CUDA_OK(cudaMemcpy(dlg.p, lg.data(), 32, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias.p, bias.data(), 32, cudaMemcpyHostToDevice));
  RouteArgs a;
  a.tokens = 1;
  a.num_experts = 8;
  a.top_k = 2;
  a.routing.mode = RoutingMode::kSigmoidGroupedTopK;
  a.routing.logits = dlg.p;
  a.routing.n_group = 4;
  a.routing.topk_group = 2;
  a.routing.routed_scaling_factor = 2.5f;
  a.routing.correction_bias = dbias.as<float>();
  a.topk_ids = dids.as<int32_t>();
  a.topk_weights = dw.as<float>();
  for (int topk_group : {2, 4}) {
    a.routing.topk_group = topk_group;
    CHECK_OK(route(a, nullptr));
    int32_t ids[2];
    float w[2];
    CUDA_OK(cudaMemcpy(ids, dids.p, 8, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(w, dw.p, 8, cudaMemcpyDeviceToHost));
    const int want1 = topk_group == 2 ? 5 : 2;  // expert 2's group is dropped with two groups kept
    // Scores 0.75 and 0.5 either way: 0.75 / 1.25 * 2.5 and 0.5 / 1.25 * 2.5.
    CHECK_MSG(ids[0] == 0 && ids[1] == want1 && std::fabs(w[0] - 1.5) < 1e-5 && std::fabs(w[1] - 1.0) < 1e-5,
              "topk_group " << topk_group << ": ids " << ids[0] << ", " << ids[1] << " weights " << w[0] << ", " << w[1]);
  }
}

// fused_moe routing from logits gives the same bits as route() followed by fused_moe on its ids, on
// both FP4 paths' decode side and BF16 experts, with routing and align in one launch (T = 1, 20, 32: one
// CTA routes every token, moe_route_align.cuh) and in two (T = 37); and the routing rules reach its
// validator.
TEST(moe_routes_from_logits) {
  // 3: DeepSeek-V3's routing shape (E = 256, 8 groups, top-8); 4: the gpt-oss shape (H = I = 2880,
  // interleaved gate/up rows) on 4 experts, whose GEMMs both run in cluster mode at T = 1 on sm_90, so that
  // call is a route launch and the one-token pass (no align).
  for (int variant = 0; variant < 5; ++variant) {
    const bool bf16 = variant == 2, grouped = variant == 1 || variant == 3;
    const Format f = grouped ? Format::kNVFP4 : Format::kMXFP4;
    const int E = variant == 3 ? 256 : variant == 4 ? 4 : 16, k = variant == 3 ? 8 : 4;
    const int64_t H = variant == 4 ? 2880 : 160, I = variant == 4 ? 2880 : 96;
    const GateUpLayout layout = variant == 4 ? GateUpLayout::kInterleaved : GateUpLayout::kConcatenated;
    Experts gu, dn;
    if (bf16) {
      make_bf16_experts(gu, E, 2 * I, H, 0);
      make_bf16_experts(dn, E, H, I, 0);
    } else {
      make_experts(gu, f, E, 2 * I, H, false);
      make_experts(dn, f, E, H, I, false);
    }
    for (int64_t T : {int64_t(1), int64_t(20), int64_t(32), int64_t(37)}) {
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<uint16_t> xb(size_t(T * H));
      for (auto& b : xb) b = fp4test::to_bits(nd(rng()), true);
      std::vector<float> lg(size_t(T * E));
      for (auto& v : lg) v = 2.0f * nd(rng());
      DevBuf dx(xb.size() * 2), dlg(lg.size() * 4), dids(size_t(T * k) * 4), dw(size_t(T * k) * 4),
          dy1(xb.size() * 2), dy2(xb.size() * 2);
      CUDA_OK(cudaMemcpy(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(dlg.p, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(dy1.p, 0xFF, xb.size() * 2));
      CUDA_OK(cudaMemset(dy2.p, 0xFF, xb.size() * 2));
      Routing r;
      r.mode = grouped ? RoutingMode::kSigmoidGroupedTopK : RoutingMode::kSoftmaxTopK;
      r.logits = dlg.p;
      if (grouped) {
        r.n_group = variant == 3 ? 8 : 4;
        r.topk_group = variant == 3 ? 4 : 2;
        r.routed_scaling_factor = 2.0f;
      }
      RouteArgs ra;
      ra.tokens = T;
      ra.num_experts = E;
      ra.top_k = k;
      ra.routing = r;
      ra.topk_ids = dids.as<int32_t>();
      ra.topk_weights = dw.as<float>();
      CHECK_OK(route(ra, nullptr));
      MoEArgs a;
      a.tokens = T;
      a.hidden = H;
      a.inter = I;
      a.layout = layout;
      a.num_experts = E;
      a.top_k = k;
      a.x = dx.p;
      a.gate_up = gu.dev;
      a.down = dn.dev;
      a.topk_ids = dids.as<int32_t>();
      a.topk_weights = dw.as<float>();
      a.y = dy1.p;
      size_t bytes = 0;
      CHECK_OK(moe_workspace_bytes(a, &bytes));
      MoEArgs b = a;
      b.topk_ids = nullptr;
      b.topk_weights = nullptr;
      b.routing = r;
      b.y = dy2.p;
      size_t bytes_r = 0;
      CHECK_OK(moe_workspace_bytes(b, &bytes_r));
      CHECK_MSG(bytes_r > bytes, "routing from logits needs room for the ids and weights (" << bytes_r << " vs "
                                                                                             << bytes << ")");
      DevBuf ws(bytes_r);
      a.workspace = b.workspace = ws.p;
      a.workspace_bytes = bytes;
      b.workspace_bytes = bytes_r;
      if (variant == 4 && T == 1) {
        int gu_c = 0, dn_c = 0;
        bool one = false;
        CHECK_OK(detail::moe_decode_clusters(b, &gu_c, &dn_c, nullptr, &one));
        CHECK_MSG(one == (gu_c > 0 && dn_c > 0), "variant 4, T = 1: one-token pass " << one << " with clusters of " << gu_c
                                                                                     << " / " << dn_c);
        int major = 0, dev = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        if (major >= 9) CHECK_MSG(one, "variant 4, T = 1: expected the one-token pass on sm_90");
        else std::printf("  [note] moe_routes_from_logits: no one-token pass on this device (no clusters)\n");
      }
      CHECK_OK(fused_moe(a, nullptr));
      CHECK_OK(fused_moe(b, nullptr));
      std::vector<uint16_t> y1(xb.size()), y2(xb.size());
      CUDA_OK(cudaMemcpy(y1.data(), dy1.p, y1.size() * 2, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(y2.data(), dy2.p, y2.size() * 2, cudaMemcpyDeviceToHost));
      int finite = 0;
      for (uint16_t v : y2) finite += std::isfinite(fp4test::from_bits(v, true)) ? 1 : 0;
      CHECK_MSG(y1 == y2 && finite == int(y2.size()),
                "variant " << variant << " T=" << T << ": routing inside fused_moe differs from route() + fused_moe ("
                           << finite << " of " << y2.size() << " finite)");
      // The C ABI's struct gives the same call.
      fp4kit_moe_args ca;
      fp4kit_moe_args_init(&ca);
      ca.tokens = T;
      ca.hidden = H;
      ca.inter = I;
      ca.layout = layout == GateUpLayout::kInterleaved ? FP4KIT_GATE_UP_INTERLEAVED : FP4KIT_GATE_UP_CONCATENATED;
      ca.num_experts = E;
      ca.top_k = k;
      ca.x = dx.p;
      const fp4kit_expert_kind kind = bf16 ? FP4KIT_EXPERTS_BF16 : FP4KIT_EXPERTS_FP4;
      const fp4kit_format cf = f == Format::kNVFP4 ? FP4KIT_NVFP4 : FP4KIT_MXFP4;
      ca.gate_up = fp4kit_experts{kind, cf, gu.dev.data, gu.dev.stride, nullptr};
      ca.down = fp4kit_experts{kind, cf, dn.dev.data, dn.dev.stride, nullptr};
      ca.routing_mode = grouped ? FP4KIT_ROUTE_SIGMOID_GROUPED : FP4KIT_ROUTE_SOFTMAX;
      ca.router_logits = dlg.p;
      ca.n_group = r.n_group;
      ca.topk_group = r.topk_group;
      ca.routed_scaling_factor = r.routed_scaling_factor;
      DevBuf dy3(xb.size() * 2);
      CUDA_OK(cudaMemset(dy3.p, 0xFF, xb.size() * 2));
      ca.y = dy3.p;
      size_t cbytes = 0;
      CHECK_EQ(fp4kit_moe_workspace_bytes(&ca, &cbytes), 0);
      CHECK_EQ(cbytes, bytes_r);
      ca.workspace = ws.p;
      ca.workspace_bytes = bytes_r;
      CHECK_MSG(fp4kit_fused_moe(&ca, nullptr) == 0, fp4kit_last_error());
      std::vector<uint16_t> y3(xb.size());
      CUDA_OK(cudaMemcpy(y3.data(), dy3.p, y3.size() * 2, cudaMemcpyDeviceToHost));
      CHECK_MSG(y3 == y2, "variant " << variant << " T=" << T << ": the C ABI's fused MoE differs from the C++ call");
      // Validator: ids given as well, and routing rules.
      MoEArgs c = b;
      c.topk_ids = dids.as<int32_t>();
      CHECK_ERROR(moe_validate(c), "topk_ids, topk_weights: must be null when routing from logits");
      c = b;
      c.routing.logits = nullptr;
      CHECK_ERROR(moe_validate(c), "routing.logits: must not be null");
      c = b;
      c.routing.logits = ws.p;
      CHECK_ERROR(moe_validate(c), "routing.logits: must not overlap the workspace");
      c = b;
      c.routing.mode = static_cast<RoutingMode>(9);
      CHECK_ERROR(moe_workspace_bytes(c, &bytes), "routing.mode: must be RoutingMode::kSoftmaxTopK or kSigmoidGroupedTopK (got 9)");
      c = a;
      c.topk_ids = nullptr;
      CHECK_ERROR(moe_validate(c), "topk_ids: must not be null (or route from logits: routing.mode)");
    }
  }
}

int main(int argc, char** argv) {
  FP4KIT_REQUIRE_GPU();
  return fp4test::run_all(argc, argv);
}
