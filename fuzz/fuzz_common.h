// Shared pieces of the qknorm fuzz targets: the byte format the targets
// decode (and the corpus generator encodes), the "representable" domain, and
// the failure reporting; the strided test buffers are validation/buffers.h's.
//
// Byte format. Every field is read front to back; a reader that runs out of
// bytes yields 0 bytes, so every prefix of an input is itself an input.
// A scalar is a tag byte followed by its payload, kind = tag % 8:
//   0 small:   int8 m, value m / 4                 (1 byte)
//   1 special: kSpecials[byte % size]              (1 byte: +-0, NaN, +-Inf,
//              +-max and min-normal/subnormal of every format, ...)
//   2 f16 bits, 3 bf16 bits (2 bytes), 4 f32 bits (4 bytes),
//   5 f64 bits (8 bytes): raw IEEE bits, so every NaN payload, subnormal and
//              infinity is reachable (FuzzedDataProvider::ConsumeFloatingPoint
//              never yields NaN or Inf: shared/NUMERICS.md)
//   6 pow2:    int8 m, int16 e, value ldexp(m, e)  (3 bytes; huge and tiny
//              magnitudes with few significant bits)
//   7 default: the parameter's documented default (eps) or 1 (elsewhere)
// A dimension is a tag byte, kind = tag % 4:
//   0 1 + byte % 4, 1 1 + byte % 16 (small, valid), 2 int8 (may be <= 0),
//   3 raw int64 (8 bytes: 0, negative, overflowing products, ...).
#ifndef QKNORM_FUZZ_FUZZ_COMMON_H_
#define QKNORM_FUZZ_FUZZ_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/error.h"
#include "qknorm/precision.h"
#include "validation/baseline_bounds.h"
#include "validation/buffers.h"
#include "validation/judge.h"

namespace qknorm::fuzz {

enum ScalarKind : uint8_t {
  kSmall = 0,
  kSpecial = 1,
  kF16Bits = 2,
  kBF16Bits = 3,
  kF32Bits = 4,
  kF64Bits = 5,
  kPow2 = 6,
  kDefault = 7,
};
enum DimKind : uint8_t { kDim4 = 0, kDim16 = 1, kDimInt8 = 2, kDimInt64 = 3 };

// The special-value table of kSpecial.
const std::vector<double>& specials();

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  double scalar(double default_value = 1.0);
  int64_t dim();
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// The inverse of ByteReader, for the corpus generator and unit tests.
class ByteWriter {
 public:
  ByteWriter& u8(uint8_t v);
  ByteWriter& u16(uint16_t v);
  ByteWriter& u32(uint32_t v);
  ByteWriter& u64(uint64_t v);
  // Encodes x exactly: kSmall when x = m/4 with int8 m, a special when x is
  // in the table (bitwise), f32 bits when x is a float, else f64 bits.
  ByteWriter& scalar(double x);
  ByteWriter& scalar_default() { return u8(kDefault); }
  ByteWriter& dim(int64_t v);  // kDim16 for 1..16, else raw int64
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Prints "qknorm fuzz: <what>\n<detail>" to stderr and aborts (libFuzzer
// records the input as a crash; the replay test fails).
[[noreturn]] void fail(const std::string& what, const std::string& detail = "");

// A failure context (entry, case, values), built the first time it is read:
// the checks read it only when they fail or log. Built for every entry of
// every input, the attention target's (every value of a small case through
// snprintf) took ~3% of each execution (perf, issue 32).
class Context {
 public:
  Context(std::string text) : text_(std::move(text)), made_(true) {}  // NOLINT
  explicit Context(std::function<std::string()> make)
      : make_(std::move(make)) {}
  const std::string& str() const {
    if (!made_) {
      text_ = make_();
      made_ = true;
    }
    return text_;
  }

 private:
  std::function<std::string()> make_;
  mutable std::string text_;
  mutable bool made_ = false;
};

// With QKNORM_FUZZ_VERDICT_LOG=<file> set, appends one line per judged field
// of `rep` to <file>: the context (entry, case), the field, its verdict, its
// margin and the naive's (%.17g). Replaying the corpus with it set before and
// after a restructuring, then diffing the two files, proves that no verdict
// or margin moved (validation/README.md). Unset: does nothing.
void log_verdict(const validation::AgreementReport& rep, const Context& ctx);

// Runs `body`; `expect_error` says whether the fuzzer's own model of the
// validation rules calls the input invalid. Invalid input must throw
// qknorm::Error, valid input must not throw; any other exception type fails.
// Returns true iff body completed without throwing.
template <class F>
bool expect_outcome(bool expect_error, const Context& ctx, F&& body) {
  try {
    body();
  } catch (const Error& e) {
    if (!expect_error)
      fail("valid input raised qknorm::Error",
           ctx.str() + "\n  what(): " + e.what());
    return false;
  } catch (const std::exception& e) {
    fail("exception other than qknorm::Error",
         ctx.str() + "\n  what(): " + e.what());
  } catch (...) {
    fail("non-std exception", ctx.str());
  }
  if (expect_error)
    fail("invalid input was accepted (no qknorm::Error)", ctx.str());
  return true;
}

// The layout mode's strided buffers are validation::TensorBuffer in its
// raw-layout mode (validation/buffers.h): the decoded Layout4 and size, no
// guard beyond `size`, and every element the layout does not address holds
// the poison NaN pattern (payload 0x5a): an input kernel that reads one
// propagates NaN; an output kernel that writes one is caught by
// guards_intact(); overlapping() tells a layout that addresses an element
// twice.
using validation::TensorBuffer;

inline bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}
inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}
inline double sum_abs(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += std::fabs(v);
  return s;
}

// Smallest max(||row||, eps) of a dense [rows, D] array, in long double.
inline long double min_row_norm(const std::vector<double>& x, int64_t D,
                                double eps) {
  long double m = std::numeric_limits<long double>::infinity();
  for (size_t r = 0; r < x.size(); r += static_cast<size_t>(D)) {
    long double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<long double>(x[r + d]) * x[r + d];
    m = std::min(m, std::max<long double>(std::sqrt(s), eps));
  }
  return m;
}

// a + b, saturated at INT64_MAX (strides decoded from huge dims).
inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t s;
  return __builtin_add_overflow(a, b, &s) ? INT64_MAX : s;
}

