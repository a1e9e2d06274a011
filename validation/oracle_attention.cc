#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "reference/reference.h"
#include "validation/operands.h"
#include "validation/oracle.h"
#include "validation/oracle_internal.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {
namespace {

// y += a x, y += x, y += a |x|, y += |x| over n contiguous elements: the
// channel loops' updates, one array at a time (vectorized; no element's
// order of operations changes).
template <class T>
void axpy(int64_t n, T a, const T* __restrict x, T* __restrict y) {
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}
template <class T>
void add(int64_t n, const T* __restrict x, T* __restrict y) {
  for (int64_t d = 0; d < n; ++d) y[d] += x[d];
}
template <class T>
void axpy_abs(int64_t n, T a, const T* __restrict x, T* __restrict y) {
  for (int64_t d = 0; d < n; ++d) y[d] += a * std::fabs(x[d]);
}
template <class T>
void add_abs(int64_t n, const T* __restrict x, T* __restrict y) {
  for (int64_t d = 0; d < n; ++d) y[d] += std::fabs(x[d]);
}

// The row sum's relative rounding error per u at most, in any order of its
// additions (any binary tree: sequential, blocked, pairwise), from its
// terms t (normalized, sorted ascending: row_tie_excess sorts them): each
// addition rounds by at most u times its result, and the r-th largest of
// the n - 1 results is a sum of at most n - r + 1 terms (the results with
// at least m terms are at most n - m + 1 of a binary tree's internal
// nodes), so at most the sum S_(n - r + 1) of the n - r + 1 largest:
// sum_{m=2..n} S_(m) (Higham 4.2's bound with each partial sum at its
// largest; n - 1 for one dominant term, (n + 1) / 2 for n equal ones),
// plus kOpUnits for the row's other operations.
double partial_sum_units(const std::vector<double>& t) {
  double units = kOpUnits, top = 0;
  for (size_t k = t.size(); k-- > 0;) {
    top += t[k];
    if (k + 1 < t.size()) units += top;
  }
  return units;
}

// Below this, exp in long double returns 0 (half its smallest subnormal):
// the P_ij > 0 of the long-double oracle, which the channels of a narrower
// oracle reproduce from S (oracle_in, alive).
const long double kWideExpFloor =
    std::log(std::numeric_limits<long double>::denorm_min() / 2);

// P_ij = exp(S_ij - lse_i) with the given lse (0 where masked), and S_ij
// (where S is not null) as the reference's backward forms it: the scale
// times the D-term dot of the logit operands (capped: attention.h softcap).
template <class LD>
void given_probabilities(const AttentionCase& c, const OperandMagsT<LD>& qm,
                         const OperandMagsT<LD>& km, const std::vector<LD>& lse,
                         LD* probs, LD* S) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len,
                Hk = kv_heads_of(p), group = p.heads / Hk;
  const LD sc = p.variant != Variant::kQKNorm
                    ? 1 / std::sqrt(static_cast<LD>(D))
                : p.fixed_scale ? static_cast<LD>(p.scale)
                                : static_cast<LD>(p.g);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hq = 0; hq < p.heads; ++hq) {
      const int64_t bh = b * p.heads + hq, bk = b * Hk + hq / group;
      for (int64_t i = 0; i < Nq; ++i) {
        const LD* qt = qm.xt.data() + (bh * Nq + i) * D;
        const LD l = lse[static_cast<size_t>(bh * Nq + i)];
        for (int64_t j = 0; j < Nk; ++j) {
          LD t = 0;
          const LD* kt = km.xt.data() + (bk * Nk + j) * D;
          for (int64_t d = 0; d < D; ++d) t += qt[d] * kt[d];
          const auto e = static_cast<size_t>((bh * Nq + i) * Nk + j);
          LD x = sc * t;
          if (p.softcap > 0) {
            const auto cap = static_cast<LD>(p.softcap);
            x = cap * std::tanh(x / cap);
          }
          probs[e] = visible(p.mask, b, i, j, Nq, Nk) ? std::exp(x - l) : 0;
          if (S != nullptr) S[e] = x;
        }
      }
    }
}

}  // namespace

