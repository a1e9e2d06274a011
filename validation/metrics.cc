#include "validation/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace qknorm::validation {
namespace {

// The values of ranks[0] <= ranks[1] of the sorted v (exactly what a sort
// would put there) into at[], and returns v's largest value; v is
// reordered. A full sort was a tenth of the default run, and selection by
// nth_element (introselect) still half of compare(): here one pass counts
// the values by the top 16 bits of their patterns (sign, exponent and 4
// significand bits: a sixteenth of an octave), which for values >= 0 order
// as the values do (+inf last), and nth_element then selects within the
// rank's bucket alone. Values with the sign bit set or NaN (compare() makes
// none: errors are >= 0 or +inf, spacings > 0) take the nth_element path.
double order_statistics(std::vector<double>* values, const size_t ranks[2],
                        double at[2]) {
  std::vector<double>& v = *values;
  constexpr int kShift = 48;
  constexpr uint64_t kInf = 0x7ff0000000000000ull;
  // Below kBucketMin values the 2^16-bucket count table costs more than it
  // saves (the fuzzers judge fields of a few elements, and zeroing the table
  // was 71% of the attention fuzzer's time): plain selection, the same
  // exact values.
  constexpr size_t kBucketMin = size_t{1} << 15;
  auto select = [&] {
    auto first = v.begin();
    std::nth_element(first, first + ranks[0], v.end());
    at[0] = v[ranks[0]];
    std::nth_element(first + ranks[0], first + ranks[1], v.end());
    at[1] = v[ranks[1]];
    return *std::max_element(first + ranks[1], v.end());
  };
  if (v.size() < kBucketMin) return select();
  std::vector<uint32_t> count(size_t{1} << (64 - kShift), 0);
  uint64_t top = 0;
  for (double x : v) {
    const uint64_t bits = std::bit_cast<uint64_t>(x);
    top = std::max(top, bits);
    ++count[bits >> kShift];
  }
  if (top > kInf) {  // a NaN or a negative value (an unsigned pattern above
                     // +inf's): select in the order of the values
    return select();
  }
  // The bucket of each rank and the rank within it.
  uint64_t bucket[2] = {0, 0};
  size_t within[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    size_t below = 0;
    uint64_t b = 0;
    while (below + count[b] <= ranks[r]) below += count[b++];
    bucket[r] = b;
    within[r] = ranks[r] - below;
  }
  std::vector<double> in[2];
  for (double x : v) {
    const uint64_t b = std::bit_cast<uint64_t>(x) >> kShift;
    if (b == bucket[0]) in[0].push_back(x);
    if (b == bucket[1] && bucket[1] != bucket[0]) in[1].push_back(x);
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<double>& c = bucket[r] == bucket[0] ? in[0] : in[1];
    std::nth_element(c.begin(), c.begin() + within[r], c.end());
    at[r] = c[within[r]];
  }
  return std::bit_cast<double>(top);
}

}  // namespace

CompareBasis compare_basis(const std::vector<long double>& expected,
                           Precision fmt) {
  CompareBasis b;
  long double scale = 0;
  b.spacing.resize(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const long double e = expected[i];
    if (!std::isfinite(e)) continue;
    scale = std::max(scale, std::fabs(e));
    b.spacing[i] = ulp(fmt, static_cast<double>(e));
  }
  b.scale = static_cast<double>(scale);
  return b;
}

ErrorStats compare(const std::vector<double>& actual,
                   const std::vector<long double>& expected, Precision fmt) {
  return compare(actual, expected, compare_basis(expected, fmt));
}

ErrorStats compare(std::span<const double> actual,
                   const std::vector<long double>& expected,
                   const CompareBasis& basis) {
  ErrorStats s;
  s.count = static_cast<int64_t>(expected.size());
  s.scale = basis.scale;
  s.rel_floor = s.scale * kRelFloorFraction;
  long double num = 0, den = 0;
  std::vector<double> ulps;
  ulps.reserve(expected.size());
  long double worst = -1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const long double e = expected[i];
    const double a = i < actual.size() ? actual[i] : NAN;
    long double err;
    if (!std::isfinite(e) || !std::isfinite(a)) {
      if (std::isinf(e) && a == static_cast<double>(e)) {
        err = 0;  // equal infinities: lse of a fully masked row
      } else {
        s.nonfinite_mismatch = true;
        err = INFINITY;
      }
    } else {
      err = std::fabs(static_cast<long double>(a) - e);
      num += err * err;
      den += e * e;
    }
    if (err > worst) {
      worst = err;
      s.worst_index = static_cast<int64_t>(i);
      s.worst_expected = static_cast<double>(e);
      s.worst_actual = a;
    }
    const double errd = static_cast<double>(err);
    s.max_abs = std::max(s.max_abs, errd);
    if (std::isfinite(e)) {
      const double denom =
          std::max(static_cast<double>(std::fabs(e)), s.rel_floor);
      if (denom > 0)
        s.max_rel = std::max(s.max_rel, errd / denom);
      else if (errd > 0)
        s.max_rel = INFINITY;
      ulps.push_back(errd / basis.spacing[i]);
    }
  }
  s.normwise = den > 0 ? static_cast<double>(std::sqrt(num / den))
                       : (num > 0 ? INFINITY : 0);
  if (s.nonfinite_mismatch) s.normwise = INFINITY;
  if (!ulps.empty()) {
    const size_t n = ulps.size();
    auto rank = [&](double q) {
      return std::min(static_cast<size_t>(q * static_cast<double>(n - 1) + 0.5),
                      n - 1);
    };
    const size_t ranks[] = {rank(0.5), rank(0.99)};
    double at[2];
    s.ulp_max = order_statistics(&ulps, ranks, at);
    s.ulp_p50 = at[0];
    s.ulp_p99 = at[1];
  }
  return s;
}

namespace {

// One ULP figure: two decimals up to a million ULPs, three significant
// digits beyond (an error at a value near 0 is ~1e17 ULPs of it, and
// f64's spacing near 0 makes one at 1e300 ULPs, several hundred digits in
// fixed point: issue 32's Zen 3 finding).
std::string ulp_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::fabs(x) < 1e6 ? "%.2f" : "%.3g", x);
  return buf;
}

}  // namespace

std::string describe(const ErrorStats& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "max_abs=%.3e max_rel=%.3e normwise=%.3e ulp p50/p99/max="
                "%s/%s/%s worst[%lld] expected=%.17g actual=%.17g "
                "scale=%.3e%s",
                s.max_abs, s.max_rel, s.normwise, ulp_text(s.ulp_p50).c_str(),
                ulp_text(s.ulp_p99).c_str(), ulp_text(s.ulp_max).c_str(),
                static_cast<long long>(s.worst_index), s.worst_expected,
                s.worst_actual, s.scale,
                s.nonfinite_mismatch ? " NONFINITE" : "");
  return buf;
}

}  // namespace qknorm::validation
