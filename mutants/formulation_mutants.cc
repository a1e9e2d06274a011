// The formulation mutants of issue 16 and their control (mutants.h): one
// small wrapper, test code, that normalizes, weights and shifts the q and k
// rows itself (every formulation of attention.h), hands the resulting
// x_tilde operands to the reference's attention loops as a problem with no
// normalization (kind none, no weight: the logits are scale * q_tilde .
// k_tilde with the problem's scale, learned or fixed), then runs its own
// normalization backward and parameter gradients. It never calls blas_path
// or simd kernels. With no bug (the control "control:formulation:<p>") it
// computes every formulation correctly; each mutant switches on one bug in
// its own part (the normalization, the weight, the GQA group sum, or the
// fixed logit scale).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "mutants/mutants.h"
#include "qknorm/precision.h"
#include "reference/reference.h"
#include "reference/storage.h"

namespace qknorm::property {
namespace {

// Storage <-> dense T, exactly as reference/backend.cc reads and writes it.
using reference::gather;
using reference::load_params;
using reference::load_qkv_params;
using reference::Params;
using reference::QkvParams;
using reference::rows4;
using reference::scatter;

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// What the backward of one normalization row needs.
template <class T>
struct RowStats {
  T den = 1;             // x_hat = (x - mu) / den
  T s = 0;               // l2: ||x - mu||; rms, layer: sqrt(mean((x-mu)^2))
  bool clamped = false;  // l2: ||x|| <= eps (x_hat = x / eps)
};

// One side's operand: x_hat (as the weight multiplies it: rounded to
// storage where the formulation says so), x_hat unrounded (what the
// normalization backward reads) and x_tilde, dense [B, H_x, N, D].
template <class T>
struct Side {
  NormRows sh{};
  std::vector<T> xh, xh_raw, xt;
  std::vector<RowStats<T>> stats;
};

template <class T>
class FormulationKernel {
 public:
  FormulationKernel(Bug bug, bool active, Precision storage)
      : bug_(bug), active_(active), storage_(storage) {}

  bool on(Bug b) const { return active_ && bug_ == b; }

  // The problem as this copy normalizes it: the olmo2 mutant normalizes
  // each head's slice of an across-heads row on its own (the weight's
  // [H_x, D] layout is the same for both axes, so only the axis changes).
  AttentionProblem normalized_problem(const AttentionProblem& p) const {
    AttentionProblem q = p;
    if (on(Bug::kOlmo2NormPerHead)) q.norm.axis = NormAxis::kHead;
    // The mutant: the norm skipped where RoPE is fused.
    if (on(Bug::kRopeNormSkipped) && has_rope(p)) q.norm.kind = NormKind::kNone;
    return q;
  }

  // RoPE (attention.h, Rope) of this copy, in place on a dense side array
  // [B, H_x, N, D]: the angle in double, cos and sin in double, the
  // rotation in T (inverse: the transpose). Each mutant changes one part.
  void rotate(const AttentionProblem& p, int sd, T* x, bool inverse) const {
    Rope r = p.rope;
    if (r.rotary_dim <= 0) return;
    if (on(Bug::kRopePairingConfused))
      r.pairing = r.pairing == RopePairing::kHalf ? RopePairing::kInterleaved
                                                  : RopePairing::kHalf;
    const int64_t D = p.head_dim, half = r.rotary_dim / 2;
    const int64_t Hx = sd == 0 ? p.heads : kv_heads_of(p);
    const int64_t N = sd == 0 ? p.q_len : p.kv_len;
    const int64_t shift =
        sd == 0 && !on(Bug::kRopeDecodeFromZero) ? p.kv_len - p.q_len : 0;
    for (int64_t row = 0; row < p.batch * Hx * N; ++row) {
      if (on(Bug::kRopeHeadZeroOnly) && (row / N) % Hx != 0) continue;
      const auto pos = static_cast<double>(row % N + shift + r.position_offset);
      T* y = x + row * D;
      for (int64_t e = 0; e < half; ++e) {
        int64_t a = 2 * e, b = 2 * e + 1;
        if (r.pairing == RopePairing::kHalf) {
          a = e;
          b = e + (on(Bug::kRopePartialWrongDims) ? D / 2 : half);
        }
        const double t = pos * rope_inv_freq<double>(r, e);
        const auto c = static_cast<T>(std::cos(t));
        const auto s = static_cast<T>(inverse ? -std::sin(t) : std::sin(t));
        const T ya = y[a] * c - y[b] * s, yb = y[b] * c + y[a] * s;
        y[a] = ya;
        y[b] = yb;
      }
    }
  }
  // Where the rotation acts: on the input (before the normalization, and
  // sdpa's raw q, k) or on x_tilde (after it).
  static bool rotates_input(const AttentionProblem& p) {
    return has_rope(p) && (p.variant != Variant::kQKNorm ||
                           p.rope.order == RopeOrder::kBeforeNorm);
  }

