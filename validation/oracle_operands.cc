#include <algorithm>
#include <cmath>
#include <vector>

#include "qknorm/formulation.h"
#include "validation/operands.h"
#include "validation/oracle.h"
#include "validation/oracle_internal.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {

template <class T>
reference::NormArgs<T> norm_args(const AttentionCase& c,
                                 std::array<std::vector<T>, 4>* store) {
  const std::vector<double>* src[4] = {&c.q_weight, &c.k_weight, &c.q_bias,
                                       &c.k_bias};
  for (int i = 0; i < 4; ++i)
    (*store)[i].assign(src[i]->begin(), src[i]->end());
  auto ptr = [](const std::vector<T>& x) {
    return x.empty() ? nullptr : x.data();
  };
  reference::NormArgs<T> w;
  w.q_weight = ptr((*store)[0]);
  w.k_weight = ptr((*store)[1]);
  w.q_bias = ptr((*store)[2]);
  w.k_bias = ptr((*store)[3]);
  w.storage = c.storage;
  w.exact_rope = true;  // the oracle rotates exactly (rule.h, "RoPE")
  return w;
}

// The normalization row (NormRows) holding dense element offset o.
size_t row_of(const NormRows& nr, size_t o) {
  const auto D = static_cast<size_t>(nr.D);
  if (!nr.all_heads) return o / D;
  const auto N = static_cast<size_t>(nr.N), H = static_cast<size_t>(nr.H);
  return o / (H * N * D) * N + (o / D) % N;
}

