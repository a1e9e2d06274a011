// The validation suite qknorm-check runs: which cases, how every registry
// entry is judged on them, and the per-entry summary rows of the report.
//
// Judgement: every entry, the reference family included, by the
// componentwise verdict (validation/rule.h) on o, lse, dq, dk, dv, dg
// (ScaleNorm y, dx, dg), on every case. The naive same-precision baseline
// reference:<prec> is run beside each other entry for the report's ratio and
// its own margin (a naive margin above 1 would mean the rule is unsound
// there); it is no part of the entry's bound.
//
// Sampled mode (RunOptions::sample_rows > 0, issue 19): every attention case
// is judged by the sampled oracle (validation/sampled.h) instead: per
// (case, storage precision) one SampledOracle, whose sampled rows every
// entry of that precision is judged on (validation::judge_sampled), with the
// O(n D) properties on every other row. The naive baseline is not run there
// (it is O(n^2 D) naive loops) and is reported absent; the reference entries
// still run if selected. ScaleNorm cases are unchanged.
#ifndef QKNORM_CLI_SUITE_H_
#define QKNORM_CLI_SUITE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/judge.h"
#include "validation/sampled.h"

namespace qknorm::cli {

struct AttentionSpec {
  AttentionProblem problem;
  validation::Distribution dist = validation::Distribution::kGaussian;
  uint64_t seed = 0;
  // > 0: this case is judged in sampled mode with at least this many rows
  // whatever the run's mode (the long covering cases, cli/coverage.h);
  // 0: the run's mode (RunOptions::sample_rows).
  int64_t sample_rows = 0;
};

struct ScaleNormSpec {
  ScaleNormProblem problem;
  validation::Distribution dist = validation::Distribution::kGaussian;
  uint64_t seed = 0;
};

struct Suite {
  std::vector<AttentionSpec> attention;
  std::vector<ScaleNormSpec> scalenorm;
  // Shape whose forward is timed for the GFLOP/s column.
  AttentionProblem timing;
};

// The built-in default suite: the translation-scale shape B=2 H=8 n=72 D=64
// under g = g_init(72) and g = 20, causal and padding masks and the gaussian
// and wide-magnitude distributions (every pair of those choices appears), plus
// small odd shapes (q_len != kv_len, odd D, heavy tails; fully masked rows)
// and ScaleNorm. The formulations models ship (issue 16) at a GQA shape
// scaled down from head_dim 128 with 32 query / 8 kv heads: qwen3, gemma3
// and olmo2 at B=1 H=8 kv_heads=2 n=64 D=128 (causal, padding; attention
// sink, massive channels, zero rows).
// Every input class (validation/case.h) has cases, each a clean
// representative of its class: realistic c0, c3, c4, c6, c7 and the first
// ScaleNorm case; extreme-range c1, c2 and the second ScaleNorm case;
// degenerate c5 (fully masked rows) and c8 (zero rows).
// Case i gets seed `seed + i`.
Suite default_suite(uint64_t seed);
// The default suite's attention-variant cases (issue 34: RoPE) draw their
// inputs from seed + kVariantSeeds + k, clear of the covering cases' seeds.
inline constexpr uint64_t kVariantSeeds = uint64_t{1} << 20;

// The name of a field's tensor in compare's files and in the tables'
// headers: the paper's O, dQ, dK, dV; lse; g's dg; the parameter gradients
// dq_weight, dk_weight, dq_bias, dk_bias; ScaleNorm's y, dx, dg. (The JSON
// and CSV keys are validation::name(f): o, dq, ...)
const char* tensor_name(validation::Field f);

// FieldResult::key of a verdict: its field's name, or the label a sampled
// run's whole-row property of the field carries.
std::string field_key(const validation::FieldVerdict& f);

// One field of one case: the verdict's figures.
struct FieldResult {
  validation::Field field = validation::Field::kO;
  // The text the reports key it by: validation::name(field), or a sampled
  // run's whole-row property of the field, "o[all rows: ...]"
  // (validation/sampled.h). Two results of a case may share `field`.
  std::string key;
  validation::ErrorStats entry, naive;  // against the oracle (statistics)
  bool has_naive = false;
  int64_t count = 0, failures = 0, not_representable = 0, ill_conditioned = 0;
  double margin = 0, naive_margin = 0;  // worst err_e / bound_e
  std::string where;                    // "[b,h,n,d]" of the worst element
  double expected = 0, actual = 0, bound = 0;
  std::string diagnosis;  // the first failing element's, if any
  bool pass = false;
};

struct CaseResult {
  std::string desc;
  // The case's input class (validation/case.h input_class, from the spec:
  // the same class --classes selects by).
  validation::InputClass input_class = validation::InputClass::kRealistic;
  bool pass = false;
  std::string error;  // non-empty if the entry threw
  // The entry does not implement the case's formulation (Backend::supports;
  // issue 16): not judged, not a failure, counted and shown as such.
  bool unsupported = false;
  std::vector<FieldResult> fields;
  std::string failure;  // failure message (rule's) if !pass
  // The first guard the entry wrote (validation/run.h MemoryEvidence), as
  // "o: guard element at index 4608 (past the sequence end, 1 past
  // o[0,0,71,63])"; "" if none. It FAILs the case whatever its fields.
  std::string out_of_bounds;
  // The likely causes if !pass (validation/diagnose.h), most confident first.
  std::vector<validation::Diagnosis> diagnoses;
  // The compute contract it was judged under and its bound's looseness
  // against f32-accumulate (validation::AgreementReport).
  std::string contract = "f32-accumulate";
  double looseness = 1;
};

// The element of largest margin: which case, field and index.
struct WorstElement {
  double margin = 0;    // err / bound (> 1 fails)
  int case_index = -1;  // -1: none yet
  bool threw = false;   // the case threw: no element, margin inf
  // The case's entry wrote outside a view (CaseResult::out_of_bounds):
  // that, margin inf.
  std::string wrote;
  validation::Field field = validation::Field::kO;
  std::string key;  // FieldResult::key
  std::string where;
  double expected = 0, actual = 0, bound = 0;
  // key; "error" if the case threw, "" if none.
  std::string field_name() const;
};

// A field summarized over every case of an entry.
struct FieldSummary {
  validation::Field field = validation::Field::kO;
  std::string key;               // FieldResult::key: the results summarized
  validation::ErrorStats worst;  // each statistic maximized over cases
  double ratio = 0;              // max over cases of err / err(naive)
  WorstElement worst_element;
  int64_t failures = 0, not_representable = 0;
  bool pass = true;
};

// The cases of one input class summarized for an entry (issue 31): the
// report's verdict per class.
struct ClassSummary {
  validation::InputClass input_class = validation::InputClass::kRealistic;
  int cases = 0;        // judged cases of the class
  int unsupported = 0;  // cases whose formulation the entry does not implement
  WorstElement worst;   // over every field and case of the class
  bool pass = true;
};

struct EntryRow {
  std::string kind;  // "attention" or "scalenorm"
  std::string name, family, target, precision;
  std::string rule = "componentwise";
  // The compute contract (qknorm/contract.h) and the largest looseness of
  // its bound against f32-accumulate's over the cases (summarize).
  std::string contract = "f32-accumulate";
  double looseness = 1;
  std::vector<FieldSummary> fields;
  std::vector<CaseResult> cases;
  // One per input class that has cases, in kAllInputClasses order.
  std::vector<ClassSummary> classes;
  double ratio = 0;
  WorstElement worst;      // over every field and case
  bool has_naive = false;  // some field was compared with the naive baseline
  double gflops = 0;       // forward, 4 * Nq * Nk * D per head (0: not timed)
  int unsupported = 0;  // cases whose formulation the entry does not implement
  // An attention row of an entry without the attention backward
  // (Backend::has_attention_backward): judged on o and lse; its gradient
  // fields are not judged.
  bool forward_only = false;
  std::string built_for;  // Backend::built_for ("" where not said)
  bool available = true;
  bool pass = true;
};

// The order in which run_suite plans a case's entries: 0 .. n-1 at one
// job or without their estimated costs, else costliest first (ties in
// index order). The results land in their slots whatever the order.
std::vector<size_t> entry_order(const std::vector<double>* costs, size_t n,
                                int jobs);

// Estimated seconds of each step of run_suite (cli/cost.h fills them), for
// the progress line's ETA. Indexed [attention case][storage precision] for
// the oracle (full, or the sampled oracle's pass and rows) and the naive
// baseline, [attention case][entry] for the entries, [entry] for the timing.
struct StepCosts {
  std::vector<std::array<double, 4>> oracle, naive;
  std::vector<std::vector<double>> entry;
  std::vector<double> timing;
  double total() const;
};

// Where a run is, for the progress line.
struct Progress {
  int done = 0, total = 0;  // (entry, case) checks
  std::string what;         // the entry, or the oracle being computed
  // Estimated seconds of the finished steps and of the whole run
  // (StepCosts; both 0 without an estimate).
  double est_done = 0, est_total = 0;
};

// What one attention case of a run cost (measured), and its sampled
// oracles (sampled mode: one per storage precision computed, `tables`
// dropped).
struct CaseCost {
  // The whole case: the wall time of its steps, summed over the workers
  // that ran them (RunOptions::jobs; cases overlap when jobs > 1).
  double seconds = 0;
  double oracle_seconds = 0;   // the oracles (sampled: pass + rows + setup)
  double naive_seconds = 0;    // the naive baselines (full mode)
  double entries_seconds = 0;  // the entries' runs and verdicts
  std::vector<validation::SampledOracle> samples;
};

// The oracles and naive baselines of one suite, shared by several run_suite
// calls on it, from any threads: `qknorm-check mutants` judges each mutant
// and control in a call of its own, two at once, and all of them need the
// same oracle per (attention case, storage precision). Each is computed once,
// by the first call that needs it (the others wait for it), and kept until
// the cache is destroyed: meant for small suites such as the default one.
// The verdicts are the ones of separate calls (the same functions on the
// same inputs). Every call must pass the same Suite object (checked).
class SharedOracles {
 public:
  SharedOracles();
  ~SharedOracles();
  SharedOracles(const SharedOracles&) = delete;
  SharedOracles& operator=(const SharedOracles&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

struct RunOptions {
  ExecConfig exec;
  // Workers judging at once (0: one per core; 1: the serial order). The
  // steps (each (case, precision)'s oracle and naive baseline, each (case,
  // entry) and (ScaleNorm case, entry) judgement) run on a pool, case-major,
  // at most `jobs` attention cases in flight (their shared data is alive);
  // each result lands in its slot by index, so the rows are the same at any
  // job count. With jobs > 1 and exec.threads == 0, entries run with one
  // thread each (the pool keeps the cores busy; OpenBLAS's thread count is
  // global to the process). The forward timing runs after the judging,
  // alone, with `exec` as given.
  int jobs = 1;
  // Oracles shared with other calls on the same suite (null: this call's
  // own, dropped after each precision's last entry).
  SharedOracles* oracles = nullptr;
  bool time_forward = true;
  // Sampled mode: at least this many query rows and key rows per attention
  // case (0: the full oracle), drawn with this seed.
  int64_t sample_rows = 0;
  uint64_t sample_seed = 1;
  // Called before each step (an (entry, case) check, an oracle, a naive
  // baseline, a timing).
  std::function<void(const Progress&)> progress;
  const StepCosts* costs = nullptr;  // for Progress::est_*; may be null
  std::vector<CaseCost>* case_costs = nullptr;  // filled per attention case
};

// The sample options run_suite uses on attention case p: the union of the
// tile sizes every entry declares for p (Backend::block_sizes), the rows,
// seed and threads (0: every core).
validation::SampleOptions sample_options(
    const std::vector<const Backend*>& entries, const AttentionProblem& p,
    int64_t rows, uint64_t seed, int threads);

// Judges every entry on every case (see the top of this file).
std::vector<EntryRow> run_suite(const std::vector<const Backend*>& entries,
                                const Suite& suite, const RunOptions& opt);

// Same judgement on one case, for reuse by compare and tests.
CaseResult judge_attention(const Backend& entry, const AttentionSpec& spec,
                           const ExecConfig& exec);
CaseResult judge_scalenorm(const Backend& entry, const ScaleNormSpec& spec,
                           const ExecConfig& exec);
// validation::AttentionCase::describe() of the spec's case, without drawing
// its inputs (a long case holds gigabytes).
std::string describe_case(const AttentionSpec& spec);
// validation::input_class of the spec's case, from its parameters alone
// (without drawing its inputs, as describe_case).
validation::InputClass input_class(const AttentionSpec& spec);
validation::InputClass input_class(const ScaleNormSpec& spec);
// The cases of `suite` whose input class is in `classes` (the others are
// dropped; the timing shape is kept).
Suite select_classes(const Suite& suite,
                     const std::vector<validation::InputClass>& classes);
// The case result of a finished verdict.
CaseResult from_report(const validation::AgreementReport& rep);

// Folds case results into the per-field and per-class summaries of a row.
void summarize(EntryRow* row);

// Best-of-several wall time of one forward call, as GFLOP/s: after an
// untimed warm-up, at least kTimingMinReps calls and kTimingMinSeconds, at
// most 200 calls. A warm-up of kTimingLongCall seconds or more is followed by
// one timed call only: a shared machine's noise is a small part of such a
// call, and three forward calls of 1x4x32768x128 cost minutes per entry.
inline constexpr int kTimingMinReps = 3;
inline constexpr double kTimingMinSeconds = 0.05, kTimingLongCall = 0.5;
double forward_gflops(const Backend& b, const AttentionProblem& p,
                      const ExecConfig& exec);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_SUITE_H_
