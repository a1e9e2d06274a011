#include "validation/rule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "qknorm/formulation.h"
#include "reference/reference.h"

namespace qknorm::validation {
ToleranceTable empty_table(Field f, Precision fmt, int64_t B, int64_t H,
                           int64_t rows, int64_t cols) {
  ToleranceTable t;
  t.field = f;
  t.fmt = fmt;
  t.B = B;
  t.H = H;
  t.rows = rows;
  t.cols = cols;
  return t;
}

namespace {

using LD = long double;

double d(LD x) { return static_cast<double>(x); }
// k x for a unit k of the oracle channel, 0 where k is: the long double
// oracle's resolution and smallest normal are below double's range (k = 0)
// while a sensitivity may exceed it (d(x) = inf; found by the corpus file
// crash-sdpa-bound-norm-overflow: 0 * inf made dq's bound NaN).
double times(double k, LD x) { return k == 0 ? 0 : k * d(x); }

// kappa = M / |x| (0 / 0 = 1: an exact zero made of zero terms).
double condition(LD mag, LD x) {
  const LD ax = std::fabs(x);
  if (ax > 0) return d(mag / ax);
  return mag > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

// kSumLambda (sqrt(a + b) - sqrt(a)): what b more squared bounds add to a
// Hoeffding bound over a (rule.h, "Repeated summands"); exactly 0 for b = 0.
// a and b are squares of element magnitudes: long double, whose range holds
// the square of every finite double (in double, a row of 1e182 overflowed
// to inf / inf = NaN bounds).
double hoeffding_more(LD a, LD b) {
  if (!(b > 0)) return 0;
  if (std::isinf(b)) return std::numeric_limits<double>::infinity();
  return d(static_cast<LD>(kSumLambda) * b / (std::sqrt(a + b) + std::sqrt(a)));
}

// The row normalization's units in dV and dK (rule.h, "The row
// normalization in the backward"), per u_c: the distinct rows' row sums
// (b_sum squared units beside the element's own sum's a, or lin_sum at
// their bound) and their log's and addition's roundings (b_lse, lin_lse),
// jointly (b_all >= b_sum + b_lse where not their sum) or either at its
// bound, whichever is smallest; the repeated rows at their bound (rep).
double row_norm_units(LD a, LD b_all, LD b_sum, LD b_lse, LD lin_sum,
                      LD lin_lse, LD rep) {
  const double ls = d(lin_sum), ll = d(lin_lse);
  return std::min({hoeffding_more(a, b_all), hoeffding_more(a, b_sum) + ll,
                   ls + hoeffding_more(a, b_lse), ls + ll}) +
         d(rep);
}

// Query row i's tied-pair excess (OracleValues::row_ties; 0 if not formed).
double row_ties(const OracleAttention& orc, size_t i) {
  return i < orc.row_ties.size() ? d(orc.row_ties[i]) : 0.0;
}

ToleranceTable table(Field f, Precision fmt, int64_t B, int64_t H, int64_t rows,
                     int64_t cols, const std::vector<LD>& expected) {
  ToleranceTable t = empty_table(f, fmt, B, H, rows, cols);
  t.expected = expected;
  t.delta.assign(expected.size(), 0);
  t.cond.assign(expected.size(), 1);
  return t;
}

// Every element's final operations (the division by the row sum or the
// norm, the subtraction of the projection, the scale) round in the compute
// format; below its normal range each carries up to ulp_c(0), absolutely
// (found by the fuzzer, issue 15: f32 dq and dx of a few 2^-149, one full
// ulp(0) off in correct kernels). kOpUnits of them join every delta.
void add_final_ops(std::vector<ToleranceTable>* tables, double c_res) {
  for (ToleranceTable& t : *tables)
    for (double& x : t.delta) x += kOpUnits * c_res;
}

// The first-order softmax term assumes the logits are resolved to much better
// than one unit: a perturbation dS moves P by P (e^{2 dS} - 1). Where
// softmax_units(A) u_c exceeds 1/8 (|A| above 2.6e5 in f32, 7e13 in f64) the
// compute format does not determine which keys dominate, so O, dQ, dK, dV and
// dg are not determined either (found by the fuzzer, issue 15: f64, g =
// -2e289, two near-equal cosines swapped by one rounding: O = -0.3 against
// 3). There every finite value passes and only non-finite values are judged;
// lse keeps its bound (it moves by at most max |dS|, at any size).
void unresolved_softmax(std::vector<ToleranceTable>* tables, double units) {
  if (!(units > 0.125)) return;
  for (ToleranceTable& t : *tables)
    if (t.field != Field::kLse)
      for (double& x : t.delta) x = std::numeric_limits<double>::infinity();
}

}  // namespace

double half_spacing(Precision fmt, double x, double delta) {
  const double m = std::fabs(x) + delta;
  const double spacing = !std::isfinite(m) || m >= max_finite(fmt)
                             ? ulp(fmt, max_finite(fmt))
                             : ulp(fmt, m);
  // Half the smallest f64 subnormal is no double: the whole spacing there.
  return spacing / 2 > 0 ? spacing / 2 : spacing;
}

std::string ToleranceTable::index_text(int64_t i) const {
  if (!index_of.empty()) i = index_of[static_cast<size_t>(i)];
  if (B * H * rows * cols == 1) return "[]";
  const int64_t c = i % cols, r = (i / cols) % rows, h = (i / cols / rows) % H,
                b = i / cols / rows / H;
  char buf[96];
  if (B == 1 && H == 1)
    std::snprintf(buf, sizeof buf, "[%lld,%lld]", (long long)r, (long long)c);
  else if (cols == 1)
    std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld]", (long long)b,
                  (long long)h, (long long)r);
  else
    std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld,%lld]", (long long)b,
                  (long long)h, (long long)r, (long long)c);
  return buf;
}