template <class T>
void fill_operand_mags(const AttentionCase& c, int side, const T* x,
                       const reference::NormArgs<T>& w, OperandMagsT<T>* mp) {
  using LD = T;  // the oracle's arithmetic (the name the loops below use)
  const AttentionProblem& p = c.problem;
  const bool qk = p.variant == Variant::kQKNorm;
  OperandMagsT<T>& m = *mp;
  m.rows = norm_rows(p, side);
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  const auto size = static_cast<size_t>(nr.rows() * L);
  // One normalization gives both x_hat (unrounded, unweighted) and x_tilde:
  // where the formulation rounds x_hat before the weight, the rounded x_hat
  // goes to xr and the unrounded one to xh.
  const bool round = reference::rounds_x_hat(p, c.storage);
  m.xh.resize(size);
  m.xt.resize(size);
  m.xr.resize(round ? size : 0);
  m.stats.resize(static_cast<size_t>(nr.rows()));
  reference::prepare_operand<T>(
      p, side, x, w, round ? m.xr.data() : m.xh.data(),
      round ? m.xh.data() : nullptr, m.xt.data(), m.stats.data());
  // The loop below writes every element of wv, xa and sh.
  m.wv.resize(size);
  m.xa.resize(size);
  m.sh.resize(size);
  m.den.assign(static_cast<size_t>(nr.rows()), 1);
  m.shr.assign(static_cast<size_t>(nr.rows()), 0);
  // wmax and xa_finite in locals: as members, the compiler stored and
  // reloaded them for every element (the arrays' stores might alias them).
  LD wmax = 1;
  bool xa_finite = true;
  const Normalization& n = p.norm;
  const std::vector<double>& wt =
      side == 0 || n.shared_qk_weight ? c.q_weight : c.k_weight;
  const std::vector<double>& bs = side == 0 ? c.q_bias : c.k_bias;
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    // The sums only where the row's divisor reads them (l2, rms: s2;
    // layer: s1).
    LD s1 = 0, s2 = 0;
    if (qk && (n.kind == NormKind::kL2 || n.kind == NormKind::kRms))
      for (int64_t e = 0; e < L; ++e) {
        const LD xe = x[static_cast<size_t>(nr.at(r0, e))];
        s2 += xe * xe;
      }
    if (qk && n.kind == NormKind::kLayer)
      for (int64_t e = 0; e < L; ++e)
        s1 += x[static_cast<size_t>(nr.at(r0, e))];
    const LD Ld = static_cast<LD>(L), eps = static_cast<LD>(p.eps);
    if (qk) {
      switch (n.kind) {
        case NormKind::kL2:
          m.den[static_cast<size_t>(r0)] = std::max(std::sqrt(s2), eps);
          break;
        case NormKind::kRms:
          m.den[static_cast<size_t>(r0)] = std::sqrt(s2 / Ld + eps);
          break;
        case NormKind::kLayer: {
          const LD mu = s1 / Ld;
          LD var = 0;
          for (int64_t e = 0; e < L; ++e) {
            const LD t = x[static_cast<size_t>(nr.at(r0, e))] - mu;
            var += t * t;
          }
          m.den[static_cast<size_t>(r0)] = std::sqrt(var / Ld + eps);
          LD a1 = 0;
          for (int64_t e = 0; e < L; ++e)
            a1 += std::fabs(x[static_cast<size_t>(nr.at(r0, e))]);
          m.shr[static_cast<size_t>(r0)] =
              static_cast<LD>(sum_units(static_cast<double>(L))) * (a1 / Ld) /
              m.den[static_cast<size_t>(r0)];
          break;
        }
        case NormKind::kNone:
          break;
      }
    }
    for (int64_t e = 0; e < L; ++e) {
      const size_t o = static_cast<size_t>(nr.at(r0, e));
      LD wv = 1, bias = 0;
      if (qk && n.weight != ParamShape::kNone) {
        const auto pi = static_cast<size_t>(nr.param(r0, e, n.weight));
        wv = n.one_plus_weight ? 1 + static_cast<LD>(wt[pi]) : wt[pi];
        if (n.bias) bias = bs[pi];
      }
      m.wv[o] = wv;
      wmax = std::max(wmax, std::fabs(wv));
      m.xa[o] = std::fabs(m.xh[o]) * std::fabs(wv) + std::fabs(bias);
      xa_finite = xa_finite && std::isfinite(m.xa[o]);
      m.sh[o] = m.shr[static_cast<size_t>(r0)] * std::fabs(wv);
    }
  }
  m.wmax = wmax;
  m.xa_finite = xa_finite;
  rounding_flips(c, m, &m.fl);
  // RoPE after the normalization: the rotated operand's magnitude.
  m.xar.clear();
  if (qk && has_rope(p) && p.rope.order == RopeOrder::kAfterNorm) {
    const reference::RopeTable<T> t =
        reference::rope_table<T>(p, side, c.storage, true);
    m.xar = m.xa;
    const int64_t D = p.head_dim, N = side == 0 ? p.q_len : p.kv_len;
    for (size_t r = 0; r * static_cast<size_t>(D) < size; ++r) {
      const size_t at = static_cast<size_t>(static_cast<int64_t>(r) % N) *
                        static_cast<size_t>(t.pairs);
      const size_t off = r * static_cast<size_t>(D);
      for (int64_t e = 0; e < t.pairs; ++e) {
        const RopePair pr = rope_pair(p.rope, e);
        const LD ca = std::fabs(t.cos[at + static_cast<size_t>(e)]);
        const LD sa = std::fabs(t.sin[at + static_cast<size_t>(e)]);
        const LD xa = m.xa[off + static_cast<size_t>(pr.a)];
        const LD xb = m.xa[off + static_cast<size_t>(pr.b)];
        m.xar[off + static_cast<size_t>(pr.a)] = ca * xa + sa * xb;
        m.xar[off + static_cast<size_t>(pr.b)] = ca * xb + sa * xa;
      }
    }
  }
}

template <class T>
void rope_pair_sum(const AttentionProblem& p, std::vector<T>* x) {
  if (!has_rope(p)) return;
  const auto D = static_cast<size_t>(p.head_dim);
  for (size_t off = 0; off + D <= x->size(); off += D)
    for (int64_t e = 0; e < p.rope.rotary_dim / 2; ++e) {
      const RopePair pr = rope_pair(p.rope, e);
      T& a = (*x)[off + static_cast<size_t>(pr.a)];
      T& b = (*x)[off + static_cast<size_t>(pr.b)];
      a = b = a + b;
    }
}

template <class T>
void rope_unrotate(const AttentionProblem& p, int side, std::vector<T>* x) {
  if (!has_rope(p) || x->empty()) return;
  reference::rope_rotate<T>(
      p, side, reference::rope_table<T>(p, side, Precision::kF64, true),
      x->data(), true);
}

