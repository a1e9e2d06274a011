// RNE conversions to bf16/f16 against independent oracles: GCC's _Float16
// (soft conversion, IEEE RNE) for f16, and an exact nearest-candidate search
// in double for bf16; plus every 16-bit pattern round-trips.
#include "qknorm/precision.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "validation/rng.h"

// The compiler's _Float16 is the independent f16 rounding these tests
// compare with. GCC 12 has it on x86-64; Clang 14 does not (from Clang 15),
// so the Clang sanitizer build (scripts/sanitize.sh) leaves those checks out
// and keeps the exhaustive round trip against our own decoder.
#if defined(__FLT16_MAX__)
#define QKNORM_HAVE_FLOAT16 1
#else
#define QKNORM_HAVE_FLOAT16 0
#endif

namespace qknorm {
namespace {

// The bf16 value nearest to x (ties to even mantissa), found by comparing the
// two bracketing candidates exactly in double.
uint16_t bf16_nearest(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation (toward 0)
  const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next away from 0
  const double dlo = std::fabs(static_cast<double>(x) - f32_from_bf16(lo));
  // IEEE 754 rounds past the largest finite value as if the exponent were
  // unbounded: the candidate above bf16 max is 2^128, which encodes as Inf.
  double fhi = f32_from_bf16(hi);
  if (std::isinf(fhi)) fhi = std::copysign(std::ldexp(1.0, 128), fhi);
  const double dhi = std::fabs(static_cast<double>(x) - fhi);
  if ((u & 0xffffu) == 0) return lo;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

// Decodes every 16-bit pattern of a storage format and encodes it back: the
// pattern returns unchanged (a NaN returns as some NaN).
void ExpectEveryPatternRoundTrips(float (*decode)(uint16_t),
                                  uint16_t (*encode)(float)) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = decode(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(decode(encode(f)))) << h;
      continue;
    }
    EXPECT_EQ(encode(f), h) << "pattern " << h;
  }
}

TEST(Precision, Bf16RoundTripsEveryPattern) {
  ExpectEveryPatternRoundTrips(f32_from_bf16, bf16_from_f32);
}

TEST(Precision, F16RoundTripsEveryPattern) {
  ExpectEveryPatternRoundTrips(f32_from_f16, f16_from_f32);
#if QKNORM_HAVE_FLOAT16
  for (uint32_t h = 0; h < 65536; ++h) {  // decode is exact
    const float f = f32_from_f16(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(static_cast<float>(static_cast<_Float16>(f)), f) << h;
    }
  }
#endif
}

// Every 2^17-th float bit pattern plus random patterns and all tie points.
TEST(Precision, Bf16MatchesNearestCandidate) {
  validation::Rng rng(20261202);
  for (uint64_t i = 0; i < (1ull << 32); i += 1ull << 15) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(i));
    if (std::isnan(x)) continue;
    ASSERT_EQ(bf16_from_f32(x), bf16_nearest(x)) << "bits " << i;
  }
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = static_cast<uint32_t>(rng.next_u64());
    const float x = std::bit_cast<float>(b);
    if (std::isnan(x)) continue;
    ASSERT_EQ(bf16_from_f32(x), bf16_nearest(x)) << "bits " << b;
    const float tie =
        std::bit_cast<float>((b & 0xffff0000u) | 0x8000u);  // exact halfway
    if (!std::isnan(tie)) {
      ASSERT_EQ(bf16_from_f32(tie), bf16_nearest(tie)) << "tie " << b;
    }
  }
}

#if QKNORM_HAVE_FLOAT16
TEST(Precision, F16MatchesCompilerConversion) {
  validation::Rng rng(7);
  auto check = [](float x) {
    const _Float16 h = static_cast<_Float16>(x);
    const uint16_t bits = std::bit_cast<uint16_t>(h);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f32_from_f16(f16_from_f32(x))));
    } else {
      ASSERT_EQ(f16_from_f32(x), bits) << "x=" << x;
    }
  };
  for (uint64_t i = 0; i < (1ull << 32); i += 1ull << 15)
    check(std::bit_cast<float>(static_cast<uint32_t>(i)));
  for (int i = 0; i < 200000; ++i) {
    const uint32_t b = static_cast<uint32_t>(rng.next_u64());
    check(std::bit_cast<float>(b));
    check(std::bit_cast<float>((b & 0xffffe000u) |
                               0x1000u));  // exact f16 normal halfway points
  }
}
#endif  // QKNORM_HAVE_FLOAT16