namespace {

// The scalars of the attention rule for one case and precision.
struct RuleScalars {
  int64_t B = 1, H = 1, Hk = 1, group = 1, D = 1, Lq = 1, Lk = 1;
  int64_t Nq = 1, Nk = 1;  // the counts the rule uses (the whole case's)
  double us = 0, uc = 0, A = 0, div = 0, soft = 0;
  double dot = kDotUnits;  // the case's cosine_units
  // The logit softcap (rule.h, "The logit softcap"): the logits' units per
  // |A| (dot, plus kSoftcapLogitUnits with a cap) and the cap's slope's
  // units on every gradient term of dS (0 without a cap).
  double dot_s = kDotUnits, slope = 0;
  // RoPE (rule.h, "RoPE"): the rotation's logit units (per |A|, in dot_s)
  // and its gradient units (per u_c on dq, dk and the parameters).
  RopeUnits rope;
  // Attention sinks (rule.h, "Attention sinks"): a logit's error per u_c,
  // absolute: the larger of a visible logit's, dot_s |A|, and the sink's
  // (sink_logit_units).
  double logit = 0;
  double o_res = 0, c_res = 0, p_res = 0;
  // A pass in double whose error joins the bounds (OracleAttention::
  // given_units): the f64 unit roundoff.
  double u_given = 0;
  // The oracle channel (rule.h): the oracle's own unit roundoff, absolute
  // resolution and smallest normal (OracleAttention::unit_roundoff,
  // resolution, tiny: u_c, ulp_c(0) and tiny_c of the rule with the
  // oracle's arithmetic for the compute format) and its softmax units,
  // soft without the kernel's rounding flips (logit_flip: a kernel's x_hat,
  // not the oracle's; oracle.h keeps those cases in long double).
  double uo = 0, soft_o = 0, co = 0, po = 0;
  Precision wf = Precision::kF64;
  // The logit scale s below the compute format's normal range: a kernel
  // holds it to ulp_c(0) only, and every gradient of q and k (and their
  // parameters) is linear in s, so it may be off by s_rel = |s - fl_c(s)| /
  // |s| relatively: s_rel times the element's magnitude (found by the CI's
  // fixed-seed fuzz run of issue 19: f32, g = 3.4e-74, which f32 flushes to
  // 0; reference:f32 returned dq = 0 for -2.6e-30, margin 184). 0 for a
  // normal s, whose relative rounding the op units cover.
  double s_rel = 0;
  // The compute contract's rounding points (qknorm/contract.h; rule.h,
  // "Compute contracts"): each point's unit roundoff where it is coarser
  // than u_c (0 otherwise), v's where the cache format does not hold every
  // storage value, the logits' extra absolute error, O's accumulator
  // resolution per term and the output point's half ulp(0).
  double uq = 0, uk = 0, uv = 0, ulog = 0, up = 0, uacc = 0, uout = 0;
  double logit_abs = 0, acc_res = 0, out_res = 0;
  // Repeated summands (rule.h): the largest tie excess E_i =
  // tie_sum_units(Nk, X_i) - sum_units(Nk) over the case's query rows.
  double tie_max = 0;
};

// The contract's units (rule.h, "Compute contracts"): u_c is the coarser of
// the compute format and the declared compute point; every other point
// costs its unit roundoff where it is coarser than u_c. v is an input in the
// storage format: its cache rounding costs only where it is inexact. The
// logits move by A (u_q + u_k) (|q_hat . k_hat| <= 1 per
// unit of A, Cauchy-Schwarz) and by their own rounding, |S| u_S + ulp_S(0)
// / 2 <= A u_S + ulp_S(0) / 2.
void contract_units(const ComputeContract& k, Precision s, double A,
                    RuleScalars* r) {
  auto fmt = [&](RoundingPoint p) { return k.format(p, s); };
  r->uc = std::max(compute_roundoff(s),
                   unit_roundoff(fmt(RoundingPoint::kCompute)));
  auto extra = [&](RoundingPoint p) {
    const double u = unit_roundoff(fmt(p));
    return u > r->uc ? u : 0.0;
  };
  r->uq = extra(RoundingPoint::kQ);
  r->uk = extra(RoundingPoint::kKv);
  // v (storage s) is exact in the cache format kvf when kvf holds every
  // value of s: kvf = s, f64, or f32 for a 16-bit s (bf16 values need not
  // fit f16's exponent range).
  const Precision kvf = fmt(RoundingPoint::kKv);
  const bool v_exact = kvf == s || kvf == Precision::kF64 ||
                       (kvf == Precision::kF32 && s != Precision::kF64);
  r->uv = v_exact ? 0.0 : r->uk;
  r->ulog = extra(RoundingPoint::kLogits);
  r->up = extra(RoundingPoint::kP);
  r->uacc = extra(RoundingPoint::kPvAcc);
  r->uout = extra(RoundingPoint::kOut);
  // (Only where a point is declared: A may be inf, and inf * 0 is NaN.)
  if (r->uq + r->uk + r->ulog > 0)
    r->logit_abs =
        A * (r->uq + r->uk + r->ulog) +
        (r->ulog > 0 ? ulp(fmt(RoundingPoint::kLogits), 0) / 2 : 0.0);
  r->out_res = r->uout > 0 ? ulp(fmt(RoundingPoint::kOut), 0) / 2 : 0.0;
}

}  // namespace

