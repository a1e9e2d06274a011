// The validation suite qknorm-check runs: which cases, how every registry
// entry is judged on them, and the per-entry summary rows of the report.
//
// Judgement:
// - Every entry except the reference family: the suite's tolerance rule
//   (validation/harness.h: err <= 2 * err(naive same-precision) + atol) on
//   o, lse, dq, dk, dv, dg, on every case.
// - reference:<prec> IS the naive baseline of its precision (ratio 1 by
//   definition), so the rule says nothing about it. Its error against the
//   oracle is held to the a-priori bound of validation/baseline_bounds.h
//   instead (reference_bounds() at f64/f32, plus the storage-rounding terms
//   at bf16/f16).
#ifndef QKNORM_CLI_SUITE_H_
#define QKNORM_CLI_SUITE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/harness.h"

namespace qknorm::cli {

struct AttentionSpec {
  AttentionProblem problem;
  validation::Distribution dist = validation::Distribution::kGaussian;
  uint64_t seed = 0;
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
// small odd shapes (q_len != kv_len, odd D, fully masked rows) and ScaleNorm.
// Case i gets seed `seed + i`.
Suite default_suite(uint64_t seed);

// One field ("o", "dq", ...) of one case.
struct FieldResult {
  std::string field;
  validation::ErrorStats entry, naive;  // against the oracle
  double limit = 0;                     // the bound the entry's err is held to
  bool pass = false;
};

struct CaseResult {
  std::string desc;
  bool pass = false;
  std::string error;  // non-empty if the entry threw
  std::vector<FieldResult> fields;
  std::string failure;  // failure message (rule's) if !pass
};

// A field summarized over every case of an entry.
struct FieldSummary {
  std::string field;
  validation::ErrorStats worst;  // each statistic maximized over cases
  double ratio = 0;              // max over cases of err / err(naive)
  double headroom = 0;           // max over cases of err / limit (> 1 fails)
  bool pass = true;
};

struct EntryRow {
  std::string kind;  // "attention" or "scalenorm"
  std::string name, family, target, precision;
  std::string rule;  // "naive" (2x naive + atol) or "derived"
  std::vector<FieldSummary> fields;
  std::vector<CaseResult> cases;
  double ratio = 0, headroom = 0;
  double gflops = 0;  // forward, 4 * Nq * Nk * D per head (0: not timed)
  bool available = true;
  bool pass = true;
};

struct RunOptions {
  ExecConfig exec;
  bool time_forward = true;
  // Called before each (entry, case) check: done, total, entry name.
  std::function<void(int, int, const std::string&)> progress;
};

// Judges every entry on every case (see the top of this file).
std::vector<EntryRow> run_suite(const std::vector<const Backend*>& entries,
                                const Suite& suite, const RunOptions& opt);

// Same judgement on one case, for reuse by compare and tests.
CaseResult judge_attention(const Backend& entry, const AttentionSpec& spec,
                           const ExecConfig& exec);
CaseResult judge_scalenorm(const Backend& entry, const ScaleNormSpec& spec,
                           const ExecConfig& exec);
// Judgement from a finished agreement report (the rule) and, for reference
// entries, the derived bound on the rounded case.
CaseResult from_report(const validation::AgreementReport& rep,
                       const std::vector<double>* derived_limits);

// Folds case results into the per-field summary of a row.
void summarize(EntryRow* row);

// Best-of-several wall time of one forward call, as GFLOP/s.
double forward_gflops(const Backend& b, const AttentionProblem& p,
                      const ExecConfig& exec);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_SUITE_H_
