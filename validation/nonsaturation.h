// THE SOFTMAX NON-SATURATION BOUND: its one definition. The property suite,
// the attention fuzzer, the plug-in conformance test and the simd and blas
// kernel tests all call check_nonsaturation(); nothing else states the bound.
//
// Exact bound (shared/NUMERICS.md; Henry et al. 2020, sec. 3). A query row
// with m visible keys whose logits all lie in [-A, A] has every visible
// probability in
//   lo = 1 / (1 + (m-1) e^{2A})  <=  p  <=  1 / (1 + (m-1) e^{-2A}) = hi,
// its logits log p + lse in [-A, A], and its entropy at least
// log(1 + (m-1) e^{-2A}) (the min-entropy -log max p). For the paper's
// QKNorm A = |g| (|q_hat . k_hat| <= 1); for the formulations A is the
// rule's logit_amplitude(c) (|scale| max ||q_a|| max ||k_a||).
//
// What a correct kernel computes (derivations; u = compute_roundoff(s)):
//   - its logits carry an absolute error E, so they lie in [-(A + E), A + E]
//     and the exact bounds above hold at the amplitude A + E:
//       paper (and sdpa): E = A (3D + 16) u: q_hat, k_hat to (D + 5) u per
//         component, the D-term dot to gamma_D, the scale, rounded up
//         (validation/bounds.h derives A (3D + 12) u for the reference;
//         4 A u more for kernels that fold the scale differently);
//       other formulations: E = A ((6 len + 3D + 32) u + r) + logit_flip
//         + logit_shift u, with len the longest normalization row (an rms
//         or layer row across heads has len = H D > D): x_hat, the weight
//         and the bias carry about (len + 4) u relative of their magnitudes
//         per side; r = 2 u_s + u_s^2 where x_hat is rounded to a 16-bit
//         storage format before the weight (Qwen3: each side's operand may
//         be (1 + u_s) larger than the unrounded x_hat the rule's A is
//         made of; else r = 0); logit_flip (Qwen3's rounding flips) and
//         logit_shift (LayerNorm's mean shift, per u) come from the oracle
//         (validation/oracle.h);
//   - exp, the row sum and the division add a relative (2m + 16) u to each
//     probability (m - 1 additions for the sum, the division, exp within a
//     few ulp, and the lse an implementation may subtract instead of
//     dividing: its (m + 8) u);
//   - an exp whose result falls below the compute format's normal range may
//     flush it to 0: each probability is resolved only to tiny =
//     min_normal(compute_format(s)), absolutely (as the verdict allows it:
//     validation/rule.h, channel P resolution).
// So every visible p must satisfy
//   lo(A + E) (1 - rel) - tiny  <=  p  <=  hi(A + E) (1 + rel) + tiny,
//   rel = (2m + 16) u,
// a row must sum to 1 within rel + m tiny (with sinks, attention.h: to 1 -
// exp(sink - lse) within that plus the sink share's rel (2 + |sink| +
// |lse|), with no lower bound on p and no entropy bound: a sink's share is
// not bounded by the amplitude), masked keys must be exactly 0,
// and (when the row's lse is given) log p + lse must lie in
// [-(A + E), A + E] within rel (2 + |lse|), for every p >= tiny, and the
// entropy must reach log(1 + (m-1) e^{-2(A + E)}) within
// rel (1 + log(1 + (m-1) e^{2(A + E)})) + m tiny.
#ifndef QKNORM_VALIDATION_NONSATURATION_H_
#define QKNORM_VALIDATION_NONSATURATION_H_

#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/precision.h"

namespace qknorm::validation {

struct AttentionCase;
struct OracleAttention;

// A + E: the largest logit magnitude an entry of precision s may compute on
// case c (inputs already rounded to s), for the exact amplitude A (pass the
// rule's logit_amplitude(c), or a larger a-priori bound). `oracle` gives the
// formulations' logit_flip and logit_shift; it may be null where both are 0
// by construction: the paper's formulation and sdpa, GQA included, and any
// formulation that neither rounds x_hat before its weight nor is a
// LayerNorm (a case with either and no oracle throws qknorm::Error).
double computed_logit_amplitude(const AttentionCase& c,
                                const OracleAttention* oracle, Precision s,
                                double amplitude);

// Checks the probabilities `probs` ([B, H, Nq, Nk], as the entries'
// attention_probabilities hook gives them) of an entry of precision s on
// problem p against the bound at the amplitude `a_plus_e`
// (computed_logit_amplitude). `lse` (may be null; [B, H, Nq]) adds the logit
// and entropy checks. Returns "" when every row holds, else the first
// violation: the probability's index [b,h,i,j], its value, m, the interval
// and the slack.
std::string check_nonsaturation(const AttentionProblem& p,
                                const std::vector<double>& probs,
                                const std::vector<double>* lse, double a_plus_e,
                                Precision s);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_NONSATURATION_H_
