// `qknorm-check mutants`: the default suite's own mutation test (issue 15).
// Runs the suite qknorm-check runs on the registry (cli::run_suite on
// default_run_suite(): default_suite() and the budgeted covering cases of
// the registry's shape model, cli/coverage.h, unless suite options are
// given; --covering: the full array) over
// every deliberately broken backend and every legitimate control of
// mutants/mutants.h, and prints a kill table: each mutant must FAIL
// (caught: the fields and cases that fail) and each control must PASS.
//
// A mutant that passes is UNTRIGGERED if its outputs equal the unmutated
// copy's (property::unmutated) bit for bit on every case: the cases never
// exercise its bug, so no verdict could catch it there (the default suite
// has no f16 zero row and runs each entry on one thread). It is
// CORRECT-HERE if its MutantInfo::correct_when states a regime where its
// outputs are correct values (no_max_subtraction: the default suite's
// qknorm logits never reach exp's overflow threshold). The property suite
// covers both. Any other passing mutant SURVIVED: a miss of the verdict.
//
// Exit status: 0 iff no mutant SURVIVED, every precision mutant (issue 15)
// is caught, on the default suite every shape mutant (issue 33,
// MutantInfo::region: the budgeted covering array reaches each region's
// singles) is caught,
// and every control passes; 1 otherwise; 2 bad option (a filter that
// selects nothing).
#ifndef QKNORM_CLI_MUTANTS_H_
#define QKNORM_CLI_MUTANTS_H_

#include <ostream>

#include "cli/options.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct MutantsOptions {
  // Entries judged at once, each on one thread (0: one per core). The
  // mutant and control loops are single-threaded.
  int jobs = 0;
};

void add_mutants_options(CLI::App& app, MutantsOptions& o);

// `suite` selects the cases (as for the default run) and, through
// --backend / --precision / --target, which mutants and controls run.
int run_mutants(const MutantsOptions& o, const SuiteOptions& suite,
                std::ostream& out, std::ostream& err, bool progress);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_MUTANTS_H_
