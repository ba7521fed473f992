// test_repack.cpp: the prepacked layout on the CPU: every value lands where decode_layout.h says (and X's
// lane order matches the records' K order), the
// round trip prepack -> unpack restores every byte but the blocks prepack rewrites exactly (NVFP4
// negative and zero scales) and the same values (both formats, shapes off every tile), padding is zero, the
// per-row factors follow repack.h, and bad arguments are rejected with their rule.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "fp4kit/repack.h"
#include "kernels/decode_layout.h"
#include "repack_common.h"
#include "testing.h"

using namespace fp4kit;

namespace {
using fp4test::rng;

struct Ckpt {
  std::vector<uint8_t> packed, scales;
};
Ckpt random_ckpt(Format f, int64_t n, int64_t k) {
  Ckpt c;
  c.packed.resize(size_t(n * k / 2));
  c.scales.resize(size_t(n * (k / group_size(f))));
  std::uniform_int_distribution<int> b(0, 255);
  for (auto& v : c.packed) v = uint8_t(b(rng()));
  for (auto& v : c.scales) v = uint8_t(f == Format::kMXFP4 ? 100 + b(rng()) % 60 : b(rng()) & 0xFE);
  return c;
}

// What unpack returns for a checkpoint, from the spec: NVFP4 blocks with a negative scale come back with
// the positive scale and negated codes, blocks with a zero scale with zero codes (repack.h); every other
// byte as it was.
Ckpt expected_unpack(Format f, const Ckpt& c, int64_t n, int64_t k) {
  Ckpt e = c;
  if (f != Format::kNVFP4) return e;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t col = 0; col < k; ++col) {
      uint8_t& sc = e.scales[size_t(r * (k / 16) + col / 16)];
      const uint8_t s0 = c.scales[size_t(r * (k / 16) + col / 16)];
      if (E4M3::is_nan(s0)) continue;
      uint8_t& b = e.packed[size_t(r * (k / 2) + col / 2)];
      const int sh = (col & 1) ? 4 : 0;
      uint8_t code = uint8_t((b >> sh) & 0xF);
      if ((s0 & 0x7F) == 0) code = 0;
      else if (s0 & 0x80) code ^= 8;
      b = uint8_t((b & ~(0xF << sh)) | (code << sh));
      if ((s0 & 0x7F) != 0) sc = uint8_t(s0 & 0x7F);
    }
  return e;
}

// The dequantised values of two checkpoints are the same (+0 == -0, NaN == NaN).
bool same_values(Format f, const Ckpt& a, const Ckpt& b, int64_t n, int64_t k) {
  const int gs = group_size(f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t col = 0; col < k; ++col) {
      const size_t bi = size_t(r * (k / 2) + col / 2), si = size_t(r * (k / gs) + col / gs);
      const int sh = (col & 1) ? 4 : 0;
      const float va = dequant_element(f, uint8_t((a.packed[bi] >> sh) & 0xF), a.scales[si], 1.0f);
      const float vb = dequant_element(f, uint8_t((b.packed[bi] >> sh) & 0xF), b.scales[si], 1.0f);
      if (!(va == vb || (std::isnan(va) && std::isnan(vb)))) return false;
    }
  return true;
}
}  // namespace

