// stream_k.h: how the decode kernel cuts its work among CTAs (host and device).
//
// Contract
//   The work is `units` (row group, K slice) units, row-group major, cut among G CTAs (1 <= G <= units):
//     stream_k_start(b, units, G)  first unit of CTA b, b * units / G: CTA b owns [start(b), start(b + 1)),
//                                  every range non-empty (the fixup's arrival count relies on it) and the
//                                  ranges tile [0, units);
//     stream_k_owner(u, units, G)  the CTA whose range holds unit u: the last b with start(b) <= u;
//     balanced_ctas(units, G, max_share)
//                                  the CTAs to use instead of G: where the largest share stream-K would give
//                                  a CTA, u = ceil(units / G), is at most max_share, ceil(units / u) CTAs
//                                  (each then holds u units or one fewer, so no CTA waits for one that holds
//                                  more, and the spare CTAs leave); otherwise G.
//   tests/cpp/test_stream_k.cpp checks these properties over a range of (units, G).
#pragma once
#include <cstdint>

#include "fp4kit/formats.h"  // FP4KIT_HD

namespace fp4kit {
namespace kernels {

FP4KIT_HD int64_t stream_k_start(int64_t b, int64_t units, int64_t G) { return b * units / G; }

FP4KIT_HD int64_t stream_k_owner(int64_t u, int64_t units, int64_t G) { return ((u + 1) * G - 1) / units; }

// The grouped decode GEMMs' max_share (decode_gemm.cuh, cta_range): measured on the MoE passes of one-token
// tiles, 1-6 units per CTA gained 4-12%, ~10 units lost 3-4% with 9% fewer CTAs (docs/moe-notes.md).
constexpr int64_t kBalancedMaxUnits = 6;

FP4KIT_HD int64_t balanced_ctas(int64_t units, int64_t G, int64_t max_share) {
  const int64_t u = (units + G - 1) / G;
  if (u <= max_share) G = (units + u - 1) / u;
  return G;
}

}  // namespace kernels
}  // namespace fp4kit
