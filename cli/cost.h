// What a qknorm-check run will cost, estimated before it starts (issue 19):
// the long-double oracle and the naive baseline once per (attention case,
// storage precision), every entry once per case, and the forward timing.
// Each is calibrated on this machine by timing one small attention problem
// (oracle, naive f64, each entry, forward and backward), then scaled by the
// work of each case, B * H * Nq * Nk * D (the O(n^2 D) part; masks are not
// discounted, so the estimate is an upper bound for masked cases). ScaleNorm
// is O(rows * dim) and left out.
#ifndef QKNORM_CLI_COST_H_
#define QKNORM_CLI_COST_H_

#include <string>
#include <vector>

#include "cli/suite.h"
#include "qknorm/backend.h"

namespace qknorm::cli {

struct CostEstimate {
  double oracle_s = 0, naive_s = 0, entries_s = 0, timing_s = 0;
  double calibration_s = 0;  // what measuring the rates took
  int attention_cases = 0, entries = 0;
  double work = 0;  // sum over attention cases of B * H * Nq * Nk * D
  double total() const { return oracle_s + naive_s + entries_s + timing_s; }
};

CostEstimate estimate_cost(const std::vector<const Backend*>& entries,
                           const Suite& suite, const ExecConfig& exec,
                           bool time_forward);

// "estimated work: 9 attention cases x 21 entries (work 6.4e+07): oracle
// ~3.1 s, naive ~0.4 s, entries ~2.2 s, timing ~1.1 s; total ~6.8 s"
std::string describe(const CostEstimate& c);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COST_H_
