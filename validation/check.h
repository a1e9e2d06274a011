// The front door most callers use: run an entry on a case
// (validation/run.h), compute the oracle (oracle.h) and judge the results
// (judge.h) by the rule (rule.h).
#ifndef QKNORM_VALIDATION_CHECK_H_
#define QKNORM_VALIDATION_CHECK_H_

#include <optional>

#include "qknorm/backend.h"
#include "validation/case.h"
#include "validation/judge.h"
#include "validation/oracle.h"
#include "validation/run.h"

namespace qknorm::validation {

// The oracle of one case, made once, when first asked for: by the judge, or
// by run_attention_fed's backward (source()) when the entry's forward output
// is no valid backward input. `c` must outlive it.
class LazyOracle {
 public:
  explicit LazyOracle(const AttentionCase& c) : c_(c) {}
  const OracleAttention& get();
  OracleSource source();

 private:
  const AttentionCase& c_;
  std::optional<OracleAttention> orc_;
};

// Runs `entry` on round_inputs(c, entry precision) and judges it
// (judge_attention) against the oracle; with_naive also runs and judges the
// naive baseline, for its margin and error statistics (never for the
// entry's verdict). forward_only: o and lse.
AgreementReport check_attention(const Backend& entry, const AttentionCase& c,
                                const ExecConfig& cfg = {},
                                bool forward_only = false,
                                bool with_naive = true);
AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c,
                                const ExecConfig& cfg = {},
                                bool with_naive = true);

// judge_attention knows no entry: its tail-block diagnosis tries the common
// block sizes alone. Where `rep` fails and `entry` declares block sizes for
// the case (Backend::block_sizes), its diagnoses are formed again with those
// tried first (c, oracle, result and forward_only as judged).
void diagnose_with_entry_blocks(const Backend& entry, const AttentionCase& c,
                                const OracleAttention& oracle,
                                const AttentionResult& result,
                                bool forward_only, AgreementReport* rep);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_CHECK_H_