OperandMags operand_mags(const AttentionCase& c, int side) {
  const std::vector<LD> x = widen(side == 0 ? c.q : c.k);
  std::array<std::vector<LD>, 4> store;
  OperandMags m;
  fill_operand_mags(c, side, x.data(), norm_args(c, &store), &m);
  return m;
}

template <class T>
void slice_operand_mags(const OperandMagsT<T>& whole, int64_t b, int64_t h0,
                        int64_t n0, const NormRows& rows, OperandMagsT<T>* mp) {
  OperandMagsT<T>& m = *mp;
  const NormRows& w = whole.rows;
  const int64_t D = rows.D, H = rows.H, N = rows.N;
  const auto size = static_cast<size_t>(rows.rows() * rows.len());
  // Element arrays: head h, rows n0.. of batch b, contiguous per head.
  auto elements = [&](const std::vector<T>& from, std::vector<T>* to) {
    to->resize(from.empty() ? 0 : size);
    if (from.empty()) return;
    for (int64_t h = 0; h < H; ++h) {
      const T* src = from.data() + ((b * w.H + h0 + h) * w.N + n0) * D;
      std::copy(src, src + N * D, to->data() + h * N * D);
    }
  };
  // Row arrays: a head's row (b, h, n), or across heads (b, n).
  const auto nrows = static_cast<size_t>(rows.rows());
  auto row_of_whole = [&](int64_t r) {
    return rows.all_heads ? b * w.N + n0 + r
                          : (b * w.H + h0 + r / N) * w.N + n0 + r % N;
  };
  m.rows = rows;
  elements(whole.xh, &m.xh);
  elements(whole.xt, &m.xt);
  elements(whole.xa, &m.xa);
  elements(whole.wv, &m.wv);
  elements(whole.sh, &m.sh);
  elements(whole.xr, &m.xr);
  elements(whole.fl, &m.fl);
  elements(whole.xar, &m.xar);
  m.den.resize(nrows);
  m.shr.resize(nrows);
  m.stats.resize(nrows);
  for (size_t r = 0; r < nrows; ++r) {
    const auto o = static_cast<size_t>(row_of_whole(static_cast<int64_t>(r)));
    m.den[r] = whole.den[o];
    m.shr[r] = whole.shr[o];
    m.stats[r] = whole.stats[o];
  }
  // The sub-case's own maxima (fill_operand_mags).
  T wmax = 1;
  bool xa_finite = true;
  for (size_t e = 0; e < size; ++e) {
    wmax = std::max(wmax, std::fabs(m.wv[e]));
    xa_finite = xa_finite && std::isfinite(m.xa[e]);
  }
  m.wmax = wmax;
  m.xa_finite = xa_finite;
}

template <class T>
reference::OperandView<T> OperandMagsT<T>::view() const {
  return {rows, xr.empty() ? xh.data() : xr.data(), xh.data(), xt.data(),
          stats.data()};
}

OracleWorkspace::OracleWorkspace() : arrays(std::make_unique<Arrays>()) {}
OracleWorkspace::~OracleWorkspace() = default;

namespace {

// |dx| magnitudes of one normalization row (length L) from its |du|
// magnitudes (du: the gradient of x_hat), in place:
//   l2:    (|du| + |u| (|u|.|du|)) / den
//   rms:   (|du| + |x_hat| (|x_hat|.|du|) / L) / den
//   layer: (|du| + mean|du| + |x_hat| (|x_hat|.|du|) / L) / den
template <class LD>
void norm_backward_mag(const AttentionProblem& p, const LD* u, LD den,
                       int64_t L, std::vector<LD>* du) {
  if (p.variant != Variant::kQKNorm || p.norm.kind == NormKind::kNone) return;
  LD c = 0, m = 0;
  for (int64_t e = 0; e < L; ++e) {
    c += std::fabs(u[e]) * (*du)[static_cast<size_t>(e)];
    m += (*du)[static_cast<size_t>(e)];
  }
  const LD Ld = static_cast<LD>(L);
  if (p.norm.kind != NormKind::kL2) c /= Ld;
  m = p.norm.kind == NormKind::kLayer ? m / Ld : 0;
  for (int64_t e = 0; e < L; ++e)
    (*du)[static_cast<size_t>(e)] =
        ((*du)[static_cast<size_t>(e)] + m + std::fabs(u[e]) * c) / den;
}

}  // namespace

