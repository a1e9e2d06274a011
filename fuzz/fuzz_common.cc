#include "fuzz/fuzz_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace qknorm::fuzz {

const std::vector<double>& specials() {
  using DL = std::numeric_limits<double>;
  using FL = std::numeric_limits<float>;
  static const std::vector<double> table = {
      0.0, -0.0, 1.0, -1.0,
      // Non-finite: every one is invalid input.
      DL::quiet_NaN(), -DL::quiet_NaN(), DL::infinity(), -DL::infinity(),
      // Range ends of every storage format.
      DL::max(), -DL::max(), DL::min(), DL::denorm_min(), -DL::denorm_min(),
      FL::max(), -FL::max(), FL::min(), FL::denorm_min(), 65504.0, 0x1p-14,
      0x1p-24,               // f16 max, min normal, min sub
      0x1.fep127, 0x1p-133,  // bf16 max, min subnormal
      // Thresholds of the scaled norm (shared/NUMERICS.md): sum of squares
      // overflows f32 above ~1.8e19, Blue's constants.
      1.8e19, 0x1p52, 0x1p-63, 0x1p486, 0x1p-511,
      // Just above the f16 max and the f32 max (round to Inf in storage).
      65520.0, 0x1.ffffffp127,
      // Default eps values and the paper's g range.
      kDefaultQKNormEps, 1e-5, 12.3197, 24.85, 30.0, -3.0, 0.5, 1e-300};
  return table;
}

uint16_t ByteReader::u16() {
  uint16_t lo = u8();
  return static_cast<uint16_t>(lo | (static_cast<uint16_t>(u8()) << 8));
}
uint32_t ByteReader::u32() {
  uint32_t lo = u16();
  return lo | (static_cast<uint32_t>(u16()) << 16);
}
uint64_t ByteReader::u64() {
  uint64_t lo = u32();
  return lo | (static_cast<uint64_t>(u32()) << 32);
}

double ByteReader::scalar(double default_value) {
  const uint8_t tag = u8();
  switch (tag % 8) {
    case kSmall:
      return static_cast<int8_t>(u8()) / 4.0;
    case kSpecial: {
      const auto& t = specials();
      return t[u8() % t.size()];
    }
    case kF16Bits:
      return f32_from_f16(u16());
    case kBF16Bits:
      return f32_from_bf16(u16());
    case kF32Bits: {
      uint32_t b = u32();
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    case kF64Bits: {
      uint64_t b = u64();
      double d;
      std::memcpy(&d, &b, 8);
      return d;
    }
    case kPow2: {
      const int m = static_cast<int8_t>(u8());
      const int e = static_cast<int16_t>(u16());
      return std::ldexp(static_cast<double>(m), e);
    }
    default:
      return default_value;
  }
}

int64_t ByteReader::dim() {
  const uint8_t tag = u8();
  switch (tag % 4) {
    case kDim4:
      return 1 + u8() % 4;
    case kDim16:
      return 1 + u8() % 16;
    case kDimInt8:
      return static_cast<int8_t>(u8());
    default:
      return static_cast<int64_t>(u64());
  }
}

ByteWriter& ByteWriter::u8(uint8_t v) {
  bytes_.push_back(v);
  return *this;
}
ByteWriter& ByteWriter::u16(uint16_t v) {
  return u8(static_cast<uint8_t>(v)).u8(static_cast<uint8_t>(v >> 8));
}
ByteWriter& ByteWriter::u32(uint32_t v) {
  return u16(static_cast<uint16_t>(v)).u16(static_cast<uint16_t>(v >> 16));
}
ByteWriter& ByteWriter::u64(uint64_t v) {
  return u32(static_cast<uint32_t>(v)).u32(static_cast<uint32_t>(v >> 32));
}

ByteWriter& ByteWriter::scalar(double x) {
  const double m = x * 4;
  if (m == std::trunc(m) && m >= -128 && m <= 127 &&
      !std::signbit(x) == !(m < 0))
    return u8(kSmall).u8(static_cast<uint8_t>(static_cast<int8_t>(m)));
  const auto& t = specials();
  for (size_t i = 0; i < t.size(); ++i)
    if (std::memcmp(&t[i], &x, sizeof x) == 0)
      return u8(kSpecial).u8(static_cast<uint8_t>(i));
  const float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || std::isnan(x)) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return u8(kF32Bits).u32(b);
  }
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return u8(kF64Bits).u64(b);
}