// The NVFP4 scale as prepack stores it: for every E4M3 byte, the kernel's two-instruction decodes give
// |s| * 2^117 (BF16: code << 4 | 0x7000) and |s| * 2^5 (FP16: code << 7) exactly, and unpack's inverse
// restores positive, zero and NaN bytes (a negative scale comes back positive).
TEST(nvfp4_scale_code_decodes_exactly) {
  auto bf16 = [](uint32_t bits) { return detail::bits_to_float(bits << 16); };
  auto fp16 = [](uint32_t h) {
    const int e = int((h >> 10) & 31), m = int(h & 1023);
    return e == 31 ? (m ? detail::quiet_nan() : INFINITY) : e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), e - 25);
  };
  for (int v = 0; v < 256; ++v) {
    const uint8_t b = uint8_t(v), code = detail::nvfp4_scale_code(b);
    const float s = E4M3::decode(b);
    if (E4M3::is_nan(b)) {
      CHECK(std::isnan(bf16((uint32_t(code) << 4) | 0x7000u)));
      CHECK(std::isnan(fp16(uint32_t(code) << 7)));
      CHECK_EQ(int(detail::nvfp4_scale_byte(code)), v);
      continue;
    }
    if (s == 0.0f) {
      CHECK_EQ(int(detail::nvfp4_scale_byte(code)), v);  // the block's codes are zeroed instead
      continue;
    }
    CHECK_EQ(bf16((uint32_t(code) << 4) | 0x7000u), std::ldexp(std::fabs(s), 117));
    CHECK_EQ(fp16(uint32_t(code) << 7), std::ldexp(std::fabs(s), 5));
    CHECK_EQ(int(detail::nvfp4_scale_byte(code)), v & 0x7F);
  }
}

// Every bit of every value sits at exactly one position: the layout is a bijection.
TEST(bit_positions_are_a_bijection) {
  std::vector<int> seen(32, 0);
  for (int p = 0; p < 4; ++p)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 4; ++b) ++seen[size_t(layout::bit_position(p, h, b))];
  for (int i = 0; i < 32; ++i) CHECK_EQ(seen[size_t(i)], 1);
  // Each lane covers 16 distinct K per chunk, the 4 lanes of a quad cover the chunk (NVFP4) or a
  // chunk pair (MXFP4) exactly once.
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    std::vector<int> k(256, 0);
    for (int c = 0; c < 4; ++c)
      for (int t = 0; t < 4; ++t)
        for (int i = 0; i < 16; ++i) ++k[size_t(layout::lane_kbase(f, c, t) + i)];
    for (int i = 0; i < 256; ++i) CHECK_EQ(k[size_t(i)], 1);
  }
}

// The kernels' pair extraction (layout::bf16_pair / f16_pair) against bit_position: for every pair, every
// code in both halves and the other pairs' bits all set, all clear, or random, exactly sign << 15 | mag << 6
// (BF16) and sign << 15 | mag << 9 (FP16) in each half, nothing else.
template <int P> static void check_pair_extraction(uint32_t others) {
  for (int lo = 0; lo < 16; ++lo)
    for (int hi = 0; hi < 16; ++hi) {
      uint32_t w = others;
      const int codes[2] = {lo, hi};
      for (int h = 0; h < 2; ++h)
        for (int b = 0; b < 4; ++b) {
          const uint32_t bit = 1u << layout::bit_position(P, h, b);
          w = ((codes[h] >> b) & 1) ? (w | bit) : (w & ~bit);
        }
      auto want = [&](int mag_at) {
        uint32_t v = 0;
        for (int h = 0; h < 2; ++h) v |= (uint32_t(codes[h] >> 3) << (15 + 16 * h)) | (uint32_t(codes[h] & 7) << (mag_at + 16 * h));
        return v;
      };
      CHECK_EQ(layout::bf16_pair<P>(w), want(6));
      CHECK_EQ(layout::f16_pair<P>(w), want(9));
    }
}
TEST(pair_extraction_matches_the_bit_layout) {
  std::mt19937 rng(7);
  for (uint32_t others : {0u, 0xFFFFFFFFu, uint32_t(rng()), uint32_t(rng()), uint32_t(rng())}) {
    check_pair_extraction<0>(others);
    check_pair_extraction<1>(others);
    check_pair_extraction<2>(others);
    check_pair_extraction<3>(others);
  }
}

