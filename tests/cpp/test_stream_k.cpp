// test_stream_k.cpp: the decode kernel's cut of its units among CTAs (kernels/stream_k.h), on the CPU.
// The kernel and its fixup rely on: ranges that tile [0, units) with none empty (a CTA with no units would
// never arrive at its row group's counter), an owner formula that agrees with the ranges (the last arrival
// reads the partials of exactly the CTAs that hold its row group), and balanced CTA counts that keep both.
#include <algorithm>
#include <cstdint>

#include "kernels/stream_k.h"
#include "testing.h"

using fp4kit::kernels::balanced_ctas;
using fp4kit::kernels::kBalancedMaxUnits;
using fp4kit::kernels::stream_k_owner;
using fp4kit::kernels::stream_k_start;

namespace {

// Every property of one cut of `units` over G CTAs; returns the largest share.
int64_t check_cut(int64_t units, int64_t G) {
  int64_t largest = 0;
  CHECK_EQ(stream_k_start(0, units, G), 0);
  CHECK_EQ(stream_k_start(G, units, G), units);
  for (int64_t b = 0; b < G; ++b) {
    const int64_t lo = stream_k_start(b, units, G), hi = stream_k_start(b + 1, units, G);
    CHECK_MSG(hi > lo, "units " << units << " G " << G << ": CTA " << b << " gets no unit");
    largest = std::max(largest, hi - lo);
    // the owner of each unit of the range (all of them for short ranges, the ends otherwise)
    for (int64_t u : {lo, hi - 1, lo + (hi - lo) / 2})
      CHECK_MSG(stream_k_owner(u, units, G) == b,
                "units " << units << " G " << G << ": unit " << u << " owned by " << stream_k_owner(u, units, G)
                         << ", not " << b);
  }
  CHECK_MSG(largest == (units + G - 1) / G, "units " << units << " G " << G << ": largest share " << largest);
  return largest;
}

}  // namespace

TEST(stream_k_cut_tiles_the_units) {
  for (int64_t units = 1; units <= 700; ++units)
    for (int64_t G = 1; G <= std::min<int64_t>(units, 420); G += (G < 40 ? 1 : 7)) check_cut(units, G);
  // real sizes: Llama-3.3-70B gate_up at m = 1 (448 row groups x 16 slices on 396 CTAs), a large MoE pass
  check_cut(448 * 16, 396);
  check_cut(int64_t(256) * 56 * 14, 396);
}

TEST(stream_k_owner_of_every_unit) {
  for (int64_t units : {1, 7, 64, 100, 1013, 4097})
    for (int64_t G : {1, 3, 64, 338, 396}) {
      if (G > units) continue;
      for (int64_t u = 0; u < units; ++u) {
        const int64_t b = stream_k_owner(u, units, G);
        CHECK_MSG(b >= 0 && b < G && stream_k_start(b, units, G) <= u && u < stream_k_start(b + 1, units, G),
                  "units " << units << " G " << G << ": unit " << u << " -> CTA " << b);
      }
    }
}

TEST(balanced_ctas_equal_shares) {
  constexpr int64_t kMax = kBalancedMaxUnits;  // the kernel's rule
  CHECK_EQ(kMax, 6);
  for (int64_t units = 1; units <= 3000; units += (units < 200 ? 1 : 13))
    for (int64_t G : {1, 2, 7, 132, 264, 338, 396}) {
      const int64_t g = std::min(G, units);
      const int64_t share = (units + g - 1) / g;
      const int64_t n = balanced_ctas(units, g, kMax);
      if (share > kMax) {
        CHECK_MSG(n == g, "units " << units << " G " << g << ": a share of " << share << " keeps every CTA");
        continue;
      }
      CHECK_MSG(n >= 1 && n <= g, "units " << units << " G " << g << " -> " << n << " CTAs");
      // the same largest share as stream-K on g CTAs, and every CTA within one unit of it
      const int64_t largest = check_cut(units, n);
      CHECK_MSG(largest == share, "units " << units << " G " << g << ": largest share " << largest << " vs " << share);
      for (int64_t b = 0; b < n; ++b)
        CHECK(stream_k_start(b + 1, units, n) - stream_k_start(b, units, n) >= share - 1);
      // no CTA count below n keeps that share
      CHECK_MSG((units + (n - 1) - 1) / std::max<int64_t>(n - 1, 1) > share || n == 1,
                "units " << units << " G " << g << ": " << n - 1 << " CTAs would do");
    }
  // gpt-oss-120b at T = 1: gate_up 1013 units on 396 CTAs (2-3 each) -> 338 CTAs of 3; down 552 -> 276 of 2
  CHECK_EQ(balanced_ctas(1013, 396, kMax), 338);
  CHECK_EQ(balanced_ctas(552, 396, kMax), 276);
  // DeepSeek-V3 at T = 1: 3584 units, ~9 per CTA: stream-K on every CTA
  CHECK_EQ(balanced_ctas(3584, 396, kMax), 396);
}

TEST_MAIN()