TEST(Precision, SpecialValues) {
  EXPECT_EQ(bf16_from_f32(INFINITY), 0x7f80);
  EXPECT_EQ(bf16_from_f32(-INFINITY), 0xff80);
  EXPECT_EQ(bf16_from_f32(3.4028235e38f), 0x7f80);  // rounds up to Inf
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_f32(1e-45f), 0x0000);  // smallest f32 subnormal -> 0
  EXPECT_EQ(f16_from_f32(65520.f), 0x7c00);  // halfway above max -> Inf
  EXPECT_EQ(f16_from_f32(65519.f), 0x7bff);
  EXPECT_EQ(f16_from_f32(5.9604645e-8f), 0x0001);  // 2^-24
  EXPECT_EQ(f16_from_f32(2.9802322e-8f), 0x0000);  // 2^-25: tie to even 0
  EXPECT_EQ(f16_from_f32(4.4703484e-8f), 0x0001);  // 1.5 * 2^-25 -> 2^-24
  EXPECT_TRUE(std::isnan(f32_from_f16(f16_from_f32(NAN))));
  EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(-NAN))));
  // A NaN whose payload sits only in the dropped bits stays NaN.
  EXPECT_TRUE(std::isnan(
      f32_from_bf16(bf16_from_f32(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(
      f32_from_f16(f16_from_f32(std::bit_cast<float>(0x7f800001u)))));
}

// round_to (direct from double, no double rounding) agrees with encode/decode
// on values exactly representable in f32, and is idempotent.
TEST(Precision, RoundToConsistent) {
  validation::Rng rng(3);
  for (int i = 0; i < 100000; ++i) {
    const double x = rng.normal() * std::pow(2.0, rng.uniform_int(-30, 30));
    const float xf = static_cast<float>(x);
    EXPECT_EQ(round_to(Precision::kBF16, xf), f32_from_bf16(bf16_from_f32(xf)));
    EXPECT_EQ(round_to(Precision::kF16, xf), f32_from_f16(f16_from_f32(xf)));
    EXPECT_EQ(round_to(Precision::kF32, x), static_cast<double>(xf));
    for (Precision p : kAllPrecisions) {
      const double r = round_to(p, x);
      EXPECT_EQ(round_to(p, r), r);
      if (std::isfinite(r)) {
        EXPECT_LE(std::fabs(r - x), 0.5 * ulp(p, x) * (1 + 1e-15)) << name(p);
      }
    }
  }
}

// ulp, round_to and the format constants are computed from bits (no libm
// ldexp/ilogb on the judging path); these are the libm definitions they
// replaced, which they must match bit for bit on every double: random bit
// patterns (NaNs, infinities, subnormals, zeros of both signs included),
// the formats' boundaries and their neighbours.
double LibmUlp(double x, int digits, int min_exp) {
  x = std::fabs(x);
  int e = min_exp;
  if (x >= std::ldexp(1.0, min_exp)) e = std::ilogb(x);
  return std::ldexp(1.0, e - (digits - 1));
}
double LibmRoundTo(Precision p, double x, int digits, int min_exp,
                   int max_exp) {
  if (p == Precision::kF64 || !std::isfinite(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), min_exp);
  const double scaled = std::ldexp(x, (digits - 1) - e);
  const double r = std::ldexp(std::nearbyint(scaled), e - (digits - 1));
  const double mf =
      (2.0 - std::ldexp(1.0, 1 - digits)) * std::ldexp(1.0, max_exp);
  if (std::fabs(r) > mf)
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

TEST(Precision, BitComputedFunctionsMatchLibm) {
  struct Format {
    Precision p;
    int digits, min_exp, max_exp;
  };
  const Format formats[] = {{Precision::kF64, 53, -1022, 1023},
                            {Precision::kF32, 24, -126, 127},
                            {Precision::kBF16, 8, -126, 127},
                            {Precision::kF16, 11, -14, 15}};
  std::vector<double> xs = {0.0,
                            -0.0,
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::max(),
                            -std::numeric_limits<double>::max()};
  for (const Format& f : formats) {
    EXPECT_EQ(unit_roundoff(f.p), std::ldexp(1.0, -f.digits));
    EXPECT_EQ(min_normal(f.p), std::ldexp(1.0, f.min_exp));
    EXPECT_EQ(max_finite(f.p), (2.0 - std::ldexp(1.0, 1 - f.digits)) *
                                   std::ldexp(1.0, f.max_exp));
    for (double b : {min_normal(f.p), max_finite(f.p),
                     std::ldexp(1.0, f.min_exp - f.digits + 1),
                     max_finite(f.p) + ulp(f.p, max_finite(f.p)) / 2})
      for (double x : {b, std::nextafter(b, 0.0), std::nextafter(b, INFINITY),
                       b / 2, b * 1.5})
        xs.insert(xs.end(), {x, -x});
  }
  validation::Rng rng(11);
  for (int i = 0; i < 200000; ++i) {
    // Uniform bit patterns cover every exponent; the second draw keeps
    // to the 16-bit formats' range, where most rounding happens.
    xs.push_back(std::bit_cast<double>(rng.next_u64()));
    xs.push_back(rng.normal() *
                 std::ldexp(1.0, static_cast<int>(rng.uniform_int(-30, 20))));
  }
  auto same = [](double a, double b) {
    return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b) ||
           (std::isnan(a) && std::isnan(b));
  };
  for (const Format& f : formats)
    for (double x : xs) {
      ASSERT_TRUE(same(ulp(f.p, x), LibmUlp(x, f.digits, f.min_exp)))
          << name(f.p) << " ulp(" << x << ")";
      ASSERT_TRUE(same(round_to(f.p, x),
                       LibmRoundTo(f.p, x, f.digits, f.min_exp, f.max_exp)))
          << name(f.p) << " round_to(" << x << ")";
    }
}

}  // namespace
}  // namespace qknorm