// Lane order of X (the prefill kernel's K order): a permutation of the pairs inside each 64-K chunk
// (NVFP4) or 128-K block (MXFP4), and at position 32c + 8s + 4h + t exactly the pair that word s of quad
// lane t's record holds in its half h (pairs p0/p1 for h = 0, p2/p3 for h = 1; layout::pair_k), which
// is what wgmma's k index 8h + 2t + e of step s meets in the kernel.
TEST(lane_order_is_the_records_k_order) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int block = f == Format::kNVFP4 ? 32 : 64;  // pairs permuted among themselves
    std::vector<int> seen(512, 0);
    for (int q = 0; q < 512; ++q) {
      const int64_t pn = layout::natural_pair(f, q);
      CHECK(pn / block == q / block);
      ++seen[size_t(pn)];
    }
    for (int i = 0; i < 512; ++i) CHECK_EQ(seen[size_t(i)], 1);
    for (int c = 0; c < 16; ++c)
      for (int s = 0; s < 4; ++s)
        for (int h = 0; h < 2; ++h)
          for (int t = 0; t < 4; ++t)
            for (int e = 0; e < 2; ++e) {
              const int64_t k_record = layout::lane_kbase(f, c, t) + layout::pair_k(s, 2 * h, e);
              CHECK_EQ(2 * layout::natural_pair(f, 32 * c + 8 * s + 4 * h + t) + e, k_record);
            }
  }
}

// The mma.sync prefill kernel's X swizzle (layout::mma_x_unit): a permutation of each 256-byte row, and the
// 16-byte reads of every quarter warp (lanes 8q .. 8q + 7: tokens 2q, 2q + 1 of a column tile, quad lanes
// t = 0..3) land in eight distinct bank groups for both formats, every chunk of a stage and both step pairs.
TEST(mma_x_tile_reads_are_conflict_free) {
  for (int tok = 0; tok < 4; ++tok) {
    std::vector<int> seen(16, 0);
    for (int u = 0; u < 16; ++u) ++seen[size_t(layout::mma_x_unit(tok, u))];
    for (int u = 0; u < 16; ++u) CHECK_EQ(seen[size_t(u)], 1);
  }
  for (Format f : {Format::kNVFP4, Format::kMXFP4})
    for (int c = 0; c < 4; ++c)  // chunks of two stages
      for (int sp = 0; sp < 2; ++sp)
        for (int nt = 0; nt < 8; ++nt)
          for (int q = 0; q < 4; ++q) {
            std::vector<int> group(8, 0);
            for (int lane = 8 * q; lane < 8 * q + 8; ++lane) {
              const int g = lane >> 2, t = lane & 3, tok = 8 * nt + g;
              const int u = (int(layout::lane_kbase(f, c, t)) & 127) / 8 + sp;
              const int byte = tok * 256 + layout::mma_x_unit(tok, u) * 16;
              ++group[size_t((byte / 16) % 8)];  // 16-byte bank groups of the 128-byte bank row
            }
            for (int b = 0; b < 8; ++b) CHECK_MSG(group[size_t(b)] == 1, format_name(f) << " c=" << c << " sp=" << sp << " q=" << q);
          }
}

// The BF16 experts' tensor-core stage buffers: each row's units a permutation, and every ldmatrix phase
// (one unit of rows r0 .. r0 + 7, r0 a multiple of 8: the kernel's A and B row addresses) on eight distinct
// 16-byte bank groups. Without the XOR every phase would hit one group eight times.
TEST(bf16_tile_reads_are_conflict_free) {
  for (int r = 0; r < 16; ++r) {
    std::vector<int> seen(8, 0);
    for (int u = 0; u < 8; ++u) ++seen[size_t(layout::bf16_unit(r, u))];
    for (int u = 0; u < 8; ++u) CHECK_EQ(seen[size_t(u)], 1);
  }
  for (int r0 = 0; r0 < 256; r0 += 8)
    for (int u = 0; u < 8; ++u) {
      std::vector<int> group(8, 0);
      for (int r = r0; r < r0 + 8; ++r) ++group[size_t(((r * 128 + layout::bf16_unit(r, u) * 16) / 16) % 8)];
      for (int b = 0; b < 8; ++b) CHECK_MSG(group[size_t(b)] == 1, "r0=" << r0 << " u=" << u);
    }
}

