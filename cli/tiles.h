// The tile-boundary sweep (issue 19), `qknorm-check sweep --over tiles`:
// every selected entry runs square problems (q_len = kv_len = n, default
// 1x2xnx128, causal, the paper's formulation) whose lengths sit on the
// tile boundaries kernels break at, n = 2^k - 1, 2^k, 2^k + 1 (k >= 4) and
// block - 1, block, block + 1, 2 block - 1, 2 block + 1 for every block size
// an entry declares (Backend::block_sizes, probed at each 2^k and at --to)
// and the defaults 64 and 128, up to --to (default 32768). Each length is
// judged by the sampled oracle (validation/sampled.h): one oracle per
// (length, storage precision), shared by that precision's entries. One CSV
// row per (length, entry) and a gnuplot PNG of the worst margin against n.
#ifndef QKNORM_CLI_TILES_H_
#define QKNORM_CLI_TILES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cli/cost.h"
#include "cli/options.h"
#include "cli/sweep.h"

namespace qknorm::cli {

// The swept lengths in [from, to] (sorted, unique), each with why it is
// there ("2^8+1", "b64-1", "2b6+1", ...: b<size> a declared or default
// block), and the declared blocks with the entries declaring them.
struct TileLengths {
  std::vector<int64_t> n;
  std::map<int64_t, std::string> why;
  // block -> "simd:AVX2:f32 simd:AVX2:bf16 ..." ("default" for 64, 128).
  std::map<int64_t, std::string> blocks;
};

// `base`: the problem whose q_len and kv_len are replaced by n (the mask
// re-applied by `problem_at`). from == to: the one length `to`.
TileLengths tile_lengths(int64_t from, int64_t to,
                         const std::vector<const Backend*>& entries,
                         const std::function<AttentionProblem(int64_t)>& at);

// One (length, entry) point.
struct TilePoint {
  int64_t n = 0;
  std::string entry, precision, why;
  // The input class of the length's case (validation/case.h).
  validation::InputClass input_class = validation::InputClass::kRealistic;
  bool run = false;   // false: not run (entry unavailable, unsupported)
  bool pass = false;  // run and judged PASS
  double margin = 0;  // the worst element's err / bound (NaN: threw)
  std::string worst_field, worst_where;
  double seconds = 0;         // the entry's forward + backward, wall
  double oracle_seconds = 0;  // the shared sampled oracle of (n, precision)
  int64_t query_rows = 0, key_rows = 0;
  std::string note;     // why not run, the exception, or the failure
  std::string command;  // a reproducer of a failing point
};

// The problem of length n the options describe (shape, mask, g, eps,
// variant, formulation; throws qknorm::Error naming the option).
AttentionProblem tile_problem(const SuiteOptions& s, int64_t n);

// Runs every (length, entry) point. The case of length n is seeded s.seed + n
// and so is its sample; the sample's tile-boundary rows are those of every
// block of the entries and of every registry entry of the precision, so that
// a reproducer selecting one entry draws the same inputs and sample. `log`
// (may be null) gets one line per length and every failure with its
// reproducer (TilePoint::command) as they happen.
std::vector<TilePoint> run_tile_points(
    const SweepOptions& o, const SuiteOptions& s,
    const std::vector<const Backend*>& entries, int threads, bool progress,
    TileLengths* lengths = nullptr, std::ostream* log = nullptr);

// The sweep's estimated work (one sampled oracle per length and precision,
// every entry once per length), calibrated on this machine.
CostEstimate estimate_tile_sweep(const SweepOptions& o, const SuiteOptions& s,
                                 const std::vector<const Backend*>& entries,
                                 int threads);

int run_tile_sweep(const SweepOptions& o, const SuiteOptions& s, int threads,
                   std::ostream& out, std::ostream& err, bool progress);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_TILES_H_
