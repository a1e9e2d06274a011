// Wall-clock helpers of the local timing drivers.
#ifndef QKNORM_SIMD_TOOLS_TIMING_UTIL_H_
#define QKNORM_SIMD_TOOLS_TIMING_UTIL_H_

#include <algorithm>
#include <chrono>

namespace qknorm::simd::tools {

inline double Seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The fastest of `reps` runs of f, in seconds.
template <class F>
double BestOf(int reps, const F& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Seconds();
    f();
    best = std::min(best, Seconds() - t0);
  }
  return best;
}

}  // namespace qknorm::simd::tools

#endif  // QKNORM_SIMD_TOOLS_TIMING_UTIL_H_
