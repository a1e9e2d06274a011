// Sweep mode: error against sequence length, g or input magnitude, one line
// per registry entry plus the sdpa baseline, written as CSV and drawn as a PNG
// by gnuplot (run as a subprocess). `--over tiles` (cli/tiles.h) judges every
// entry at the tile-boundary lengths up to 32768 by the sampled oracle.
#ifndef QKNORM_CLI_SWEEP_H_
#define QKNORM_CLI_SWEEP_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cli/cost.h"
#include "cli/options.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct SweepOptions {
  std::string over;                  // seq | g | magnitude | tiles
  double from = NAN, to = NAN;       // NaN: the defaults of `over`
  int points = 0;                    // 0: the default of `over`
  std::string out = "qknorm-sweep";  // writes OUT.csv, OUT.dat, OUT.gp, OUT.png
  bool no_plot = false;
  bool no_sdpa = false;
  int64_t sample = 64;  // tiles: sampled query and key rows (each), at least
  // The budget (the top-level --max-seconds): every sweep estimates its
  // work first and stops before starting past it.
  double max_seconds = 600;
  // Workers (the top-level --jobs; cli/pool.h): the (x, variant) steps of
  // seq/g/magnitude and the lengths of tiles run on the pool, each into its
  // own slot: the CSV, plot and exit status are the same at any job count.
  int jobs = 1;
};

void add_sweep_options(CLI::App& app, SweepOptions& o);

// One point of one line.
struct SweepPoint {
  std::string line;     // entry name, "sdpa reference:f32", ...
  std::string variant;  // qknorm | sdpa
  std::string precision;
  double x = 0;
  double o_err = 0;     // max|O - oracle| / max|oracle O|
  double dq_err = 0;    // max|dQ - oracle| / max|oracle dQ|
  double max_prob = 0;  // oracle's mean over rows of max_j P_ij
  // The input class of the point's case as the entry reads it
  // (validation/case.h; --over magnitude moves it).
  validation::InputClass input_class = validation::InputClass::kRealistic;
  std::string error;  // entry threw (e.g. input overflowed the format)
};

// The swept values of `o` (validated; throws qknorm::Error).
std::vector<double> sweep_values(const SweepOptions& o);

// The estimate of a sweep over seq, g or magnitude (cli/cost.h
// estimate_sweep), its rates measured on this machine.
CostEstimate estimate_value_sweep(const SweepOptions& o, const SuiteOptions& s,
                                  const std::vector<const Backend*>& entries,
                                  int threads);

// Prints the estimate ("qknorm-check sweep: estimated work: ..."); past
// the budget, also why the sweep stops before starting and what to cut
// (`cut`: the sweep's own ways, then entries and the budget). True: within
// the budget.
bool within_budget(const CostEstimate& cost, double max_seconds,
                   const std::string& cut, std::ostream& err);

// Runs the sweep for `entries` (and the sdpa line of each precision's
// reference) and returns every point.
std::vector<SweepPoint> run_sweep_points(
    const SweepOptions& o, const SuiteOptions& s,
    const std::vector<const Backend*>& entries, int threads, bool progress);

// Runs gnuplot on `script` (argv, no shell; also used by power mode).
// Returns its exit status (127: gnuplot could not be started).
int run_gnuplot(const std::string& script);

// The precisions of `entries`, in first-seen order.
std::vector<Precision> precisions_of(
    const std::vector<const Backend*>& entries);

// The plots' colour of a precision ("#1f77b4", ...).
std::string sweep_color(Precision p);

// Writes PREFIX.csv, PREFIX.dat and PREFIX.gp, then (unless no_plot) runs
// gnuplot on the script, saying what it wrote (`points`, `lines`: counts for
// the message). Returns `verdict`, kExitInput if a file cannot be written,
// or kExitTool if gnuplot fails while `verdict` is kExitPass.
int write_sweep_files(const std::string& prefix, const std::string& csv,
                      const std::string& dat, const std::string& gp,
                      size_t points, size_t lines, bool no_plot, int verdict,
                      std::ostream& out, std::ostream& err);

int run_sweep(const SweepOptions& o, const SuiteOptions& s, int threads,
              std::ostream& out, std::ostream& err, bool progress);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_SWEEP_H_
