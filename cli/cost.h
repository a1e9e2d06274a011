// What a qknorm-check run will cost, estimated before it starts (issue 19).
//
// Full mode: the long-double oracle and the naive baseline once per
// (attention case, storage precision), every entry once per case, and the
// forward timing. Sampled mode (--sample N): per (case, precision) the
// sampled oracle instead, whose pass costs 4 B H (visible pairs) D flops in
// double (validation/sampled.h) and whose sampled rows are long-double
// sub-cases of O(rows x visible keys x D) each; no naive baseline, no full
// oracle. Each rate is calibrated on this machine by timing one small
// problem (the oracle, the naive f64 baseline, the sampled oracle when it is
// used, each entry forward and backward; a fast entry also on a second,
// larger problem (n = 256), which separates its O(n D) part (conversions,
// normalization) from its O(n^2 D) rate: at n = 96 simd bf16 and f16 calls
// are mostly the former, and one size alone overestimated n = 4096
// 40-fold; and, when the run is long, at n = 1024, where the kernels reach
// their long-row speed: the fit through 96 and 256 overestimated the five
// simd AVX2 and blas entries at 1x4x32768x128 causal 5-fold, 59 min against
// 11), then scaled by the work of each case:
//   - entries and the naive baseline: B H D x (visible (query, key) pairs)
//     (+ the input elements B H (Nq + Nk) D for fast entries)
//     (validation::visible_keys; causal masks and padding discounted: every
//     entry skips masked key blocks and the naive loops skip masked pairs);
//   - the full oracle: B H Nq Nk D, not discounted (its tolerance channels
//     visit every pair: measured causal/unmasked 0.75-0.9);
//   - the pass: B H D x visible pairs at the rate of its own loop (two
//     D-term dots and an update of O per pair, timed on this machine: a
//     small sampled oracle's pass is mostly its O(n D) preparation) plus
//     that preparation per input element; the sampled rows: D x the pairs
//     of their sub-cases, from a small sampled oracle;
//   - per (case, precision): drawing and rounding the inputs, B H (Nq + Nk) D.
// ScaleNorm is O(rows * dim) and left out.
// Rates are CPU seconds (every thread's), so other processes do not
// inflate them. The wall time is not the steps' sum: the --jobs pool runs
// steps side by side, and the sampled oracle's pass and rows run on every
// core within a step. estimate() replays run_suite's plan (steps in plan
// order, an oracle before its entries, `jobs` workers) on the machine's
// cores (simulate_schedule), then divides by the share of a core that other
// processes leave (CostRates::share, measured at calibration). Measured
// before this model (quiet Zen 4, 1x4xNx128 causal, --sample 256, 5
// entries, 2 jobs): the steps' sum was 1.39x the wall time at n = 8192 and
// 1.76x at n = 32768.
#ifndef QKNORM_CLI_COST_H_
#define QKNORM_CLI_COST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cli/suite.h"
#include "qknorm/backend.h"

