// Power mode (issue 15, item 4): the suite measures its own detection power.
//
// It takes correct outputs (those of real registry entries on QKNorm
// attention cases), injects relative errors into them and asks the verdict
// (validation::judge_attention, the componentwise rule of
// validation/rule.h) whether it catches them; torch.testing.assert_close's
// default rule is applied to the same corrupted outputs, side by side.
//
// Injection. The selected elements x of a field (one element, one row = the
// D elements of one [b,h,n], one head = every row of one [b,h], or the whole
// field) become round_to(fmt, x (1 + s r)), fmt the field's storage format,
// s = +-1 per element (random, or + with --sign plus). An injection that
// rounds back to the stored value is invisible: the effective relative error
// max |x' - x| / |x| over the selected elements is reported beside r.
//
// Trials. For each (precision, distribution, field, granularity), `trials`
// trials cycle over the (entry, case) runs and pick a random target: an
// element among the field's elements that are not ill-conditioned
// (kappa_e <= validation::kIllConditioned) and whose stored value is finite
// and nonzero (a relative error cannot move 0 or inf); a row or a head among
// those with at least one finite nonzero element (its ill-conditioned
// elements are injected too, and counted); for the field, the whole field.
// A trial's threshold is the smallest grid value r such that the injection
// is caught at r and at every larger grid value (scanned from the top down;
// "never" if not caught at the top). The row's threshold is the largest trial
// threshold (every trial caught) and the median trial's.
//
// "Caught" means the corrupted output FAILs because of the injection: an
// injected element that passes uncorrupted fails corrupted. The verdict is
// componentwise, so the scan judges the injected elements with
// validation::judge_element on the field's table; each trial's threshold is
// then confirmed with the full verdict (judge_attention on the whole
// corrupted field: FAIL at the threshold, PASS one grid step below) wherever
// the uncorrupted field passes; a disagreement is reported and fails the
// run. assert_close's thresholds are found the same way on the same
// injections (its element rule below). Where assert_close already fails the
// uncorrupted field (a false alarm), the whole-tensor assert_close fails at
// any r; its thresholds then say what it would catch among the elements it
// still accepts, and trials whose injected elements it rejects uncorrupted
// are left out of its figures.
//
// False alarms: the (entry, case, distribution) runs whose uncorrupted
// outputs FAIL (the verdict on o, lse, dq, dk, dv, dg; assert_close on the
// same fields). assert_close's rule, per element, with expected = the oracle
// (as double) and the default tolerances of the entry's precision (the
// model's dtype, for lse and dg too, which this project returns in f32):
//   close iff actual == expected, or |actual - expected| is finite and
//   <= atol + |rtol expected|    (torch.isclose, equal_nan=False).
#ifndef QKNORM_CLI_POWER_H_
#define QKNORM_CLI_POWER_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "qknorm/precision.h"
#include "validation/judge.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct PowerOptions {
  int trials = 8;
  std::vector<std::string> fields;  // o lse dq dk dv dg; default o dq dk dv
  std::vector<std::string>
      granularities;  // element row head field (default all)
  double r_min = 1e-7, r_max = 1;
  int per_decade = 4;
  std::string sign = "random";  // random | plus
  std::string out;              // PREFIX: PREFIX.csv .dat .gp .png
  bool no_plot = false;
  bool quick = false;
  std::string torch_dump;  // DIR: arrays + manifest for the torch cross-check
  // Workers (the top-level --jobs; cli/pool.h): each (precision,
  // distribution)'s cases, (case, entry) runs and (field, granularity)
  // rows run on the pool, each into its own slot: the table, CSV and exit
  // status are the same at any job count.
  int jobs = 1;
};

void add_power_options(CLI::App& app, PowerOptions& o);

enum class Granularity { kElement, kRow, kHead, kField };
const char* name(Granularity g);

// torch.testing.assert_close's default (rtol, atol) for a tensor of dtype p.
struct AssertCloseTol {
  double rtol = 0, atol = 0;
};
AssertCloseTol assert_close_defaults(Precision p);
// torch.isclose(actual, expected, rtol, atol, equal_nan=False) in float64.
bool assert_close_element(double actual, double expected, AssertCloseTol t);

// The injected-error grid: per_decade points per decade from r_min to r_max
// (powers of ten on it), plus the target values that lie in range,
// ascending. Throws qknorm::Error on a bad range.
std::vector<double> power_grid(double r_min, double r_max, int per_decade);

// The target for a single element (kElement) or a row / head, in
// precision p, for fields o, dq, dk, dv; NaN where the issue sets none (f64,
// the whole field, lse, dg).
double power_target(Precision p, Granularity g, validation::Field f);

int run_power(const PowerOptions& o, const SuiteOptions& s, int threads,
              std::ostream& out, std::ostream& err, bool progress);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_POWER_H_