TEST(round_trip_restores_bytes_and_values) {
  struct S { int64_t n, k; };
  const S shapes[] = {{16, 64}, {17, 96}, {1, 32}, {40, 2880}, {33, 1056}, {128, 512}, {5, 4128}};
  for (Format f : {Format::kNVFP4, Format::kMXFP4})
    for (const S& s : shapes) {
      if (s.k % group_size(f)) continue;
      Ckpt c = random_ckpt(f, s.n, s.k);
      PackedLayout l;
      CHECK_OK(packed_layout(f, s.n, s.k, &l));
      std::vector<uint8_t> buf(l.total_bytes, 0xA5);
      const float ts = 0.25f;
      PrepackArgs a;
      a.format = f;
      a.n = s.n;
      a.k = s.k;
      a.packed = c.packed.data();
      a.scales = c.scales.data();
      a.tensor_scale = f == Format::kNVFP4 ? &ts : nullptr;
      a.dst = buf.data();
      CHECK_OK(prepack_cpu(a));
      std::vector<uint8_t> p2(c.packed.size()), s2(c.scales.size());
      CHECK_OK(unpack_cpu(f, s.n, s.k, buf.data(), p2.data(), s2.data()));
      const Ckpt want = expected_unpack(f, c, s.n, s.k);
      CHECK_MSG(p2 == want.packed, format_name(f) << " " << s.n << "x" << s.k << ": codes differ");
      CHECK_MSG(s2 == want.scales, format_name(f) << " " << s.n << "x" << s.k << ": scales differ");
      CHECK_MSG(same_values(f, c, Ckpt{p2, s2}, s.n, s.k), format_name(f) << " " << s.n << "x" << s.k << ": values differ");
      // Row factors: NVFP4 ts * 2^9; MXFP4 2^(emax - 128); padding rows 0.
      const float* os = reinterpret_cast<const float*>(buf.data() + l.out_scale_offset);
      const int64_t groups = s.k / group_size(f);
      for (int64_t r = 0; r < s.n; ++r) {
        if (f == Format::kNVFP4) {
          CHECK_EQ(os[r], 128.0f);
        } else {
          int emax = 0;
          for (int64_t gi = 0; gi < groups; ++gi) emax = std::max<int>(emax, c.scales[size_t(r * groups + gi)]);
          CHECK_EQ(os[r], std::ldexp(1.0f, emax - 128));
        }
      }
      for (int64_t r = s.n; r < l.n_pad; ++r) CHECK_EQ(os[r], 0.0f);
    }
}

// A NaN block scale makes its row's factor NaN; unpack still restores its byte.
TEST(nan_scale_rows) {
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t n = 20, k = 256, groups = k / group_size(f);
    Ckpt c = random_ckpt(f, n, k);
    c.scales[size_t(3 * groups + 1)] = f == Format::kNVFP4 ? 0x7F : 0xFF;
    c.scales[size_t(9 * groups)] = f == Format::kNVFP4 ? 0xFF : 0xFF;
    PackedLayout l;
    CHECK_OK(packed_layout(f, n, k, &l));
    std::vector<uint8_t> buf(l.total_bytes);
    PrepackArgs a;
    a.format = f;
    a.n = n;
    a.k = k;
    a.packed = c.packed.data();
    a.scales = c.scales.data();
    a.dst = buf.data();
    CHECK_OK(prepack_cpu(a));
    const float* os = reinterpret_cast<const float*>(buf.data() + l.out_scale_offset);
    for (int64_t r = 0; r < n; ++r) CHECK_EQ(std::isnan(os[r]), r == 3 || r == 9);
    std::vector<uint8_t> p2(c.packed.size()), s2(c.scales.size());
    CHECK_OK(unpack_cpu(f, n, k, buf.data(), p2.data(), s2.data()));
    const Ckpt want = expected_unpack(f, c, n, k);
    CHECK(p2 == want.packed);
    CHECK(s2 == want.scales);
  }
}