  // The attention problem the reference runs on x_tilde: no normalization,
  // the same logit scale (learned g or fixed), mask and GQA.
  AttentionProblem attention_problem(const AttentionProblem& p) const {
    AttentionProblem a = p;
    if (p.variant == Variant::kQKNorm) a.norm = Normalization{NormKind::kNone};
    a.rope = Rope{};  // the operands arrive rotated (side())
    // The mutant: a fixed scale s used as 1 / s.
    if (on(Bug::kFixedScaleInverted) && p.variant == Variant::kQKNorm &&
        p.fixed_scale && p.scale != 0)
      a.scale = 1 / p.scale;
    // The mutant: the softcap dropped.
    if (on(Bug::kSoftcapDropped)) a.softcap = 0;
    // The mutants: a window side one key too wide (transformers #39408:
    // a model's sliding_window = w taken as (w, 0) where its mask keeps
    // i - j < w, i.e. (w - 1, 0)).
    if (on(Bug::kWindowLeftOffByOne) && a.mask.window_left >= 0)
      ++a.mask.window_left;
    if (on(Bug::kWindowRightOffByOne) && a.mask.window_right >= 0)
      ++a.mask.window_right;
    return a;
  }

  RowStats<T> normalize_row(NormKind kind, const T* x, int64_t n, T eps,
                            T* xh) const {
    RowStats<T> st;
    if (kind == NormKind::kNone) {
      std::copy(x, x + n, xh);
      return st;
    }
    T xmax = 0;
    for (int64_t i = 0; i < n; ++i) xmax = std::max(xmax, std::fabs(x[i]));
    T mu = 0;
    if (kind == NormKind::kLayer && xmax > 0) {
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += x[i] / xmax;
      mu = s / static_cast<T>(n) * xmax;
    }
    // amax = max |x - mu|; y = (x - mu) / amax; m = sum y^2 (no overflow).
    T amax = 0;
    for (int64_t i = 0; i < n; ++i)
      amax = std::max(amax, std::fabs(x[i] / 2 - mu / 2));
    amax *= 2;
    T m = 0;
    if (amax > 0)
      for (int64_t i = 0; i < n; ++i) {
        const T y = (x[i] / 2 - mu / 2) / amax * 2;
        m += y * y;
      }
    const T se = std::sqrt(eps);
    if (kind == NormKind::kL2) {
      st.s = amax * std::sqrt(m);
      st.clamped = !(st.s > eps);
      st.den = st.clamped ? eps : st.s;
    } else {
      m /= static_cast<T>(n);
      st.s = amax * std::sqrt(m);
      if (on(Bug::kRmsEpsOutsideRsqrt) && kind == NormKind::kRms) {
        // The mutant: x / (sqrt(mean(x^2)) + eps), eps outside the root.
        st.den = st.s + eps;
      } else if (amax >= se) {
        // sqrt(var + eps) = amax sqrt(m + (sqrt(eps) / amax)^2)
        const T r = se / amax;
        st.den = amax * std::sqrt(m + r * r);
      } else {
        const T r = amax / se;
        st.den = se * std::sqrt(1 + m * r * r);
      }
    }
    for (int64_t i = 0; i < n; ++i)
      xh[i] = amax == 0 ? T(0) : (x[i] / 2 - mu / 2) * 2 / st.den;
    return st;
  }

