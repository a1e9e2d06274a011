#include "property_tests/mutants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "qknorm/precision.h"

namespace qknorm::property {
namespace {

// Gathers a strided [B,H,rows,D] storage tensor into dense T.
template <class T>
std::vector<T> gather(Precision s, const ConstTensor4& t, int64_t B, int64_t H,
                      int64_t rows, int64_t D) {
  std::vector<T> out(static_cast<size_t>(B * H * rows * D));
  size_t idx = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        const int64_t base = b * t.layout.batch_stride +
                             h * t.layout.head_stride + n * t.layout.row_stride;
        for (int64_t d = 0; d < D; ++d)
          out[idx++] =
              static_cast<T>(decode(s, t.data, static_cast<size_t>(base + d)));
      }
  return out;
}

// Stores dense T into strided storage; `truncate_bf16` is the bug of
// Highway 1.0.3's BF16FromF32 / DemoteTo (drops the low 16 bits).
template <class T>
void scatter(Precision s, const std::vector<T>& src, const MutTensor4& t,
             int64_t B, int64_t H, int64_t rows, int64_t D,
             bool truncate_bf16) {
  size_t idx = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        const int64_t base = b * t.layout.batch_stride +
                             h * t.layout.head_stride + n * t.layout.row_stride;
        for (int64_t d = 0; d < D; ++d) {
          const double x = static_cast<double>(src[idx++]);
          const size_t at = static_cast<size_t>(base + d);
          if (truncate_bf16 && s == Precision::kBF16) {
            const float f = static_cast<float>(x);
            uint32_t u;
            std::memcpy(&u, &f, 4);
            static_cast<uint16_t*>(t.data)[at] = static_cast<uint16_t>(u >> 16);
          } else {
            encode(s, x, t.data, at);
          }
        }
      }
}

ConstTensor4 as4(const ConstTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}
MutTensor4 as4(const MutTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}

// Reference-style loops with one switchable bug.
template <class T>
class Kernel {
 public:
  Kernel(Bug bug, bool active, int threads)
      : bug_(bug), active_(active), threads_(threads) {}

  bool on(Bug b) const { return active_ && bug_ == b; }

  bool visible(const AttentionProblem& p, int64_t b, int64_t i,
               int64_t j) const {
    const int64_t shift = p.kv_len - p.q_len;
    if (p.mask.causal &&
        (on(Bug::kCausalOffByOne) ? j >= i + shift : j > i + shift))
      return false;
    if (!p.mask.key_lengths.empty()) {
      int64_t len = p.mask.key_lengths[static_cast<size_t>(b)];
      if (on(Bug::kPaddingDropsLastKey)) len -= 1;
      if (j >= len) return false;
    }
    return true;
  }

  T eps(double e) const {
    return on(Bug::kF16EpsUnderflow)
               ? static_cast<T>(round_to(Precision::kF16, e))
               : static_cast<T>(e);
  }

  static T dot(const T* a, const T* b, int64_t n) {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
  }