ContractUnits contract_units(const ComputeContract& k, Precision s) {
  RuleScalars r;
  contract_units(k, s, 0, &r);
  ContractUnits u;
  u.u = std::max({r.uc, r.uq, r.uk, r.ulog, r.up, r.uacc, r.uout});
  const double p_half = ulp(k.format(RoundingPoint::kP, s), 0) / 2;
  u.p_res = p_half > min_normal(compute_format(s)) ? p_half : 0.0;
  u.logit_res =
      r.ulog > 0 ? ulp(k.format(RoundingPoint::kLogits, s), 0) / 2 : 0.0;
  return u;
}

namespace {

RuleScalars rule_scalars(const AttentionCase& c, Precision s,
                         const OracleAttention& orc,
                         const ComputeContract& contract) {
  const AttentionProblem& p = c.problem;
  RuleScalars r;
  r.B = p.batch;
  r.H = p.heads;
  r.D = p.head_dim;
  // A sampled row's sub-case counts and amplitude as the whole case
  // (OracleAttention::amplitude, count_*).
  r.Nq = orc.count_q_len > 0 ? orc.count_q_len : p.q_len;
  r.Nk = orc.count_kv_len > 0 ? orc.count_kv_len : p.kv_len;
  // A sink is one more term of every row sum (rule.h, "Attention sinks"):
  // the rule's row counts take it (the oracle's ties do).
  if (has_sinks(p)) ++r.Nk;
  r.us = unit_roundoff(s);
  r.A = orc.amplitude > 0 ? orc.amplitude : logit_amplitude(c);
  r.dot = orc.cosine_units > 0 ? orc.cosine_units : cosine_units(c);
  r.wf = compute_format(s);
  contract_units(contract, s, std::fabs(r.A), &r);
  r.rope = rope_units(p, s, r.uc, orc.unit_roundoff);
  r.dot_s = r.dot + (p.softcap > 0 ? kSoftcapLogitUnits : 0.0) + r.rope.logit;
  {
    const double sc = p.variant != Variant::kQKNorm ? 0
                      : p.fixed_scale               ? p.scale
                                                    : p.g;
    if (r.wf == Precision::kF32 && sc != 0 &&
        std::fabs(sc) < min_normal(Precision::kF32)) {
      const double fl = static_cast<double>(static_cast<float>(sc));
      r.s_rel = std::fabs(sc - fl) / std::fabs(sc);
    }
  }
  // Round-before-weight formulations in 16-bit storage: x_hat flips to the
  // other storage neighbour where a correct kernel's x_hat lies within its
  // error of a midpoint; the logits move by up to logit_flip more
  // (OracleAttention), twice that in P's relative terms.
  // LayerNorm's computed mean shifts a row's x_hat: the logits move by up to
  // logit_shift u_c more (OracleAttention; 0 for the other kinds).
  // RMSNorm and LayerNorm divide each row by sqrt of an L-term sum of
  // nonnegative terms; that sum's relative error can be coherent (a row of
  // one outlier and near-equal rest: every addition rounds against the same
  // running sum), so it is bounded deterministically, (L - 1) u_c (Higham
  // 4.2), halved by the sqrt, plus kOpUnits for the row's own operations:
  // div_units per side. It scales the row's x_hat, hence the logits by up to
  // (div_q + div_k) u_c A and every gradient term that reads x_hat (found by
  // the fuzzer, issue 16: layer across 4 heads, L = 52, f64, one q element
  // 8.4e298: reference:f64's lse 280 u off, margin 2.8). The paper's l2 norm
  // keeps its sum inside the cosine units (rule.h, dot).
  auto div_units = [&](int side) {
    if (p.variant != Variant::kQKNorm ||
        (p.norm.kind != NormKind::kRms && p.norm.kind != NormKind::kLayer))
      return 0.0;
    return static_cast<double>(norm_rows(p, side).len() - 1) / 2 + kOpUnits;
  };
  r.div = div_units(0) + div_units(1);
  r.logit = std::max(r.dot_s * std::fabs(r.A) + sink_shift_units(p, r.A),
                     sink_logit_units(p, r.A));
  r.soft = 2 * r.logit + 2 * std::fabs(r.A) * r.div +
           2 * orc.logit_flip / r.uc + 2 * orc.logit_shift;
  r.uo = orc.unit_roundoff;
  r.co = orc.resolution;
  r.po = orc.tiny;
  r.soft_o = 2 * r.logit + 2 * std::fabs(r.A) * r.div + 2 * orc.logit_shift;
  // The slope reads every logit error the rule grants (soft / 2 per u_c,
  // and the contract's absolute logit_abs).
  if (p.softcap > 0)
    r.slope = softcap_slope_units(r.soft / 2 + r.logit_abs / r.uc, p.softcap);
  r.Hk = kv_heads_of(p);
  r.group = p.heads / r.Hk;
  r.Lq = norm_rows(p, 0).len();
  r.Lk = norm_rows(p, 1).len();
  // An exp may flush a result below the compute format's normal range to 0
  // (blas:f32's exp2 does below 2^-126): every probability is resolved
  // only to the smallest normal, p_res (found by the fuzzer, issue 15: f32,
  // g = 1e4, P ~ 1e-40 of a key whose v is O(1), O = -2e-40 returned as 0).
  r.o_res = ulp(s, 0);
  r.c_res = ulp(r.wf, 0);
  r.p_res = std::max(min_normal(r.wf),
                     ulp(contract.format(RoundingPoint::kP, s), 0) / 2);
  r.acc_res =
      std::max(r.c_res, ulp(contract.format(RoundingPoint::kPvAcc, s), 0));
  {
    const auto nk = static_cast<double>(r.Nk);
    for (size_t i = 0; i < orc.row_ties.size(); ++i) {
      const double t = tie_sum_units(nk, d(orc.row_ties[i]));
      r.tie_max = std::max(r.tie_max, t - sum_units(nk));
    }
  }
  r.u_given = orc.given_units > 0 || orc.given_soft_units > 0
                  ? unit_roundoff(Precision::kF64)
                  : 0;
  return r;
}

// dg = sum_ij dS_ij C_ij over every batch and head, returned in the
// compute format: a B H Nq Nk-term sum of terms of magnitude dg_scale
// (each dS_ij itself a D-term dot minus delta), the softmax's
// conditioning, the stored O (relative u_s, absolute ulp_s(0)) and the
// subnormal intermediates; plus a given pass's own error (sampled).
ToleranceTable dg_table(const RuleScalars& r, const OracleAttention& orc) {
  ToleranceTable t = table(Field::kDg, r.wf, 1, 1, 1, 1, {orc.dg});
  const double n = static_cast<double>(r.B * r.H * r.Nq * r.Nk);
  const double units =
      sum_units(n) + sum_units(static_cast<double>(r.D)) + r.div + r.slope;
  t.delta[0] =
      r.uc * (units + r.soft) * d(orc.dg_scale) +
      r.uo * (times(units + r.soft_o, orc.dg_scale) + d(orc.dg_shift)) +
      times(r.co, orc.dg_uf_sens) + times(r.po, orc.dg_p_sens) +
      r.us * d(orc.dg_o_rel_sens) + r.o_res * d(orc.dg_o_sens) +
      r.c_res * d(orc.dg_uf_sens) + r.p_res * d(orc.dg_p_sens) +
      r.uc * d(orc.dg_shift) +
      r.u_given * (orc.given_units + orc.given_soft_units) * d(orc.dg_scale) +
      (2 * r.logit_abs + r.up + r.uq + r.uk + r.uv) * d(orc.dg_scale) +
      r.uout * d(orc.dg_o_rel_sens) + times(orc.operand_flip, orc.dg_scale) +
      (r.uc + r.uo) * 2 * r.tie_max * d(orc.dg_scale);
  t.cond[0] = condition(orc.dg_scale, orc.dg);
  return t;
}

// The sinks' gradient (rule.h, "Attention sinks"): dsinks_h = -sum_i
// P_sink,i delta_i over the batch and query rows of head h, P_sink,i =
// exp(sink_h - lse_i), delta_i = dO_i . O_i, from the lse and O the
// backward reads: each within its own table's bound of the oracle's
// (final_res: the final operations' resolution every table adds later).
ToleranceTable dsinks_table(const RuleScalars& r, const AttentionCase& c,
                            const OracleAttention& orc, const ToleranceTable& o,
                            const ToleranceTable& lse, double final_res) {
  const AttentionProblem& p = c.problem;
  ToleranceTable t = table(Field::kDSinks, r.wf, 1, r.H, 1, 1, orc.d_sinks);
  const int64_t Nq = p.q_len, D = p.head_dim;
  const double u = r.uc + r.uo;
  const double dot_units = sum_units(static_cast<double>(D)) + kOpUnits;
  auto bound = [&](const ToleranceTable& x, size_t e) {
    const double dl = x.delta[e] + final_res;
    return dl + half_spacing(x.fmt, d(x.expected[e]), dl);
  };
  std::vector<double> mag(static_cast<size_t>(r.H), 0);
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h) {
      const double sink = p.sinks[static_cast<size_t>(h)];
      double& dh = t.delta[static_cast<size_t>(h)];
      for (int64_t i = 0; i < Nq; ++i) {
        const auto row = static_cast<size_t>((b * r.H + h) * Nq + i);
        const LD li = orc.lse[row];
        const LD ps = std::exp(static_cast<LD>(sink) - li);
        LD delta = 0, dabs = 0;
        double bo = 0;  // sum_d |dO_id| times O_id's bound
        for (int64_t dd = 0; dd < D; ++dd) {
          const size_t e =
              row * static_cast<size_t>(D) + static_cast<size_t>(dd);
          const LD x = static_cast<LD>(c.d_o[e]);
          delta += x * orc.o[e];
          dabs += std::fabs(x) * std::fabs(orc.o[e]);
          if (x != 0) bo += std::fabs(d(x)) * bound(o, e);
        }
        // P_sink to the row's lse bound (in the exponent) and the sink's
        // own exponent (the sink rounded, its difference with lse, the exp);
        // delta to the stored O's bound and its D-term dot; P_sink below
        // the compute format's normal range to p_res, absolutely.
        if (ps > 0)
          dh += d(ps) * (d(std::fabs(delta)) *
                             (bound(lse, row) +
                              u * (2 * std::fabs(sink) + d(std::fabs(li)) +
                                   kSinkExpUnits + kOpUnits)) +
                         bo + u * dot_units * d(dabs)) +
                r.c_res * static_cast<double>(D + 1) * d(ps);
        dh += r.p_res * d(dabs);
        mag[static_cast<size_t>(h)] += d(ps * dabs);
      }
    }
  const double n = static_cast<double>(r.B * Nq);
  for (int64_t h = 0; h < r.H; ++h) {
    const auto e = static_cast<size_t>(h);
    t.delta[e] += u * sum_units(n) * mag[e] + r.c_res * (n + 2);
    t.cond[e] = condition(mag[e], orc.d_sinks[e]);
  }
  return t;
}

}  // namespace