  // du (the gradient of x_hat) -> dx, in place.
  void normalize_row_backward(NormKind kind, const T* xh, const RowStats<T>& st,
                              int64_t n, T* du) const {
    switch (kind) {
      case NormKind::kNone:
        return;
      case NormKind::kL2: {
        if (st.clamped) {
          for (int64_t i = 0; i < n; ++i) du[i] /= st.den;
          return;
        }
        const T c = dot(xh, du, n);
        for (int64_t i = 0; i < n; ++i) du[i] = (du[i] - xh[i] * c) / st.den;
        return;
      }
      case NormKind::kRms: {
        T c = dot(xh, du, n) / static_cast<T>(n);
        // d/dx of x / (s + eps): (du - x_hat (x_hat . du) (s + eps) /
        // (n s)) / (s + eps); a zero row: du / eps.
        if (on(Bug::kRmsEpsOutsideRsqrt))
          c = st.s > 0 ? c * (st.den / st.s) : 0;
        for (int64_t i = 0; i < n; ++i) du[i] = (du[i] - xh[i] * c) / st.den;
        return;
      }
      case NormKind::kLayer: {
        T s = 0;
        for (int64_t i = 0; i < n; ++i) s += du[i];
        const T mdu = s / static_cast<T>(n);
        const T c = dot(xh, du, n) / static_cast<T>(n);
        for (int64_t i = 0; i < n; ++i)
          du[i] = (du[i] - mdu - xh[i] * c) / st.den;
        return;
      }
    }
  }

  // The weight factor of element pi: gamma, or Gemma's 1 + gamma (the
  // gemma mutant: gamma).
  T gain(const Normalization& nm, const T* weight, int64_t pi) const {
    const bool one_plus = nm.one_plus_weight && !on(Bug::kGemmaWNotOnePlusW);
    return one_plus ? 1 + weight[pi] : weight[pi];
  }

  T round_s(T x) const {
    return static_cast<T>(round_to(storage_, static_cast<double>(x)));
  }

  // x_hat and x_tilde of side 0 (q) or 1 (k).
  void side(const AttentionProblem& p, int sd, const T* x_in,
            const reference::NormArgs<T>& w, Side<T>* out) const {
    const NormRows sh = norm_rows(p, sd);
    out->sh = sh;
    const int64_t L = sh.len();
    const size_t total = static_cast<size_t>(sh.rows() * L);
    std::vector<T> rotated;
    const T* x = x_in;
    if (rotates_input(p)) {
      rotated.assign(x_in, x_in + total);
      rotate(p, sd, rotated.data(), false);
      x = rotated.data();
    }
    out->xh.assign(x, x + total);
    out->xh_raw.assign(x, x + total);
    out->xt.assign(x, x + total);
    out->stats.assign(static_cast<size_t>(sh.rows()), RowStats<T>{});
    if (p.variant != Variant::kQKNorm) return;
    const Normalization& nm = p.norm;
    const T* weight = sd == 0 || nm.shared_qk_weight ? w.q_weight : w.k_weight;
    const T* bias = sd == 0 ? w.q_bias : w.k_bias;
    const bool sixteen =
        storage_ == Precision::kBF16 || storage_ == Precision::kF16;
    const bool weighted = nm.weight != ParamShape::kNone;
    const bool round = nm.round_before_weight && sixteen;
    // The qwen3 mutant: round_s(x_hat * w) instead of round_s(x_hat) * w.
    const bool cast_after =
        round && weighted && on(Bug::kQwen3WeightBeforeCast);
    std::vector<T> row(static_cast<size_t>(L)), rh(static_cast<size_t>(L));
    for (int64_t r = 0; r < sh.rows(); ++r) {
      for (int64_t e = 0; e < L; ++e) row[e] = x[sh.at(r, e)];
      out->stats[static_cast<size_t>(r)] = normalize_row(
          nm.kind, row.data(), L, static_cast<T>(p.eps), rh.data());
      for (int64_t e = 0; e < L; ++e) {
        const int64_t o = sh.at(r, e);
        T xh = rh[e];
        if (round && !cast_after) xh = round_s(xh);
        T xt = xh;
        if (weighted) {
          const int64_t pi = sh.param(r, e, nm.weight);
          xt = xh * gain(nm, weight, pi);
          if (cast_after) xt = round_s(xt);
          if (nm.bias) xt += bias[pi];
        }
        out->xh[o] = xh;
        out->xh_raw[o] = rh[e];
        out->xt[o] = xt;
      }
    }
    if (has_rope(p) && !rotates_input(p)) rotate(p, sd, out->xt.data(), false);
  }

