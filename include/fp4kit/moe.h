// fp4kit/moe.h: fused Mixture-of-Experts layer with FP4 (NVFP4 or MXFP4) or BF16 experts, for given routing.
//
//   for each token t and each of its top_k slots j (expert e = topk_ids[t, j], weight w = topk_weights[t, j]):
//     h      = X[t] @ W_gate_up[e]^T (+ b_gate_up[e])          [2I]   (gate and up rows, see GateUpLayout)
//     a      = act(gate(h), up(h))                              [I]
//     o_tj   = a @ W_down[e]^T (+ b_down[e])                    [H]
//   Y[t] = sum_j w * o_tj  (fp32, slots in order j = 0..top_k-1), cast to the activation dtype.
//
// Contract:
//   - x [T, H] and y [T, H] row-major, dtype `act` (kBF16 or kF16), 16-byte
//     aligned; topk_ids int32 [T, top_k] and topk_weights float32 [T, top_k], device memory.
//   - Or routing from router logits [T, E] (MoEArgs::routing, fp4kit/routing.h: softmax top-k, or
//     DeepSeek-V3's sigmoid grouped top-k): topk_ids and topk_weights then stay null, the layer routes
//     into its workspace first (one more launch; E <= kRoutingMaxExperts, top_k <= kRoutingMaxTopK).
//     Call route() for the ids and weights themselves.
//   - Experts, one of two kinds (ExpertWeights::kind; gate_up and down of the same kind):
//       kFP4:  each of the E experts' matrices prepacked (prepack_*) for the same (format, n, k), stored
//              `stride` bytes apart from `data` (256-byte aligned; stride a multiple of 256, at least
//              packed_layout().total_bytes).
//       kBF16: each expert's matrix plain row-major [n, k] BF16 (as checkpoints ship it, no prepack),
//              stored `stride` bytes apart from `data` (16-byte aligned; stride a multiple of 16, at least
//              n * k * 2: a contiguous [E, n, k] tensor has stride n * k * 2). `format` is ignored.
//     gate_up: n = 2 * I, k = H; down: n = H, k = I. Biases optional: [E, n] of dtype `act` (BF16 experts:
//     bfloat16 whatever `act`).
//     FP4 experts with FP16 activations: the dequantisation is the dense FP16 GEMM's (gemm.h; MXFP4 block
//     scales applied in fp32 before the cast, see README for blocks far below their row's largest).
//     BF16 experts run through a grouped BF16 x BF16 tensor-core GEMV (1-8 warps per 16 weight rows, each
//     a contiguous part of K, summed in a fixed order; fp32 accumulation) or a grouped tensor-core GEMM
//     (below), driven by the same device-side schedule as the FP4 path.
//     BF16 experts with FP16 activations: the tensor-core path only (kAuto takes it at every T; kDecode is
//     rejected). The gather writes each x as two BF16 terms, hi (x rounded to BF16) and lo = x - hi, which
//     is exact, and gate_up multiplies both: x is used as it is, at twice gate_up's tensor work and the
//     same weight traffic. h, a and o_tj are BF16 (the FP16 range rule below does not apply); Y is rounded
//     to FP16 (+-inf past its range).
//   - The h and a intermediates are rounded to `act` (as an unfused layer of that dtype would); o_tj is
//     rounded to `act` before the fp32 weighted sum. BF16 experts: to BF16 (both activation dtypes).
//   - FP16 range (|v| <= 65504; BF16 has fp32's range): h and a stay FP16 and saturate instead of
//     overflowing. An h value past the range (the gate_up epilogue's cast made it +-inf) is read by the
//     activation as +-65504, and an activation output past the range is written as +-65504 (NaN stays NaN),
//     so the down GEMM never meets an infinity. This is exact for swiglu_oai (its clamps, +-limit, lie
//     inside the range, and a gate at -65504 gives 0, as at -inf) and for silu gates <= -65504 (output 0);
//     only a silu_and_mul product whose true value exceeds the FP16 range is changed (to +-65504), i.e. a
//     layer an unfused FP16 implementation could not represent either. o_tj and Y are not saturated: past
//     the range they are +-inf, as the output of an unfused FP16 down projection would be. Use FP16 for
//     models whose MoE activations fit in it (what FP16 checkpoints were trained for); otherwise BF16.
//     (fp32 h would need the grouped GEMM to write fp32 outputs, which it does not.)
//   - An id outside [0, E), or an id a token lists twice, cannot be reported without a host
//     synchronisation: that token's output row is NaN (every other token is computed normally).
//   - Experts nobody routed to are not read. Work is spread over all SMs for whatever routing arrives
//     (the schedule is built on the device), so the call is CUDA-graph safe: no allocation, no host sync.
//   - Two paths for FP4 experts (MoEArgs::path; kAuto picks by token count and rows per expert, see
//     kMoETensorCoreMinTokens):
//       decode:      the grouped decode GEMM (mma.sync), passes of up to kMoEDecodePassTokens tokens,
//                    each streaming the experts its tokens touch once (an expert with many more rows than
//                    the average of the pass once per block of them); for small T (bandwidth-bound).
//       tensor core: Hopper (sm_90a) only: the tokens' rows are gathered per expert and both projections
//                    run through the grouped prefill GEMM (wgmma), passes of up to kMoETensorCorePassTokens
//                    tokens; for large T (compute-bound). Forcing it elsewhere gives kNotSupported.
//     BF16 experts: the grouped GEMV (passes of kMoEBF16PassTokens tokens, each touched expert's weights
//     streamed once per pass), or the tensor-core path (passes of up to kMoETensorCorePassTokens tokens)
//     with a grouped BF16 GEMM: wgmma on sm_90a (64-, 128- and 256-token tiles), mma.sync on other sm_80+
//     devices (64 and 128). kAuto takes the tensor-core path at every T where the wgmma kernel runs; with
//     mma.sync past one GEMV pass and where experts average 8 or more rows (measured faster there).
//   - workspace: moe_workspace_bytes() bytes of device scratch, 16-byte aligned; no initialisation needed
//     (the call clears what it relies on). One workspace per stream. It grows with min(T, pass tokens):
//     on the tensor-core path up to ~0.8 GB for gpt-oss-120b and ~1.7 GB for DeepSeek-V3 (8192-token
//     passes).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fp4kit/formats.h"
#include "fp4kit/routing.h"
#include "fp4kit/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace fp4kit {