// One magnitude array alone through the weight and the normalization
// backward (carry_side's map of every channel; the row normalization's
// per-element row maximum, rule.h "Repeated summands").
template <class T>
void carry_magnitude(const AttentionProblem& p, const OperandMagsT<T>& m,
                     const std::vector<T>& in, std::vector<T>* out) {
  using LD = T;
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  out->assign(in.size(), 0);
  std::vector<LD> row(static_cast<size_t>(L)), u(static_cast<size_t>(L));
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    for (int64_t e = 0; e < L; ++e) {
      const size_t o = static_cast<size_t>(nr.at(r0, e));
      u[static_cast<size_t>(e)] = m.xh[o];
      row[static_cast<size_t>(e)] = in[o] * std::fabs(m.wv[o]);
    }
    norm_backward_mag(p, u.data(), m.den[static_cast<size_t>(r0)], L, &row);
    for (int64_t e = 0; e < L; ++e)
      (*out)[static_cast<size_t>(nr.at(r0, e))] = row[static_cast<size_t>(e)];
  }
}

// Through the weight and the normalization backward, per side row.
// The subnormal count of the sums forming du (Nk products and
// additions, the normalization backward's L + 2), each of which the
// scale s may multiply afterwards (found by the property suite: f32,
// keys below eps, q_hat_d = 3.7e-39: g dS q_hat_d = 4.8e-43 formed as
// (dS q_hat_d) g carries 13 half-ulps of 2^-149).
template <class T>
void carry_side(const AttentionProblem& p, T s, int sd,
                const OperandMagsT<T>& m, ChannelArraysT<T>& ch_in,
                const std::vector<T>& du, const std::vector<T>& ads,
                const std::vector<T>& adr, int64_t terms,
                const std::array<std::vector<T>*, kChannels>& dst,
                ChannelArraysT<T>* dw, ChannelArraysT<T>* db,
                ChannelArraysT<T>* dws, T* out_max) {
  using LD = T;  // the oracle's arithmetic (the name the loops below use)
  constexpr int kCh = kChannels;
  const bool qk = p.variant == Variant::kQKNorm;
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  LD add[kCh] = {};  // only the subnormal count adds a per-element count
  add[kSub] = (1 + s) * static_cast<LD>(terms + L + 2);
  for (int ch = 0; ch < kCh; ++ch) dst[ch]->assign(ch_in[ch].size(), 0);
  const int64_t np = param_size(p, sd) > 0           ? param_size(p, sd)
                     : p.norm.shared_qk_weight && qk ? param_size(p, 0)
                                                     : 0;
  // LayerNorm's x_hat is off by its row's mean shift, an absolute error
  // however small x_hat_e is; the weight gradient's product x_hat_e
  // dx_tilde_e then meets dx_tilde_e's own error (rule.h, "The weight
  // gradient's product"): every channel of dx_tilde_e weighted by the shift
  // shr (per u_c) instead of |x_hat_e|, into *dws.
  const bool shifts = dws != nullptr && dw != nullptr && np > 0 && qk &&
                      p.norm.kind == NormKind::kLayer;
  for (int ch = 0; ch < kCh; ++ch) {
    if (dw) (*dw)[ch].assign(static_cast<size_t>(np), 0);
    if (db) (*db)[ch].assign(static_cast<size_t>(np), 0);
    if (dws) (*dws)[ch].assign(shifts ? static_cast<size_t>(np) : 0, 0);
  }
  std::vector<LD> row(static_cast<size_t>(L)), u(static_cast<size_t>(L)),
      dus(static_cast<size_t>(L));
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    for (int64_t e = 0; e < L; ++e) {
      const size_t o = static_cast<size_t>(nr.at(r0, e));
      u[static_cast<size_t>(e)] = m.xh[o];
      dus[static_cast<size_t>(e)] = du[o] * m.wv[o];
    }
    for (int ch = 0; ch < kCh; ++ch) {
      for (int64_t e = 0; e < L; ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        const LD g = ch_in[ch][o] + add[ch];
        if (np > 0 && dw) {
          const auto pi = static_cast<size_t>(nr.param(r0, e, p.norm.weight));
          (*dw)[ch][pi] += g * std::fabs(u[static_cast<size_t>(e)]);
          if (shifts) (*dws)[ch][pi] += g * m.shr[static_cast<size_t>(r0)];
          if (p.norm.bias && db) (*db)[ch][pi] += g;
        }
        row[static_cast<size_t>(e)] = g * std::fabs(m.wv[o]);
      }
      norm_backward_mag(p, u.data(), m.den[static_cast<size_t>(r0)], L, &row);
      for (int64_t e = 0; e < L; ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        (*dst[ch])[o] = row[static_cast<size_t>(e)];
        if (ch <= static_cast<int>(kSub))
          out_max[ch] = std::max(out_max[ch], row[e]);
      }
    }
    // Layer: this row's own mean shift (every x_hat_e off by up to shr,
    // per u_c) enters the weight gradient sum dx_tilde_e x_hat_e as
    // |dx_tilde_e| shr, and the backward dx = (du - mean(du) - x_hat c)
    // / den, c = x_hat . du / L, as shr (|c| + |x_hat_e| |sum du| / L) /
    // den (first order, so the true dx_tilde and du = dx_tilde w; the
    // divisor does not move: sum (x - mu) = 0).
    const LD shr = m.shr[static_cast<size_t>(r0)];
    if (shr > 0) {
      LD c0 = 0, s0 = 0;
      for (int64_t e = 0; e < L; ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        c0 += u[static_cast<size_t>(e)] * dus[static_cast<size_t>(e)];
        s0 += dus[static_cast<size_t>(e)];
        if (np > 0 && dw)
          (*dw)[kShift][static_cast<size_t>(nr.param(r0, e, p.norm.weight))] +=
              std::fabs(du[o]) * shr;
      }
      const LD Ld = static_cast<LD>(L), den = m.den[static_cast<size_t>(r0)];
      for (int64_t e = 0; e < L; ++e)
        (*dst[kShift])[static_cast<size_t>(nr.at(r0, e))] +=
            shr *
            (std::fabs(c0) +
             std::fabs(u[static_cast<size_t>(e)]) * std::fabs(s0)) /
            Ld / den;
    }
    // Round-before-weight: the weight gradient sums dx_tilde_e times the
    // rounded x_hat_e, which a kernel may round to the other neighbour:
    // |dx_tilde_e| fl_e more (kRoundingFlip; the other side's flips reach
    // this row through ch_in). The normalization backward reads the
    // unrounded x_hat: no own-row term in dst.
    if (!m.fl.empty() && np > 0 && dw)
      for (int64_t e = 0; e < L; ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        (*dw)[kFlip][static_cast<size_t>(nr.param(r0, e, p.norm.weight))] +=
            std::fabs(du[o]) * m.fl[o];
      }
    // The unit rows' own absolute resolution ulp_c(0): x_hat_d of a
    // row whose components span many binades is subnormal, and the
    // normalization backward dx = (du - x_hat (x_hat . du)) / n
    // multiplies its error by |x_hat . du| / n; the other operand's
    // unit rows enter du = s sum dS x_hat' with weight s sum |dS| (found
    // by the fuzzer, issue 15: f64, q_hat_d below 2^-1022 beside
    // |q_hat . du| ~ 1e45, a correct dq 2400 u off). Per ulp_c(0), added
    // to *_uf_sens_e:
    //   (|w_d| a_d + |x_hat_d| sum_e |x_hat_e| |w_e| a_e
    //    + res (|x_hat . du| + |x_hat_d| sum |du|)) / n
    // with a_d = s sum_j |dS_ij| res'_jd (ads), res'_jd the other
    // side's operand resolution (operand_resolution; 1 for the paper's
    // unit rows), res this row's x_hat resolution (x_hat_resolution)
    // and du the true du (signed). rms and layer scale the same terms
    // by 1 / L or less: the l2 form bounds them.
    // The parameter gradients sum dx_tilde_e x_hat_e over rows, and
    // dx_tilde_e = s sum dS x_tilde' reads the other side's operand,
    // resolved only to operand_resolution's ulp_c(0) where it is
    // subnormal (a subnormal weight: found by the fuzzer, issue 16:
    // timm, f64, w_q = 8.4e-315, dk_weight 2.4 bounds off in
    // reference:f64 and blas:f64 alike): a_e = s sum |dS| times that
    // (ads) per row element, times |x_hat_e| for the weight. This row's
    // own x_hat is resolved to x_hat_resolution's ulp_c(0).
    const LD own_res =
        static_cast<LD>(x_hat_resolution(p, L, m.den[static_cast<size_t>(r0)]));
    // The per-row terms the per-element ones above were first meant to
    // replace stay beside them (found by the fuzz CI mode with
    // formulations on, once they were gone: rms with [D] weights of
    // ~1e-12, f32, a correct dq = -0 for -1.9e-35, margin 1.1e5; qwen3,
    // f64, subnormal dq ~6e-320 about 495 ulp(0) off, margin 99). A
    // product w_e du_e that lands below the normal range rounds to
    // ulp_c(0) whatever |w_e| is, and rms and layer kernels form du at the
    // scaled row's magnitude (scaled_row_resolution): adr = s sum |dS|
    // per row, times max(1, max |w|) (m.wmax) and that resolution.
    auto adr_at = [&](int64_t e) {
      const int64_t idx =
          nr.all_heads ? ((r0 / nr.N) * nr.H + e / nr.D) * nr.N + r0 % nr.N
                       : r0;
      return adr[static_cast<size_t>(idx)];
    };
    if (np > 0 && dw) {
      for (int64_t e = 0; e < L; ++e) {
        const LD a = ads[static_cast<size_t>(nr.at(r0, e))] + adr_at(e);
        const auto pi = static_cast<size_t>(nr.param(r0, e, p.norm.weight));
        // And this row's own x_hat_e, resolved to own_res ulp_c(0)
        // (below), times |dx_tilde_e| (found by the fuzzer, issue 16:
        // olmo2, f64, k_e = 1e-323 in a row of rms 0.44: x_hat_e = 2e-323
        // to 25%, dk_weight 1.2e-320 off by 800 ulp(0) in reference:f64).
        const LD own = ch_in[kMag][static_cast<size_t>(nr.at(r0, e))];
        (*dw)[kSub][pi] +=
            a * std::fabs(u[static_cast<size_t>(e)]) + own_res * own;
        if (p.norm.bias && db) (*db)[kSub][pi] += a;
      }
    }
    if (qk && p.norm.kind != NormKind::kNone) {
      // wa[e] = |w_e| a_e: du_e's error from the other side's operand;
      // a1 = sum_e |x_hat_e| wa[e]: that error in x_hat . du.
      LD cdot = 0, l1 = 0, a1 = 0, u1 = 0, a_row = 0;
      const int64_t heads_in_row = nr.all_heads ? nr.H : 1;
      for (int64_t hh = 0; hh < heads_in_row; ++hh) a_row += adr_at(hh * nr.D);
      a_row *= m.wmax;
      const LD res_row = static_cast<LD>(scaled_row_resolution(p, L));
      for (int64_t e = 0; e < L; ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        cdot += u[static_cast<size_t>(e)] * dus[static_cast<size_t>(e)];
        l1 += std::fabs(dus[static_cast<size_t>(e)]);
        u1 += std::fabs(u[static_cast<size_t>(e)]);
        row[static_cast<size_t>(e)] = std::fabs(m.wv[o]) * ads[o];
        a1 +=
            std::fabs(u[static_cast<size_t>(e)]) * row[static_cast<size_t>(e)];
      }
      const LD den = m.den[static_cast<size_t>(r0)];
      for (int64_t e = 0; e < L; ++e) {
        const LD ue = std::fabs(u[static_cast<size_t>(e)]);
        (*dst[kSub])[static_cast<size_t>(nr.at(r0, e))] +=
            (row[static_cast<size_t>(e)] + ue * a1 +
             res_row * a_row * (1 + ue * u1) +
             own_res * (std::fabs(cdot) + ue * l1)) /
            den;
      }
      // The roundings at du's own scale, after the weight. add[kSub]
      // counts (1 + s) (terms + L + 2) ulp_c(0) per element of
      // dx_tilde (its sums and the normalization backward's operations)
      // and the row then carries it times |w_e|: right for dx_tilde's
      // own sums, formed before the weight, but the product du_e = w_e
      // dx_tilde_e and the normalization backward's operations on du
      // (its dot x_hat . du, the L products and sums, the division by L
      // or the mean, x_hat_e c and the subtraction: the L + 2 of add[kSub])
      // round at du's magnitude, to ulp_c(0) below the normal range
      // whatever |w_e| is, and the division by den multiplies them by 1
      // / den. So each du_e carries (1 + s) (1 + L + 2) ulp_c(0)
      // unweighted (s: a kernel may scale after these operations, as
      // add[kSub] allows), through the same backward as the other channels
      // (norm_backward_mag): (1 + s) (L + 3) (1 + |x_hat_e| sum |x_hat|
      // / L) / den for rms. Found by the fuzz CI mode with formulations
      // on: rms, [D] weight with w_7 = 7.0e-309 (the others 1.9e-314,
      // 3 ulp(0) or 0), f64, a q row of eight -2.0e-4 (den = 2.0e-4):
      // dx_tilde_7 = 1.7e-4 and du_7 = 1.17e-312, resolved to 0.42
      // ulp(0) in reference:f64, which 1 / den = 5011 made 2500 ulp(0)
      // of dq_7 = 5.1e-309, where the weighted count gave nothing and
      // the bound was 1667 ulp(0) (margin 1.5). 0 without a weight: then
      // add[kSub] counts these operations with |w_e| = 1.
      if (p.norm.weight != ParamShape::kNone) {
        const LD du_ops = (1 + s) * static_cast<LD>(L + 3);
        for (int64_t e = 0; e < L; ++e) row[static_cast<size_t>(e)] = du_ops;
        norm_backward_mag(p, u.data(), den, L, &row);
        for (int64_t e = 0; e < L; ++e)
          (*dst[kSub])[static_cast<size_t>(nr.at(r0, e))] +=
              row[static_cast<size_t>(e)];
      }
    }
  }
}

