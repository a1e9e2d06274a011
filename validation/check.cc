#include "validation/check.h"

namespace qknorm::validation {

AgreementReport check_attention(const Backend& entry, const AttentionCase& c0,
                                const ExecConfig& cfg, bool forward_only,
                                bool with_naive) {
  const Precision s = entry.precision();
  const AttentionCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const AttentionResult er = forward_only ? run_attention_forward(entry, c, cfg)
                                          : run_attention(entry, c, cfg);
  AttentionResult nr;
  if (with_naive)
    nr = forward_only ? run_attention_forward(nb, c) : run_attention(nb, c);
  return judge_attention(c, s, oracle_attention(c), er,
                         with_naive ? &nr : nullptr, forward_only, entry.name(),
                         nb.name(), nullptr, entry.contract());
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
