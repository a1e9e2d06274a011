// The checks shared by several properties and by the sdpa negative control.
#ifndef QKNORM_PROPERTY_TESTS_PROPERTIES_H_
#define QKNORM_PROPERTY_TESTS_PROPERTIES_H_

#include <string>
#include <vector>

#include "qknorm/attention.h"

namespace qknorm::property {

// Softmax non-saturation (Henry et al. 2020; shared/NUMERICS.md) on the
// probabilities `probs` [B,H,q_len,kv_len] an entry computed, with its lse:
//   - masked keys and fully masked rows hold exactly 0;
//   - every visible p satisfies 1/(1+(m-1)e^{2|g|}) <= p <=
//   1/(1+(m-1)e^{-2|g|})
//     up to a relative error gamma;
//   - rows sum to 1 within gamma;
//   - the logits log p + lse lie in [-|g|, |g|] within gamma (2 + |lse|);
//   - the row entropy H >= log(1 + (m-1) e^{-2|g|}) (the min-entropy bound
//     -log max p) within gamma (1 + log(1 + (m-1) e^{2|g|})).
// `gamma` bounds the relative error of each computed p (see the caller).
// `tiny`: where the lower bound is below it (the compute format's smallest
// normal), p = 0 is accepted (an exp may flush below the normal range, as
// the verdict allows; rule.h) and its logit is not checked.
// Returns "" if all hold, else the first violation.
std::string check_nonsaturation(const AttentionProblem& p,
                                const std::vector<double>& probs,
                                const std::vector<double>& lse, double abs_g,
                                double gamma, double tiny = 0);

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_PROPERTIES_H_