  static T nrm2(const T* x, int64_t n) {
    T amax = 0;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0) return 0;
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += (x[i] / amax) * (x[i] / amax);
    return amax * std::sqrt(s);
  }

  // u = x / max(||x||, eps) (or the bug's denominator); returns ||x||.
  T normalize(const T* x, int64_t n, T e, T* u) const {
    const T nrm = nrm2(x, n);
    const T den = on(Bug::kEpsInSquaredNorm) ? std::sqrt(nrm * nrm + e)
                                             : std::max(nrm, e);
    for (int64_t i = 0; i < n; ++i) u[i] = x[i] / den;
    return nrm;
  }

  // du -> dx in place.
  void normalize_backward(const T* u, T nrm, T e, int64_t n, T* du,
                          bool clamp_by_norm) const {
    if (nrm > e) {
      const T c = on(Bug::kMissingNormBackwardTerm) ? T(0) : dot(u, du, n);
      for (int64_t i = 0; i < n; ++i) du[i] = (du[i] - u[i] * c) / nrm;
    } else {
      for (int64_t i = 0; i < n; ++i) du[i] = du[i] / (clamp_by_norm ? nrm : e);
    }
  }

  struct Head {
    std::vector<T> qh, kh, vh, qn, kn;
    T scale = 1;
  };

  void operands(const AttentionProblem& p, const T* q, const T* k, const T* v,
                Head* h) const {
    const int64_t D = p.head_dim;
    h->qh.assign(q, q + p.q_len * D);
    h->kh.assign(k, k + p.kv_len * D);
    h->vh.assign(v, v + p.kv_len * D);
    h->qn.assign(static_cast<size_t>(p.q_len), 0);
    h->kn.assign(static_cast<size_t>(p.kv_len), 0);
    if (p.variant == Variant::kQKNorm) {
      const T e = eps(p.eps);
      for (int64_t i = 0; i < p.q_len; ++i)
        h->qn[i] = normalize(q + i * D, D, e, h->qh.data() + i * D);
      for (int64_t j = 0; j < p.kv_len; ++j)
        h->kn[j] = normalize(k + j * D, D, e, h->kh.data() + j * D);
      if (on(Bug::kNormalizesV))
        for (int64_t j = 0; j < p.kv_len; ++j)
          normalize(v + j * D, D, e, h->vh.data() + j * D);
      const T g = static_cast<T>(p.g);
      h->scale = on(Bug::kInvSqrtD) ? T(1) / std::sqrt(static_cast<T>(D))
                 : on(Bug::kGTwice) ? g * g
                                    : g;
    } else {
      h->scale = T(1) / std::sqrt(static_cast<T>(D));
    }
  }

  // Logits of row i into s; masked keys get -inf; returns the visible count.
  int64_t logits(const AttentionProblem& p, const Head& h, int64_t b, int64_t i,
                 T* s) const {
    const int64_t D = p.head_dim;
    int64_t m = 0;
    for (int64_t j = 0; j < p.kv_len; ++j) {
      if (!visible(p, b, i, j)) {
        // -1e9 as the fill value, stored in f16 by the f16-mask bug: -inf.
        s[j] = on(Bug::kF16MaskToInf)
                   ? static_cast<T>(round_to(Precision::kF16, -1e9))
                   : -std::numeric_limits<T>::infinity();
        continue;
      }
      s[j] = h.scale * dot(h.qh.data() + i * D, h.kh.data() + j * D, D);
      ++m;
    }
    return m;
  }

  void forward(const AttentionProblem& p, const T* q, const T* k, const T* v,
               T* o, T* lse) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    constexpr int64_t kTile = 4;
    Head h;
    std::vector<T> s(static_cast<size_t>(Nk)), acc(static_cast<size_t>(D));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd;
        operands(p, q + bh * Nq * D, k + bh * Nk * D, v + bh * Nk * D, &h);
        for (int64_t i = 0; i < Nq; ++i) {
          T* oi = o + (bh * Nq + i) * D;
          const int64_t m = logits(p, h, b, i, s.data());
          if (m == 0 && !on(Bug::kF16MaskToInf)) {
            std::fill(oi, oi + D, T(0));
            lse[bh * Nq + i] = -std::numeric_limits<T>::infinity();
            continue;
          }
          std::fill(acc.begin(), acc.end(), T(0));
          T mx = -std::numeric_limits<T>::infinity(), sum = 0;
          // Online softmax over key tiles (flash-attention style).
          for (int64_t t0 = 0; t0 < Nk; t0 += kTile) {
            const int64_t t1 = std::min(Nk, t0 + kTile);
            T tmx = mx;
            for (int64_t j = t0; j < t1; ++j) tmx = std::max(tmx, s[j]);
            if (on(Bug::kNoMaxSubtraction)) tmx = 0;
            if (tmx > mx || on(Bug::kNoMaxSubtraction)) {
              const bool skip = on(Bug::kSkippedRescaleOneTile) && t0 == kTile;
              if (!skip && sum > 0) {
                const T r = std::exp(mx - tmx);
                sum *= r;
                for (T& a : acc) a *= r;
              }
              mx = tmx;
            }
            for (int64_t j = t0; j < t1; ++j) {
              if (!visible(p, b, i, j) && !on(Bug::kF16MaskToInf)) continue;
              const T e = std::exp(s[j] - mx);
              sum += e;
              for (int64_t d = 0; d < D; ++d) acc[d] += e * h.vh[j * D + d];
            }
          }
          for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] / sum;
          lse[bh * Nq + i] = mx + std::log(sum);
        }
      }
  }

  // P = exp(S - lse) with this kernel's own lse (so a forward bug shows).
  void probabilities(const AttentionProblem& p, const T* q, const T* k,
                     T* probs) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const std::vector<T> zeros(static_cast<size_t>(p.batch * p.heads * Nk * D),
                               T(0));
    std::vector<T> o(static_cast<size_t>(p.batch * p.heads * Nq * D)),
        lse(static_cast<size_t>(p.batch * p.heads * Nq));
    forward(p, q, k, zeros.data(), o.data(), lse.data());
    Head h;
    std::vector<T> s(static_cast<size_t>(Nk));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd;
        operands(p, q + bh * Nq * D, k + bh * Nk * D, zeros.data(), &h);
        for (int64_t i = 0; i < Nq; ++i) {
          T* pr = probs + (bh * Nq + i) * Nk;
          const int64_t m = logits(p, h, b, i, s.data());
          for (int64_t j = 0; j < Nk; ++j)
            pr[j] = (m == 0 && !on(Bug::kF16MaskToInf)) || !visible(p, b, i, j)
                        ? T(0)
                        : std::exp(s[j] - lse[bh * Nq + i]);
        }
      }
  }

  void backward(const AttentionProblem& p, const T* q, const T* k, const T* v,
                const T* o, const T* d_o, const T* lse, T* dq, T* dk, T* dv,
                T* dg) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const bool qk = p.variant == Variant::kQKNorm;
    Head h;
    std::vector<T> s(static_cast<size_t>(Nk)), ds(static_cast<size_t>(Nq * Nk)),
        dkh(static_cast<size_t>(Nk * D));
    T dg_sum = 0;
    const bool reverse = on(Bug::kThreadDependentOrder) && threads_ != 1;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd;
        operands(p, q + bh * Nq * D, k + bh * Nk * D, v + bh * Nk * D, &h);
        const T* ob = o + bh * Nq * D;
        const T* dob = d_o + bh * Nq * D;
        T* dqb = dq + bh * Nq * D;
        T* dkb = dk + bh * Nk * D;
        T* dvb = dv + bh * Nk * D;
        std::fill(ds.begin(), ds.end(), T(0));
        std::fill(dvb, dvb + Nk * D, T(0));
        for (int64_t i = 0; i < Nq; ++i) {
          const T* doi = dob + i * D;
          T* dqi = dqb + i * D;
          std::fill(dqi, dqi + D, T(0));
          if (logits(p, h, b, i, s.data()) > 0) {
            const T delta = dot(doi, ob + i * D, D);
            for (int64_t j = 0; j < Nk; ++j) {
              if (!visible(p, b, i, j)) {
                if (!on(Bug::kBackwardIgnoresMask)) continue;
                // The bug: P recomputed over every key in the backward.
                s[j] =
                    h.scale * dot(h.qh.data() + i * D, h.kh.data() + j * D, D);
              }
              const T pij = std::exp(s[j] - lse[bh * Nq + i]);
              for (int64_t d = 0; d < D; ++d) dvb[j * D + d] += pij * doi[d];
              const T dsij = pij * (dot(doi, h.vh.data() + j * D, D) - delta);
              ds[static_cast<size_t>(i * Nk + j)] = dsij;
              const T* khj = h.kh.data() + j * D;
              if (qk && !(on(Bug::kDgOneHead) && hd != 0))
                dg_sum += dsij * dot(h.qh.data() + i * D, khj, D);
              for (int64_t d = 0; d < D; ++d) dqi[d] += dsij * khj[d];
            }
          }
          for (int64_t d = 0; d < D; ++d) dqi[d] *= h.scale;
          if (qk)
            normalize_backward(h.qh.data() + i * D, h.qn[i], eps(p.eps), D, dqi,
                               false);
        }
        const bool transposed = on(Bug::kTransposedDk) && Nq == Nk;
        std::fill(dkh.begin(), dkh.end(), T(0));
        for (int64_t step = 0; step < Nq; ++step) {
          const int64_t i = reverse ? Nq - 1 - step : step;
          for (int64_t j = 0; j < Nk; ++j) {
            const T dsij = transposed ? ds[static_cast<size_t>(j * Nk + i)]
                                      : ds[static_cast<size_t>(i * Nk + j)];
            for (int64_t d = 0; d < D; ++d)
              dkh[static_cast<size_t>(j * D + d)] += dsij * h.qh[i * D + d];
          }
        }
        for (int64_t j = 0; j < Nk; ++j) {
          T* dkj = dkb + j * D;
          for (int64_t d = 0; d < D; ++d)
            dkj[d] = h.scale * dkh[static_cast<size_t>(j * D + d)];
          if (qk)
            normalize_backward(h.kh.data() + j * D, h.kn[j], eps(p.eps), D, dkj,
                               false);
        }
      }
    *dg = dg_sum;
  }

  void scalenorm_forward(const ScaleNormProblem& p, const T* x, T* y) const {
    const T g = static_cast<T>(p.g), e = eps(p.eps);
    for (int64_t r = 0; r < p.rows; ++r) {
      normalize(x + r * p.dim, p.dim, e, y + r * p.dim);
      for (int64_t i = 0; i < p.dim; ++i) y[r * p.dim + i] *= g;
    }
  }

  void scalenorm_backward(const ScaleNormProblem& p, const T* x, const T* dy,
                          T* dx, T* dg) const {
    const T g = static_cast<T>(p.g), e = eps(p.eps);
    std::vector<T> u(static_cast<size_t>(p.dim));
    T dg_sum = 0;
    for (int64_t r = 0; r < p.rows; ++r) {
      const T nrm = normalize(x + r * p.dim, p.dim, e, u.data());
      const T* dyr = dy + r * p.dim;
      T* dxr = dx + r * p.dim;
      dg_sum += dot(dyr, u.data(), p.dim);
      for (int64_t i = 0; i < p.dim; ++i) dxr[i] = g * dyr[i];
      normalize_backward(u.data(), nrm, e, p.dim, dxr,
                         on(Bug::kScaleNormClampByNorm));
    }
    *dg = dg_sum;
  }

 private:
  Bug bug_;
  bool active_;
  int threads_;
};

