// Error metrics between an implementation's output and the oracle's.
#ifndef QKNORM_VALIDATION_METRICS_H_
#define QKNORM_VALIDATION_METRICS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qknorm/precision.h"

namespace qknorm::validation {

struct ErrorStats {
  int64_t count = 0;
  double max_abs = 0;    // max |a - e|
  double max_rel = 0;    // max |a - e| / max(|e|, rel_floor)
  double rel_floor = 0;  // the floor used (see compare())
  double normwise = 0;   // ||a - e||_2 / ||e||_2 (0 if both are 0)
  // |a - e| / ulp_fmt(e): error in units of the format's spacing at e.
  double ulp_p50 = 0, ulp_p99 = 0, ulp_max = 0;
  int64_t worst_index = -1;  // argmax of |a - e| (-1 if count == 0)
  double worst_expected = 0, worst_actual = 0;
  double scale = 0;                 // max |e|
  bool nonfinite_mismatch = false;  // a NaN, or an Inf where e is finite
};

// Relative-error floor: |e| below kRelFloorFraction * max|e| is measured
// against that floor, so elements that are exactly or nearly zero (masked
// rows, cancelling gradients) do not turn roundoff-sized absolute errors into
// huge relative ones. 2^-20 keeps the floor below every value whose relative
// error a 16-bit format can still resolve.
inline constexpr double kRelFloorFraction = 0x1p-20;

// Equal infinities (lse of fully masked rows) count as zero error; any other
// non-finite actual sets nonfinite_mismatch and max_abs = +inf.
ErrorStats compare(const std::vector<double>& actual,
                   const std::vector<long double>& expected, Precision fmt);

// What compare() derives from the expected values alone: the scale max |e|
// and the format's spacing at each finite e (0 elsewhere). A verdict that
// compares two results with the same expected values (the entry's and the
// naive baseline's) derives it once.
struct CompareBasis {
  double scale = 0;
  std::vector<double> spacing;
};
CompareBasis compare_basis(const std::vector<long double>& expected,
                           Precision fmt);
// compare(actual, expected, fmt) with basis = compare_basis(expected, fmt):
// the same statistics, bit for bit.
ErrorStats compare(std::span<const double> actual,
                   const std::vector<long double>& expected,
                   const CompareBasis& basis);

std::string describe(const ErrorStats& s);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_METRICS_H_
