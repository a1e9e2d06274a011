#include "cli/sweep.h"

#include <CLI/CLI.hpp>

namespace qknorm::cli {
void add_sweep_options(CLI::App& app, SweepOptions& o) {
  app.add_option("--over", o.over, "seq, g or magnitude")->required();
}
int run_sweep(const SweepOptions&, const SuiteOptions&, int, std::ostream&,
              std::ostream& err, bool) {
  err << "sweep: not yet\n";
  return 2;
}
}  // namespace qknorm::cli
