// test_formats.cpp: the E2M1 / E4M3 / E8M0 codecs of formats.h against values written here from the
// spec: every code decoded, E2M1 and E4M3 rounding (ties to even, saturation, subnormals), NaN codes,
// signed zero, and dequant_element.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "fp4kit/formats.h"
#include "testing.h"

using namespace fp4kit;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// E2M1 magnitudes straight from the OCP table.
const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// E4M3 from its fields (bias 7): normal (8 + m) * 2^(e - 10), subnormal m * 2^-9; S.1111.111 is NaN.
double e4m3_spec(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
  return s ? -mag : mag;
}

// The even one of two neighbouring codes (ties to even pick the even mantissa).
int even_of(int a, int b) { return (a & 1) ? b : a; }

}  // namespace

TEST(e2m1_decode_all_16_codes) {
  for (int c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -kE2M1[c & 7] : kE2M1[c & 7];
    const float got = E2M1::decode(uint8_t(c));
    CHECK_MSG(double(got) == want, "code " << c << " got " << got << " want " << want);
    CHECK_EQ(std::signbit(got), bool(c & 8));  // 0x8 decodes to -0.0
  }
}

TEST(e2m1_encode_exact_and_round_trip) {
  for (int c = 0; c < 16; ++c) {
    const uint8_t want = c == 8 ? 0 : uint8_t(c);  // a zero is always stored as +0
    CHECK_EQ(int(E2M1::encode(E2M1::decode(uint8_t(c)))), int(want));
  }
  CHECK_EQ(int(E2M1::encode(-0.0f)), 0);
  CHECK_EQ(int(E2M1::encode(-0.1f)), 0);  // rounds to zero: +0, not 0x8
  CHECK_EQ(int(E2M1::encode(-0.25f)), 0);
}

TEST(e2m1_encode_midpoints_ties_to_even) {
  struct Case { float x; int code; };
  const Case cases[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6}};
  for (const Case& t : cases) {
    CHECK_MSG(E2M1::encode(t.x) == t.code, "x=" << t.x);
    CHECK_MSG(E2M1::encode(-t.x) == (t.code ? t.code | 8 : 0), "x=" << -t.x);
  }
  // Just off each midpoint goes to the nearer neighbour.
  for (int c = 0; c < 7; ++c) {
    const float mid = float((kE2M1[c] + kE2M1[c + 1]) / 2);
    CHECK_MSG(E2M1::encode(std::nextafter(mid, 0.0f)) == c, "below mid " << mid);
    CHECK_MSG(E2M1::encode(std::nextafter(mid, 10.0f)) == c + 1, "above mid " << mid);
    CHECK_EQ(int(E2M1::encode(mid)), even_of(c, c + 1));
  }
}

TEST(e2m1_encode_saturates) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, 3.0e38f, inf}) {
    CHECK_MSG(E2M1::encode(x) == 7, "x=" << x);
    CHECK_MSG(E2M1::encode(-x) == 15, "x=" << -x);
  }
}

TEST(e4m3_decode_all_256_codes) {
  for (int c = 0; c < 256; ++c) {
    const float got = E4M3::decode(uint8_t(c));
    if ((c & 0x7F) == 0x7F) {
      CHECK_MSG(std::isnan(got), "code " << c);
      CHECK(E4M3::is_nan(uint8_t(c)));
      continue;
    }
    CHECK(!E4M3::is_nan(uint8_t(c)));
    CHECK_MSG(double(got) == e4m3_spec(c), "code " << c << " got " << got << " want " << e4m3_spec(c));
    CHECK_EQ(std::signbit(got), bool(c & 0x80));
  }
  CHECK_EQ(E4M3::decode(0x7E), 448.0f);
  CHECK_EQ(E4M3::decode(0xFE), -448.0f);
  CHECK_EQ(E4M3::decode(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  CHECK_EQ(E4M3::decode(0x07), 7.0f / 512.0f);
  CHECK_EQ(E4M3::decode(0x08), 0.015625f);  // 2^-6, the smallest normal
  CHECK_EQ(E4M3::decode(0x38), 1.0f);
}

TEST(e4m3_encode_round_trip_all_finite_codes) {
  int n = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    const uint8_t want = c == 0x80 ? 0 : uint8_t(c);  // -0 encodes as +0
    CHECK_MSG(E4M3::encode(E4M3::decode(uint8_t(c))) == want, "code " << c);
    ++n;
  }
  CHECK_EQ(n, 254);
}

TEST(e4m3_encode_ties_to_even_between_neighbours) {
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = e4m3_spec(c), hi = e4m3_spec(c + 1);
    const float mid = float((lo + hi) / 2);  // at most 5 significant bits: exact in fp32
    CHECK_MSG(double(mid) == (lo + hi) / 2, "mid of " << c);
    CHECK_MSG(E4M3::encode(mid) == even_of(c, c + 1), "tie between " << c << " and " << c + 1);
    CHECK_MSG(E4M3::encode(-mid) == (even_of(c, c + 1) ? (even_of(c, c + 1) | 0x80) : 0), "-tie " << c);
    CHECK_MSG(E4M3::encode(std::nextafter(mid, 0.0f)) == c, "below tie " << c);
    CHECK_MSG(E4M3::encode(std::nextafter(mid, 1000.0f)) == c + 1, "above tie " << c);
  }
}

