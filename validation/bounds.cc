#include "validation/bounds.h"

#include <algorithm>
#include <cmath>

#include "reference/reference.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {
namespace {
double max_abs(const std::vector<long double>& x) {
  long double m = 0;
  for (long double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return static_cast<double>(m);
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}
// Largest row norm, scaled (reference::nrm2) and in long double: an unscaled
// double sum of squares overflows for |x| > ~1e154, a double norm for |x|
// near DBL_MAX, and either made the sdpa amplitude 0 * inf = NaN (found by
// the fuzzer, issue 7).
long double max_row_norm(const std::vector<double>& x, int64_t D) {
  long double m = 0;
  std::vector<long double> row(static_cast<size_t>(D));
  for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
       r += static_cast<size_t>(D)) {
    for (int64_t d = 0; d < D; ++d) row[d] = x[r + static_cast<size_t>(d)];
    m = std::max(m, reference::nrm2<long double>(row.data(), D));
  }
  return m;
}
}  // namespace

ReferenceBounds reference_bounds(const AttentionCase& c,
                                 const OracleAttention& oracle, double u) {
  const AttentionProblem& p = c.problem;
  const double D = static_cast<double>(p.head_dim);
  const double N = static_cast<double>(std::max(p.q_len, p.kv_len));
  // Formulations other than the paper's: the oracle-based amplitude of the
  // verdict (rule.h), which bounds every logit.
  const double A =
      p.variant == Variant::kQKNorm
          ? (is_paper_formulation(p) ? std::fabs(p.g) : logit_amplitude(c))
          : static_cast<double>(max_row_norm(c.q, p.head_dim) *
                                max_row_norm(c.k, p.head_dim) / std::sqrt(D));
  ReferenceBounds b;
  b.gamma_fwd = (2 * A * (3 * D + 12) + 2 * N + 6) * u;
  b.gamma_bwd = b.gamma_fwd + (3 * D + N + 8) * u;
  b.o = b.gamma_fwd * max_abs(c.v);
  b.lse = b.gamma_fwd * (1 + max_abs(oracle.lse));
  b.dq = b.gamma_bwd * max_abs(oracle.dq);
  b.dk = b.gamma_bwd * max_abs(oracle.dk);
  b.dv = b.gamma_bwd * max_abs(oracle.dv);
  b.dg = b.gamma_bwd * static_cast<double>(oracle.dg_scale);
  return b;
}

ScaleNormBounds scalenorm_bounds(const ScaleNormCase& c,
                                 const OracleScaleNorm& oracle, double u) {
  const double D = static_cast<double>(c.problem.dim);
  const double R = static_cast<double>(c.problem.rows);
  ScaleNormBounds b;
  b.y = (D + 6) * u * max_abs(oracle.y);
  b.dx = (3 * D + 12) * u * max_abs(oracle.dx);
  b.dg = (D * R + D + 6) * u * static_cast<double>(oracle.dg_scale);
  return b;
}

}  // namespace qknorm::validation
