// `qknorm-check determinism` (issue 35, item 4): every selected entry runs
// `runs` times at each thread count on each attention case of the suite the
// common options select (the default suite without its covering cases, or
// --shape/...), and validation::check_determinism compares the runs bitwise
// and judges each one (validation/determinism.h has the rule and the
// causes). An entry declaring itself deterministic (Backend::deterministic,
// every production entry; a plug-in without QKNORM_FLAG_NONDETERMINISTIC)
// FAILs on any difference; for one declaring otherwise the table gives the
// run-to-run spread beside the bound (as a fraction of it). Exit 0 iff every
// (entry, case) passes.
#ifndef QKNORM_CLI_DETERMINISM_H_
#define QKNORM_CLI_DETERMINISM_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct DeterminismOptions {
  int runs = 3;                          // per thread count
  std::vector<int> thread_counts{1, 2};  // ExecConfig::threads of the runs
};

void add_determinism_options(CLI::App& app, DeterminismOptions& o);

// json: also write the rows as JSON there ("-": stdout, replacing the text).
int run_determinism(const DeterminismOptions& o, const SuiteOptions& suite,
                    const std::string& json, std::ostream& out,
                    std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_DETERMINISM_H_