enum class MoEActivation : int {
  kSiluAndMul = 0,  // silu(g) * u
  kSwigluOAI = 1,   // gpt-oss: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1)
};
enum class GateUpLayout : int {
  kConcatenated = 0,  // rows [0, I) are gate, [I, 2I) are up
  kInterleaved = 1,   // row 2i is gate i, row 2i+1 is up i (gpt-oss checkpoints)
};

// What an expert set holds. A separate field rather than a Format value: Format names the FP4 formats
// every FP4 API (quantize, prepack, packed_layout, gemm, group_size) is written for, and a BF16 value there
// would be one each of them had to reject; a kind appended to ExpertWeights keeps Format meaning "FP4
// format" and keeps existing initialisers ({format, n, k, data, stride, bias}) meaning FP4 experts.
enum class ExpertKind : int {
  kFP4 = 0,   // prepacked FP4 in `format`
  kBF16 = 1,  // plain row-major [n, k] bfloat16 (format ignored)
};

struct ExpertWeights {
  Format format = Format::kMXFP4;  // kFP4 experts only
  int64_t n = 0, k = 0;
  const void* data = nullptr;  // expert e's buffer (prepacked, or the bf16 [n, k] matrix) at data + e * stride
  size_t stride = 0;           // bytes
  const void* bias = nullptr;  // [E, n] of the activation dtype, or null
  ExpertKind kind = ExpertKind::kFP4;
};

enum class MoEPath : int {
  kAuto = 0,        // FP4 experts: tensor core where T > kMoEDecodePassTokens, or where the decode path
                    // would need 16-token or wider tiles (experts averaging about 3.3 or more rows of the
                    // pass) and the wgmma kernel runs (sm_90a); where the tensor-core path is mma.sync,
                    // only from the widest (64-token) tiles and T >= kMoETensorCoreMinTokens; else
                    // decode. BF16 experts: tensor core where their wgmma kernel runs (sm_90a),
                    // elsewhere where T > kMoEBF16PassTokens or experts average >= 8 rows of the pass
  kDecode = 1,      // the grouped decode GEMM, or BF16 experts' GEMV (any device; BF16 activations)
  kTensorCore = 2,  // the grouped tensor-core GEMM: FP4 experts wgmma on sm_90a, mma.sync on other sm_80+
                    // devices (64- and 128-token tiles there); BF16 experts wgmma on sm_90a, mma.sync on
                    // other sm_80+ devices (64- and 128-token tiles there)
};
constexpr int64_t kMoETensorCoreMinTokens = 64;
constexpr int64_t kMoEDecodePassTokens = 256;  // FP4 experts on the decode path
constexpr int64_t kMoEBF16PassTokens = 64;     // BF16 experts' GEMV (<= 64 rows per expert per pass)
// Tensor-core passes: every pass re-reads the weights of the experts it touches (gpt-oss-120b: 1.7 GB, ~0.4 ms
// at HBM speed), and more rows per expert fill wider token tiles; the workspace grows with the pass
// (tokens x top_k x (3 I + H) x 2 bytes, roughly: gpt-oss-120b ~0.8 GB, DeepSeek-V3 ~1.7 GB at 8192; BF16
// experts with FP16 activations 3 I + 2 H: the gathered X holds two BF16 terms).
// 8192 against 4096: gpt-oss-120b and DeepSeek-V3 at T = 8192 17-18% faster (docs/moe-notes.md).
constexpr int64_t kMoETensorCorePassTokens = 8192;

struct MoEArgs {
  int64_t tokens = 0;  // T
  int64_t hidden = 0;  // H
  int64_t inter = 0;   // I
  int num_experts = 0; // E
  int top_k = 0;
  DType act = DType::kBF16;
  const void* x = nullptr;
  const int32_t* topk_ids = nullptr;
  const float* topk_weights = nullptr;
  ExpertWeights gate_up;  // n = 2I, k = H
  ExpertWeights down;     // n = H, k = I
  MoEActivation activation = MoEActivation::kSiluAndMul;
  GateUpLayout layout = GateUpLayout::kConcatenated;
  float alpha = 1.702f, limit = 7.0f;  // kSwigluOAI only
  void* y = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  MoEPath path = MoEPath::kAuto;
  // Tensor-core path: tokens per tile of the grouped GEMM, 64, 128 or 256 (256: the wgmma kernels, sm_90a); 0
  // (default) chooses from the average tokens per routed expert. Ignored on the decode path.
  int token_tile = 0;
  // Routing from router logits (mode kNone: topk_ids / topk_weights as given).
  Routing routing;
};

// Checks every argument (the messages name the argument and the rule).
Status moe_validate(const MoEArgs& a);
// Workspace bytes fused_moe() needs for these shapes on the current device.
Status moe_workspace_bytes(const MoEArgs& a, size_t* bytes);
Status fused_moe(const MoEArgs& a, cudaStream_t stream);
// The path fused_moe() takes for these shapes and a.path on the current device: kDecode or kTensorCore
// (BF16 experts: kDecode is their grouped GEMV).
Status moe_path(const MoEArgs& a, MoEPath* path);

}  // namespace fp4kit
