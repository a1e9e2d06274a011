// The report of a suite run: a compact table for people, JSON and CSV for CI
// dashboards.
#ifndef QKNORM_CLI_REPORT_H_
#define QKNORM_CLI_REPORT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
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
  int jobs = 1;  // RunOptions::jobs of the run
  // A line of the header about how the suite was chosen (the default run at
  // production lengths: options.h long_run_note); empty: none.
  std::string note;
  std::vector<std::string> cases;  // case descriptions, in suite order
  // Each case's input class (validation/case.h), parallel to `cases`.
  std::vector<validation::InputClass> case_classes;
  // The classes --classes selected (only their cases ran); empty: every
  // class.
  std::vector<validation::InputClass> classes;
  std::vector<EntryRow> rows;
  double seconds = 0;
  // The default run's estimate made before it started (cli/cost.h; 0 and
  // empty elsewhere).
  double estimate_s = 0;
  std::string estimate;
  // The estimate's phases (seconds; pass and rows in sampled mode) and
  // what measuring the rates took.
  double est_oracle_s = 0, est_pass_s = 0, est_rows_s = 0, est_naive_s = 0,
         est_entries_s = 0, est_timing_s = 0, calibration_s = 0;
  // Sampled mode (--sample; 0: the full oracle) and its seed.
  int64_t sample_rows = 0;
  uint64_t sample_seed = 0;
  // Per attention case of the default run: the estimate and the measured
  // cost, with the sampled oracles (text: describe() once per case).
  std::vector<double> case_estimates;
  std::vector<CaseCost> case_costs;
  // The default run's covering cases (issue 33; cli/coverage.h) and its
  // "coverage" section (coverage_json; null: not the default suite).
  int covering_cases = 0;
  nlohmann::json coverage;
  bool pass = true;  // every available row passes
};

// Sets report.pass from the rows (unavailable rows do not count).
void finalize(Report* report);

// One row per entry: backend:target:precision, per field max abs / max rel /
// ULP p50/p99/max (maxima over cases), ratio to the naive baseline, the
// worst err/limit, forward GFLOP/s and PASS/FAIL; then the verdict per input
// class of every entry (class_line); then every failure, its class first.
void print_table(std::ostream& out, const Report& report);
// One entry's verdict per input class, one segment per class with cases:
// "PASS realistic 0.2 · FAIL extreme-range 5.5e7 (o[1,3,7,2] in case c2)
// · PASS degenerate 0.01" (the worst element only where the class FAILs).
std::string class_line(const EntryRow& row);
// Everything, including each case's per-field statistics.
std::string to_json(const Report& report);
// One line per (entry, field) summary (class and case "all"), then one per
// (entry, input class) and one per (entry, case), field "all", with the
// class, the case, the margin and the verdict.
void write_csv(std::ostream& out, const Report& report);

// Compact number formats shared by the table printers.
std::string sci(double v);   // "1.2e-07"
std::string ulps(double v);  // "0.5", "12", "3e+04"

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_REPORT_H_