std::vector<ToleranceTable> attention_tolerances(const AttentionCase& c,
                                                 Precision s,
                                                 const OracleAttention& orc,
                                                 bool forward_only,
                                                 const ComputeContract& k) {
  const AttentionProblem& p = c.problem;
  const RuleScalars rs = rule_scalars(c, s, orc, k);
  const int64_t B = p.batch, H = p.heads, Nq = p.q_len, Nk = p.kv_len,
                D = p.head_dim, Hk = rs.Hk, group = rs.group, Lq = rs.Lq,
                Lk = rs.Lk;
  const double us = rs.us, uc = rs.uc, A = rs.A, div = rs.div, soft = rs.soft,
               o_res = rs.o_res, c_res = rs.c_res, p_res = rs.p_res;
  const Precision wf = rs.wf;
  // The rule's counts (the whole case's for a sampled row's sub-case).
  const auto nq = static_cast<double>(rs.Nq), nk = static_cast<double>(rs.Nk);
  std::vector<ToleranceTable> out;
  // A sub-case oracle without one side's channels (RowCounts: a sampled
  // row's) gets no table for that side's fields.
  // O_id = sum_j P_ij v_jd / l_i: an Nk-term sum, the softmax's conditioning,
  // and each P_ij resolved only to the smallest normal (o_p_sens_e).
  if (!orc.o_mag.empty()) {
    ToleranceTable t = table(Field::kO, s, B, H, Nq, D, orc.o);
    // dP_ij = P_ij (dS_ij - sum_k P_ik dS_ik) moves O_id by sum_j P_ij
    // dS_ij (v_jd - O_id): at most A dot u_c o_dev_mag.
    t.masked_row.assign(orc.o.size(), 0);
    for (size_t e = 0; e < orc.o.size(); ++e) {
      // O divides by the row sum (rule.h, "Repeated summands").
      const double units =
          tie_sum_units(nk, row_ties(orc, e / static_cast<size_t>(D)));
      t.delta[e] =
          uc * (units * d(orc.o_mag[e]) + soft / 2 * d(orc.o_dev_mag[e])) +
          rs.uo * (units * d(orc.o_mag[e]) +
                   times(rs.soft_o / 2, orc.o_dev_mag[e])) +
          times(rs.po, orc.o_p_sens_e[e]) + rs.co * (nk + 2) +
          p_res * d(orc.o_p_sens_e[e]) + rs.acc_res * (nk + 2);
      if (rs.logit_abs > 0 || rs.up > 0 || rs.uacc > 0 || rs.uv > 0)
        t.delta[e] += (units * rs.uacc + rs.uv + rs.up) * d(orc.o_mag[e]) +
                      (rs.logit_abs + rs.up) * d(orc.o_dev_mag[e]);
      if (rs.uout > 0)
        t.delta[e] +=
            rs.uout * (d(std::fabs(orc.o[e])) + t.delta[e]) + rs.out_res;
      t.cond[e] = condition(orc.o_mag[e], orc.o[e]);
      t.masked_row[e] = std::isinf(orc.lse[e / static_cast<size_t>(D)]);
    }
    out.push_back(std::move(t));
  }
  // lse_i = m_i + log(l_i), kept in the compute format: absolute in S. S
  // moves by A dot u_c, log(l) by l's relative error (an Nk-term sum
  // of positive terms), and |lse| costs its own rounding and the addition.
  {
    ToleranceTable t = table(Field::kLse, wf, B, H, Nq, 1, orc.lse);
    t.masked_row.assign(orc.lse.size(), 0);
    for (size_t e = 0; e < orc.lse.size(); ++e) {
      const LD x = orc.lse[e];
      t.masked_row[e] = std::isinf(x);
      if (!std::isfinite(x)) continue;
      const double mag = d(std::fabs(x)) + std::fabs(A);
      // (dot_s + div) |A| without a sink whose logit error exceeds the
      // visible logits' (bitwise the bound before sinks).
      const double logit_units = rs.logit > rs.dot_s * std::fabs(A)
                                     ? rs.logit + div * std::fabs(A)
                                     : (rs.dot_s + div) * std::fabs(A);
      t.delta[e] =
          (uc + rs.uo) * (logit_units + tie_sum_units(nk, row_ties(orc, e)) +
                          2 * d(std::fabs(x)) + orc.logit_shift) +
          orc.logit_flip + rs.logit_abs;
      t.cond[e] = condition(mag, x);
    }
    out.push_back(std::move(t));
  }
  if (forward_only) {
    add_final_ops(&out, c_res + rs.co);
    unresolved_softmax(&out, soft * uc + 2 * rs.logit_abs);
    return out;
  }
  // dQ, dK: the dS sums (Nk resp. Nq terms) through the normalization
  // backward (a D-term dot and a division); the stored O they read enters as
  // u_s R_e (relative) and ulp_s(0) So_e (absolute), subnormal
  // intermediates as ulp_c(0) Sc_e.
  // The rounding of dP, delta, dS and the sums scales with the terms before
  // cancellation (mag: P_ij (|dO_i|.|v_j| + Del_i)). The softmax's
  // conditioning perturbs P_ij by P_ij (dS_ij - sum_k P_ik dS_ik), at most
  // 2 A dot u_c P_ij, so dS_ij = P_ij (dP_ij - delta_i) by that times
  // |dP_ij - delta_i|, and by P_ij times delta_i's own perturbation, at most
  // A dot u_c sum_k P_ik |dP_ik - delta_i| (ds_mag carries both, as
  // P_ij (|dP_ij - delta_i| + that sum / 2), through the same sums).
  auto grad = [&](Field f, const std::vector<LD>& x, int64_t heads,
                  int64_t rows, double n, int64_t L, const std::vector<LD>& mag,
                  const std::vector<LD>& ds_mag, const std::vector<LD>& o_rel,
                  const std::vector<LD>& o_sens, const std::vector<LD>& uf,
                  const std::vector<LD>& p_sens, const std::vector<LD>& shift,
                  const std::vector<LD>& flip, bool rows_tie, bool row_norm,
                  const std::vector<LD>& rope_mag) {
    ToleranceTable t = table(f, s, B, heads, rows, D, x);
    const double base = sum_units(n + static_cast<double>(L)) + div + rs.slope;
    for (size_t e = 0; e < x.size(); ++e) {
      // The terms dS_ij = P_ij (dP_ij - delta_i) move with their row's
      // normalization, twice (P and delta; rule.h, "Repeated summands"):
      // dQ's row by its tie excess (exactly 0 without ties).
      const double units =
          rows_tie
              ? base + 2 * (tie_sum_units(
                                n, row_ties(orc, e / static_cast<size_t>(D))) -
                            sum_units(n))
              : base;
      // dK's rows by their normalization error times their share z_i
      // (rule.h, "The row normalization in the backward"; sum_i w_i z_i^2
      // <= max_i w_i z_i sum_i z_i).
      double norm = 0;
      if (row_norm && e < orc.dk_norm_rep_e.size()) {
        const LD m = mag[e], z = orc.dk_norm_z_e[e];
        const LD all = orc.dk_rowmax_e[e] * z;
        norm = row_norm_units(
            static_cast<LD>(n + static_cast<double>(L)) * m * m, all,
            orc.dk_sum_rowmax_e[e] * z, all, orc.dk_norm_lin_e[e],
            orc.dk_norm_lse_lin_e[e], orc.dk_norm_rep_e[e]);
      }
      t.delta[e] =
          uc * (units * d(mag[e]) + soft * d(ds_mag[e]) + d(shift[e])) +
          rs.uo *
              (units * d(mag[e]) + times(rs.soft_o, ds_mag[e]) + d(shift[e])) +
          (uc + rs.uo) * norm + times(rs.co, uf[e]) + times(rs.po, p_sens[e]) +
          us * d(o_rel[e]) + o_res * d(o_sens[e]) + c_res * d(uf[e]) +
          p_res * d(p_sens[e]) +
          rs.u_given * (orc.given_units * d(mag[e]) +
                        orc.given_soft_units * d(ds_mag[e])) +
          rs.s_rel * d(mag[e]) + (rs.uq + rs.uk + rs.uv) * d(mag[e]) +
          (2 * rs.logit_abs + rs.up) * d(ds_mag[e]) + rs.uout * d(o_rel[e]) +
          (flip.empty() ? 0.0 : d(flip[e])) +
          uc * rs.rope.grad * d(rope_mag.empty() ? mag[e] : rope_mag[e]);
      t.cond[e] = condition(mag[e], x[e]);
    }
    return t;
  };
  if (!orc.dq_mag.empty())
    out.push_back(grad(Field::kDq, orc.dq, H, Nq, nk, Lq, orc.dq_mag,
                       orc.dq_ds_mag, orc.dq_o_rel_e, orc.dq_o_sens_e,
                       orc.dq_uf_sens_e, orc.dq_p_sens_e, orc.dq_shift_e,
                       orc.dq_flip_e, true, false, orc.dq_rope_mag));
  if (!orc.dk_mag.empty())
    out.push_back(grad(Field::kDk, orc.dk, Hk, Nk, group * nq, Lk, orc.dk_mag,
                       orc.dk_ds_mag, orc.dk_o_rel_e, orc.dk_o_sens_e,
                       orc.dk_uf_sens_e, orc.dk_p_sens_e, orc.dk_shift_e,
                       orc.dk_flip_e, false, true, orc.dk_rope_mag));
  // dV_jd = sum_i P_ij dO_id: an Nq-term sum; P carries the softmax's
  // conditioning.
  if (!orc.dv_mag.empty()) {
    ToleranceTable t = table(Field::kDv, s, B, Hk, Nk, D, orc.dv);
    const double units = sum_units(group * nq) + soft,
                 units_o = sum_units(group * nq) + rs.soft_o;
    for (size_t e = 0; e < orc.dv.size(); ++e) {
      // Below the normal range each of the Nq products and sums rounds to
      // ulp_c(0) (found by the fuzzer, issue 15: f32, dO = 2 ulp(0), P =
      // 1/4: four products of 0.5 ulp(0) rounded to even).
      t.delta[e] = (uc * units + rs.uo * units_o) * d(orc.dv_mag[e]) +
                   times(rs.po, orc.dv_p_sens_e[e]) + rs.co * (group * nq + 2) +
                   p_res * d(orc.dv_p_sens_e[e]) + c_res * (group * nq + 2) +
                   rs.u_given * orc.given_soft_units * d(orc.dv_mag[e]) +
                   (2 * rs.logit_abs + rs.up) * d(orc.dv_mag[e]);
      // The backward's P reads the stored lse: each row normalization's
      // rounding (rule.h, "The row normalization in the backward"; 0 where
      // not formed), beside the sum's own G Nq additions of at most M each.
      if (e < orc.dv_norm_rep_e.size()) {
        const LD m = orc.dv_mag[e];
        const LD bs = orc.dv_norm_sq_e[e], bl = orc.dv_norm_lse_sq_e[e];
        t.delta[e] +=
            (uc + rs.uo) * row_norm_units(static_cast<LD>(group * nq) * m * m,
                                          bs + bl, bs, bl, orc.dv_norm_lin_e[e],
                                          orc.dv_norm_lse_lin_e[e],
                                          orc.dv_norm_rep_e[e]);
      }
      t.cond[e] = condition(orc.dv_mag[e], orc.dv[e]);
    }
    out.push_back(std::move(t));
  }
  out.push_back(dg_table(rs, orc));  // dg: see dg_table
  // The parameter gradients (issue 16), returned in the compute format:
  // each element sums R rows' x_hat_e dx_tilde_e (weight) or dx_tilde_e
  // (bias), and each dx_tilde_e is itself an n-term sum (Nk keys for q,
  // group * Nq queries for k): R- and n-term sums of the channels carried
  // like dq's (OracleAttention: magnitude, softmax terms, stored O, the
  // subnormal counts, P's resolution), plus x_hat's own rounding (kOpUnits)
  // and R subnormal roundings of the row sum.
  // sh (weights; may be null): the weight's channels weighted by the rows'
  // LayerNorm mean shifts (rule.h, "The weight gradient's product"): u_c
  // times the same channel terms, with one row's units (an n-term sum),
  // bound the product of x_hat's shift and dx_tilde's own error.
  using Channels = std::array<std::vector<LD>, kChannels>;
  auto param = [&](Field f, const std::vector<LD>& x, const Channels& ch,
                   int64_t R, int64_t n, const Channels* sh) {
    if (x.empty()) return;
    ToleranceTable t = table(f, wf, 1, 1, 1, static_cast<int64_t>(x.size()), x);
    const double row_units =
        sum_units(static_cast<double>(n)) + kOpUnits + div + rs.slope;
    const double units = sum_units(static_cast<double>(R)) +
                         sum_units(static_cast<double>(n)) + kOpUnits + div +
                         rs.slope + rs.rope.grad;
    // The channel terms of element e of cs, with un units for the sums and
    // `rows` subnormal roundings of the row sum.
    auto terms = [&](const Channels& cs, size_t e, double un, double rows) {
      auto chan = [&](Channel k) { return cs[at(k)][e]; };
      return uc * (un * d(chan(Channel::kMagnitude)) +
                   soft * d(chan(Channel::kSoftmaxTerms)) +
                   d(chan(Channel::kLayerShift))) +
             rs.uo * (un * d(chan(Channel::kMagnitude)) +
                      times(rs.soft_o, chan(Channel::kSoftmaxTerms)) +
                      d(chan(Channel::kLayerShift))) +
             (rs.co == 0 ? 0
                         : rs.co * (d(chan(Channel::kSubnormalCount)) + rows)) +
             times(rs.po, chan(Channel::kPResolution)) +
             us * d(chan(Channel::kStoredORel)) +
             o_res * d(chan(Channel::kStoredOAbs)) +
             c_res * (d(chan(Channel::kSubnormalCount)) + rows) +
             p_res * d(chan(Channel::kPResolution)) +
             rs.s_rel * d(chan(Channel::kMagnitude)) +
             (rs.uq + rs.uk + rs.uv) * d(chan(Channel::kMagnitude)) +
             (2 * rs.logit_abs + rs.up) * d(chan(Channel::kSoftmaxTerms)) +
             rs.uout * d(chan(Channel::kStoredORel)) +
             (cs[at(Channel::kRoundingFlip)].empty()
                  ? 0.0
                  : d(chan(Channel::kRoundingFlip)));
    };
    const bool shifts = sh != nullptr && !(*sh)[0].empty();
    for (size_t e = 0; e < x.size(); ++e) {
      t.delta[e] = terms(ch, e, units, static_cast<double>(R + 2));
      if (shifts) t.delta[e] += uc * terms(*sh, e, row_units, 0);
      t.cond[e] = condition(ch[at(Channel::kMagnitude)][e], x[e]);
    }
    out.push_back(std::move(t));
  };
  param(Field::kDqWeight, orc.dq_weight, orc.dq_weight_ch, orc.q_param_rows,
        std::max(rs.Nk, group * rs.Nq), &orc.dq_weight_sh_ch);
  param(Field::kDkWeight, orc.dk_weight, orc.dk_weight_ch, orc.k_param_rows,
        group * rs.Nq, &orc.dk_weight_sh_ch);
  param(Field::kDqBias, orc.dq_bias, orc.dq_bias_ch, orc.q_param_rows, rs.Nk,
        nullptr);
  param(Field::kDkBias, orc.dk_bias, orc.dk_bias_ch, orc.k_param_rows,
        group * rs.Nq, nullptr);
  if (!orc.d_sinks.empty()) {
    const ToleranceTable* o = nullptr;
    const ToleranceTable* lse = nullptr;
    for (const ToleranceTable& t : out) {
      if (t.field == Field::kO) o = &t;
      if (t.field == Field::kLse) lse = &t;
    }
    if (o != nullptr && lse != nullptr)
      out.push_back(dsinks_table(rs, c, orc, *o, *lse, c_res + rs.co));
  }
  add_final_ops(&out, c_res + rs.co);
  unresolved_softmax(&out, soft * uc + 2 * rs.logit_abs);
  return out;
}

