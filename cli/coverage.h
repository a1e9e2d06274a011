// The shape-coverage model in the default run (issue 33): the covering
// cases appended to the default suite, what each entry's cases reach, the
// `coverage` subcommand and the report's "coverage" section.
// validation/coverage.h is the model; cli/README.md, "Shape coverage".
#ifndef QKNORM_CLI_COVERAGE_H_
#define QKNORM_CLI_COVERAGE_H_

#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/suite.h"
#include "qknorm/backend.h"
#include "validation/coverage.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

// The thread count the model's batch cell ">threads" counts: --threads if
// given, else every core (at least 2).
int coverage_threads(int threads);

// The model of the union of `entries`: every block any of them declares.
validation::coverage::Model union_model(
    const std::vector<const Backend*>& entries, int threads);

// The logit scale of the covering cases: the paper's g_init(72).
double covering_g();

// The covering cases of union_model(entries, threads) that `mode` selects:
// the budgeted array (validation::coverage::budgeted_covering_array at
// kDefaultBudget), the full one, or none. case_cap: the cost() up to which
// a pair counts as in budget in the report: the budgeted array's cap (also
// for kNone: what the default run reaches), infinity for kFull.
struct CoveringCases {
  std::vector<AttentionProblem> cases;
  double case_cap = 0;
  double cost = 0;  // sum of cost() over cases
};
CoveringCases covering_cases(const std::vector<const Backend*>& entries,
                             int threads, Covering mode);

// Appends `cases` to the default suite `s`: Gaussian cases, seeds after
// default_suite(seed)'s last (its attention and ScaleNorm cases keep
// theirs).
void append_covering(Suite* s, const std::vector<AttentionProblem>& cases,
                     uint64_t seed);

// The suite of the default run: build_suite(o), plus the covering cases
// o.covering selects if o selects the default suite (then filtered by
// --classes as the rest). *covering: how many covering cases it holds;
// *case_cap (if given): the report's cap (covering_cases; for a custom
// suite the budgeted array's).
Suite default_run_suite(const SuiteOptions& o,
                        const std::vector<const Backend*>& entries, int threads,
                        int* covering, double* case_cap = nullptr);

// What the attention cases of a suite that an entry supports reach in the
// entry's own model (its blocks, the run's threads, the needs it supports).
// The unreached pairs are split by their cheapest problem's cost() in that
// model (validation::coverage::pair_costs): over case_cap they are over the
// budget (the full array, --covering, reaches them); at most case_cap they
// are missed.
struct EntryCoverage {
  std::string entry;
  std::shared_ptr<const validation::coverage::Model> model;
  std::shared_ptr<validation::coverage::Tally> tally;
  int cases = 0;      // attention cases it supports
  int in_budget = 0;  // feasible pairs within its needs and case_cap
  std::vector<std::pair<int, int>> missed, over_budget;
  // Every single and every pair within the budget reached.
  bool complete() const {
    return tally->singles_reached() == tally->singles_feasible() &&
           missed.empty();
  }
};
std::vector<EntryCoverage> suite_coverage(
    const std::vector<const Backend*>& entries, const Suite& s, int threads,
    double case_cap);

// The report's "coverage" section: the union model (cells, needs, n/a
// pairs), the budget (mode, budget, case cap, the cases' cost()) and per
// entry reached / feasible singles and pairs (and the pairs in budget),
// the labels of the unreached singles, of the missed pairs (in budget) and
// of the pairs over the budget.
nlohmann::json coverage_json(const validation::coverage::Model& model,
                             const std::vector<EntryCoverage>& entries,
                             int covering_cases, Covering mode,
                             double case_cap);

// `qknorm-check coverage`: prints the model and, for the suite the common
// options select, what each entry reaches and misses; exit 0 iff every
// entry reaches every feasible single within its needs and every feasible
// pair within its needs and the budget (with --covering: every pair).
struct CoverageOptions {
  bool pairs = false;  // list every unreached pair (default: the first 10)
  std::string json;    // also write the JSON section to this file
};
void add_coverage_options(CLI::App& app, CoverageOptions& o);
int run_coverage(const CoverageOptions& opt, const SuiteOptions& suite,
                 int threads, std::ostream& out, std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COVERAGE_H_
