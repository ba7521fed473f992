// one_token.h: the schedule of a one-token pass (host and device; the kernels that read it include it, and
// so does prefill.h, whose launch arguments carry it).
//
// One-token passes (moe.cu, MoEPlan::one_token: the decode path where both grouped GEMMs run in cluster
// mode, and BF16 experts' wgmma kernel): the schedule is the pair ids themselves, and no align launch runs.
// Entry a is pair a = slot a of the token's top_k (= pairs): expert ids[a] (expert 0 where the id is outside
// [0, experts): its row is computed and never read, since the combine makes a bad pair's token NaN), output
// row a, X row 0 (gate_up: the token) or a (down: pair a's activations). A token's top-k ids are distinct
// experts, so every touched expert's weights are still read once. CTA 0 of the launch that has n_rows
// (gate_up) also writes what the align step writes for the launches after it: the rows (*n_rows = pairs)
// and each pair's row (a, or -1 where not routed). Cluster mode uses no arrival counters. The stream-K
// grouped decode kernels do not read this (their code is as before).
#pragma once
#include <cstdint>

namespace fp4kit {
namespace kernels {

// A trivial type (no member initialisers: as a member of the kernels' by-value parameters, a non-trivial
// one cost the sm_80 decode kernels 8-16 bytes of stack and spills each); value-initialise it (`{}`).
struct OneToken {
  const int32_t* ids;  // null: the schedule comes from the align step
  int pairs, experts;
  bool token_x;        // every entry reads X row 0 (gate_up), else row a (down)
  int* n_rows;
  int* row_of_pair;
  // FP4 decode path (cluster mode), set on both launches or neither: gate_up (the launch with n_rows) lets its
  // dependents launch only after its own griddepcontrol.wait, so when down starts the ids' writer is
  // complete and down reads them, and requests its first weights, before its wait: down's weights then
  // stream on the SMs gate_up's last CTAs leave, while those CTAs still reduce.
  bool early_down;
};

}  // namespace kernels
}  // namespace fp4kit
