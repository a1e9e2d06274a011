#include "validation/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qknorm::validation {

ErrorStats compare(const std::vector<double>& actual,
                   const std::vector<long double>& expected, Precision fmt) {
  ErrorStats s;
  s.count = static_cast<int64_t>(expected.size());
  long double scale = 0;
  for (long double e : expected)
    if (std::isfinite(e)) scale = std::max(scale, std::fabs(e));
  s.scale = static_cast<double>(scale);
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
      ulps.push_back(errd / ulp(fmt, static_cast<double>(e)));
    }
  }
  s.normwise = den > 0 ? static_cast<double>(std::sqrt(num / den))
                       : (num > 0 ? INFINITY : 0);
  if (s.nonfinite_mismatch) s.normwise = INFINITY;
  if (!ulps.empty()) {
    // The order statistics of rank k50 <= k99 <= n - 1 of the sorted ulps,
    // found by selection (O(n)) rather than a full sort (it was a tenth of
    // the default run): nth_element puts exactly the value a sort would
    // put at a rank there, everything below it before it and everything
    // above after it, so each later rank is selected in the part above the
    // previous one. No ulp is NaN (errors are finite or +inf, spacings > 0),
    // so the order is total.
    const size_t n = ulps.size();
    auto rank = [&](double q) {
      return std::min(static_cast<size_t>(q * static_cast<double>(n - 1) + 0.5),
                      n - 1);
    };
    const size_t k50 = rank(0.5), k99 = rank(0.99);
    auto first = ulps.begin();
    std::nth_element(first, first + k50, ulps.end());
    s.ulp_p50 = ulps[k50];
    std::nth_element(first + k50, first + k99, ulps.end());
    s.ulp_p99 = ulps[k99];
    s.ulp_max = *std::max_element(first + k99, ulps.end());
  }
  return s;
}

std::string describe(const ErrorStats& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "max_abs=%.3e max_rel=%.3e normwise=%.3e ulp p50/p99/max="
                "%.2f/%.2f/%.2f worst[%lld] expected=%.17g actual=%.17g "
                "scale=%.3e%s",
                s.max_abs, s.max_rel, s.normwise, s.ulp_p50, s.ulp_p99,
                s.ulp_max, static_cast<long long>(s.worst_index),
                s.worst_expected, s.worst_actual, s.scale,
                s.nonfinite_mismatch ? " NONFINITE" : "");
  return buf;
}

}  // namespace qknorm::validation
