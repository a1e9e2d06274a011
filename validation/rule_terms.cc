#include "validation/rule_terms.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qknorm/formulation.h"
#include "validation/case.h"
#include "validation/operands.h"

namespace qknorm::validation {

double sum_units(double n) { return kSumLambda * std::sqrt(n) + kOpUnits; }

double softmax_units(double amplitude) {
  return 2 * kDotUnits * std::fabs(amplitude);
}

// x_hat's absolute resolution per ulp_c(0) in one normalization row of
// length L and divisor den (exact: m.den), below the compute format's
// normal range. The one place it is derived; the row's own x_hat reads it
// (the normalization backward and the weight gradient) and, through
// operand_resolution, the other side's gradients:
//   l2: 1 (u = x / n rounds once; tiny rows are scaled exactly first);
//   rms, layer: kOpUnits (sqrt(L) + 1 / den). (a) x_hat = y f from the
//     scaled row y (its subnormal elements resolved to ulp_c(0), each
//     rounding) and f <= sqrt(L): (f + 1) / 2 ulp_c(0) per rounding,
//     kOpUnits sqrt(L) bounds it (found by the fuzzer, issue 16: qwen3,
//     f64, a q row spanning 7e240 to 1e-80, reference:f64's dq 12 bounds
//     off where x_hat was subnormal). (b) The operations a kernel performs
//     on the row at the input's own scale before it divides by den (x_e / 2
//     and mu / 2 against overflow, x_e - mu) round a subnormal result to
//     ulp_c(0) / 2 each, and the division by den (as low as sqrt(eps))
//     multiplies that: two such roundings (x_e / 2 and mu / 2, each at half
//     scale) cost 2 ulp_c(0) / den, kOpUnits / den bounds them (found by
//     the CI's fuzz run with formulations on: qwen3, f64, x_e = ulp(0) in a
//     q row of max|x| = 1e-12, den = sqrt(eps) = 1e-3: reference:f64's x_e /
//     2 rounds to 0, x_hat_e = 4.9e-321 (1000 ulp(0)) becomes 0, and dq_e =
//     -x_hat_e c / den = 1.3e-282 is returned as 0; margin 1.28);
//   none: 0 (x_hat = x).
// scaled_row_resolution is part (a) alone (l2 1, rms and layer kOpUnits
// sqrt(L)): the resolution at the scaled row's magnitude, where the
// normalization backward forms du (oracle_attention's `side`).
LD scaled_row_resolution(const AttentionProblem& p, int64_t L) {
  if (p.variant != Variant::kQKNorm) return 0;
  switch (p.norm.kind) {
    case NormKind::kNone:
      return 0;
    case NormKind::kL2:
      return 1;
    case NormKind::kRms:
    case NormKind::kLayer:
      break;
  }
  return kOpUnits * std::sqrt(static_cast<LD>(L));
}

LD x_hat_resolution(const AttentionProblem& p, int64_t L, LD den) {
  const bool by_den =
      p.variant == Variant::kQKNorm &&
      (p.norm.kind == NormKind::kRms || p.norm.kind == NormKind::kLayer);
  return by_den ? kOpUnits * (std::sqrt(static_cast<LD>(L)) + 1 / den)
                : scaled_row_resolution(p, L);
}

// The logit operand x_tilde_e = x_hat_e w_e + beta_e of one side, per
// element, resolved per ulp_c(0) to its x_hat's resolution (the row's
// x_hat_resolution) times |w_e|, plus one ulp_c(0) for the product and one
// for the bias addition where the formulation has them. The other side's
// gradients read it through dx_tilde = s sum dS x_tilde' (found by the CI's
// fuzz run with formulations on: olmo2, f64, a k element of 4 ulp(0) in a
// row whose max is 1.7e38: k_hat_e = 1.3 ulp(0) returns as 0 and k_tilde_e =
// -2 k_hat_e is 2.6 ulp(0) off, times s dS = 2.9e24 in dq_tilde; dq_weight
// 2.8e-299 returned as 0 where one ulp(0) per key was counted, margin 1.32;
// and a k row of rms 0.31 whose k_hat_e = 9.6 ulp(0) is 6.4 ulp(0) off,
// times w_e = 1.5, margin 2.34).
// Into *out (resized; a workspace array, not a fresh n x D allocation per
// sampled sub-case).
void operand_resolution(const AttentionProblem& p, const OperandMags& m,
                        std::vector<LD>* out_v) {
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  const bool qk = p.variant == Variant::kQKNorm;
  const LD ops = (qk && p.norm.weight != ParamShape::kNone ? 1 : 0) +
                 (qk && p.norm.bias ? 1 : 0);
  std::vector<LD>& out = *out_v;
  out.resize(m.wv.size());
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    const LD res = x_hat_resolution(p, L, m.den[static_cast<size_t>(r0)]);
    for (int64_t e = 0; e < L; ++e) {
      const auto o = static_cast<size_t>(nr.at(r0, e));
      out[o] = res * std::fabs(m.wv[o]) + ops;
    }
  }
}

