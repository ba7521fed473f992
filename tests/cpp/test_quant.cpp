// test_quant.cpp: the CPU quantizers, dequantizer and reference GEMM. Known-answer vectors worked out by
// hand from the NVFP4 / MXFP4 recipes (ties, saturation, zero blocks, subnormal E4M3 scales, NaN/Inf
// blocks, scale clamping), round-trip bounds on random data (seed printed; FP4KIT_SEED=n repeats a run),
// exact round trips of grid-exact data, bf16/fp16 inputs, and every bad-argument error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "fp4kit/quant.h"
#include "testing.h"

using namespace fp4kit;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

using fp4test::test_seed;

struct Quantized {
  std::vector<uint8_t> packed, scales;
  float ts = 0.0f;
  Status status;
};

Quantized quantize(Format f, const void* w, DType dt, int64_t n, int64_t k, const float* given = nullptr) {
  Quantized q;
  q.packed.assign(size_t(n * k / 2), 0xCD);  // poisoned: every byte must be written
  q.scales.assign(size_t(n * k / group_size(f)), 0xCD);
  QuantizeArgs a;
  a.format = f;
  a.w = w;
  a.w_dtype = dt;
  a.n = n;
  a.k = k;
  a.packed = q.packed.data();
  a.scales = q.scales.data();
  a.tensor_scale = &q.ts;
  a.given_tensor_scale = given;
  q.status = quantize_cpu(a);
  return q;
}

std::vector<float> dequantize(Format f, const Quantized& q, int64_t n, int64_t k) {
  std::vector<float> out(size_t(n * k), kNaN);
  DequantizeArgs d;
  d.format = f;
  d.packed = q.packed.data();
  d.scales = q.scales.data();
  d.tensor_scale = q.ts;
  d.n = n;
  d.k = k;
  d.out = out.data();
  CHECK_OK(dequantize_cpu(d));
  return out;
}

// A block written as (value, expected code) pairs; the rest of the block is zeros (code 0).
using Block = std::vector<std::pair<float, int>>;

void build(const std::vector<Block>& blocks, int g, std::vector<float>* w, std::vector<uint8_t>* packed) {
  std::vector<int> codes;
  for (const Block& b : blocks) {
    for (int i = 0; i < g; ++i) {
      w->push_back(i < int(b.size()) ? b[i].first : 0.0f);
      codes.push_back(i < int(b.size()) ? b[i].second : 0);
    }
  }
  for (size_t i = 0; i < codes.size(); i += 2) packed->push_back(uint8_t(codes[i] | (codes[i + 1] << 4)));
}

// Independent half -> float: normal (1024 + m) * 2^(e - 25), subnormal m * 2^-24.
float half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? std::nan("") : HUGE_VAL;
  else v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
  return float(s ? -v : v);
}

}  // namespace

// ---- NVFP4 known answers -----------------------------------------------------------------------