ToleranceTable attention_dg_tolerance(const AttentionCase& c, Precision s,
                                      const OracleAttention& orc,
                                      const ComputeContract& k) {
  const RuleScalars rs = rule_scalars(c, s, orc, k);
  std::vector<ToleranceTable> out{dg_table(rs, orc)};
  add_final_ops(&out, rs.c_res + rs.co);
  unresolved_softmax(&out, rs.soft * rs.uc + 2 * rs.logit_abs);
  return out[0];
}

std::vector<ToleranceTable> scalenorm_tolerances(const ScaleNormCase& c,
                                                 Precision s,
                                                 const OracleScaleNorm& orc) {
  const ScaleNormProblem& p = c.problem;
  const int64_t R = p.rows, Dm = p.dim;
  const double uc = compute_roundoff(s);
  const Precision wf = compute_format(s);
  const double c_res = ulp(wf, 0);
  const LD g = std::fabs(static_cast<LD>(p.g));
  std::vector<ToleranceTable> out;
  ToleranceTable ty = table(Field::kY, s, 1, 1, R, Dm, orc.y);
  ToleranceTable tx = table(Field::kDx, s, 1, 1, R, Dm, orc.dx);
  // y = g x / n, n a Dm-term sum of squares under a sqrt: |dy| <=
  // (sum_units(Dm) + 3) u_c |y| (no cancellation). dx = (g / n)(dy - u (u .
  // dy)): magnitude (g / n)(|dy_e| + |u_e| sum_k |u_k| |dy_k|) with the same
  // units plus the dot's.
  // Below the compute format's normal range every intermediate is resolved
  // only to ulp_c(0), absolutely, and a kernel may form the products in any
  // order: y as (g x) / n, (g / n) x or g (x / n) carries ulp_c(0) / 2 times
  // 1 / n, |x_e| or |g| (found by the fuzzer: f64, x / n = 4e-336 flushed
  // to 0 and then times g = 1.5e32; f32, x / n below 2^-149 times g = 25).
  // dx: c = u . dy and u_e c carry up to (Dm + 1) ulp_c(0), times g / n;
  // u's own components (ulp_c(0) each) reach dx through g / n times
  // sum |dy| + |u . dy|; the factor g / n (or g w / n) times |w_e| (or 1/n),
  // w = dy - u (u . dy); and a kernel that scales by g first carries the
  // Dm + 2 roundings of g dy, g u c and its g-scaled dot below the normal
  // range, ulp_c(0) each (counted twice: a half-ulp rounding on each side of
  // the subtraction), through / n (found by the fuzzer, issue 15: f64, g =
  // 1.05e-321, 11 ulp(0) / n where 1 / n was allowed).
  const double units = sum_units(static_cast<double>(Dm)) + 3;
  // g below the compute format's normal range: the entry receives g as a
  // double and holds it to ulp_c(0) only; y and dx are linear in g, so they
  // may be off by g_rel = |g - fl_c(g)| / |g| relatively (attention's s_rel;
  // found by the CI's fixed-seed fuzz run on another CPU, stop 39: f32,
  // g = 2.2e-41, reference:f32 dx off by 3.0e-5 relatively, margin 8.7). 0
  // for a normal g, whose relative rounding the op units cover.
  double g_rel = 0;
  if (wf == Precision::kF32 && g != 0 && g < min_normal(Precision::kF32)) {
    const double gd = std::fabs(p.g);
    g_rel = std::fabs(gd - static_cast<double>(static_cast<float>(gd))) / gd;
  }
  for (int64_t r = 0; r < R; ++r) {
    const double* xr = c.x.data() + r * Dm;
    const double* dyr = c.dy.data() + r * Dm;
    std::vector<LD> xl(xr, xr + Dm);
    const LD n = std::max<LD>(reference::nrm2<LD>(xl.data(), Dm), p.eps);
    LD ud = 0, dy_l1 = 0;
    for (int64_t i = 0; i < Dm; ++i) {
      ud += std::fabs(xr[i] / n * dyr[i]);
      dy_l1 += std::fabs(static_cast<LD>(dyr[i]));
    }
    for (int64_t i = 0; i < Dm; ++i) {
      const size_t e = static_cast<size_t>(r * Dm + i);
      const LD ax = std::fabs(static_cast<LD>(xr[i]));
      ty.delta[e] = uc * units * d(std::fabs(orc.y[e])) +
                    c_res * d(g + ax + 1 / n) + g_rel * d(std::fabs(orc.y[e]));
      const LD w = std::fabs(static_cast<LD>(dyr[i])) + ax / n * ud;
      const LD mag = g / n * w;
      tx.delta[e] = uc * (units + sum_units(static_cast<double>(Dm))) * d(mag) +
                    c_res * d((Dm + 1) * g / n + g / n * (dy_l1 + ud) + w +
                              (2 * Dm + 4) / n) +
                    g_rel * d(mag);
      tx.cond[e] = condition(mag, orc.dx[e]);
    }
  }
  out.push_back(std::move(ty));
  out.push_back(std::move(tx));
  // dg = sum over rows of dy . u: R Dm terms of magnitude dg_scale. Below
  // the normal range each u_i is resolved only to ulp_c(0), times |dy_i|,
  // and each product and sum rounds to ulp_c(0) (found by the fuzzer, issue
  // 15: f64, u_0 = 7.3e-309 / 5.6e303 flushed to 0 beside dy_0 = -5.6e303).
  LD dy_total = 0;
  for (double v : c.dy) dy_total += std::fabs(static_cast<LD>(v));
  ToleranceTable tg = table(Field::kScaleNormDg, wf, 1, 1, 1, 1, {orc.dg});
  tg.delta[0] =
      uc * (sum_units(static_cast<double>(R * Dm)) + units) * d(orc.dg_scale) +
      c_res * (d(dy_total) + static_cast<double>(2 * R * Dm + 2));
  tg.cond[0] = condition(orc.dg_scale, orc.dg);
  out.push_back(std::move(tg));
  add_final_ops(&out, c_res);
  return out;
}

}  // namespace qknorm::validation
