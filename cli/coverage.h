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

// Appends the covering array of union_model(entries, threads) to the
// default suite `s`: Gaussian cases, seeds after default_suite(seed)'s last
// (its attention and ScaleNorm cases keep theirs). Returns how many.
int append_covering(Suite* s, const std::vector<const Backend*>& entries,
                    int threads, uint64_t seed);

// The suite of the default run: build_suite(o), plus the covering cases if
// o selects the default suite (then filtered by --classes as the rest).
// *covering: how many covering cases it holds.
Suite default_run_suite(const SuiteOptions& o,
                        const std::vector<const Backend*>& entries, int threads,
                        int* covering);

// What the attention cases of a suite that an entry supports reach in the
// entry's own model (its blocks, the run's threads, the needs it supports).
struct EntryCoverage {
  std::string entry;
  std::shared_ptr<const validation::coverage::Model> model;
  std::shared_ptr<validation::coverage::Tally> tally;
  int cases = 0;  // attention cases it supports
};
std::vector<EntryCoverage> suite_coverage(
    const std::vector<const Backend*>& entries, const Suite& s, int threads);

// The report's "coverage" section: the union model (cells, needs, n/a
// pairs) and per entry reached / feasible singles and pairs and the labels
// of the unreached ones.
nlohmann::json coverage_json(const validation::coverage::Model& model,
                             const std::vector<EntryCoverage>& entries,
                             int covering_cases);

// `qknorm-check coverage`: prints the model and, for the suite the common
// options select, what each entry reaches and misses; exit 0 iff every
// entry reaches every feasible single and pair within its needs.
struct CoverageOptions {
  bool pairs = false;  // list every unreached pair (default: the first 10)
  std::string json;    // also write the JSON section to this file
};
void add_coverage_options(CLI::App& app, CoverageOptions& o);
int run_coverage(const CoverageOptions& opt, const SuiteOptions& suite,
                 int threads, std::ostream& out, std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COVERAGE_H_