namespace qknorm::cli {

// CPU seconds per unit of work (every thread's), measured on this machine.
struct CostRates {
  // Per B H Nq Nk D, for f64 storage (the wide oracle) and for f32, bf16
  // and f16 (the oracle in double where validation/oracle.h evaluates it
  // so; timed on an f32 case).
  double oracle = 0, oracle_narrow = 0;
  double naive = 0;  // per B H D x visible pair (naive f64)
  double setup = 0;  // per input element, B H (Nq + Nk) D
  // Per entry: seconds per B H D x visible pair, and per input element
  // (its O(n D) part, from the two calibration sizes; 0 for slow entries).
  std::vector<double> entry, entry_elem;
  // Sampled oracle (calibrated only when asked for): the pass per
  // B H D x visible pair plus its long-double preparation per input
  // element, the rows per sub-case pair x D.
  bool sampled = false;
  double pass = 0, pass_setup = 0, rows = 0;
  double rows_narrow = 0;  // the rows of f32, bf16 and f16 storage
  // The costs that grow with the input elements (elements(p): q, dO, k, v)
  // beside the O(n^2 D) work, per element, measured on a case of one query
  // row against many keys (calibrate_elements): the rule's tables, the
  // compare bases and the naive's statistics (naive_elem, with the naive
  // baseline's own run), judging one entry's fields (judge_elem; sampled:
  // judge_sampled_elem), encoding, validating and decoding one entry's
  // tensors (harness_elem, for the entries whose own fit has no element
  // term), the full oracle's (oracle_elem, f64 storage; oracle_narrow_elem)
  // and the sampled oracle's (sampled_elem) preparation. Without them the
  // covering cases (issue 33: most have a long side of a single row at head
  // dims up to 576) were estimated at a quarter of their time. step: one
  // (entry, case) judgement's fixed CPU seconds (buffers, the report).
  double judge_elem = 0, judge_sampled_elem = 0, harness_elem = 0;
  double oracle_elem = 0, oracle_narrow_elem = 0, naive_elem = 0;
  double sampled_elem = 0, step = 0;
  // The long-double softmax probabilities per B H Nq Nk D (a sweep's
  // saturation curve; calibrate_probabilities, 0 until then).
  double probs = 0;
  double seconds = 0;  // what measuring took
  // The share of a core each of the machine's cores gives this run while
  // other processes load it (cost.cc core_share; 1 when idle).
  double share = 1;
};

// Measures the rates for `entries` (the sampled oracle's too if `sampled`).
// largest_work (largest_work(suite)): a fast entry that would take more than
// a few seconds on it is timed at n = 1024 too, for its long-row rate.
// jobs: the run's --jobs (0: one per core), whose pool runs each entry on
// one thread when jobs > 1 (cli/pool.h pooled_exec): they are timed so.
// full_oracle: time the full oracle even if `sampled` (a suite that mixes
// sampled and full cases: the default run with its covering cases).
CostRates calibrate(const std::vector<const Backend*>& entries,
                    const ExecConfig& exec, bool sampled,
                    double largest_work = 0, int jobs = 1,
                    bool full_oracle = false);
// The largest attention case's B H D x visible pairs.
double largest_work(const Suite& suite);
// Adds the sampled oracle's rates to r (no-op if it has them).
void calibrate_sampled(CostRates* r, const ExecConfig& exec);

// Adds the long-double probabilities' rate to r (no-op if it has it).
void calibrate_probabilities(CostRates* r);

struct CostEstimate {
  double oracle_s = 0, naive_s = 0, entries_s = 0, timing_s = 0;
  // Sampled mode: oracle_s = setup + pass_s + rows_s.
  bool sampled = false;
  int64_t sample_rows = 0;
  double pass_s = 0, rows_s = 0, pass_flops = 0;
  double calibration_s = 0;  // what measuring the rates took
  int attention_cases = 0, entries = 0;
  double work = 0;     // sum over attention cases of B * H * Nq * Nk * D
  double visible = 0;  // the same over visible pairs only
  // Full mode: the largest case's oracle arrays, at least two long-double
  // [B, H, Nq, Nk] arrays (dS and P in validation::oracle_attention).
  double oracle_bytes = 0;
  StepCosts steps;             // per step, for the progress line's ETA
  std::vector<double> case_s;  // per attention case: oracle, naive, entries
  // The three most expensive entries (name, seconds), for the stop message.
  std::vector<std::pair<std::string, double>> top_entries;
  // The wall time: the pool's schedule simulated (estimate: its jobs on
  // this machine's cores), or the steps' sum where none was (0).
  double wall_s = 0;
  int jobs = 1, cores = 1;
  double share = 1;  // CostRates::share
  double steps_total() const {
    return oracle_s + naive_s + entries_s + timing_s;
  }
  double total() const { return wall_s > 0 ? wall_s : steps_total(); }
};

// The estimate of a run of `entries` on `suite`; sample_rows > 0: sampled
// mode with that many rows (rates must then have the sampled rates).
// threads, jobs: the run's --threads and --jobs (0: one per core). The wall
// time (total()) simulates run_suite's pool: jobs workers taking the steps
// in plan order on this machine's cores (simulate_schedule); jobs = 1 is
// the steps' sum.
CostEstimate estimate(const CostRates& rates,
                      const std::vector<const Backend*>& entries,
                      const Suite& suite, bool time_forward,
                      int64_t sample_rows, int threads, int jobs);

// The estimate of a sweep over `points` (cli/sweep.h, --over seq, g or
// magnitude: one problem per swept value). Per point and variant (qknorm,
// and sdpa if `sdpa`): the saturation curve's long-double probabilities,
// one full oracle per precision of `entries`, and each entry of that
// precision (the sdpa line: that precision's naive baseline) run forward,
// then forward and backward (4/3 of a forward-and-backward call). `rates`
// must hold the probabilities' rate.
CostEstimate estimate_sweep(const CostRates& rates,
                            const std::vector<const Backend*>& entries,
                            const std::vector<AttentionProblem>& points,
                            bool sdpa);

// The pool's schedule (cli/suite.cc run_suite), simulated to estimate the
// wall time: `jobs` workers take the steps in plan order as their
// dependencies finish (a precision's oracle before its entries), and the
// running steps share the machine's cores. A step is a sequence of phases,
// each of `work` core-seconds run on `threads` threads (the sampled
// oracle's preparation on one, its pass and rows on SampleOptions::threads,
// an entry on one when jobs > 1); while the running phases ask for more
// threads than there are cores, every thread gets cores / threads of one.
struct SimPhase {
  double work = 0;  // core-seconds
  int threads = 1;
};
struct SimStep {
  std::vector<SimPhase> phases;
  std::vector<size_t> deps;  // indices of earlier steps
};
double simulate_schedule(const std::vector<SimStep>& plan, int jobs, int cores);

// calibrate + estimate.
CostEstimate estimate_cost(const std::vector<const Backend*>& entries,
                           const Suite& suite, const ExecConfig& exec,
                           bool time_forward, int64_t sample_rows = 0);

// "estimated work: 9 attention cases x 21 entries (sum of B H Nq Nk D
// 6.4e+07, visible pairs 4.1e+07): oracle ~3.1 s, naive baselines ~0.4 s,
// entries ~2.2 s, timing ~1.1 s; total ~6.8 s (rates measured on this
// machine in 0.71 s)"; sampled: "sampled oracle ~41 s (pass 1.2e+12 flops
// ~35 s, rows ~6 s)" in place of oracle and naive.
std::string describe(const CostEstimate& c);
// This machine's physical memory in bytes (0: unknown).
double physical_memory();
// "12.3 s", "4.1 min", "2.0 h".
std::string duration_text(double seconds);
// The costliest entries for a stop message: "blas:f64 ~12.9 min, ...".
std::string top_entries_text(const CostEstimate& c);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COST_H_