  // dxt (the gradient of x_tilde) -> dx; parameter gradients accumulated
  // into dweight / dbias (may be null).
  void side_backward(const AttentionProblem& p, int sd,
                     const reference::NormArgs<T>& w, const Side<T>& op,
                     const T* dxt_in, T* dx, T* dweight, T* dbias) const {
    const NormRows& sh = op.sh;
    const int64_t L = sh.len();
    // RoPE's transpose: first after the normalization, last before it.
    std::vector<T> unrotated;
    const T* dxt = dxt_in;
    if (has_rope(p) && !rotates_input(p)) {
      unrotated.assign(dxt_in, dxt_in + sh.rows() * L);
      rotate(p, sd, unrotated.data(), true);
      dxt = unrotated.data();
    }
    if (p.variant != Variant::kQKNorm) {
      std::copy(dxt, dxt + sh.rows() * L, dx);
      if (rotates_input(p)) rotate(p, sd, dx, true);
      return;
    }
    const Normalization& nm = p.norm;
    const T* weight = sd == 0 || nm.shared_qk_weight ? w.q_weight : w.k_weight;
    std::vector<T> rh(static_cast<size_t>(L)), du(static_cast<size_t>(L));
    for (int64_t r = 0; r < sh.rows(); ++r) {
      for (int64_t e = 0; e < L; ++e) {
        const int64_t o = sh.at(r, e);
        rh[e] = op.xh_raw[o];
        T g = 1;
        if (nm.weight != ParamShape::kNone) {
          const int64_t pi = sh.param(r, e, nm.weight);
          g = gain(nm, weight, pi);
          if (dweight) dweight[pi] += dxt[o] * op.xh[o];
          if (nm.bias && dbias) dbias[pi] += dxt[o];
        }
        du[e] = dxt[o] * g;
      }
      normalize_row_backward(nm.kind, rh.data(),
                             op.stats[static_cast<size_t>(r)], L, du.data());
      for (int64_t e = 0; e < L; ++e) dx[sh.at(r, e)] = du[e];
    }
    if (rotates_input(p)) rotate(p, sd, dx, true);
  }

  void forward(const AttentionProblem& p0, const T* q, const T* k, const T* v,
               T* o, T* lse, const reference::NormArgs<T>& w) const {
    const AttentionProblem p = normalized_problem(p0);
    Side<T> qs, ks;
    side(p, 0, q, w, &qs);
    side(p, 1, k, w, &ks);
    reference::attention_forward<T>(attention_problem(p), qs.xt.data(),
                                    ks.xt.data(), v, o, lse);
    if (on(Bug::kSinkIndexFromRow) && has_sinks(p)) wrong_sinks(p, o, lse);
  }

  // The mutant: row i of head h with sinks[(h q_len + i) % heads] instead
  // of sinks[h], exactly from the right answer (the row's sum without its
  // sink, exp(lse) - exp(sink_h), plus the wrong sink's exp).
  void wrong_sinks(const AttentionProblem& p, T* o, T* lse) const {
    const int64_t Nq = p.q_len, D = p.head_dim;
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t h = bh % p.heads;
        const auto right = static_cast<T>(p.sinks[static_cast<size_t>(h)]);
        const auto wrong = static_cast<T>(
            p.sinks[static_cast<size_t>((h * Nq + i) % p.heads)]);
        T& l = lse[bh * Nq + i];
        // In units of exp(l) (no overflow at large logits).
        const T rest = std::max<T>(1 - std::exp(right - l), 0);
        const T l2 = l + std::log(rest + std::exp(wrong - l));
        for (int64_t d = 0; d < D; ++d)
          o[(bh * Nq + i) * D + d] *= std::exp(l - l2);
        l = l2;
      }
  }

  void probabilities(const AttentionProblem& p0, const T* q, const T* k,
                     T* probs, const reference::NormArgs<T>& w) const {
    const AttentionProblem p = normalized_problem(p0);
    Side<T> qs, ks;
    side(p, 0, q, w, &qs);
    side(p, 1, k, w, &ks);
    reference::attention_probabilities<T>(attention_problem(p), qs.xt.data(),
                                          ks.xt.data(), probs);
  }

