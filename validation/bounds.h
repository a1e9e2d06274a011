// A-priori error bounds for the reference loops run in arithmetic of unit
// roundoff u (the f64 entry against the oracle; also usable for the f32
// reference), from first-order rounding error analysis (Higham, "Accuracy
// and Stability of Numerical Algorithms", 2nd ed., sec. 3.1: a computed sum
// or dot product of n terms has error <= gamma_n * sum |terms|,
// gamma_n = n u / (1 - n u)).
//
// Forward, per row i, with N = max(q_len, kv_len), D = head_dim and A the
// logit amplitude (|g| for qknorm; max ||q_i|| ||k_j|| / sqrt(D) for sdpa):
//   q_hat, k_hat: scaled nrm2 (D+3 roundings) and a division: each component
//     has relative error <= (D + 5) u;
//   C_ij = q_hat . k_hat: |dC| <= gamma_D + 2 (D + 5) u <= (3D + 11) u;
//   S_ij = A C_ij: |dS| <= A (3D + 12) u (absolute);
//   e_j = exp(S_ij - m): relative error <= |dS| + 2u (exp is < 1 ulp);
//   sum_j e_j: relative error <= |dS| + (N + 2) u;
//   O_i = (sum_j e_j v_j) / sum: |dO| <= (2 |dS| + (2N + 6) u) max|V|.
// So with gamma_fwd = (2 A (3D + 12) + 2N + 6) u:
//   err(O) <= gamma_fwd * max|V|,  err(lse) <= gamma_fwd * (1 + max|lse|).
// Backward: dP and delta are D-term dot products, dS = P (dP - delta) adds
// their errors to P's, and dq/dk/dv are N-term sums followed by the
// normalization backward (a D-term dot and a division), so
//   gamma_bwd = gamma_fwd + (3D + N + 8) u
// times the magnitude of each gradient. The magnitude of the terms of the
// sums is taken as max|oracle field| (the inputs these bounds are used on are
// random and well conditioned: no cancellation is designed into them), and
// dg uses sum |dS| (its true term magnitude, |C| <= 1).
// These are worst-case (every rounding aligned) bounds: measured errors are
// typically 10-1000x smaller; they still sit many orders of magnitude below
// the O(1) relative error of any wrong formula.
#ifndef QKNORM_VALIDATION_BOUNDS_H_
#define QKNORM_VALIDATION_BOUNDS_H_

#include "validation/oracle.h"

namespace qknorm::validation {

struct ReferenceBounds {
  double gamma_fwd = 0, gamma_bwd = 0;
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0, dg = 0;
};

ReferenceBounds reference_bounds(const AttentionCase& c,
                                 const OracleAttention& oracle, double u);

// ScaleNorm: y = g x / n with n a scaled nrm2: |dy_i| <= (D + 6) u |y_i|;
// dx = (g/n)(dy - u (u . dy)): gamma = (3D + 12) u times max|dx|, dg a
// D*rows-term sum: (D * rows + D + 6) u * sum|dy . u|.
struct ScaleNormBounds {
  double y = 0, dx = 0, dg = 0;
};
ScaleNormBounds scalenorm_bounds(const ScaleNormCase& c,
                                 const OracleScaleNorm& oracle, double u);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_BOUNDS_H_
