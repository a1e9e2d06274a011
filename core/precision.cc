#include "qknorm/precision.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace qknorm {
namespace {

// 2^k as a double, exactly ldexp(1.0, k) (0 below the smallest subnormal
// 2^-1074, inf above 2^1023), built from its bits: ldexp is a libm call
// (glibc's __wrap_scalbn, which sets errno on overflow) and was a tenth of
// the default run's time, called several times per judged element.
constexpr double pow2(int k) {
  if (k > 1023) return std::numeric_limits<double>::infinity();
  if (k >= -1022)
    return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52);
  if (k >= -1074) return std::bit_cast<double>(uint64_t{1} << (k + 1074));
  return 0;
}

// The unbiased exponent of a finite, normal double (its ilogb).
int normal_exponent(double x) {
  return static_cast<int>((std::bit_cast<uint64_t>(x) >> 52) & 0x7ff) - 1023;
}

// Every per-precision constant, one row a storage format.
struct FormatInfo {
  std::string_view name;
  size_t bytes;  // element size in storage
  int digits;    // significand bits including the implicit bit
  int min_exp;   // exponent of the smallest normal, as 2^min_exp
  int max_exp;   // largest finite is (2 - 2^(1-digits)) * 2^max_exp
  // Derived from the above once (FormatInfo of()): unit roundoff, smallest
  // normal, largest finite.
  double u = 0, min_normal = 0, max_finite = 0;
};

constexpr FormatInfo of(std::string_view name, size_t bytes, int digits,
                        int min_exp, int max_exp) {
  return {name,          bytes,
          digits,        min_exp,
          max_exp,       pow2(-digits),
          pow2(min_exp), (2.0 - pow2(1 - digits)) * pow2(max_exp)};
}

constexpr FormatInfo kF64Info = of("f64", 8, 53, -1022, 1023);
constexpr FormatInfo kF32Info = of("f32", 4, 24, -126, 127);
constexpr FormatInfo kBF16Info = of("bf16", 2, 8, -126, 127);
constexpr FormatInfo kF16Info = of("f16", 2, 11, -14, 15);
// Not a Precision: named "?", f64's arithmetic, 2 bytes (as ever).
constexpr FormatInfo kUnknownInfo = of("?", 2, 53, -1022, 1023);

const FormatInfo& info(Precision p) {
  switch (p) {
    case Precision::kF64:
      return kF64Info;
    case Precision::kF32:
      return kF32Info;
    case Precision::kBF16:
      return kBF16Info;
    case Precision::kF16:
      return kF16Info;
  }
  return kUnknownInfo;
}

}  // namespace

std::string_view name(Precision p) { return info(p).name; }

bool parse_precision(std::string_view s, Precision* out) {
  for (Precision p : kAllPrecisions) {
    if (name(p) == s) {
      *out = p;
      return true;
    }
  }
  return false;
}

size_t element_bytes(Precision p) { return info(p).bytes; }

double unit_roundoff(Precision p) { return info(p).u; }
Precision compute_format(Precision p) {
  return p == Precision::kF64 ? Precision::kF64 : Precision::kF32;
}
double compute_roundoff(Precision p) {
  return unit_roundoff(compute_format(p));
}
double max_finite(Precision p) { return info(p).max_finite; }
double min_normal(Precision p) { return info(p).min_normal; }

double ulp(Precision p, double x) {
  const FormatInfo& f = info(p);
  x = std::fabs(x);
  int e = f.min_exp;
  if (x >= f.min_normal) {
    // ilogb(inf) is INT_MAX, whose power of two is inf.
    if (std::isinf(x)) return std::numeric_limits<double>::infinity();
    e = normal_exponent(x);  // x >= min_normal(p) >= 2^-1022: normal
  }
  return pow2(e - (f.digits - 1));
}

double round_to(Precision p, double x) {
  if (p == Precision::kF64 || !std::isfinite(x) || x == 0) return x;
  const FormatInfo& f = info(p);
  // ilogb(x), except for subnormal doubles, whose exponent is below every
  // 16- and 32-bit format's min_exp anyway.
  const int e = std::max(normal_exponent(x), f.min_exp);
  // Scale so that the last kept bit has weight 1, round to nearest even
  // (nearbyint in the default rounding mode), scale back: exact in double.
  // Both powers of two are normal doubles here (e in [min_exp, 1023]), so
  // each product is the correctly rounded x 2^k, as ldexp's.
  const double scaled = x * pow2((f.digits - 1) - e);
  const double r = std::nearbyint(scaled) * pow2(e - (f.digits - 1));
  if (std::fabs(r) > f.max_finite)
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

uint16_t bf16_from_f32(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  // Round to nearest even on the 16 dropped bits; overflow carries into the
  // exponent and yields Inf correctly.
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float f32_from_bf16(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

uint16_t f16_from_f32(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  // Exact value as a double: round with the generic routine, then pack.
  double r =
      round_to(Precision::kF16, static_cast<double>(std::bit_cast<float>(a)));
  if (std::isinf(r)) return static_cast<uint16_t>(sign | 0x7c00u);
  if (r == 0) return sign;
  // r is an f16 value (a normal double): the products below are exact.
  int e = normal_exponent(r);
  if (e < -14) {  // subnormal: r = m * 2^-24
    uint16_t m = static_cast<uint16_t>(r * 0x1p24);
    return static_cast<uint16_t>(sign | m);
  }
  uint16_t m = static_cast<uint16_t>(r * pow2(10 - e) - 1024.0);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | m);
}

float f32_from_f16(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  // Exact products (m < 2^11, a power of two in f16's range).
  double v =
      e == 0 ? static_cast<double>(m) * 0x1p-24
             : static_cast<double>(m + 1024) * pow2(static_cast<int>(e) - 25);
  return sign ? -static_cast<float>(v) : static_cast<float>(v);
}

void encode(Precision p, double x, void* dst, size_t i) {
  switch (p) {
    case Precision::kF64:
      static_cast<double*>(dst)[i] = x;
      return;
    case Precision::kF32:
      static_cast<float*>(dst)[i] = static_cast<float>(x);
      return;
    case Precision::kBF16:
      // round_to gives a bf16 value exactly, so the f32 step is exact too.
      static_cast<uint16_t*>(dst)[i] =
          bf16_from_f32(static_cast<float>(round_to(p, x)));
      return;
    case Precision::kF16:
      static_cast<uint16_t*>(dst)[i] =
          f16_from_f32(static_cast<float>(round_to(p, x)));
      return;
  }
}

double decode(Precision p, const void* src, size_t i) {
  switch (p) {
    case Precision::kF64:
      return static_cast<const double*>(src)[i];
    case Precision::kF32:
      return static_cast<const float*>(src)[i];
    case Precision::kBF16:
      return f32_from_bf16(static_cast<const uint16_t*>(src)[i]);
    case Precision::kF16:
      return f32_from_f16(static_cast<const uint16_t*>(src)[i]);
  }
  return 0;
}

}  // namespace qknorm
