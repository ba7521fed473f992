// moe_internal.h: what the fused MoE's plan chose, for the tests and the benchmark (not public API).
#pragma once
#include "fp4kit/moe.h"

namespace fp4kit {
namespace detail {

// The cluster sizes of the decode path's two grouped GEMMs for these arguments (moe.cu, plan_grouped):
// 0 where a GEMM runs stream-K (or the call takes another path), else the CTAs per cluster; and (if
// act_in_gate_up is not null) whether gate_up's cluster reduction applies the activation (no activation
// launch).
// If one_token is not null: whether the call is a one-token pass without the align launch (moe.cu,
// kernels::OneToken; the FP4 decode path in cluster mode, or BF16 experts' wgmma kernel).
Status moe_decode_clusters(const MoEArgs& a, int* gate_up, int* down, bool* act_in_gate_up = nullptr,
                           bool* one_token = nullptr);

// The GEMM kernel the plan runs for these arguments: "decode" (the grouped decode GEMM), "bf16 gemv" (BF16
// experts' GEMV), "wgmma" or "mma.sync" (FP4 experts on the tensor-core path), "bf16 wgmma" or "bf16
// mma.sync" (BF16 experts on the tensor-core path). The benchmark records it beside each row.
Status moe_gemm_kernel(const MoEArgs& a, const char** kernel);

// The decode path's cluster mode (moe.cu, plan_grouped): 0 never (stream-K only), 1 by its rule, -1 as the
// environment says (FP4KIT_MOE_CLUSTERS=0 turns it off; default on). Not thread-safe: set it before the
// calls it affects.
void set_moe_clusters(int on);

// One-token passes (moe.cu, MoEPlan::one_token: the FP4 decode path, BF16 experts' wgmma kernel): 0 never
// (the align step always runs), 1 by the rule, -1 as the environment says (FP4KIT_MOE_ONE_TOKEN=0 turns it
// off; default on). Not thread-safe: set it before the calls it affects.
void set_moe_one_token(int on);

// The tensor-core path's kernel (moe.cu, choose_tensor_core): 1 the mma.sync kernel on every device (so a
// Hopper GPU runs what sm_80-89 run), 0 wgmma where the device and build run it, -1 as the environment says
// (FP4KIT_MOE_MMA=1 forces mma.sync; default off). Not thread-safe: set it before the calls it affects.
void set_moe_mma(int on);

// The BF16 experts' GEMV (moe.cu, plan_bf16): warps per 16-row tile, 1, 2, 4 or 8 (capped by K's steps), 0 by
// its rule, -1 as the environment says (FP4KIT_MOE_BF16_SPLIT; default the rule). Not thread-safe: set it
// before the calls it affects.
void set_moe_bf16_split(int split);

// The CTAs of the schedule's grid form for a pass of `tokens` tokens at top_k (kernels/moe_align.cuh:
// passes of many pairs), or 0 where the pass builds it in one CTA.
int moe_align_grid(int tokens, int top_k);

}  // namespace detail
}  // namespace fp4kit