TEST(per_row_tensor_scales) {
  const int64_t n = 24, k = 64;
  Ckpt c = random_ckpt(Format::kNVFP4, n, k);
  std::vector<float> rts(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rts[size_t(r)] = 0.5f + float(r);
  PackedLayout l;
  CHECK_OK(packed_layout(Format::kNVFP4, n, k, &l));
  std::vector<uint8_t> buf(l.total_bytes);
  PrepackArgs a;
  a.n = n;
  a.k = k;
  a.packed = c.packed.data();
  a.scales = c.scales.data();
  a.row_tensor_scale = rts.data();
  a.dst = buf.data();
  CHECK_OK(prepack_cpu(a));
  const float* os = reinterpret_cast<const float*>(buf.data() + l.out_scale_offset);
  for (int64_t r = 0; r < n; ++r)
    if (!std::isnan(os[r])) CHECK_EQ(os[r], rts[size_t(r)] * 512.0f);
}

TEST(layout_sizes) {
  PackedLayout l;
  CHECK_OK(packed_layout(Format::kNVFP4, 17, 80, &l));
  CHECK_EQ(l.n_pad, 32);
  CHECK_EQ(l.k_pad, 128);
  CHECK_EQ(l.weights_bytes, size_t(2 * 2 * 32 * 16));
  CHECK_EQ(l.total_bytes % 256, size_t(0));
  CHECK_OK(packed_layout(Format::kMXFP4, 1, 2880, &l));
  CHECK_EQ(l.k_pad, 2944);
  CHECK_EQ(l.k_macros, 6);
}

TEST(prepack_errors) {
  std::vector<uint8_t> p(64), s(64), d(1 << 16);
  PrepackArgs a;
  a.n = 4;
  a.k = 32;
  a.packed = p.data();
  a.scales = s.data();
  a.dst = d.data();
  PrepackArgs b = a;
  b.k = 24;
  CHECK_ERROR(prepack_cpu(b), "k: must be a multiple of the group size 16 for nvfp4 (got 24)");
  b = a;
  b.format = Format::kMXFP4;
  b.k = 48;
  CHECK_ERROR(prepack_cpu(b), "k: must be a multiple of the group size 32 for mxfp4 (got 48)");
  b = a;
  b.n = 0;
  CHECK_ERROR(prepack_cpu(b), "n: must be >= 1 (got 0)");
  b = a;
  b.packed = nullptr;
  CHECK_ERROR(prepack_cpu(b), "packed: must not be null");
  b = a;
  b.scales = nullptr;
  CHECK_ERROR(prepack_cpu(b), "scales: must not be null");
  b = a;
  b.dst = d.data() + 1;
  CHECK_ERROR(prepack_cpu(b), "dst: must be 16-byte aligned");
  float ts = 1.0f;
  b = a;
  b.format = Format::kMXFP4;
  b.tensor_scale = &ts;
  CHECK_ERROR(prepack_cpu(b), "tensor_scale: mxfp4 has no tensor scale");
  b = a;
  b.tensor_scale = &ts;
  b.row_tensor_scale = &ts;
  CHECK_ERROR(prepack_cpu(b), "row_tensor_scale: give either");
  b = a;
  b.format = static_cast<Format>(7);
  CHECK_ERROR(prepack_cpu(b), "format: must be nvfp4 or mxfp4");
  PackedLayout l;
  CHECK_ERROR(packed_layout(Format::kNVFP4, 1, int64_t(1) << 40, &l), "k: must be < 2^31");
}

TEST_MAIN()