ByteWriter& ByteWriter::dim(int64_t v) {
  if (v >= 1 && v <= 16) return u8(kDim16).u8(static_cast<uint8_t>(v - 1));
  return u8(kDimInt64).u64(static_cast<uint64_t>(v));
}

void fail(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "qknorm fuzz: %s\n%s\n", what.c_str(), detail.c_str());
  std::fflush(stderr);
  std::abort();
}

void log_verdict(const validation::AgreementReport& rep, const Context& ctx) {
  static const char* path = std::getenv("QKNORM_FUZZ_VERDICT_LOG");
  if (path == nullptr || *path == '\0') return;
  std::FILE* f = std::fopen(path, "a");
  if (f == nullptr) fail("cannot append to QKNORM_FUZZ_VERDICT_LOG", path);
  std::string where = rep.entry_name + " |" + ctx.str();
  std::replace(where.begin(), where.end(), '\n', ' ');
  for (const auto& fv : rep.fields)
    std::fprintf(f, "%s | %s pass=%d margin=%.17g naive=%.17g worst=%lld\n",
                 where.c_str(), validation::name(fv.id), fv.pass ? 1 : 0,
                 fv.margin, fv.naive_margin,
                 static_cast<long long>(fv.worst_index));
  std::fclose(f);
}

int64_t required_size(const Layout4& l, int64_t B, int64_t H, int64_t rows,
                      int64_t D) {
  if (l.batch_stride < 0 || l.head_stride < 0 || l.row_stride < 0) return -1;
  // Raw-layout mode decodes dims from the bytes: B - 1 below would overflow
  // for B = INT64_MIN (found by the CI fuzz run, UBSan).
  if (B < 1 || H < 1 || rows < 1 || D < 1) return -1;
  int64_t last = D, t;
  bool ovf = __builtin_mul_overflow(B - 1, l.batch_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  ovf |= __builtin_mul_overflow(H - 1, l.head_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  ovf |= __builtin_mul_overflow(rows - 1, l.row_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  return ovf ? -1 : last;
}

bool compute_range_ok(double g, double eps, Precision prec) {
  constexpr double kF32Max = std::numeric_limits<float>::max();
  return prec == Precision::kF64 || (static_cast<float>(eps) > 0 &&
                                     eps <= kF32Max && std::fabs(g) <= kF32Max);
}

bool near_clamp_kink(const std::vector<double>& x, int64_t D, double eps,
                     Precision prec) {
  const long double tol =
      (D + 8) * compute_roundoff(prec) * static_cast<long double>(eps);
  for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
       r += static_cast<size_t>(D)) {
    long double s = 0;
    for (int64_t d = 0; d < D; ++d) {
      const long double v = x[r + static_cast<size_t>(d)];
      s += v * v;
    }
    if (std::fabs(std::sqrt(s) - eps) <= tol) return true;
  }
  return false;
}

bool representable(long double x, Precision fmt) {
  return std::isfinite(x) && std::fabs(x) <= max_finite(fmt) / 2;
}

bool representable(const std::vector<long double>& x, Precision fmt,
                   bool allow_neg_inf) {
  for (long double v : x) {
    if (allow_neg_inf && v == -std::numeric_limits<long double>::infinity())
      continue;
    if (!representable(v, fmt)) return false;
  }
  return true;
}

}  // namespace qknorm::fuzz
