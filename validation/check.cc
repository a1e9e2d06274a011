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
  return judge_attention(c, s, oracle.get(), er, with_naive ? &nr : nullptr,
                         forward_only, entry.name(), nb.name());
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