#define QKNORM_ORACLE_OPERANDS_INSTANTIATE(T)                               \
  template reference::NormArgs<T> norm_args<T>(                             \
      const AttentionCase&, std::array<std::vector<T>, 4>*);                \
  template void fill_operand_mags<T>(const AttentionCase&, int, const T*,   \
                                     const reference::NormArgs<T>&,         \
                                     OperandMagsT<T>*);                     \
  template reference::OperandView<T> OperandMagsT<T>::view() const;         \
  template void rope_pair_sum<T>(const AttentionProblem&, std::vector<T>*); \
  template void rope_unrotate<T>(const AttentionProblem&, int,              \
                                 std::vector<T>*);                          \
  template void slice_operand_mags<T>(const OperandMagsT<T>&, int64_t,      \
                                      int64_t, int64_t, const NormRows&,    \
                                      OperandMagsT<T>*);                    \
  template void carry_magnitude<T>(const AttentionProblem&,                 \
                                   const OperandMagsT<T>&,                  \
                                   const std::vector<T>&, std::vector<T>*); \
  template void carry_side<T>(                                              \
      const AttentionProblem&, T, int, const OperandMagsT<T>&,              \
      ChannelArraysT<T>&, const std::vector<T>&, const std::vector<T>&,     \
      const std::vector<T>&, int64_t,                                       \
      const std::array<std::vector<T>*, kChannels>&, ChannelArraysT<T>*,    \
      ChannelArraysT<T>*, ChannelArraysT<T>*, T*);
QKNORM_ORACLE_OPERANDS_INSTANTIATE(float)
QKNORM_ORACLE_OPERANDS_INSTANTIATE(double)
QKNORM_ORACLE_OPERANDS_INSTANTIATE(long double)
#undef QKNORM_ORACLE_OPERANDS_INSTANTIATE

}  // namespace qknorm::validation
