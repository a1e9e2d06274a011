// The report of a suite run: a compact table for people, JSON and CSV for CI
// dashboards.
#ifndef QKNORM_CLI_REPORT_H_
#define QKNORM_CLI_REPORT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cli/machine.h"
#include "cli/suite.h"

namespace qknorm::cli {

struct Report {
  std::string title = "qknorm-check";
  MachineInfo machine;
  uint64_t seed = 0;
  bool seeded = true;  // false: the cases came from files (compare)
  int threads = 0;
  std::vector<std::string> cases;  // case descriptions, in suite order
  std::vector<EntryRow> rows;
  double seconds = 0;
  // The default run's estimate made before it started (cli/cost.h; 0 and
  // empty elsewhere).
  double estimate_s = 0;
  std::string estimate;
  bool pass = true;  // every available row passes
};

// Sets report.pass from the rows (unavailable rows do not count).
void finalize(Report* report);

// One row per entry: backend:target:precision, per field max abs / max rel /
// ULP p50/p99/max (maxima over cases), ratio to the naive baseline, the
// worst err/limit, forward GFLOP/s and PASS/FAIL; then every failure.
void print_table(std::ostream& out, const Report& report);
// Everything, including each case's per-field statistics.
std::string to_json(const Report& report);
// One line per (entry, field) summary.
void write_csv(std::ostream& out, const Report& report);

// Compact number formats shared by the table printers.
std::string sci(double v);   // "1.2e-07"
std::string ulps(double v);  // "0.5", "12", "3e+04"

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_REPORT_H_