TEST(nvfp4_known_answer_bytes) {
  // One row of 4 blocks. amax = 2688 = 6 * 448, so tensor_scale = 1 exactly.
  const float w[64] = {
      // block 0: scale 2688/6 = 448 -> 0x7E; codes of x/448 (ties: 0.25->0, 0.75->1, 5->4, -3.5->-4)
      2688, 224, 448, 672, 896, 1344, 1792, -2688, -224, 0, -0.0f, 100, 112, 336, 2240, -1568,
      // block 1: amax 12, scale 12/6 = 2 -> 0x40; codes of x/2
      12, 1, 0.5f, 1.5f, 2.5f, 3.5f, 5, 7, 10, -12, -1, -0.2f, 3, 8, 6, -7,
      // block 2: amax 6 * 2^-8, scale 2^-8 = subnormal 0x02; codes of x * 256
      6 / 256.f, 1 / 256.f, 1.5f / 256, -4 / 256.f, 0.25f / 256, 0.75f / 256, 2 / 256.f, 3 / 256.f,
      -6 / 256.f, 0.5f / 256, 5 / 256.f, 2.5f / 256, 0, -1 / 256.f, 4 / 256.f, 1.25f / 256,
      // block 3: amax 1e-4, 1e-4/6 is below half the smallest subnormal -> scale 0, all codes 0
      1e-4f, -1e-4f, 5e-5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t want_packed[32] = {0x17, 0x32, 0x54, 0xF6, 0x09, 0x00, 0x20, 0xE6,   //
                                   0x17, 0x20, 0x42, 0x64, 0xF6, 0x09, 0x63, 0xE5,   //
                                   0x27, 0xE3, 0x20, 0x54, 0x1F, 0x46, 0xA0, 0x26,   //
                                   0, 0, 0, 0, 0, 0, 0, 0};
  const uint8_t want_scales[4] = {0x7E, 0x40, 0x02, 0x00};
  Quantized q = quantize(Format::kNVFP4, w, DType::kF32, 1, 64);
  CHECK_OK(q.status);
  CHECK_EQ(bits(q.ts), bits(1.0f));
  for (int i = 0; i < 32; ++i) CHECK_MSG(q.packed[i] == want_packed[i], "byte " << i << " got " << int(q.packed[i]));
  for (int i = 0; i < 4; ++i) CHECK_MSG(q.scales[i] == want_scales[i], "scale " << i << " got " << int(q.scales[i]));
}

TEST(nvfp4_tensor_scale_rounding_and_given_scale) {
  // amax 6: tensor_scale = fl(6 / 2688); block scale e4m3(6 / fl(6 * ts)) = 448; codes of x / fl(448 * ts).
  std::vector<float> w = {6, -3, 1, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  Quantized q = quantize(Format::kNVFP4, w.data(), DType::kF32, 1, 16);
  CHECK_OK(q.status);
  const float ts = 6.0f / 2688.0f;
  CHECK_EQ(bits(q.ts), bits(ts));
  CHECK_EQ(int(q.scales[0]), 0x7E);
  CHECK_EQ(int(q.packed[0]), 0x7 | 0xD << 4);
  CHECK_EQ(int(q.packed[1]), 0x2 | 0x1 << 4);
  // A given tensor scale replaces amax / 2688 and is echoed to tensor_scale.
  const float given = 0.25f;  // block scale e4m3(6 / 1.5) = 4 -> 0x48, codes of x / 1
  q = quantize(Format::kNVFP4, w.data(), DType::kF32, 1, 16, &given);
  CHECK_OK(q.status);
  CHECK_EQ(q.ts, 0.25f);
  CHECK_EQ(int(q.scales[0]), 0x48);
  CHECK_EQ(int(q.packed[0]), 0x7 | 0xD << 4);
  // An all-zero tensor: tensor_scale 1, scales 0, codes 0.
  std::vector<float> z(32, 0.0f);
  z[3] = -0.0f;
  q = quantize(Format::kNVFP4, z.data(), DType::kF32, 2, 16);
  CHECK_OK(q.status);
  CHECK_EQ(q.ts, 1.0f);
  for (uint8_t b : q.packed) CHECK_EQ(int(b), 0);
  for (uint8_t b : q.scales) CHECK_EQ(int(b), 0);
}

TEST(nvfp4_scale_rounds_to_nearest_e4m3) {
  // ts = 1 (amax 2688 in row 0). Row 1: amax 13 -> 13/6 = 2.1667 -> e4m3 2.25 (0x41); 13/2.25 = 5.78 -> 6.
  // Row 2: amax 2600 -> 433.3 -> e4m3 448 (0x7E, the neighbours are 416 and 448); 2600/448 = 5.80 -> 6.
  std::vector<float> w(48, 0.0f);
  w[0] = 2688;
  w[16] = 13;
  w[17] = 2.25f;  // -> 1.0 exactly
  w[18] = -1.6875f;  // -0.75 tie -> -1.0 (even)
  w[32] = 2600;  // 2600/448 = 5.80 -> 6
  w[33] = 1000;  // 2.23 -> 2
  Quantized q = quantize(Format::kNVFP4, w.data(), DType::kF32, 3, 16);
  CHECK_OK(q.status);
  CHECK_EQ(q.ts, 1.0f);
  CHECK_EQ(int(q.scales[1]), 0x41);
  CHECK_EQ(int(q.packed[8]), 0x7 | 0x2 << 4);
  CHECK_EQ(int(q.packed[9]), 0xA);
  CHECK_EQ(int(q.scales[2]), 0x7E);
  CHECK_EQ(int(q.packed[16]), 0x7 | 0x4 << 4);
}

TEST(nvfp4_nan_and_inf_blocks) {
  // Block 0 sets amax 2688 (ts 1); block 1 holds a NaN, block 2 an Inf: NaN scale 0x7F and zero codes.
  // Their finite values still count toward the tensor amax (block 2's 5376 makes ts = 2).
  std::vector<float> w(48, 1.0f);
  w[0] = 2688;
  w[20] = kNaN;
  w[33] = -kInf;
  w[40] = 5376;
  Quantized q = quantize(Format::kNVFP4, w.data(), DType::kF32, 1, 48);
  CHECK_OK(q.status);
  CHECK_EQ(q.ts, 2.0f);
  CHECK_EQ(int(q.scales[0]), 0x76);  // 2688 / 12 = 224 = 1.75 * 2^7 -> 0x76
  CHECK_EQ(int(q.scales[1]), 0x7F);
  CHECK_EQ(int(q.scales[2]), 0x7F);
  for (int i = 8; i < 24; ++i) CHECK_EQ(int(q.packed[i]), 0);
  const std::vector<float> d = dequantize(Format::kNVFP4, q, 1, 48);
  CHECK_EQ(d[0], 2688.0f);
  CHECK(std::isnan(d[16]) && std::isnan(d[47]));
  // A tensor with no finite non-zero value: ts = 1.
  std::vector<float> v(16, kNaN);
  q = quantize(Format::kNVFP4, v.data(), DType::kF32, 1, 16);
  CHECK_OK(q.status);
  CHECK_EQ(q.ts, 1.0f);
  CHECK_EQ(int(q.scales[0]), 0x7F);
}

// ---- MXFP4 known answers -----------------------------------------------------------------------

TEST(mxfp4_known_answers) {
  const std::vector<Block> blocks = {
      // amax 6: floor(log2 6) = 2 -> e = 2 - 2 + 127 = 127 (scale 1): grid values exact, ties to even
      {{6, 7}, {0.5f, 1}, {1, 2}, {1.5f, 3}, {2, 4}, {3, 5}, {4, 6}, {-6, 15}, {-0.5f, 9}, {0, 0}, {-0.0f, 0},
       {0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5, 6}, {-1.75f, 12}, {-0.1f, 0}},
      // amax 8: e = 128 (scale 2): 8 -> 4; 5 -> 2.5 -> 2; 7 -> 3.5 -> 4
      {{8, 6}, {1, 1}, {3, 3}, {5, 4}, {7, 6}, {0.5f, 0}, {-8, 14}},
      // amax 7: e = 127, 7 and 6.5 saturate to 6
      {{7, 7}, {6.5f, 7}, {-7, 15}, {5.5f, 7}},
      // amax 0.75: floor(log2) = -1 -> e = 124 (scale 1/8): x * 8
      {{0.75f, 7}, {0.1f, 2}, {0.0625f, 1}, {-0.5f, 14}},
      // all zero: e = 0
      {},
      // amax 2^-126: e = -1 clamped to 0 (scale 2^-127): x * 2^127
      {{std::ldexp(1.0f, -126), 4}, {std::ldexp(1.0f, -127), 2}, {-std::ldexp(1.0f, -128), 9},
       {std::ldexp(1.0f, -130), 0}},
      // amax 1.5 * 2^127: e = 127 + 125 = 252 (scale 2^125)
      {{std::ldexp(1.5f, 127), 7}, {std::ldexp(1.0f, 127), 6}, {-std::ldexp(1.0f, 124), 9}, {1.0f, 0}},
  };
  const uint8_t want_scales[] = {127, 128, 127, 124, 0, 0, 252};
  std::vector<float> w;
  std::vector<uint8_t> want_packed;
  build(blocks, 32, &w, &want_packed);
  const int64_t k = int64_t(w.size());
  Quantized q = quantize(Format::kMXFP4, w.data(), DType::kF32, 1, k);
  CHECK_OK(q.status);
  for (size_t b = 0; b < blocks.size(); ++b) CHECK_MSG(q.scales[b] == want_scales[b], "block " << b << " scale " << int(q.scales[b]));
  for (size_t i = 0; i < want_packed.size(); ++i)
    CHECK_MSG(q.packed[i] == want_packed[i], "byte " << i << " got " << int(q.packed[i]) << " want " << int(want_packed[i]));
}

TEST(mxfp4_nan_inf_blocks_and_null_tensor_scale) {
  std::vector<float> w(96, 2.0f);
  w[40] = kNaN;
  w[95] = kInf;
  std::vector<uint8_t> packed(48, 0xCD), scales(3, 0xCD);
  QuantizeArgs a;
  a.format = Format::kMXFP4;
  a.w = w.data();
  a.n = 1;
  a.k = 96;
  a.packed = packed.data();
  a.scales = scales.data();
  CHECK_OK(quantize_cpu(a));  // tensor_scale may be null for MXFP4
  CHECK_EQ(int(scales[0]), 126);  // amax 2: floor(log2 2) = 1 -> e = 126; 2 / 0.5 = 4 -> code 6
  CHECK_EQ(int(packed[0]), 0x66);
  CHECK_EQ(int(scales[1]), 0xFF);
  CHECK_EQ(int(scales[2]), 0xFF);
  for (int i = 16; i < 48; ++i) CHECK_EQ(int(packed[i]), 0);
}

// ---- round trips -------------------------------------------------------------------------------

// Checks every element against the grid of its block: |deq - x| <= half the local E2M1 step times the
// block's scale S, and values beyond 6*S saturate to exactly +-6*S. Checks every block's amax / S against
// the recipe: NVFP4 with a normal E4M3 scale in [6 / (1 + 1/16), 6 / (1 - 1/16)] (a 3-bit mantissa
// rounds by at most 2^-4 relative), MXFP4 in [4, 8); a zero scale only where amax / (6 ts) <= 2^-10.
// Returns the number of blocks whose scale is {zero, E4M3-subnormal, normal}.
std::vector<int> check_round_trip_bounds(Format f, const std::vector<float>& w, const Quantized& q, int64_t n,
                                         int64_t k) {
  const std::vector<float> d = dequantize(f, q, n, k);
  const int g = group_size(f);
  std::vector<int> kinds(3, 0);
  int bad = 0;
  for (int64_t b = 0; b < n * k / g && bad < 10; ++b) {
    const uint8_t sb = q.scales[b];
    const double S = f == Format::kNVFP4 ? double(E4M3::decode(sb)) * q.ts : std::ldexp(1.0, int(sb) - 127);
    double amax = 0;
    for (int64_t i = b * g; i < (b + 1) * g; ++i) amax = std::max(amax, std::fabs(double(w[i])));
    if (S == 0.0) {
      // The block scale underflowed: only when amax / (6 ts) <= 2^-10 (half the smallest subnormal).
      ++kinds[0];
      bool ok = amax <= 6.0 * q.ts * std::ldexp(1.0, -10) * (1 + 1e-6);
      for (int64_t i = b * g; i < (b + 1) * g; ++i) ok = ok && d[i] == 0.0f;
      if (!ok) ++bad;
      CHECK_MSG(ok, "block " << b << " amax " << amax << " has a zero scale");
      continue;
    }
    const bool normal = f == Format::kMXFP4 || (sb & 0x78) != 0;
    ++kinds[normal ? 2 : 1];
    if (normal) {
      // Smallest normal binade (exponent field 1): a value just above the midpoint between the largest
      // subnormal 7*2^-9 and 2^-6 rounds up by 1/15 of the scale, so the bound there is 6 / (16/15).
      const bool first_binade = f == Format::kNVFP4 && ((sb & 0x78) >> 3) == 1;
      const double lo = f == Format::kMXFP4 ? 4.0 : first_binade ? 5.625 : 6.0 / 1.0625;
      const double hi = f == Format::kMXFP4 ? 8.0 : 6.4;
      const bool ok = amax / S >= lo * (1 - 1e-6) && amax / S < hi * (1 + 1e-6);
      if (!ok) ++bad;
      CHECK_MSG(ok, format_name(f) << " block " << b << " amax / scale = " << amax / S);
    }
    for (int64_t i = b * g; i < (b + 1) * g; ++i) {
      const double x = w[i], err = std::fabs(double(d[i]) - x), v = std::fabs(x) / S;
      bool ok;
      if (v <= 6.0) {
        const double half_step = v < 2 ? 0.25 : (v < 4 ? 0.5 : 1.0);
        ok = err <= half_step * S + 6e-6 * S;  // slack for the fp32 roundings of s * ts
      } else {
        ok = std::fabs(std::fabs(double(d[i])) - 6 * S) <= 6 * S * 1e-6 && std::signbit(d[i]) == std::signbit(x);
      }
      if (!ok) ++bad;
      CHECK_MSG(ok, format_name(f) << " element " << i << " x=" << x << " deq=" << d[i] << " S=" << S);
    }
  }
  return kinds;
}

TEST(random_round_trip_error_bounds) {
  std::mt19937_64 rng(test_seed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> jitter(-0.5f, 0.5f);
  for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
    const int64_t n = 41, k = 320;
    std::vector<float> w(size_t(n * k));
    for (int64_t r = 0; r < n; ++r) {
      // Rows spread over 10 decades: the small ones get subnormal or zero E4M3 scales.
      const float mag = std::pow(10.0f, -6.0f + 10.0f * float(r) / float(n - 1) + jitter(rng));
      for (int64_t c = 0; c < k; ++c) w[size_t(r * k + c)] = normal(rng) * mag;
    }
    Quantized q = quantize(f, w.data(), DType::kF32, n, k);
    CHECK_OK(q.status);
    const std::vector<int> kinds = check_round_trip_bounds(f, w, q, n, k);
    CHECK(kinds[2] > 0);
    if (f == Format::kNVFP4) CHECK_MSG(kinds[0] > 0 && kinds[1] > 0, "zero " << kinds[0] << " subnormal " << kinds[1]);
  }
}

TEST(grid_exact_data_round_trips_exactly) {
  std::mt19937_64 rng(test_seed() + 1);
  const int64_t n = 19, k = 256;
  // NVFP4: x = e2m1 * e4m3(s) * ts with one +-6 per block, so amax = 6 * s * ts and every step is exact.
  for (const float given : {0.0f, std::ldexp(1.0f, -10)}) {
    const float ts = given != 0.0f ? given : 1.0f;
    std::vector<float> w(size_t(n * k));
    std::vector<uint8_t> sbytes(size_t(n * k / 16));
    for (size_t b = 0; b < sbytes.size(); ++b) {
      sbytes[b] = b == 0 ? 0x7E : uint8_t(1 + rng() % 0x7E);  // block 0 makes amax = 2688 * ts
      const float s = E4M3::decode(sbytes[b]);
      for (int i = 0; i < 16; ++i) w[b * 16 + i] = E2M1::decode(uint8_t(rng() % 16)) * s * ts;
      w[b * 16 + rng() % 16] = (rng() & 1 ? 6.0f : -6.0f) * s * ts;
    }
    Quantized q = quantize(Format::kNVFP4, w.data(), DType::kF32, n, k, given != 0.0f ? &given : nullptr);
    CHECK_OK(q.status);
    CHECK_EQ(bits(q.ts), bits(ts));
    CHECK(q.scales == sbytes);
    const std::vector<float> d = dequantize(Format::kNVFP4, q, n, k);
    int mism = 0;
    for (size_t i = 0; i < w.size(); ++i) mism += d[i] != w[i];
    CHECK_EQ(mism, 0);
  }
  // MXFP4: x = e2m1 * 2^(e-127) with one +-6 per block (amax in [4, 8) -> the scale is e), e in 0..252.
  std::vector<float> w(size_t(n * k));
  std::vector<uint8_t> ebytes(size_t(n * k / 32));
  for (size_t b = 0; b < ebytes.size(); ++b) {
    ebytes[b] = uint8_t(rng() % 253);
    const float s = E8M0::decode(ebytes[b]);
    for (int i = 0; i < 32; ++i) w[b * 32 + i] = E2M1::decode(uint8_t(rng() % 16)) * s;
    w[b * 32 + rng() % 32] = (rng() & 1 ? 6.0f : -6.0f) * s;
  }
  Quantized q = quantize(Format::kMXFP4, w.data(), DType::kF32, n, k);
  CHECK_OK(q.status);
  CHECK(q.scales == ebytes);
  const std::vector<float> d = dequantize(Format::kMXFP4, q, n, k);
  int mism = 0;
  for (size_t i = 0; i < w.size(); ++i) mism += d[i] != w[i];
  CHECK_EQ(mism, 0);
}

TEST(bf16_and_f16_inputs_match_their_fp32_values) {
  // Random bit patterns over the whole range (Inf/NaN included): the 16-bit input must quantize exactly
  // like the fp32 tensor of its values.
  std::mt19937_64 rng(test_seed() + 2);
  const int64_t n = 8, k = 128;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (Format f : {Format::kNVFP4, Format::kMXFP4}) {
      std::vector<uint16_t> h(size_t(n * k));
      std::vector<float> w(h.size());
      for (size_t i = 0; i < h.size(); ++i) {
        // Mostly moderate exponents, now and then anything (subnormals, Inf, NaN).
        uint16_t u = uint16_t(rng());
        if (rng() % 64 != 0) u = dt == DType::kBF16 ? uint16_t((u & 0x807F) | ((120 + rng() % 16) << 7))
                                                    : uint16_t((u & 0x83FF) | ((5 + rng() % 20) << 10));
        h[i] = u;
        if (dt == DType::kBF16) {
          const uint32_t fb = uint32_t(u) << 16;
          std::memcpy(&w[i], &fb, 4);
        } else {
          w[i] = half_value(u);
        }
      }
      const Quantized a = quantize(f, h.data(), dt, n, k), b = quantize(f, w.data(), DType::kF32, n, k);
      CHECK_OK(a.status);
      CHECK_OK(b.status);
      CHECK_MSG(a.packed == b.packed && a.scales == b.scales && bits(a.ts) == bits(b.ts),
                dtype_name(dt) << " " << format_name(f));
    }
  }
  // Spot values: fp16 subnormal 2^-24, fp16 -0, bf16 1.0.
  CHECK_EQ(double(half_value(1)), std::ldexp(1.0, -24));
  uint16_t hs[16] = {0x0001, 0x8000, 0x3C00, 0x4600};  // 2^-24, -0, 1, 6 -> amax 6
  Quantized q = quantize(Format::kNVFP4, hs, DType::kF16, 1, 16);
  CHECK_OK(q.status);
  CHECK_EQ(bits(q.ts), bits(6.0f / 2688.0f));
  CHECK_EQ(int(q.packed[0]), 0);
  CHECK_EQ(int(q.packed[1]), 0x7 << 4 | 0x2);
  // A block of fp16 subnormals: amax 1023 * 2^-24 sets the tensor scale; 512 * 2^-24 is about 3 of 6.
  const uint16_t sub[16] = {0x03FF, 0x0200, 0x8001};
  q = quantize(Format::kNVFP4, sub, DType::kF16, 1, 16);
  CHECK_OK(q.status);
  CHECK_EQ(bits(q.ts), bits(float(1023 * std::ldexp(1.0, -24)) / 2688.0f));
  CHECK_EQ(int(q.packed[0]), 0x7 | 0x5 << 4);
}

// ---- bad arguments -----------------------------------------------------------------------------

TEST(quantize_rejects_bad_arguments) {
  std::vector<float> w(64, 1.0f);
  std::vector<uint8_t> packed(32), scales(4);
  float ts = 0;
  QuantizeArgs good;
  good.w = w.data();
  good.n = 1;
  good.k = 64;
  good.packed = packed.data();
  good.scales = scales.data();
  good.tensor_scale = &ts;
  CHECK_OK(quantize_cpu(good));
  auto with = [&](auto edit) {
    QuantizeArgs a = good;
    edit(a);
    return a;
  };
  const std::pair<QuantizeArgs, const char*> cases[] = {
      {with([](QuantizeArgs& a) { a.w = nullptr; }), "w: must not be null"},
      {with([](QuantizeArgs& a) { a.packed = nullptr; }), "packed: must not be null"},
      {with([](QuantizeArgs& a) { a.scales = nullptr; }), "scales: must not be null"},
      {with([](QuantizeArgs& a) { a.tensor_scale = nullptr; }), "tensor_scale: must not be null for nvfp4"},
      {with([](QuantizeArgs& a) { a.n = 0; }), "n: must be >= 1 (got 0)"},
      {with([](QuantizeArgs& a) { a.n = -3; }), "n: must be >= 1 (got -3)"},
      {with([](QuantizeArgs& a) { a.k = 0; }), "k: must be >= 1 (got 0)"},
      {with([](QuantizeArgs& a) { a.k = 30; }), "k: must be a multiple of the group size 16 for nvfp4 (got 30)"},
      {with([](QuantizeArgs& a) { a.format = Format::kMXFP4; a.k = 48; }),
       "k: must be a multiple of the group size 32 for mxfp4 (got 48)"},
      {with([](QuantizeArgs& a) { a.w_dtype = DType(7); }), "w_dtype: must be float32, bfloat16 or float16 (got 7)"},
      {with([](QuantizeArgs& a) { a.format = Format(5); }), "format: must be nvfp4 or mxfp4 (got 5)"},
      {with([](QuantizeArgs& a) { a.w = reinterpret_cast<const char*>(a.w) + 2; }), "w: must be aligned to 4 bytes"},
      {with([](QuantizeArgs& a) { a.n = int64_t(1) << 60; }), "n * k: must be < 2^62"},
  };
  for (const auto& c : cases) {
    const Status s = quantize_cpu(c.first);
    CHECK_EQ(int(s.code()), int(Code::kInvalidArgument));
    CHECK_ERROR(s, c.second);
    // The GPU quantizer validates the same way, before touching the device.
    CHECK_ERROR(quantize_gpu(c.first, nullptr, nullptr), c.second);
  }
  CHECK_ERROR(quantize_gpu(good, nullptr, nullptr), "workspace: must not be null");
  CHECK_EQ(quantize_workspace_bytes() >= 4, true);
}

TEST(dequantize_and_reference_gemm_reject_bad_arguments) {
  std::vector<uint8_t> packed(8), scales(1);
  std::vector<float> out(16);
  DequantizeArgs good;
  good.packed = packed.data();
  good.scales = scales.data();
  good.n = 1;
  good.k = 16;
  good.out = out.data();
  CHECK_OK(dequantize_cpu(good));
  DequantizeArgs a = good;
  a.packed = nullptr;
  CHECK_ERROR(dequantize_cpu(a), "packed: must not be null");
  a = good;
  a.scales = nullptr;
  CHECK_ERROR(dequantize_cpu(a), "scales: must not be null");
  a = good;
  a.out = nullptr;
  CHECK_ERROR(dequantize_cpu(a), "out: must not be null");
  a = good;
  a.n = 0;
  CHECK_ERROR(dequantize_cpu(a), "n: must be >= 1 (got 0)");
  a = good;
  a.format = Format::kMXFP4;
  CHECK_ERROR(dequantize_cpu(a), "k: must be a multiple of the group size 32 for mxfp4 (got 16)");

  float x[2] = {1, 2};
  double y[1];
  CHECK_ERROR(reference_gemm(nullptr, x, nullptr, 1, 1, 2, y), "x: must not be null");
  CHECK_ERROR(reference_gemm(x, nullptr, nullptr, 1, 1, 2, y), "w: must not be null");
  CHECK_ERROR(reference_gemm(x, x, nullptr, 1, 1, 2, nullptr), "y: must not be null");
  CHECK_ERROR(reference_gemm(x, x, nullptr, 0, 1, 2, y), "m: must be >= 1 (got 0)");
  CHECK_ERROR(reference_gemm(x, x, nullptr, 1, -1, 2, y), "n: must be >= 1 (got -1)");
  CHECK_ERROR(reference_gemm(x, x, nullptr, 1, 1, 0, y), "k: must be >= 1 (got 0)");
}

// ---- reference GEMM ----------------------------------------------------------------------------

TEST(reference_gemm_known_answer) {
  const float x[6] = {1, 2, 3, 4, 5, 6};           // [2, 3]
  const float w[6] = {1, 0, -1, 0.5f, 0.5f, 0.5f};  // [2, 3]
  const float bias[2] = {10, -1};
  double y[4];
  CHECK_OK(reference_gemm(x, w, bias, 2, 2, 3, y));
  CHECK_EQ(y[0], 8.0);
  CHECK_EQ(y[1], 2.0);
  CHECK_EQ(y[2], 8.0);
  CHECK_EQ(y[3], 6.5);
  CHECK_OK(reference_gemm(x, w, nullptr, 2, 2, 3, y));
  CHECK_EQ(y[0], -2.0);
  CHECK_EQ(y[3], 7.5);
  // fp64 accumulation: fp32 would lose the 1 (1e8 + 1 == 1e8 in fp32) and the 2 (2^24 + 1 + 1).
  const float x2[6] = {1e8f, 1, -1e8f, 16777216.0f, 1, 1}, ones[3] = {1, 1, 1};
  CHECK_OK(reference_gemm(x2, ones, nullptr, 2, 1, 3, y));
  CHECK_EQ(y[0], 1.0);
  CHECK_EQ(y[1], 16777218.0);
}

TEST_MAIN()
