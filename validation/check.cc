#include "validation/check.h"

namespace qknorm::validation {

const OracleAttention& LazyOracle::get() {
  if (!orc_) orc_ = oracle_attention(c_);
  return *orc_;
}

OracleSource LazyOracle::source() {
  return [this] {
    const OracleAttention& o = get();
    return ExactForward{o.o, o.lse};
  };
}

AgreementReport check_attention(const Backend& entry, const AttentionCase& c0,
                                const ExecConfig& cfg, bool forward_only,
                                bool with_naive) {
  const Precision s = entry.precision();
  const AttentionCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  LazyOracle oracle(c);
  const AttentionResult er =
      forward_only ? run_attention_forward(entry, c, cfg)
                   : run_attention_fed(entry, c, oracle.source(), cfg);
  AttentionResult nr;
  if (with_naive)
    nr = forward_only ? run_attention_forward(nb, c)
                      : run_attention_fed(nb, c, oracle.source());
  const OracleAttention& orc = oracle.get();
  AgreementReport rep =
      judge_attention(c, s, orc, er, with_naive ? &nr : nullptr, forward_only,
                      entry.name(), nb.name(), nullptr, entry.contract());
  diagnose_with_entry_blocks(entry, c, orc, er, forward_only, &rep);
  return rep;
}

void diagnose_with_entry_blocks(const Backend& entry, const AttentionCase& c,
                                const OracleAttention& orc,
                                const AttentionResult& er, bool forward_only,
                                AgreementReport* rep) {
  if (rep->pass) return;
  const std::vector<int64_t> blocks = entry.block_sizes(c.problem);
  if (blocks.empty()) return;
  const Precision s = entry.precision();
  rep->diagnoses = diagnose_attention(
      c, s, orc,
      attention_tolerances(c, s, orc, forward_only, entry.contract()), er,
      blocks);
}

AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c0,
                                const ExecConfig& cfg, bool with_naive) {
  const Precision s = entry.precision();
  const ScaleNormCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const ScaleNormResult er = run_scalenorm(entry, c, cfg);
  ScaleNormResult nr;
  if (with_naive) nr = run_scalenorm(nb, c);
  return judge_scalenorm(c, s, oracle_scalenorm(c), er,
                         with_naive ? &nr : nullptr, entry.name(), nb.name());
}

}  // namespace qknorm::validation
