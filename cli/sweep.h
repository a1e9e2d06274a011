// Sweep mode: error against sequence length, g or input magnitude, one line
// per registry entry plus the sdpa baseline, written as CSV and drawn as a PNG
// by gnuplot (run as a subprocess).
#ifndef QKNORM_CLI_SWEEP_H_
#define QKNORM_CLI_SWEEP_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct SweepOptions {
  std::string over;                  // seq | g | magnitude
  double from = NAN, to = NAN;       // NaN: the defaults of `over`
  int points = 0;                    // 0: the default of `over`
  std::string out = "qknorm-sweep";  // writes OUT.csv, OUT.dat, OUT.gp, OUT.png
  bool no_plot = false;
  bool no_sdpa = false;
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
  std::string error;    // entry threw (e.g. input overflowed the format)
};

// The swept values of `o` (validated; throws qknorm::Error).
std::vector<double> sweep_values(const SweepOptions& o);

// Runs the sweep for `entries` (and the sdpa line of each precision's
// reference) and returns every point.
std::vector<SweepPoint> run_sweep_points(
    const SweepOptions& o, const SuiteOptions& s,
    const std::vector<const Backend*>& entries, int threads, bool progress);

// Runs gnuplot on `script` (argv, no shell; also used by power mode).
// Returns its exit status (127: gnuplot could not be started).
int run_gnuplot(const std::string& script);

int run_sweep(const SweepOptions& o, const SuiteOptions& s, int threads,
              std::ostream& out, std::ostream& err, bool progress);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_SWEEP_H_
