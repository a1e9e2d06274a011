// Derived bounds on the error of the naive baselines themselves.
//
// The tolerance rule (validation/rule.h) judges every entry, the naive
// same-precision baselines reference:<prec> included, against the oracle by
// a per-element bound; the baselines are also held to a check independent
// of the rule: their error against the oracle must stay under the a-priori
// bounds below (a naive that met the rule only because the rule is too
// loose would fail here).
//
// reference:f64 / reference:f32 compute and store in the same format, so
// their bound is reference_bounds() (bounds.h) at the compute roundoff u_c.
// reference:bf16 / reference:f16 compute in f32 on exactly widened 16-bit
// inputs and round every output to storage (u_s = 2^-8 / 2^-11). On top of
// reference_bounds(u_c = 2^-24) that adds, to first order in u_s:
//   (a) the final rounding of each stored output: u_s * max|field|;
//   (b) the backward is fed the STORED O (as every entry is, run.h), so
//       delta_i = rowsum(dO * O)_i is perturbed by
//         Ddelta_i <= u_s * sum_d |dO_id O_id|,
//       and dS_ij = P_ij (dP_ij - delta_i) by <= P_ij Ddelta_i. Through
//       dQ_hat_i = g sum_j dS_ij k_hat_j (||k_hat_j|| <= 1, sum_j P_ij = 1)
//       and the normalization backward dx = (du - u (u . du)) / n, whose
//       components are <= (|du|_inf + ||du||_2) / n <= 2 ||du||_2 / n:
//         Ddq_i   <= 2 |g| Ddelta_i / max(||q_i||, eps),
//         Ddk_j   <= 2 |g| (sum_i P_ij Ddelta_i) / max(||k_j||, eps),
//         Ddg     <= sum_i Ddelta_i   (|C_ij| <= 1),
//       dV = P^T dO does not read O. For sdpa (dq_i = dS_i K / sqrt(D)):
//         Ddq_i <= Ddelta_i max|k| / sqrt(D), Ddk_j <= (sum_i P_ij Ddelta_i)
//         max|q| / sqrt(D).
// Products of two rounding errors are dropped (first-order analysis, as in
// bounds.h); the bounds are worst case and measured errors sit well below.
#ifndef QKNORM_VALIDATION_BASELINE_BOUNDS_H_
#define QKNORM_VALIDATION_BASELINE_BOUNDS_H_

#include "qknorm/precision.h"
#include "validation/bounds.h"
#include "validation/field.h"
#include "validation/oracle.h"

namespace qknorm::validation {

// Bound on max |reference:<prec> - oracle| per field, for the case `c` whose
// inputs are already rounded to prec (round_inputs) and its oracle.
// Fields as in check_attention: o, lse, dq, dk, dv, dg.
ReferenceBounds baseline_bounds(const AttentionCase& c,
                                const OracleAttention& oracle, Precision prec);

// ScaleNorm: scalenorm_bounds() at u_c plus the output rounding u_s * max|y|
// and u_s * max|dx| for the 16-bit formats (backward reads x and dy only,
// both exact inputs).
ScaleNormBounds baseline_bounds(const ScaleNormCase& c,
                                const OracleScaleNorm& oracle, Precision prec);

// The bound of `field` (attention: kO, kLse, kDq, kDk, kDv, kDg; ScaleNorm:
// kY, kDx, kScaleNormDg); throws qknorm::Error for a field the bounds do not
// cover.
double bound_of(const ReferenceBounds& b, Field field);
double bound_of(const ScaleNormBounds& b, Field field);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_BASELINE_BOUNDS_H_
