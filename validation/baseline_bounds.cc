#include "validation/baseline_bounds.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/error.h"
#include "reference/reference.h"

namespace qknorm::validation {
namespace {

// max |x| over the finite elements (lse of fully masked rows is -inf).
template <class T>
double largest_magnitude(const std::vector<T>& x) {
  T m = 0;
  for (T v : x) m = std::isfinite(v) && std::fabs(v) > m ? std::fabs(v) : m;
  return static_cast<double>(m);
}

double row_norm(const std::vector<double>& x, int64_t row, int64_t D) {
  return static_cast<double>(reference::nrm2<double>(x.data() + row * D, D));
}

bool sixteen_bit(Precision p) {
  return p == Precision::kBF16 || p == Precision::kF16;
}

}  // namespace

ReferenceBounds baseline_bounds(const AttentionCase& c,
                                const OracleAttention& oracle, Precision prec) {
  ReferenceBounds b = reference_bounds(c, oracle, compute_roundoff(prec));
  if (!sixteen_bit(prec)) return b;
  const double us = unit_roundoff(prec);
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Nq = p.q_len, Nk = p.kv_len,
                D = p.head_dim;
  // (a) output rounding.
  b.o += us * largest_magnitude(oracle.o);
  b.dq += us * largest_magnitude(oracle.dq);
  b.dk += us * largest_magnitude(oracle.dk);
  b.dv += us * largest_magnitude(oracle.dv);
  // (b) the stored O feeding delta. P in double is ample for a bound.
  std::vector<double> probs(static_cast<size_t>(B * H * Nq * Nk));
  reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                             probs.data());
  const bool qk = p.variant == Variant::kQKNorm;
  const double inv_sqrt_d = 1 / std::sqrt(static_cast<double>(D));
  const double amax_q = largest_magnitude(c.q), amax_k = largest_magnitude(c.k);
  double ddq = 0, ddk = 0, ddg = 0;
  std::vector<double> ddelta(static_cast<size_t>(Nq));
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < Nq; ++i) {
      long double s = 0;
      for (int64_t d = 0; d < D; ++d) {
        const size_t idx = static_cast<size_t>((bh * Nq + i) * D + d);
        s += std::fabs(c.d_o[idx] * oracle.o[idx]);
      }
      ddelta[static_cast<size_t>(i)] = us * static_cast<double>(s);
      ddg += ddelta[static_cast<size_t>(i)];
      const double factor =
          qk ? 2 * std::fabs(p.g) /
                   std::max(row_norm(c.q, bh * Nq + i, D), p.eps)
             : amax_k * inv_sqrt_d;
      ddq = std::max(ddq, factor * ddelta[static_cast<size_t>(i)]);
    }
    for (int64_t j = 0; j < Nk; ++j) {
      double s = 0;
      for (int64_t i = 0; i < Nq; ++i)
        s += probs[static_cast<size_t>((bh * Nq + i) * Nk + j)] *
             ddelta[static_cast<size_t>(i)];
      const double factor =
          qk ? 2 * std::fabs(p.g) /
                   std::max(row_norm(c.k, bh * Nk + j, D), p.eps)
             : amax_q * inv_sqrt_d;
      ddk = std::max(ddk, factor * s);
    }
  }
  b.dq += ddq;
  b.dk += ddk;
  if (qk) b.dg += ddg;
  return b;
}

ScaleNormBounds baseline_bounds(const ScaleNormCase& c,
                                const OracleScaleNorm& oracle, Precision prec) {
  ScaleNormBounds b = scalenorm_bounds(c, oracle, compute_roundoff(prec));
  if (!sixteen_bit(prec)) return b;
  const double us = unit_roundoff(prec);
  b.y += us * largest_magnitude(oracle.y);
  b.dx += us * largest_magnitude(oracle.dx);
  return b;
}

namespace {

// Which member of a bounds struct bounds each field it covers.
template <typename Bounds>
using BoundMember = std::pair<Field, double Bounds::*>;

constexpr BoundMember<ReferenceBounds> kAttentionBounds[] = {
    {Field::kO, &ReferenceBounds::o},   {Field::kLse, &ReferenceBounds::lse},
    {Field::kDq, &ReferenceBounds::dq}, {Field::kDk, &ReferenceBounds::dk},
    {Field::kDv, &ReferenceBounds::dv}, {Field::kDg, &ReferenceBounds::dg},
};

constexpr BoundMember<ScaleNormBounds> kScaleNormBounds[] = {
    {Field::kY, &ScaleNormBounds::y},
    {Field::kDx, &ScaleNormBounds::dx},
    {Field::kScaleNormDg, &ScaleNormBounds::dg},
};

template <typename Bounds, size_t N>
double bound_in(const BoundMember<Bounds> (&table)[N], const Bounds& b,
                Field field, const char* kind) {
  for (const auto& [f, member] : table)
    if (f == field) return b.*member;
  throw Error("field", {},
              std::string("no ") + kind + " bound for '" + name(field) + "'");
}

}  // namespace

double bound_of(const ReferenceBounds& b, Field field) {
  return bound_in(kAttentionBounds, b, field, "attention");
}

double bound_of(const ScaleNormBounds& b, Field field) {
  return bound_in(kScaleNormBounds, b, field, "scalenorm");
}

}  // namespace qknorm::validation