  void backward(const AttentionProblem& p0, const T* q, const T* k, const T* v,
                const T* o, const T* d_o, const T* lse, T* dq, T* dk, T* dv,
                T* dg, const reference::NormArgs<T>& w,
                const reference::NormGrads<T>& dw) const {
    reference::NormGrads<T> sink_grad;  // the sinks' gradient only
    sink_grad.sinks = dw.sinks;
    const AttentionProblem p = normalized_problem(p0);
    Side<T> qs, ks;
    side(p, 0, q, w, &qs);
    side(p, 1, k, w, &ks);
    const AttentionProblem a = attention_problem(p);
    const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nk = p.kv_len,
                  D = p.head_dim;
    std::vector<T> dqt(qs.xt.size()), dkt(ks.xt.size());
    if (on(Bug::kGqaNoGroupSum) && Hk < H) {
      // The mutant: k_tilde and v repeated per query head (kv_heads =
      // heads), and each kv head's dK, dV taken from the first query head
      // of its group instead of the sum over the group.
      const int64_t group = H / Hk, hd = Nk * D;
      std::vector<T> kr(static_cast<size_t>(B * H * hd)), vr(kr.size());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t src = (b * Hk + h / group) * hd, dst = (b * H + h) * hd;
          std::copy(ks.xt.data() + src, ks.xt.data() + src + hd,
                    kr.data() + dst);
          std::copy(v + src, v + src + hd, vr.data() + dst);
        }
      AttentionProblem r = a;
      r.kv_heads = 0;
      std::vector<T> dkr(kr.size()), dvr(kr.size());
      reference::attention_backward<T>(r, qs.xt.data(), kr.data(), vr.data(), o,
                                       d_o, lse, dqt.data(), dkr.data(),
                                       dvr.data(), dg, nullptr, {}, sink_grad);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t hk = 0; hk < Hk; ++hk) {
          const int64_t src = (b * H + hk * group) * hd,
                        dst = (b * Hk + hk) * hd;
          std::copy(dkr.data() + src, dkr.data() + src + hd, dkt.data() + dst);
          std::copy(dvr.data() + src, dvr.data() + src + hd, dv + dst);
        }
    } else {
      reference::attention_backward<T>(a, qs.xt.data(), ks.xt.data(), v, o, d_o,
                                       lse, dqt.data(), dkt.data(), dv, dg,
                                       nullptr, {}, sink_grad);
    }
    // A shared weight (nGPT): both sides' gradients into dq_weight.
    T* dkw = p.norm.shared_qk_weight ? dw.q_weight : dw.k_weight;
    side_backward(p, 0, w, qs, dqt.data(), dq, dw.q_weight, dw.q_bias);
    side_backward(p, 1, w, ks, dkt.data(), dk, dkw, dw.k_bias);
  }

 private:
  Bug bug_;
  bool active_;
  Precision storage_;
};

template <class T>
class FormulationBackend final : public Backend {
 public:
  FormulationBackend(const char* family, const char* name, Precision precision,
                     Bug bug, bool active)
      : Backend(family, name, precision), bug_(bug), active_(active) {}