TEST(e4m3_encode_saturation_nan_and_subnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {448.0f, 449.0f, 464.0f, 480.0f, 1.0e6f, 3.0e38f, inf}) {
    CHECK_MSG(E4M3::encode(x) == 0x7E, "x=" << x);
    CHECK_MSG(E4M3::encode(-x) == 0xFE, "x=" << -x);
  }
  CHECK_EQ(int(E4M3::encode(std::nanf(""))), 0x7F);
  const float sub = 0.001953125f;  // 2^-9
  CHECK_EQ(int(E4M3::encode(1.4f * sub)), 1);
  CHECK_EQ(int(E4M3::encode(1.6f * sub)), 2);
  CHECK_EQ(int(E4M3::encode(2.5f * sub)), 2);  // tie -> even
  CHECK_EQ(int(E4M3::encode(3.5f * sub)), 4);  // tie -> even
  CHECK_EQ(int(E4M3::encode(7.5f * sub)), 8);  // tie between the largest subnormal and 2^-6 -> 0x08
  CHECK_EQ(int(E4M3::encode(-3.0f * sub)), 0x83);
  CHECK_EQ(int(E4M3::encode(0.5f * sub)), 0);   // tie between 0 and 2^-9 -> 0 (even)
  CHECK_EQ(int(E4M3::encode(0.49f * sub)), 0);  // below half the smallest subnormal
  CHECK_EQ(int(E4M3::encode(0.51f * sub)), 1);
  CHECK_EQ(int(E4M3::encode(1.0e-30f)), 0);
  CHECK_EQ(int(E4M3::encode(-1.0e-30f)), 0);
  CHECK_EQ(int(E4M3::encode(0.0f)), 0);
  CHECK_EQ(int(E4M3::encode(-0.0f)), 0);
}

TEST(e8m0_decode_all_256_codes) {
  for (int c = 0; c < 255; ++c) {
    const float got = E8M0::decode(uint8_t(c));
    CHECK_MSG(double(got) == std::ldexp(1.0, c - 127), "code " << c << " got " << got);
    CHECK(!E8M0::is_nan(uint8_t(c)));
  }
  CHECK(std::isnan(E8M0::decode(0xFF)));
  CHECK(E8M0::is_nan(0xFF));
  CHECK(E8M0::decode(0) > 0.0f);  // 2^-127: a float32 subnormal, not zero
  CHECK_EQ(bits(E8M0::decode(0)), 0x00400000u);
  CHECK_EQ(E8M0::decode(127), 1.0f);
  CHECK_EQ(E8M0::decode(254), std::ldexp(1.0f, 127));
}

TEST(dequant_element_both_formats) {
  // NVFP4: e2m1 * e4m3 * tensor scale, with a subnormal scale and a negative zero code.
  CHECK_EQ(dequant_element(Format::kNVFP4, 0x7, 0x38, 0.5f), 3.0f);          // 6 * 1 * 0.5
  CHECK_EQ(dequant_element(Format::kNVFP4, 0xB, 0x03, 1.0f), -1.5f * 3.0f / 512.0f);
  CHECK(std::signbit(dequant_element(Format::kNVFP4, 0x8, 0x38, 1.0f)));
  CHECK(std::isnan(dequant_element(Format::kNVFP4, 0x2, 0x7F, 1.0f)));
  // MXFP4: e2m1 * 2^(e-127), exact down to e = 0.
  CHECK_EQ(dequant_element(Format::kMXFP4, 0x7, 127, 0.0f), 6.0f);
  CHECK_EQ(double(dequant_element(Format::kMXFP4, 0x1, 0, 0.0f)), std::ldexp(1.0, -128));
  CHECK_EQ(double(dequant_element(Format::kMXFP4, 0xF, 0, 0.0f)), -6.0 * std::ldexp(1.0, -127));
  CHECK(std::isnan(dequant_element(Format::kMXFP4, 0x0, 0xFF, 0.0f)));
  CHECK_EQ(group_size(Format::kNVFP4), 16);
  CHECK_EQ(group_size(Format::kMXFP4), 32);
}

TEST_MAIN()