// OracleAttention::logit_flip: an element of x_hat is ambiguous when its
// distance to the storage format's rounding midpoint is within a correct
// kernel's error of x_hat, (sum_units(L) / 2 + 2) u_c |x_hat| (an L-term
// sum of squares, its square root, the product); a flip moves x_tilde by
// ulp_s(x_hat) |w|. The logit moves by at most s times (the row's flips)
// times the other side's largest operand element, per side.
LD logit_flip(const AttentionCase& c, const OperandMags& qm,
              const OperandMags& km, LD s) {
  const AttentionProblem& p = c.problem;
  const Precision st = c.storage;
  if (p.variant != Variant::kQKNorm || !p.norm.round_before_weight ||
      (st != Precision::kBF16 && st != Precision::kF16))
    return 0;
  const double uc = compute_roundoff(st);
  auto side_flip = [&](const OperandMags& m) {
    const NormRows& nr = m.rows;
    const double rel = (sum_units(static_cast<double>(nr.len())) / 2 + 2) * uc;
    LD worst = 0;
    for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
      LD f = 0;
      for (int64_t e = 0; e < nr.len(); ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        const double x = static_cast<double>(m.xh[o]);
        const double sp = ulp(st, std::fabs(x));
        const double rd = round_to(st, x);
        const double to_mid = std::fabs(sp / 2 - std::fabs(x - rd));
        if (to_mid <= rel * std::fabs(x) + ulp(Precision::kF32, 0))
          f += static_cast<LD>(sp) * std::fabs(m.wv[o]);
      }
      worst = std::max(worst, f);
    }
    return worst;
  };
  auto max_abs = [](const std::vector<LD>& x) {
    LD a = 0;
    for (LD e : x) a = std::max(a, std::fabs(e));
    return a;
  };
  return s * (side_flip(qm) * max_abs(km.xa) + side_flip(km) * max_abs(qm.xa));
}

namespace {
// In long double: a row norm (or the product of two) near DBL_MAX overflows
// double and made A = 0 * inf = NaN (found by the fuzzer, issue 7).
long double max_row_norm(const std::vector<double>& x, int64_t D) {
  long double m = 0;
  for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
       r += static_cast<size_t>(D)) {
    long double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<LD>(x[r + static_cast<size_t>(d)]) *
           x[r + static_cast<size_t>(d)];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}
}  // namespace

double logit_amplitude(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  if (p.variant == Variant::kQKNorm && is_paper_formulation(p))
    return std::fabs(p.g);
  if (p.variant == Variant::kQKNorm) {
    // |scale| max ||q_a|| max ||k_a|| over the per-head operand rows, with
    // x_a = |x_hat| |w| + |beta| (rms: at most sqrt(D) max|w_q| max|w_k|
    // scale without bias).
    auto max_norm = [&](const std::vector<LD>& xa) {
      LD m = 0;
      const auto D = static_cast<size_t>(p.head_dim);
      for (size_t r = 0; r + D <= xa.size(); r += D) {
        LD t = 0;
        for (size_t d = 0; d < D; ++d) t += xa[r + d] * xa[r + d];
        m = std::max(m, std::sqrt(t));
      }
      return m;
    };
    const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
    return static_cast<double>(sc * max_norm(operand_mags(c, 0).xa) *
                               max_norm(operand_mags(c, 1).xa));
  }
  return static_cast<double>(max_row_norm(c.q, p.head_dim) *
                             max_row_norm(c.k, p.head_dim) /
                             std::sqrt(static_cast<LD>(p.head_dim)));
}

// The pass's error, per f64 unit roundoff u (the derivation the header
// promises). The pass computes each logit as a correct f64 kernel does, to
// dS_ik = kDotUnits u A in the rule's model (it reads x_tilde rounded once
// from long double, so no divisor term), and l_i in chunked sums: lse_i is
// off by at most e = kDotUnits A + sum_units(kChunk) + 2 kOpUnits units
// (exp, log). A sampled key row's oracle forms S_ij exactly and P_ij =
// exp(S_ij - lse_i): every P_ij of row i scales by the same (1 - d lse_i),
// so dV_jd = sum_i P_ij dO_id moves by e u dv_mag. delta_i = sum_k P_ik dP_ik
// moves by sum_k P_ik (dS_ik - d lse_i) dP_ik = sum_k P_ik dS_ik (dP_ik -
// delta_i) - d lse_i delta_i, plus its own dots and chunked sums, u
// (sum_units(D) + sum_units(kChunk)) Del_i. So dS_ij = P_ij (dP_ij -
// delta_i) moves by at most
//   u e P_ij (|dP_ij - delta_i| + sum_k P_ik |dP_ik - delta_i|) + ...
// <= 2 e u (the softmax terms ds_mag: P_ij (|dP_ij - delta_i| + ds_l1 / 2))
//  + u (sum_units(D) + sum_units(kChunk)) (the magnitudes P_ij Del_i).
// soft_units = 2 e (also bounding dV's e), units = sum_units(D) +
// sum_units(kChunk); dg sums both over dg_scale.
void pass_units(double A, int64_t D, double* units, double* soft_units) {
  const double e =
      kDotUnits * std::fabs(A) + sum_units(kPassChunk) + 2 * kOpUnits;
  *soft_units = 2 * e;
  *units = sum_units(static_cast<double>(D)) + sum_units(kPassChunk);
}

}  // namespace qknorm::validation