  // Every formulation and variant of attention.h (and sdpa): the
  // reference's loops apply the softcap, the window and the sinks; the
  // wrapper rotates (RoPE).
  bool supports(const AttentionProblem&) const override { return true; }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig&) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim;
    QkvParams<T> in;
    load_qkv_params(p, a, s, &in);
    const auto &q = in.q, &k = in.k, &v = in.v;
    const Params<T>& w = in.w;
    std::vector<T> o(q.size()), lse(static_cast<size_t>(B * H * p.q_len));
    kernel().forward(p, q.data(), k.data(), v.data(), o.data(), lse.data(),
                     w.args);
    scatter(s, o, a.o, B, H, p.q_len, D);
    for (size_t i = 0; i < lse.size(); ++i)
      a.lse[i] = static_cast<double>(lse[i]);
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig&) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
    QkvParams<T> in;
    load_qkv_params(p, a, s, &in);
    const auto &q = in.q, &k = in.k, &v = in.v;
    const Params<T>& w = in.w;
    auto o = gather<T>(s, a.o, B, H, p.q_len, D);
    auto d_o = gather<T>(s, a.d_o, B, H, p.q_len, D);
    std::vector<T> lse(a.lse, a.lse + a.lse_size);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<T> dqw(static_cast<size_t>(a.d_params.q_weight.size)),
        dkw(static_cast<size_t>(a.d_params.k_weight.size)),
        dqb(static_cast<size_t>(a.d_params.q_bias.size)),
        dkb(static_cast<size_t>(a.d_params.k_bias.size));
    auto ptr = [](std::vector<T>& x) { return x.empty() ? nullptr : x.data(); };
    reference::NormGrads<T> dw;
    dw.q_weight = ptr(dqw);
    dw.k_weight = ptr(dkw);
    dw.q_bias = ptr(dqb);
    dw.k_bias = ptr(dkb);
    std::vector<T> dsinks(static_cast<size_t>(a.d_sinks_size));
    dw.sinks = ptr(dsinks);
    T dg = 0;
    kernel().backward(p, q.data(), k.data(), v.data(), o.data(), d_o.data(),
                      lse.data(), dq.data(), dk.data(), dv.data(), &dg, w.args,
                      dw);
    scatter(s, dq, a.dq, B, H, p.q_len, D);
    scatter(s, dk, a.dk, B, Hk, p.kv_len, D);
    scatter(s, dv, a.dv, B, Hk, p.kv_len, D);
    *a.dg = static_cast<double>(dg);
    auto out = [](const std::vector<T>& x, const MutParamRef& r) {
      for (size_t i = 0; i < x.size(); ++i)
        r.data[i] = static_cast<double>(x[i]);
    };
    out(dqw, a.d_params.q_weight);
    out(dkw, a.d_params.k_weight);
    out(dqb, a.d_params.q_bias);
    out(dkb, a.d_params.k_bias);
    for (size_t h = 0; h < dsinks.size(); ++h)
      a.d_sinks[h] = static_cast<double>(dsinks[h]);
  }

  // ScaleNorm has no formulation: the reference's loops.
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace*,
                         const ExecConfig&) const override {
    const Precision s = precision();
    auto x = gather<T>(s, rows4(a.x), 1, 1, p.rows, p.dim);
    std::vector<T> y(x.size());
    reference::scalenorm_forward<T>(p, x.data(), y.data());
    scatter(s, y, rows4(a.y), 1, 1, p.rows, p.dim);
  }

  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace*,
                          const ExecConfig&) const override {
    const Precision s = precision();
    auto x = gather<T>(s, rows4(a.x), 1, 1, p.rows, p.dim);
    auto dy = gather<T>(s, rows4(a.dy), 1, 1, p.rows, p.dim);
    std::vector<T> dx(x.size());
    T dg = 0;
    reference::scalenorm_backward<T>(p, x.data(), dy.data(), dx.data(), &dg);
    scatter(s, dx, rows4(a.dx), 1, 1, p.rows, p.dim);
    *a.dg = static_cast<double>(dg);
  }

  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace*) const override {
    const Precision s = precision();
    auto q = gather<T>(s, a.q, p.batch, p.heads, p.q_len, p.head_dim);
    auto k = gather<T>(s, a.k, p.batch, kv_heads_of(p), p.kv_len, p.head_dim);
    Params<T> w;
    load_params(a.params, s, &w);
    std::vector<T> pr(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    kernel().probabilities(p, q.data(), k.data(), pr.data(), w.args);
    for (size_t i = 0; i < pr.size(); ++i)
      probs[i] = static_cast<double>(pr[i]);
    return true;
  }

 private:
  FormulationKernel<T> kernel() const {
    return FormulationKernel<T>(bug_, active_, precision());
  }

  Bug bug_;
  bool active_;
};

}  // namespace

std::unique_ptr<Backend> make_formulation_entry(const char* family,
                                                const char* name,
                                                Precision precision, Bug bug,
                                                bool active) {
  if (precision == Precision::kF64)
    return std::make_unique<FormulationBackend<double>>(family, name, precision,
                                                        bug, active);
  return std::make_unique<FormulationBackend<float>>(family, name, precision,
                                                     bug, active);
}

}  // namespace qknorm::property
