// Central-difference gradient checking in the oracle type (long double).
//
// The loss is L(q, k, v, g) = <dO, O(q, k, v, g)> (resp. <dy, y(x, g)> for
// ScaleNorm), so dL/dinput is exactly the backward's output for that dO.
// Central differences: (L(x + h t) - L(x - h t)) / 2h has truncation error
// h^2 |L'''| / 6 and rounding error ~ u_LD |L| / h (u_LD = 2^-64).
// The step is relative to the row it perturbs: h = kFdStep * ||row||, divided
// by max(1, |g|) for qknorm because logits move by g * h / ||row||; a row with
// ||row|| <= eps (the clamp region, where u = x / eps is linear) uses
// h = kFdStep * eps so the perturbation never crosses the kink.
// kFdStep = 2^-20 ~ u_LD^(1/3) balances the two terms: both are ~1e-12
// relative for O(1) derivatives.
// Formulations (issue 16): the inputs are [q | k | v | q_weight | k_weight
// | q_bias | k_bias | sinks | g]; row steps divide by max(1, A) (A the logit
// amplitude) instead of |g|, parameters step by kFdStep max(1, |w|). The
// loss never rounds x_hat to storage (round_before_weight is a cast, whose
// gradient is the identity; the rounded loss is piecewise constant).
#ifndef QKNORM_VALIDATION_GRADCHECK_H_
#define QKNORM_VALIDATION_GRADCHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "validation/case.h"

namespace qknorm::validation {

inline constexpr double kFdStep = 0x1p-20;

// The relative tolerance of a check of f64 (or oracle) gradients. Central
// differences with h = kFdStep (relative) in long double have truncation
// error ~ h^2 |L'''| / 6 ~ 1e-13 relative for O(1) third derivatives and
// rounding error ~ 2^-64 / h ~ 5e-14. The double reference's own gradient
// error is ~1e-14 relative (reference_oracle_test). Measured worst relative
// disagreement over the foundation tests' cases: printed by each of
// tests/gradient_test.cc and tests/formulation_test.cc (~1e-10 at g = 25,
// where third derivatives grow like g^3 despite the g-scaled step).
// kFdTol = 1e-8 sits ~100x above that and ~1e8x below the O(1) relative
// error of a missing or wrong term.
inline constexpr double kFdTol = 1e-8;

// Gradients to be checked, as long double (an f64 entry's output widens
// exactly).
struct AttentionGradients {
  std::vector<long double> dq, dk, dv;
  long double dg = 0;
  // The formulation's parameter gradients (sizes as the case's parameters).
  std::vector<long double> dq_weight, dk_weight, dq_bias, dk_bias;
  std::vector<long double> d_sinks;  // with sinks (attention.h)
};
// An entry's (AttentionResult) or the oracle's (OracleAttention) gradients,
// widened to long double (exactly).
template <class Result>
AttentionGradients gradients_of(const Result& r) {
  const auto wide = [](const auto& v) {
    return std::vector<long double>(v.begin(), v.end());
  };
  return {
      wide(r.dq),        wide(r.dk),        wide(r.dv),      r.dg,
      wide(r.dq_weight), wide(r.dk_weight), wide(r.dq_bias), wide(r.dk_bias),
      wide(r.d_sinks)};
}
struct ScaleNormGradients {
  std::vector<long double> dx;
  long double dg = 0;
};

struct GradCheckReport {
  bool pass = true;
  int64_t checked = 0;  // elements (full mode) or directions
  // Worst |fd - analytic| / scale, where scale is max|analytic| of the
  // element's tensor (full mode) or sum_e |grad_e t_e| (directional mode).
  double worst_rel = 0;
  std::string worst_item;  // "dk[0,1,3,2]", "dg", or "direction 7 (seed ...)"
  long double worst_fd = 0, worst_analytic = 0;
  std::string message() const;
};

// Full Jacobian: every input element and g, one column J e at a time (each
// column is the full output difference; the check contracts it with dO).
GradCheckReport check_attention_full(const AttentionCase& c,
                                     const AttentionGradients& grad,
                                     double tol);
// n_dirs random Gaussian directions t over (q, k, v, g), each scaled
// per row as above: (L(x+ht) - L(x-ht)) / 2h against <grad, t>.
GradCheckReport check_attention_directions(const AttentionCase& c,
                                           const AttentionGradients& grad,
                                           int n_dirs, uint64_t seed,
                                           double tol);
GradCheckReport check_scalenorm_full(const ScaleNormCase& c,
                                     const ScaleNormGradients& grad,
                                     double tol);
GradCheckReport check_scalenorm_directions(const ScaleNormCase& c,
                                           const ScaleNormGradients& grad,
                                           int n_dirs, uint64_t seed,
                                           double tol);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_GRADCHECK_H_