// Last addressed offset + 1 of the layout, or -1 if a stride is negative or
// the computation overflows int64 (the model of validate_tensor).
int64_t required_size(const Layout4& l, int64_t B, int64_t H, int64_t rows,
                      int64_t D);

// The model of validate.h's compute-range rule: entries computing in f32
// need eps > 0 after conversion to f32, eps <= FLT_MAX and |g| <= FLT_MAX.
bool compute_range_ok(double g, double eps, Precision prec);

// True iff some row of the dense [rows, D] array x has a norm within the
// rounding distance (D + 8) u_c of eps, u_c the compute roundoff of `prec`.
// The normalization's gradient jumps at ||x|| = eps (dx = (du - u (u.du)) / n
// above, du / eps below): a kernel's rounded norm, or eps rounded to f32, may
// land on the other side of the kink than the oracle, so gradients of such
// rows are not comparable (found by the fuzzer: ScaleNorm, dim 1).
bool near_clamp_kink(const std::vector<double>& x, int64_t D, double eps,
                     Precision prec);

// True iff every value is finite and |value| <= max_finite(fmt) / 2 (the
// headroom keeps the rounding of a correct result away from overflow).
bool representable(const std::vector<long double>& x, Precision fmt,
                   bool allow_neg_inf = false);
bool representable(long double x, Precision fmt);

// The naive baselines are judged by the componentwise verdict like every
// entry (validation/rule.h; the naive is no part of any bound). On top
// of that they are held to their a-priori bounds (baseline_bounds.h), for
// the fields named in `fields`. Only fields whose bound holds for arbitrary
// finite input are listed by the targets: the gradient bounds take
// max|oracle field| as the magnitude of the terms summed, which cancellation
// (dP - delta, dy - u (u . dy)) breaks for fuzzed input (see README.md).
// The a-priori bounds are relative (gamma * magnitude); a result or an
// intermediate in the subnormal range of the storage format carries an
// absolute error instead, up to one spacing ulp(fmt, 0) per rounding, which
// later products amplify (|g| for ScaleNorm's y = g u, |v| for O = P V,
// |dy| for dg = sum dy . u). underflow_slack allows `terms` such roundings
// plus 16, times the amplification `gain` (at least 1).
inline double underflow_slack(Precision storage, int64_t terms,
                              double gain = 1) {
  return (2.0 * static_cast<double>(terms) + 16) * ulp(storage, 0) *
         std::max(1.0, gain);
}

// One field checked against its a-priori bound plus an absolute slack.
struct BaselineField {
  validation::Field field;
  double slack;
};

template <class Bounds>
void check_baseline(const validation::AgreementReport& rep, const Bounds& b,
                    std::initializer_list<BaselineField> fields) {
  for (const auto& f : rep.fields) {
    const BaselineField* listed = nullptr;
    for (const BaselineField& n : fields)
      if (f.id == n.field) listed = &n;
    if (listed == nullptr) continue;
    const double bound = validation::bound_of(b, f.id) + listed->slack;
    if (f.entry.nonfinite_mismatch || !(f.entry.max_abs <= bound)) {
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "  field %s: err=%.6e > a-priori bound %.6e\n",
                    validation::name(f.id), f.entry.max_abs, bound);
      fail("naive baseline exceeds its a-priori error bound",
           "entry " + rep.entry_name + " on " + rep.case_desc + "\n" + buf +
               "    entry: " + validation::describe(f.entry));
    }
  }
}

}  // namespace qknorm::fuzz

#endif  // QKNORM_FUZZ_FUZZ_COMMON_H_