template <class T>
class MutantBackend final : public Backend {
 public:
  MutantBackend(const MutantInfo& m, bool active)
      : Backend("mutant", active ? m.name : "control", m.precision),
        bug_(m.bug),
        active_(active) {}

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig& cfg) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim;
    auto q = gather<T>(s, a.q, B, H, p.q_len, D);
    auto k = gather<T>(s, a.k, B, H, p.kv_len, D);
    auto v = gather<T>(s, a.v, B, H, p.kv_len, D);
    std::vector<T> o(q.size()), lse(static_cast<size_t>(B * H * p.q_len));
    kernel(cfg).forward(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    scatter(s, o, a.o, B, H, p.q_len, D, truncates());
    for (size_t i = 0; i < lse.size(); ++i)
      a.lse[i] = static_cast<double>(lse[i]);
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig& cfg) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim;
    auto q = gather<T>(s, a.q, B, H, p.q_len, D);
    auto k = gather<T>(s, a.k, B, H, p.kv_len, D);
    auto v = gather<T>(s, a.v, B, H, p.kv_len, D);
    auto o = gather<T>(s, a.o, B, H, p.q_len, D);
    auto d_o = gather<T>(s, a.d_o, B, H, p.q_len, D);
    std::vector<T> lse(a.lse, a.lse + a.lse_size);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    T dg = 0;
    kernel(cfg).backward(p, q.data(), k.data(), v.data(), o.data(), d_o.data(),
                         lse.data(), dq.data(), dk.data(), dv.data(), &dg);
    scatter(s, dq, a.dq, B, H, p.q_len, D, truncates());
    scatter(s, dk, a.dk, B, H, p.kv_len, D, truncates());
    scatter(s, dv, a.dv, B, H, p.kv_len, D, truncates());
    *a.dg = static_cast<double>(dg);
  }

  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace*,
                         const ExecConfig& cfg) const override {
    const Precision s = precision();
    auto x = gather<T>(s, as4(a.x), 1, 1, p.rows, p.dim);
    std::vector<T> y(x.size());
    kernel(cfg).scalenorm_forward(p, x.data(), y.data());
    scatter(s, y, as4(a.y), 1, 1, p.rows, p.dim, truncates());
  }

  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace*,
                          const ExecConfig& cfg) const override {
    const Precision s = precision();
    auto x = gather<T>(s, as4(a.x), 1, 1, p.rows, p.dim);
    auto dy = gather<T>(s, as4(a.dy), 1, 1, p.rows, p.dim);
    std::vector<T> dx(x.size());
    T dg = 0;
    kernel(cfg).scalenorm_backward(p, x.data(), dy.data(), dx.data(), &dg);
    scatter(s, dx, as4(a.dx), 1, 1, p.rows, p.dim, truncates());
    *a.dg = static_cast<double>(dg);
  }

  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace*) const override {
    const Precision s = precision();
    auto q = gather<T>(s, a.q, p.batch, p.heads, p.q_len, p.head_dim);
    auto k = gather<T>(s, a.k, p.batch, p.heads, p.kv_len, p.head_dim);
    std::vector<T> pr(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    kernel({}).probabilities(p, q.data(), k.data(), pr.data());
    for (size_t i = 0; i < pr.size(); ++i)
      probs[i] = static_cast<double>(pr[i]);
    return true;
  }

 private:
  Kernel<T> kernel(const ExecConfig& cfg) const {
    return Kernel<T>(bug_, active_, cfg.threads);
  }
  bool truncates() const { return active_ && bug_ == Bug::kBf16Truncate; }

  Bug bug_;
  bool active_;
};