// The oracle in arithmetic T (oracle_internal.h).
template <class T>
void oracle_in(const AttentionCase& c, const GivenRows* given,
               const RowCounts& counts, const SubCaseOf& sub,
               OracleArrays<T>& a, OracleValues<T>& r, OracleAttention& out) {
  using LD = T;  // the oracle's arithmetic (the name the loops below use)
  const AttentionProblem& p = c.problem;
  std::vector<LD>&q = a.q, &k = a.k, &v = a.v, &d_o = a.d_o;
  q.assign(c.q.begin(), c.q.end());
  k.assign(c.k.begin(), c.k.end());
  v.assign(c.v.begin(), c.v.end());
  d_o.assign(c.d_o.begin(), c.d_o.end());
  std::array<std::vector<LD>, 4> store;
  const reference::NormArgs<LD> w = norm_args<LD>(c, &store);
  // Both sides' logit operands, normalized once: the forward, backward,
  // probabilities and magnitudes below all read them (OperandMags::view).
  // (or sliced from the whole case's, SharedOperands).
  const OperandMagsT<LD>* shared_q = shared_side<LD>(sub.shared, 0);
  if (shared_q != nullptr) {
    slice_operand_mags(*shared_q, sub.b, sub.q_head, sub.q_row, norm_rows(p, 0),
                       &a.qm);
    slice_operand_mags(*shared_side<LD>(sub.shared, 1), sub.b, sub.k_head,
                       sub.k_row, norm_rows(p, 1), &a.km);
  } else {
    fill_operand_mags(c, 0, q.data(), w, &a.qm);
    fill_operand_mags(c, 1, k.data(), w, &a.km);
  }
  const OperandMagsT<LD>&qm = a.qm, &km = a.km;
  const reference::OperandView<LD> qv = qm.view(), kv = km.view();
  // RowCounts: the outputs of a side the caller does not need are not
  // formed, nor, in a sub-case (either side off), the case-wide scalars.
  const bool qs = counts.q_side, ks = counts.k_side, whole = qs && ks;
  r.o.resize(q.size());
  r.lse.resize(static_cast<size_t>(p.batch * p.heads * p.q_len));
  // P, and in a sub-case S for the backward: there the forward (or the
  // given rows' loop) returns them, the logits formed once instead of in
  // each of forward, probabilities and backward (the full long-double
  // oracle keeps no S: as large as P). An oracle narrower than long double
  // keeps S always: its P flushes to 0 below its range where long double's
  // does not (exp(S - lse) < 2^-1074 in double), and the channels that ask
  // whether P_ij > 0 (kPResolution, o_p_sens_e, dv_p_sens_e) ask it of
  // long double's P, from S (alive below).
  constexpr bool narrow = !std::is_same_v<T, long double>;
  const bool cache = !whole || narrow;
  const auto pairs =
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len);
  std::vector<LD>&probs = a.probs, &logits = a.logits;
  probs.resize(pairs);
  logits.resize(cache ? pairs : 0);
  LD* const S = cache ? logits.data() : nullptr;
  if (given == nullptr) {
    reference::attention_forward<LD>(p, qv, kv, v.data(), r.o.data(),
                                     r.lse.data(),
                                     cache ? probs.data() : nullptr, S);
    if (!cache) reference::attention_probabilities<LD>(p, qv, kv, probs.data());
  } else {
    // The rows' lse as given, and an O whose dO . O is the given delta (the
    // backward reads delta from O): O_i = delta_i dO_i / ||dO_i||^2.
    const auto D = static_cast<size_t>(p.head_dim);
    const size_t rows = static_cast<size_t>(p.batch * p.heads * p.q_len);
    for (const std::vector<long double>* x :
         {&given->lse, &given->delta, &given->del, &given->ds_l1, &given->o_abs,
          &given->p_del})
      if (x->size() != rows)
        throw Error("oracle_attention", {},
                    "GivenRows holds " + std::to_string(x->size()) +
                        " values of a statistic where the case has " +
                        std::to_string(rows) + " query rows");
    r.lse.assign(given->lse.begin(), given->lse.end());
    out.given_units = given->units;
    out.given_soft_units = given->soft_units;
    for (size_t row = 0; row < r.lse.size(); ++row) {
      const LD* doi = d_o.data() + row * D;
      LD ss = 0;
      for (size_t d = 0; d < D; ++d) ss += doi[d] * doi[d];
      for (size_t d = 0; d < D; ++d)
        r.o[row * D + d] = ss > 0 ? given->delta[row] / ss * doi[d] : 0;
    }
    given_probabilities(c, qm, km, r.lse, probs.data(), S);
  }
  r.dq.resize(qs ? q.size() : 0);
  r.dk.resize(ks ? k.size() : 0);
  r.dv.resize(ks ? v.size() : 0);
  r.dq_weight.resize(c.q_weight.size());
  r.dk_weight.resize(c.k_weight.size());
  r.dq_bias.resize(c.q_bias.size());
  r.dk_bias.resize(c.k_bias.size());
  reference::NormGrads<LD> dw;
  auto ptr = [](std::vector<LD>& x) { return x.empty() ? nullptr : x.data(); };
  dw.q_weight = ptr(r.dq_weight);
  dw.k_weight = ptr(r.dk_weight);
  dw.q_bias = ptr(r.dq_bias);
  dw.k_bias = ptr(r.dk_bias);
  // The sinks' gradient sums every query row: the whole case's only.
  r.d_sinks.assign(has_sinks(p) && whole ? static_cast<size_t>(p.heads) : 0, 0);
  dw.sinks = ptr(r.d_sinks);
  reference::attention_backward<LD>(
      p, q.data(), k.data(), qv, kv, v.data(), r.o.data(), d_o.data(),
      r.lse.data(), qs ? r.dq.data() : nullptr, ks ? r.dk.data() : nullptr,
      ks ? r.dv.data() : nullptr, whole ? &r.dg : nullptr, nullptr, w, dw, S);
  // Once per case (every entry's tables read it, and the row sums' ties
  // below): O(B H Nq Nk D) where rows have dominant channels, as the logits.
  // (A sub-case's own, for its row sums' ties: the whole case's are the
  // caller's.)
  // (A sampled row's sub-case reads its pairs from the whole case's rows.)
  const double case_cos_units =
      sub.shared == nullptr
          ? cosine_units(c)
          : sub.shared->cosine().units({p.batch, p.heads, kv_heads_of(p),
                                        p.q_len, p.kv_len, sub.b, sub.q_head,
                                        sub.q_row, sub.k_head, sub.k_row});
  // dg sums dS_ij C_ij with dS_ij = P_ij (dP_ij - delta_i): the rounding
  // error of those terms scales with P_ij (|dP_ij| + |delta_i|), not with
  // |dS_ij|, which cancels to ~0 when the visible v_j are alike (found by the
  // fuzzer, issue 7: v = 7e4 everywhere, sum |dS| = 0, correct kernels 1e-2
  // apart). dg_scale is that pre-cancellation magnitude (>= sum |dS|).
  //
  // dq, dk and dv are sums of the same kind of terms, and they too can cancel
  // to ~0 (head_dim 1, where the projection removes everything; symmetric
  // rows; saturated rows): their scales are the magnitudes of their terms
  // before cancellation, max over elements of
  //   |dv_jd|:  sum_i P_ij |dO_id|
  //   |du_id|:  s sum_j T_ij |k_hat_jd|, T_ij = P_ij (|dO_i|.|v_j| + Del_i),
  //             Del_i = sum_k P_ik |dO_i|.|v_k|,
  //             s = |g| (qknorm) or 1/sqrt(D) (sdpa); |du_jd| for keys with
  //             T^T and q_hat;
  //   |dx_d|:   (|du_d| + |u_d| sum_e |u_e| |du_e|) / max(||x||, eps) through
  //             the normalization backward (qknorm).
  // |x|.|y| = sum_d |x_d||y_d| is the magnitude a dot product's rounding
  // error scales with (Higham, Accuracy and Stability, 3.1), not |x . y|:
  // dP_ij = dO_i . v_j and delta_i = sum_k P_ik dP_ik = dO_i . O_i can both
  // cancel (found by the fuzzer, issue 7: sdpa, q = 0, P uniform over 7
  // keys, delta = 0.036 from terms of ~3; a correct blas:f64 dq was 17 ulp
  // of |dq| off where the old scale, built on |dP| and |delta|, allowed 4).
  // Del_i bounds both ways of computing delta (|dO_i|.|O_i| <= Del_i).
  //
  // The backward also reads the stored O (delta = dO . O), and each entry
  // stores its own: below the normal range the storage format resolves O
  // only to ulp_s(0), absolutely, so two correct entries' O differ by that
  // much whatever their relative accuracy. Its effect on a gradient is the
  // sensitivity *_o_sens times ulp_s(0) (verdict), with
  //   dS_ij per unit of O error: P_ij sum_d |dO_id|
  // carried through the same sums as T_ij (found by the fuzzer, issue 7:
  // f32, zero q rows, O ~ 1e-42 stored with 1.4e-45 resolution, dq = g dS
  // k_hat / eps with eps = 2.9e-36: a correct simd dq 4% off, the naive 0.6%).
  //
  // Likewise the compute format resolves its own intermediates only to
  // ulp_c(0) below the normal range: dP_ij and delta_i (D products and sums
  // each, <= D ulp_c(0)), dS_ij = P_ij (dP_ij - delta_i) (<= P_ij (2D + 1)
  // + 1), du = s sum_j dS_ij k_hat_j (+ Nk for its own sums) and the
  // normalization backward's u . du (+ D + 2). *_uf_sens is that count per
  // ulp_c(0), carried through the normalization backward (found by the
  // fuzzer, issue 7: f32, zero q rows, eps = 2.9e-36, dO ~ 4.6e-40: dP is a
  // subnormal with a few bits, a correct blas:f32 dq returned 0 for -3.9e-9,
  // the naive -5.7e-9). A kernel that scales dS before the product with the
  // other operand, (s dS_ij) k_j, rounds s dS_ij once more: one ulp_c(0)
  // per pair not scaled by s, so the count adds |x_tilde'| per pair outside
  // the factor s (found by the CI's fixed-seed fuzz run of issue 19: sdpa,
  // f32, dP ~ 1e-40 and dS ~ 7 ulp(0): reference:f32, which forms
  // scale * dS first, had dk 1.0-1.5 bounds off on a whole row).
  // Outside subnormal intermediates both terms are far below u * scale.
  {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len,
                  Hk = kv_heads_of(p), group = p.heads / Hk;
    const bool qk = p.variant == Variant::kQKNorm;
    // The logit operands of both sides (x_tilde signed, and its magnitude
    // before cancellation |x_hat| |w| + |beta|), x_hat and each row's
    // divisor (OperandMags).
    const LD s_signed = qk ? static_cast<LD>(p.fixed_scale ? p.scale : p.g)
                           : 1 / std::sqrt(static_cast<LD>(D));
    const LD s = std::fabs(s_signed);
    const auto cap = static_cast<LD>(p.softcap);
    const bool learned = qk && !p.fixed_scale;
    const bool layer = qk && p.norm.kind == NormKind::kLayer;
    LD logit_shift = 0;
    const bool shift_zero = std::isfinite(s) && qm.xa_finite && km.xa_finite;
    auto absdot = [D](const LD* a, const LD* b) {
      LD t = 0;
      for (int64_t d = 0; d < D; ++d) t += std::fabs(a[d]) * std::fabs(b[d]);
      return t;
    };
    auto norm2 = [D](const LD* a) {
      LD t = 0;
      for (int64_t d = 0; d < D; ++d) t += a[d] * a[d];
      return std::sqrt(t);
    };
    // Seven channels (Channel, validation/field.h) carried through the same
    // sums: kMagnitude the rounding scale (weight T_ij), kStoredOAbs the
    // stored-O sensitivity (P_ij sum_d |dO_id|), kSubnormalCount the
    // subnormal-intermediate count of dS_ij (P_ij (2D + 1) + 1; it adds its
    // own sums' count to du before the normalization backward), kStoredORel
    // the stored-O relative sensitivity (P_ij |dO_i|.|O_i|), kSoftmaxTerms
    // |dS_ij| = P_ij |dP_ij - delta_i| (exact), the size of the terms the
    // softmax's conditioning perturbs (rule.cc), kPResolution P_ij's own
    // resolution (|dP_ij - delta_i| for every visible P_ij, plus P_ij
    // p_del_i: every P_ik's resolution moves delta_i by up to |dO_i|.|v_k|,
    // and dS_ij by P_ij times that; found by the fuzzer in the CI's
    // fixed-seed run of issue 19: sdpa, f32, a key of P = 7e-45 (five
    // ulp(0)) with |v| ~ 2^66 beside the key of P = 1: delta, so dS of that
    // key and dq, 2% off in reference:f32, margin 167; the CI's case returned
    // dq = 0 for 7.8e-20, margin 7.9e3), kLayerShift LayerNorm's mean shift
    // (below). They are accumulated per element of the logit operands'
    // gradients (dq_tilde, dk_tilde; dk's summed over each kv head's group
    // of query heads), then carried through the weight and the
    // normalization backward per row.
    constexpr int kCh = kChannels;
    std::array<std::vector<LD>, kCh>&mq = a.mq, &mk = a.mk;
    // A side the caller does not judge (RowCounts) gets none of its
    // per-element arrays: a sampled row's sub-case of a long problem would
    // otherwise fill hundreds of MB it never reads.
    for (int ch = 0; ch < kCh; ++ch) {
      if (qs) mq[ch].assign(q.size(), 0);
      if (ks) mk[ch].assign(k.size(), 0);
    }
    // Signed du (the true gradients of q_tilde, k_tilde) and, per element
    // of each, s sum |dS| times the other side's operand resolution
    // (operand_resolution), for unit_resolution.
    std::vector<LD>&du_q = a.du_q, &du_k = a.du_k, &ads_q = a.ads_q,
    &ads_k = a.ads_k;
    du_q.assign(qs ? q.size() : 0, 0);
    du_k.assign(ks ? k.size() : 0, 0);
    ads_q.assign(qs ? q.size() : 0, 0);
    ads_k.assign(ks ? k.size() : 0, 0);
    // And s sum |dS| per logit-operand row, unweighted (adr): the per-row
    // terms that per-element ads does not replace (see `side` below).
    std::vector<LD>&adr_q = a.adr_q, &adr_k = a.adr_k;
    adr_q.assign(static_cast<size_t>(p.batch * p.heads * Nq), 0);
    adr_k.assign(static_cast<size_t>(p.batch * Hk * Nk), 0);
    // Round-before-weight in 16-bit storage: a kernel's x_hat may round to
    // the other storage neighbour (qm.fl, km.fl), which moves x_tilde by
    // fl |w| (flt). The logits read it (logit_flip, in the softmax terms),
    // and so does the other side's gradient directly, dx_tilde' = s sum dS
    // x_tilde: by s sum |dS| flt per element, kRoundingFlip, carried like
    // the other channels (rule.h; found by the property soak, issue 32:
    // qwen3, bf16, one q element at a midpoint, x_hat = 2.6e-15, moved dk
    // by 6.2e-16 where the bound was 5.5e-16).
    const bool flips = !qm.fl.empty();
    std::vector<LD>&flt_q = a.flt_q, &flt_k = a.flt_k;
    if (flips) {
      flt_q.resize(qm.fl.size());
      flt_k.resize(km.fl.size());
      for (size_t e = 0; e < flt_q.size(); ++e)
        flt_q[e] = qm.fl[e] * std::fabs(qm.wv[e]);
      for (size_t e = 0; e < flt_k.size(); ++e)
        flt_k[e] = km.fl[e] * std::fabs(km.wv[e]);
      // RoPE after the normalization: a flip of x_tilde_a moves the rotated
      // pair's elements by |cos| and |sin| times it (rule.h, "RoPE").
      if (!qm.xar.empty()) rope_pair_sum(p, &flt_q);
      if (!km.xar.empty()) rope_pair_sum(p, &flt_k);
    }
    // LayerNorm's per-element shifts as the logits' coordinates see them
    // (RoPE after the normalization: pair sums, rule.h "RoPE").
    std::vector<LD> sh_q = qm.sh, sh_k = km.sh;
    if (!qm.xar.empty()) {
      rope_pair_sum(p, &sh_q);
      rope_pair_sum(p, &sh_k);
    }
    // The other side's operand resolution, for the side that reads it.
    std::vector<LD>&res_q = a.res_q, &res_k = a.res_k;
    if (ks) operand_resolution(p, qm, &res_q);
    if (qs) operand_resolution(p, km, &res_k);
    // RoPE: a rotated element is resolved to its pair's resolutions
    // (|cos| res_a + |sin| res_b <= res_a + res_b).
    if (rope_before_norm_backward(p)) {
      rope_pair_sum(p, &res_q);
      rope_pair_sum(p, &res_k);
    }
    if (qs) {
      r.o_mag.assign(q.size(), 0);
      r.o_dev_mag.assign(q.size(), 0);
      r.o_p_sens_e.assign(q.size(), 0);
    }
    if (ks) {
      r.dv_p_sens_e.assign(v.size(), 0);
      r.dv_mag.assign(v.size(), 0);
    }
    // Repeated summands (rule.h): each row sum's tied term pairs beyond
    // distinct terms (row_tie_excess: at the compute format's u, with a
    // kernel's term error of cosine_units |A| + kOpUnits units, the
    // softcap's kSoftcapLogitUnits |A| more with a cap), and
    // dV's sensitivity to the row normalizations' rounding. A sampled key
    // row's sub-case (given) holds part of each row: the pass's ties.
    const double u_tie = compute_roundoff(c.storage);
    const double cos_u =
        case_cos_units + (p.softcap > 0 ? kSoftcapLogitUnits : 0.0) +
        rope_units(p, c.storage, u_tie, unit_roundoff(Precision::kF64)).logit;
    // A sink is one more term of each row sum, whose logit error is
    // sink_logit_units (rule.h, "Attention sinks").
    const double term_units =
        std::max(cos_u * std::fabs(logit_amplitude(c)) +
                     sink_shift_units(p, logit_amplitude(c)),
                 sink_logit_units(p, logit_amplitude(c))) +
        kOpUnits;
    const auto n_row =
        static_cast<double>(counts.kv_len > 0 ? counts.kv_len : Nk) +
        (has_sinks(p) ? 1 : 0);
    const double log_n = std::log(std::max(n_row, 1.0));
    r.row_ties.assign(static_cast<size_t>(p.batch * p.heads * Nq), 0);
    if (ks) {
      for (auto* x : {&r.dv_norm_sq_e, &r.dv_norm_lin_e, &r.dv_norm_lse_sq_e,
                      &r.dv_norm_lse_lin_e, &r.dv_norm_rep_e})
        x->assign(v.size(), 0);
      for (auto& x : a.zk) x.assign(k.size(), 0);
    }
    std::vector<LD>&sdp = a.sdp, &av = a.av;
    sdp.resize(static_cast<size_t>(Nk));
    av.resize(static_cast<size_t>(Nk));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hq = 0; hq < p.heads; ++hq) {
        const int64_t bh = b * p.heads + hq, bk = b * Hk + hq / group;
        // The query rows a kv head's dV and dK sum over: a repeated row
        // rounds its row sum as the first did (below).
        if (hq % group == 0 && ks) {
          // The kv head's repeated query rows, and each group's signed sum
          // of dO (its rows' errors are one: dV_jd moves by it times P_ij
          // |sum dO_id|).
          RowGroups& rg = a.groups;
          const auto slots = std::bit_ceil(static_cast<size_t>(2 * group * Nq));
          rg.slot_hash.assign(slots, 0);
          rg.slot_group.assign(slots, -1);
          rg.row_group.assign(static_cast<size_t>(group * Nq), -1);
          rg.size.clear();
          rg.rep.clear();
          rg.rep_pos.clear();
          a.group_do.clear();
          for (int64_t h2 = hq; h2 < hq + group; ++h2)
            for (int64_t i = 0; i < Nq; ++i) {
              const int64_t rw = (b * p.heads + h2) * Nq + i;
              const LD l = r.lse[static_cast<size_t>(rw)];
              if (!std::isfinite(l)) continue;
              // Rows group by the keys they see (their visible interval),
              // not their position: rows past a padding under a causal
              // mask, or under a window wider than the sequence, see the
              // same keys from different positions.
              const KeyRange kr = visible_keys(p.mask, b, i, Nq, Nk);
              const int32_t g = rg.group_of(qm.xt, static_cast<size_t>(rw * D),
                                            D, kr.begin * (Nk + 1) + kr.end);
              if (static_cast<size_t>(g) == rg.size.size() - 1 &&
                  rg.size[g] == 0)
                a.group_do.resize(a.group_do.size() + static_cast<size_t>(D));
              ++rg.size[static_cast<size_t>(g)];
              rg.row_group[static_cast<size_t>((h2 - hq) * Nq + i)] = g;
              axpy(D, LD(1), d_o.data() + rw * D,
                   a.group_do.data() + static_cast<size_t>(g) * D);
            }
          rg.done.assign(rg.size.size(), 0);
        }
        LD* dv_mag = ks ? r.dv_mag.data() + bk * Nk * D : nullptr;
        LD* dv_uf = ks ? r.dv_p_sens_e.data() + bk * Nk * D : nullptr;
        for (int64_t i = 0; i < Nq; ++i) {
          const size_t qi = static_cast<size_t>((bh * Nq + i) * D);
          const LD* doi = d_o.data() + qi;
          const LD* pi = probs.data() + (bh * Nq + i) * Nk;
          // P_ij > 0 as long double's exp would have it (cache, above): a
          // visible pair whose S_ij - lse_i is above long double's
          // underflow.
          const LD* si = S != nullptr ? S + (bh * Nq + i) * Nk : nullptr;
          const LD li = r.lse[static_cast<size_t>(bh * Nq + i)];
          // The sink's share of the row (attention.h; 0 without sinks).
          const LD p_sink =
              has_sinks(p) ? std::exp(static_cast<LD>(p.sinks[hq]) - li) : 0;
          auto alive = [&](int64_t j) {
            return pi[j] > 0 ||
                   (narrow && visible(p.mask, b, i, j, Nq, Nk) &&
                    static_cast<long double>(si[j]) - li > kWideExpFloor);
          };
          const LD* qti = qm.xt.data() + qi;
          const LD* qai = qm.logit_mag().data() + qi;
          const LD qan = norm2(qai);
          LD* omag = qs ? r.o_mag.data() + qi : nullptr;
          LD del = 0, do_l1 = 0, sdel = 0;
          for (int64_t j = 0; j < Nk; ++j) {
            const LD* vj = v.data() + (bk * Nk + j) * D;
            LD t = 0, ta = 0;  // dO_i . v_j and |dO_i|.|v_j|, one loop
            for (int64_t d = 0; d < D; ++d) {
              ta += std::fabs(doi[d]) * std::fabs(vj[d]);
              t += doi[d] * vj[d];
            }
            av[static_cast<size_t>(j)] = ta;
            del += pi[j] * ta;
            sdp[static_cast<size_t>(j)] = t;
            sdel += pi[j] * t;
          }
          // sum_k P_ik |dP_ik - delta_i|: delta_i's own perturbation by the
          // softmax's conditioning, per unit of |dS| perturbation.
          // With a sink, a logit error e moves delta_i by P_sink e |delta_i|
          // more (the sink's term of dP sum_k P_ik dS_ik, rule.h).
          LD ds_l1 = p_sink * std::fabs(sdel);
          for (int64_t j = 0; j < Nk; ++j)
            ds_l1 += pi[j] * std::fabs(sdp[static_cast<size_t>(j)] - sdel);
          // sum_k |dO_i|.|v_k| over the visible keys: delta_i's error per
          // unit of absolute error in every P_ik (summed directly, sum_k P_ik
          // dP_ik, or through O, dO_i . O_i), kPResolution's term P_ij p_del_i.
          LD p_del = 0;
          for (int64_t j = 0; j < Nk; ++j)
            if (alive(j)) p_del += av[static_cast<size_t>(j)];
          const size_t row = static_cast<size_t>(bh * Nq + i);
          // The row sum's deterministic units in any order of its additions
          // (a sampled sub-case has part of the row: none).
          double det_row = std::numeric_limits<double>::infinity();
          if (given != nullptr) {
            if (row < given->ties.size())
              r.row_ties[row] = static_cast<LD>(given->ties[row]);
          } else {
            std::vector<double>& t = a.ties;
            t.clear();
            for (int64_t j = 0; j < Nk; ++j)
              if (pi[j] > 0) t.push_back(static_cast<double>(pi[j]));
            if (p_sink > 0) t.push_back(static_cast<double>(p_sink));
            r.row_ties[row] =
                static_cast<LD>(row_tie_excess(&t, u_tie, term_units));
            det_row = partial_sum_units(t);
          }
          // dV's and dK's row normalization units (rule.h, "The row
          // normalization in the backward"): the row sum's Nk roundings,
          // v_i = Nk + X_i squared units for a Hoeffding bound and tau_i at
          // its bound; the log's and the addition's, c_i = log^2 Nk +
          // lse_i^2 squared units and l_i = log Nk + |lse_i|. A repeated
          // row (its first occurrence's error) is taken at its bound.
          LD v_row = 0, c_row = 0, tau_row = 0, l_row = 0;
          // A repeated row's group (-1: none); its first row carries the
          // group's dV share, every row its own dK share.
          int32_t grp = -1;
          bool grp_first = false;
          const LD lse_row = r.lse[row];
          if (ks && std::isfinite(lse_row)) {
            const auto x = static_cast<double>(r.row_ties[row]);
            v_row = n_row + x;
            c_row = log_n * log_n + lse_row * lse_row;
            tau_row = std::min(tie_sum_units(n_row, x), det_row);
            l_row = log_n + std::fabs(lse_row);
            const int32_t g =
                a.groups.row_group[static_cast<size_t>((hq % group) * Nq + i)];
            if (g >= 0 && a.groups.size[static_cast<size_t>(g)] > 1) {
              grp = g;
              grp_first = !a.groups.done[static_cast<size_t>(g)];
              a.groups.done[static_cast<size_t>(g)] = 1;
            }
          }
          if (given != nullptr) {  // the whole row's, not the sub-case's
            del = given->del[row];
            sdel = given->delta[row];
            ds_l1 = given->ds_l1[row];
            p_del = given->p_del[row];
          }
          const LD* oi = r.o.data() + qi;
          LD* odev = qs ? r.o_dev_mag.data() + qi : nullptr;
          LD* ouf = qs ? r.o_p_sens_e.data() + qi : nullptr;
          for (int64_t d = 0; d < D; ++d) do_l1 += std::fabs(doi[d]);
          // |dO_i|.|O_i|: delta_i's error per relative error of the stored O.
          const LD o_abs_dot =
              given != nullptr ? given->o_abs[row] : absdot(doi, oi);
          for (int64_t j = 0; j < Nk; ++j) {
            const LD pij = pi[j];
            const bool pos = alive(j);
            const LD dpd = sdp[static_cast<size_t>(j)] - sdel;
            // In Channel order (validation/field.h).
            const LD wt[kCh] = {
                pij * (av[static_cast<size_t>(j)] + del),  // kMagnitude
                pij * do_l1,                               // kStoredOAbs
                pij * (2 * D + 1) + 1,                     // kSubnormalCount
                pij * o_abs_dot,                           // kStoredORel
                pij * (std::fabs(dpd) + ds_l1 / 2),        // kSoftmaxTerms
                pos ? std::fabs(dpd) + pij * p_del : 0,    // kPResolution
                0,   // kLayerShift: added below, from the shifts
                0};  // kRoundingFlip: added below, from the flips
            const size_t kj = static_cast<size_t>((bk * Nk + j) * D);
            const LD* ktj = km.xt.data() + kj;
            const LD* kaj = km.logit_mag().data() + kj;
            // The layer mean shifts' change of C_ij = q_tilde . k_tilde (per
            // u_c, first order): a shift d of q's row moves it by d sum_e
            // w_e k_tilde_je (signed: 0 for a layer-normed k with a uniform
            // weight), and k's the same way.
            LD dc = 0;
            if (layer && whole) {
              LD wk = 0, wq = 0;
              if (qm.xar.empty()) {
                for (int64_t d = 0; d < D; ++d) {
                  wk += qm.wv[qi + static_cast<size_t>(d)] * ktj[d];
                  wq += km.wv[kj + static_cast<size_t>(d)] * qti[d];
                }
              } else {
                // RoPE after the normalization: the shift d w moves the
                // rotated row by R (d w), whose dot with the other rotated
                // row is at most ||w|| times its norm.
                wk = norm2(qm.wv.data() + qi) * norm2(ktj);
                wq = norm2(km.wv.data() + kj) * norm2(qti);
              }
              dc = qm.shr[row_of(qm.rows, qi)] * std::fabs(wk) +
                   km.shr[row_of(km.rows, kj)] * std::fabs(wq);
            }
            logit_shift = std::max(logit_shift, s * dc);
            if (learned && whole) {
              // dS_ij C_ij with |C_ij| <= ||q_a|| ||k_a|| (1 for the paper's
              // unit rows).
              const LD cm = std::max<LD>(1, qan * norm2(kaj));
              r.dg_shift += pij * std::fabs(dpd) * dc;
              r.dg_scale += wt[kMag] * cm;
              r.dg_o_sens += wt[kOAbs] * cm;
              r.dg_o_rel_sens += wt[kORel] * cm;
              r.dg_uf_sens += wt[kSub] * cm + 1;  // + the product and its sum
              r.dg_p_sens += wt[kPRes] * cm;
            }
            const LD* vj = v.data() + (bk * Nk + j) * D;
            const LD dsv = pij * dpd;
            // The signed du below sums the true dS = dS' sigma_ij (softcap,
            // rule.h: sigma = 1 - (S' / cap)^2, which breaks the cancellation
            // of dS' rows); the magnitudes keep |dS'| >= |dS|.
            LD dsv_signed = dsv;
            if (cap > 0 && dsv != 0) {
              LD c = 0;
              for (int64_t d = 0; d < D; ++d) c += qti[d] * ktj[d];
              const LD th = std::tanh(s_signed * c / cap);
              dsv_signed = dsv * (1 - th * th);
            }
            // Each term below is (s w) x: s times the pair's weight formed
            // once per pair instead of once per element (the same product,
            // so the same sums; the element loops were 40% of a sub-case at
            // n = 4096, perf). kLayerShift's weight is 0: its term adds +0 to
            // a sum of nonnegative terms, which changes nothing while s and
            // every operand magnitude are finite (shift_zero).
            LD sw[kCh];
            for (int ch = 0; ch < kCh; ++ch) sw[ch] = s * wt[ch];
            const LD s_dsv = s * dsv_signed, s_adsv = s * std::fabs(dsv);
            const int nch = shift_zero ? static_cast<int>(kShift) : kCh;
            // layer: dx_tilde = s sum dS x_tilde' of shifted x' (kLayerShift);
            // pij > 0: P_ij's absolute resolution (smallest normal).
            if (qs) {
              LD* mqi[kCh];
              for (int ch = 0; ch < kCh; ++ch) mqi[ch] = mq[ch].data() + qi;
              LD* duq = du_q.data() + qi;
              LD* adq = ads_q.data() + qi;
              const LD* rk = res_k.data() + kj;
              const LD* ksh = sh_k.data() + kj;
              // One loop per array (each element's sums in the same order
              // as one loop over d doing them all: the same bits), so that
              // each is a contiguous axpy the compiler vectorizes.
              for (int ch = 0; ch < nch; ++ch) axpy(D, sw[ch], kaj, mqi[ch]);
              // (s dS_ij) x_tilde': the scaled dS rounds once more to
              // ulp_c(0), unscaled (above).
              add(D, kaj, mqi[kSub]);
              if (layer) axpy(D, s_adsv, ksh, mqi[kShift]);
              if (flips) axpy(D, s_adsv, flt_k.data() + kj, mqi[kFlip]);
              axpy(D, s_dsv, ktj, duq);
              axpy(D, s_adsv, rk, adq);
              axpy_abs(D, pij, vj, omag);
              if (pos) add_abs(D, vj, ouf);
              for (int64_t d = 0; d < D; ++d)
                odev[d] += pij * std::fabs(vj[d] - oi[d]);
            }
            if (ks) {
              LD* mkj[kCh];
              for (int ch = 0; ch < kCh; ++ch) mkj[ch] = mk[ch].data() + kj;
              LD* duk = du_k.data() + kj;
              LD* adk = ads_k.data() + kj;
              const LD* rq = res_q.data() + qi;
              const LD* qsh = sh_q.data() + qi;
              LD* dvm = dv_mag + j * D;
              LD* dvu = dv_uf + j * D;
              for (int ch = 0; ch < nch; ++ch) axpy(D, sw[ch], qai, mkj[ch]);
              add(D, qai, mkj[kSub]);
              if (tau_row > 0) {
                // This row's share z of dK_hat's move per unit of its
                // normalization error: P_ij and (if formed from P) delta_i
                // scale by it, dS_ij by at most P_ij (|dP_ij - delta_i| +
                // |delta_i|), times s |q_a|.
                const LD z = s * pij * (std::fabs(dpd) + std::fabs(sdel));
                if (grp >= 0) {
                  axpy(D, z * (tau_row + l_row), qai, a.zk[5].data() + kj);
                } else {
                  LD* z0 = a.zk[0].data() + kj;
                  LD* z1 = a.zk[1].data() + kj;
                  const LD zw = z * (v_row + c_row), zv = z * v_row;
                  for (int64_t d = 0; d < D; ++d) {
                    z0[d] = std::max(z0[d], zw * qai[d]);
                    z1[d] = std::max(z1[d], zv * qai[d]);
                  }
                  axpy(D, z, qai, a.zk[2].data() + kj);
                  axpy(D, z * tau_row, qai, a.zk[3].data() + kj);
                  axpy(D, z * l_row, qai, a.zk[4].data() + kj);
                }
              }
              if (layer) axpy(D, s_adsv, qsh, mkj[kShift]);
              if (flips) axpy(D, s_adsv, flt_q.data() + qi, mkj[kFlip]);
              axpy(D, s_dsv, qti, duk);
              axpy(D, s_adsv, rq, adk);
              axpy_abs(D, pij, doi, dvm);
              if (pos) add_abs(D, doi, dvu);
              if (tau_row > 0 && pij > 0) {
                const size_t vj0 = static_cast<size_t>((bk * Nk + j) * D);
                if (grp >= 0) {
                  // A sampled sub-case has no mask: rows of one x_tilde
                  // at different causal positions group there, and are
                  // not one error: each row at its bound.
                  if (given != nullptr)
                    axpy_abs(D, pij * (tau_row + l_row), doi,
                             r.dv_norm_rep_e.data() + vj0);
                  else if (grp_first)
                    axpy_abs(D, pij * (tau_row + l_row),
                             a.group_do.data() + static_cast<size_t>(grp) * D,
                             r.dv_norm_rep_e.data() + vj0);
                } else {
                  LD* sq = r.dv_norm_sq_e.data() + vj0;
                  LD* lsq = r.dv_norm_lse_sq_e.data() + vj0;
                  const LD p2 = pij * pij;
                  for (int64_t d = 0; d < D; ++d) {
                    const LD x2 = p2 * doi[d] * doi[d];
                    sq[d] += x2 * v_row;
                    lsq[d] += x2 * c_row;
                  }
                  axpy_abs(D, pij * tau_row, doi, r.dv_norm_lin_e.data() + vj0);
                  axpy_abs(D, pij * l_row, doi,
                           r.dv_norm_lse_lin_e.data() + vj0);
                }
              }
            }
            adr_q[static_cast<size_t>(bh * Nq + i)] += s_adsv;
            adr_k[static_cast<size_t>(bk * Nk + j)] += s_adsv;
          }
          // The sink moves O_i by -P_sink O_i per unit of its logit's error
          // (rule.h, "Attention sinks").
          if (odev != nullptr && p_sink > 0)
            for (int64_t d = 0; d < D; ++d)
              odev[d] += p_sink * std::fabs(oi[d]);
        }
      }
    // Through the weight and the normalization backward, per side row
    // (carry_side, oracle_operands.cc).
    // RoPE (rule.h, "RoPE"): the sums above are in the rotated
    // coordinates the logits use. After the normalization (and sdpa) the
    // backward unrotates before the normalization backward: the signed du
    // exactly, every magnitude by its pair's sum (|R^T y|_a <= |y_a| +
    // |y_b|). Before it, the normalization backward runs in the rotated
    // coordinates and its results are pair-summed; the rotation's error
    // there reaches the gradient through the normalization's rows (its
    // own magnitude, rope_mag: pair sums before and after, rule.h).
    const bool unrotate_first = rope_before_norm_backward(p);
    const bool unrotate_after = has_rope(p) && !unrotate_first;
    auto side = [&](int sd, const OperandMagsT<LD>& m,
                    ChannelArraysT<LD>& ch_in, std::vector<LD>& du,
                    std::vector<LD>& ads, const std::vector<LD>& adr,
                    int64_t terms, const std::array<std::vector<LD>*, kCh>& dst,
                    ChannelArraysT<LD>* dw, ChannelArraysT<LD>* db,
                    ChannelArraysT<LD>* dws, LD* out_max,
                    std::vector<LD>* rope_mag) {
      rope_mag->clear();
      if (unrotate_first) {
        rope_unrotate(p, sd, &du);
        rope_pair_sum(p, &ads);
        for (int ch = 0; ch < kCh; ++ch) rope_pair_sum(p, &ch_in[ch]);
      }
      std::vector<LD> mag_ps;
      if (unrotate_after) {
        mag_ps = ch_in[kMag];
        rope_pair_sum(p, &mag_ps);
      }
      carry_side(p, s, sd, m, ch_in, du, ads, adr, terms, dst, dw, db, dws,
                 out_max);
      if (unrotate_after) {
        for (int ch = 0; ch < kCh; ++ch) rope_pair_sum(p, dst[ch]);
        for (int ch = 0; ch <= static_cast<int>(kSub); ++ch) {
          out_max[ch] = 0;
          for (LD x : *dst[ch]) out_max[ch] = std::max(out_max[ch], x);
        }
        carry_magnitude(p, m, mag_ps, rope_mag);
        rope_pair_sum(p, rope_mag);
      }
    };
    LD dq_out[3] = {}, dk_out[3] = {};
    std::array<std::vector<LD>*, kCh> dq_dst = {
        &r.dq_mag,    &r.dq_o_sens_e, &r.dq_uf_sens_e, &r.dq_o_rel_e,
        &r.dq_ds_mag, &r.dq_p_sens_e, &r.dq_shift_e,   &r.dq_flip_e};
    std::array<std::vector<LD>*, kCh> dk_dst = {
        &r.dk_mag,    &r.dk_o_sens_e, &r.dk_uf_sens_e, &r.dk_o_rel_e,
        &r.dk_ds_mag, &r.dk_p_sens_e, &r.dk_shift_e,   &r.dk_flip_e};
    const bool shared = qk && p.norm.shared_qk_weight;
    const int64_t nk_terms = counts.kv_len > 0 ? counts.kv_len : Nk,
                  nq_terms = counts.q_len > 0 ? counts.q_len : Nq;
    // A side the caller does not need (a sampled row's sub-case,
    // RowCounts): no per-element channels (attention_tolerances then makes
    // no table for its fields); the parameter channels stay 0.
    auto zero_side = [&](int sd, const std::array<std::vector<LD>*, kCh>& dst,
                         const std::vector<LD>& like,
                         std::array<std::vector<LD>, kCh>* dw,
                         std::array<std::vector<LD>, kCh>* db) {
      const int64_t np = param_size(p, sd) > 0           ? param_size(p, sd)
                         : p.norm.shared_qk_weight && qk ? param_size(p, 0)
                                                         : 0;
      for (int ch = 0; ch < kCh; ++ch) {
        dst[ch]->clear();
        (*dw)[ch].assign(static_cast<size_t>(np), 0);
        (*db)[ch].assign(static_cast<size_t>(np), 0);
      }
      for (auto& x : sd == 0 ? r.dq_weight_sh_ch : r.dk_weight_sh_ch) x.clear();
      (void)like;
    };
    if (counts.q_side)
      side(0, qm, mq, du_q, ads_q, adr_q, nk_terms, dq_dst, &r.dq_weight_ch,
           &r.dq_bias_ch, &r.dq_weight_sh_ch, dq_out, &r.dq_rope_mag);
    else
      zero_side(0, dq_dst, q, &r.dq_weight_ch, &r.dq_bias_ch);
    if (counts.k_side) {
      side(1, km, mk, du_k, ads_k, adr_k, group * nq_terms, dk_dst,
           &r.dk_weight_ch, &r.dk_bias_ch, &r.dk_weight_sh_ch, dk_out,
           &r.dk_rope_mag);
      const std::array<std::vector<LD>*, 6> zdst = {
          &r.dk_rowmax_e,   &r.dk_sum_rowmax_e,   &r.dk_norm_z_e,
          &r.dk_norm_lin_e, &r.dk_norm_lse_lin_e, &r.dk_norm_rep_e};
      for (size_t z = 0; z < zdst.size(); ++z) {
        if (unrotate_first) rope_pair_sum(p, &a.zk[z]);
        carry_magnitude(p, km, a.zk[z], zdst[z]);
        if (unrotate_after) rope_pair_sum(p, zdst[z]);
      }
    } else
      zero_side(1, dk_dst, k, &r.dk_weight_ch, &r.dk_bias_ch);
    if (shared) {  // one weight: both sides' channels add
      for (int ch = 0; ch < kCh; ++ch)
        for (size_t e = 0; e < r.dq_weight_ch[ch].size(); ++e)
          r.dq_weight_ch[ch][e] += r.dk_weight_ch[ch][e];
      for (int ch = 0; ch < kCh; ++ch)
        if (r.dq_weight_sh_ch[ch].size() == r.dk_weight_sh_ch[ch].size())
          for (size_t e = 0; e < r.dq_weight_sh_ch[ch].size(); ++e)
            r.dq_weight_sh_ch[ch][e] += r.dk_weight_sh_ch[ch][e];
        else  // one side not formed (a sub-case): neither is whole
          r.dq_weight_sh_ch[ch].clear();
    }
    if (param_size(p, 1) == 0) {
      for (auto& x : r.dk_weight_ch) x.clear();
      for (auto& x : r.dk_weight_sh_ch) x.clear();
    }
    if (!(qk && p.norm.bias))
      for (auto* x : {&r.dq_bias_ch, &r.dk_bias_ch})
        for (auto& y : *x) y.clear();
    if (param_size(p, 0) == 0) {
      for (auto& x : r.dq_weight_ch) x.clear();
      for (auto& x : r.dq_weight_sh_ch) x.clear();
    }
    const NormRows qr = norm_rows(p, 0), kr = norm_rows(p, 1);
    out.q_param_rows =
        qr.rows() * qr.len() / std::max<int64_t>(1, param_size(p, 0));
    out.k_param_rows =
        shared ? out.q_param_rows
               : kr.rows() * kr.len() / std::max<int64_t>(1, param_size(p, 1));
    if (shared) out.q_param_rows *= 2;
    if (whole) {
      out.logit_flip = static_cast<double>(logit_flip(c, qm, km, s));
      out.operand_flip = static_cast<double>(logit_flip<LD>(c, qm, km, 1));
    }
    out.logit_shift = static_cast<double>(logit_shift);
    for (int64_t e = 0; ks && e < Nk * D * p.batch * Hk; ++e)
      r.dv_scale = std::max(r.dv_scale, r.dv_mag[static_cast<size_t>(e)]);
    r.dq_scale = dq_out[kMag];
    r.dk_scale = dk_out[kMag];
    r.dq_o_sens = dq_out[kOAbs];
    r.dk_o_sens = dk_out[kOAbs];
    r.dq_uf_sens = dq_out[kSub];
    r.dk_uf_sens = dk_out[kSub];
  }
  if (whole) out.cosine_units = case_cos_units;
}

template void oracle_in<float>(const AttentionCase&, const GivenRows*,
                               const RowCounts&, const SubCaseOf&,
                               OracleArrays<float>&, OracleValues<float>&,
                               OracleAttention&);
template void oracle_in<double>(const AttentionCase&, const GivenRows*,
                                const RowCounts&, const SubCaseOf&,
                                OracleArrays<double>&, OracleValues<double>&,
                                OracleAttention&);
template void oracle_in<long double>(const AttentionCase&, const GivenRows*,
                                     const RowCounts&, const SubCaseOf&,
                                     OracleArrays<long double>&,
                                     OracleValues<long double>&,
                                     OracleAttention&);

}  // namespace qknorm::validation