std::unique_ptr<Backend> make(const MutantInfo& m, bool active) {
  if (m.precision == Precision::kF64)
    return std::make_unique<MutantBackend<double>>(m, active);
  return std::make_unique<MutantBackend<float>>(m, active);
}

}  // namespace

const std::vector<MutantInfo>& mutant_list() {
  static const std::vector<MutantInfo> list = {
      {Bug::kInvSqrtD, "inv_sqrt_d",
       "1/sqrt(D) instead of g (the sdpa scale kept after adding QKNorm)",
       Precision::kF32},
      {Bug::kGTwice, "g_twice",
       "g applied twice (once folded into q_hat, once on the logits)",
       Precision::kF32},
      {Bug::kEpsInSquaredNorm, "eps_in_squared_norm",
       "sqrt(||x||^2 + eps) instead of the clamp max(||x||, eps)",
       Precision::kF64},
      {Bug::kCausalOffByOne, "causal_off_by_one",
       "causal mask j < i instead of j <= i (diagonal hidden)",
       Precision::kF32},
      {Bug::kPaddingDropsLastKey, "padding_drops_last_key",
       "padding mask j >= len - 1 (last real key ignored)", Precision::kF32},
      {Bug::kNoMaxSubtraction, "no_max_subtraction",
       "softmax without subtracting the row max (exp overflows)",
       Precision::kF32},
      {Bug::kBf16Truncate, "bf16_truncate",
       "f32 -> bf16 outputs truncated (Highway 1.0.3 DemoteTo), not RNE",
       Precision::kBF16},
      {Bug::kDgOneHead, "dg_one_head",
       "dg summed over head 0 only instead of all heads and batches",
       Precision::kF64},
      {Bug::kMissingNormBackwardTerm, "missing_norm_backward_term",
       "normalization backward dx = du / ||x|| without - u (u . du)",
       Precision::kF32},
      {Bug::kTransposedDk, "transposed_dk",
       "dK_hat = g dS Q_hat instead of g dS^T Q_hat (square problems)",
       Precision::kF32},
      {Bug::kSkippedRescaleOneTile, "skipped_rescale_one_tile",
       "online softmax: running sum/acc not rescaled when tile 1 raises the "
       "max",
       Precision::kF32},
      {Bug::kThreadDependentOrder, "thread_dependent_order",
       "dK reduction order depends on the thread count", Precision::kF32},
      {Bug::kF16MaskToInf, "f16_mask_to_inf",
       "masked logits filled with -1e9 in f16 (= -inf): fully masked rows NaN",
       Precision::kF16},
      {Bug::kF16EpsUnderflow, "f16_eps_underflow",
       "eps stored in f16 (1e-12 -> 0): zero rows give 0/0", Precision::kF16},
      {Bug::kScaleNormClampByNorm, "scalenorm_clamp_by_norm",
       "ScaleNorm backward divides by ||x|| instead of eps in the clamp region",
       Precision::kF32},
      {Bug::kBackwardIgnoresMask, "backward_ignores_mask",
       "backward recomputes P over every key: masked keys get gradient",
       Precision::kF32},
      {Bug::kNormalizesV, "normalizes_v", "v rows normalized like q and k",
       Precision::kBF16},
  };
  return list;
}

const Registry& mutant_registry() {
  static const Registry* r = [] {
    auto* reg = new Registry;
    for (const MutantInfo& m : mutant_list()) reg->add(make(m, true));
    return reg;
  }();
  return *r;
}

// The unmutated copy at every precision (mutation_test.cc requires that it
// passes the whole table: the mutants are caught for their bug, not for the
// copy).
const Registry& control_registry() {
  static const Registry* r = [] {
    auto* reg = new Registry;
    for (Precision p : kAllPrecisions)
      reg->add(make({Bug::kInvSqrtD, "control", "unmutated copy", p}, false));
    return reg;
  }();
  return *r;
}

}  // namespace qknorm::property
