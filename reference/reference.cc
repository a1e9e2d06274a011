// Compiled with -ffp-contract=off (see CMakeLists.txt): no FMA contraction.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace qknorm::reference {
namespace {

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// max |x_i| and ||x / max|x_i| ||: ||x|| without forming it, for a finite x
// whose norm overflows T (e.g. four elements of T's max; found by the fuzzer).
template <class T>
T scaled_norm(const T* x, int64_t n, T* amax) {
  *amax = 0;
  for (int64_t i = 0; i < n; ++i) *amax = std::max(*amax, std::fabs(x[i]));
  T s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T t = x[i] / *amax;
    s += t * t;
  }
  return std::sqrt(s);
}

// A finite row's norm can fall outside T's normal range: above T's max
// (e.g. four elements of T's max) or into the subnormals, where it keeps a
// few significant bits and may even compare wrongly with eps (both found by
// the fuzzer, issue 7). Rows with max|x| < 2^digits * min_normal are scaled
// by 2^(2 digits) first, exactly (a power of two), norm, eps and all; rows
// whose norm overflows divide by max|x| and then by ||x / max|x|||.
template <class T>
T tiny_row_scale(const T* x, int64_t n) {
  using L = std::numeric_limits<T>;
  T amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const bool tiny = amax > 0 && amax < std::ldexp(L::min(), L::digits);
  return tiny ? std::ldexp(T(1), 2 * L::digits) : T(1);
}

// u = x / max(||x||, eps) into `u`; returns ||x|| (+inf if it overflows T;
// approximate if it is subnormal: the backward recomputes what it needs).
template <class T>
T unit_normalize(const T* x, int64_t n, T eps, T* u) {
  const T sc = tiny_row_scale(x, n);
  if (sc != 1) {
    for (int64_t i = 0; i < n; ++i) u[i] = x[i] * sc;
    const T nrm = nrm2(u, n), eps_sc = eps * sc;
    const T den = nrm > eps_sc ? nrm : eps_sc;
    for (int64_t i = 0; i < n; ++i) u[i] /= den;
    return nrm / sc;
  }
  T nrm = nrm2(x, n);
  if (std::isinf(nrm)) {
    T amax;
    const T s = scaled_norm(x, n, &amax);
    for (int64_t i = 0; i < n; ++i) u[i] = x[i] / amax / s;
    return nrm;
  }
  T den = nrm > eps ? nrm : eps;
  for (int64_t i = 0; i < n; ++i) u[i] = x[i] / den;
  return nrm;
}

// Everything the forward and backward share for one (b, h): the operands of
// the logits (q_hat/k_hat for qknorm, q/k for sdpa), the scale, and norms.
template <class T>
struct HeadOperands {
  std::vector<T> qh, kh, qn, kn;
  T scale;
};

template <class T>
void head_operands(const AttentionProblem& p, const T* q, const T* k,
                   HeadOperands<T>* h) {
  const int64_t D = p.head_dim;
  h->qh.assign(q, q + p.q_len * D);
  h->kh.assign(k, k + p.kv_len * D);
  h->qn.assign(p.q_len, 0);
  h->kn.assign(p.kv_len, 0);
  if (p.variant == Variant::kQKNorm) {
    const T eps = static_cast<T>(p.eps);
    for (int64_t i = 0; i < p.q_len; ++i)
      h->qn[i] = unit_normalize(q + i * D, D, eps, h->qh.data() + i * D);
    for (int64_t j = 0; j < p.kv_len; ++j)
      h->kn[j] = unit_normalize(k + j * D, D, eps, h->kh.data() + j * D);
    h->scale = static_cast<T>(p.g);
  } else {
    h->scale = T(1) / std::sqrt(static_cast<T>(D));
  }
}

// Row i of S into s[0..kv_len) (masked entries untouched); returns the count
// of visible keys.
template <class T>
int64_t logits_row(const AttentionProblem& p, const HeadOperands<T>& h,
                   int64_t b, int64_t i, T* s) {
  const int64_t D = p.head_dim;
  int64_t m = 0;
  for (int64_t j = 0; j < p.kv_len; ++j) {
    if (!visible(p.mask, b, i, j, p.q_len, p.kv_len)) continue;
    s[j] = h.scale * dot(h.qh.data() + i * D, h.kh.data() + j * D, D);
    ++m;
  }
  return m;
}

// Normalization backward of one row: du -> dx, in place.
template <class T>
void unit_normalize_backward(const T* x, const T* u, T nrm, T eps, int64_t n,
                             T* du) {
  // The cases of unit_normalize. A tiny row: ||x|| = ||x sc|| / sc, and
  // (du - u c) * sc cannot overflow unless the result does (||x sc|| < 1).
  const T sc = tiny_row_scale(x, n);
  T amax = 0, s = 0;
  if (sc != 1 || std::isinf(nrm)) s = scaled_norm(x, n, &amax);
  const bool above = sc != 1 ? amax * sc * s > eps * sc : nrm > eps;
  if (above) {
    const T c = dot(u, du, n);
    for (int64_t i = 0; i < n; ++i) {
      const T r = du[i] - u[i] * c;
      du[i] = sc != 1           ? r * sc / (amax * sc * s)
              : std::isinf(nrm) ? r / amax / s
                                : r / nrm;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) du[i] = du[i] / eps;
  }
}

}  // namespace

template <class T>
T nrm2(const T* x, int64_t n) {
  T amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0) return 0;
  T s = 0;
  for (int64_t i = 0; i < n; ++i) {
    T t = x[i] / amax;
    s += t * t;
  }
  return amax * std::sqrt(s);
}

template <class T>
void attention_forward(const AttentionProblem& p, const T* q, const T* k,
                       const T* v, T* o, T* lse) {
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  HeadOperands<T> h;
  std::vector<T> s(Nk), acc(D);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      const int64_t bh = b * p.heads + hd;
      const T* qb = q + bh * Nq * D;
      const T* kb = k + bh * Nk * D;
      const T* vb = v + bh * Nk * D;
      head_operands(p, qb, kb, &h);
      for (int64_t i = 0; i < Nq; ++i) {
        T* oi = o + (bh * Nq + i) * D;
        if (logits_row(p, h, b, i, s.data()) == 0) {
          for (int64_t d = 0; d < D; ++d) oi[d] = 0;
          lse[bh * Nq + i] = -std::numeric_limits<T>::infinity();
          continue;
        }
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < Nk; ++j)
          if (visible(p.mask, b, i, j, Nq, Nk)) mx = std::max(mx, s[j]);
        T sum = 0;
        for (int64_t d = 0; d < D; ++d) acc[d] = 0;
        for (int64_t j = 0; j < Nk; ++j) {
          if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
          T e = std::exp(s[j] - mx);
          sum += e;
          for (int64_t d = 0; d < D; ++d) acc[d] += e * vb[j * D + d];
        }
        for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] / sum;
        lse[bh * Nq + i] = mx + std::log(sum);
      }
    }
}

template <class T>
void attention_probabilities(const AttentionProblem& p, const T* q, const T* k,
                             T* probs) {
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  HeadOperands<T> h;
  std::vector<T> s(Nk);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      const int64_t bh = b * p.heads + hd;
      head_operands(p, q + bh * Nq * D, k + bh * Nk * D, &h);
      for (int64_t i = 0; i < Nq; ++i) {
        T* pr = probs + (bh * Nq + i) * Nk;
        for (int64_t j = 0; j < Nk; ++j) pr[j] = 0;
        if (logits_row(p, h, b, i, s.data()) == 0) continue;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < Nk; ++j)
          if (visible(p.mask, b, i, j, Nq, Nk)) mx = std::max(mx, s[j]);
        T sum = 0;
        for (int64_t j = 0; j < Nk; ++j)
          if (visible(p.mask, b, i, j, Nq, Nk))
            sum += (pr[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < Nk; ++j) pr[j] /= sum;
      }
    }
}

template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds) {
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const bool qk = p.variant == Variant::kQKNorm;
  HeadOperands<T> h;
  std::vector<T> s(Nk), dsr(Nk), dqh(D), dkh;
  T dg_sum = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      const int64_t bh = b * p.heads + hd;
      const T* qb = q + bh * Nq * D;
      const T* kb = k + bh * Nk * D;
      const T* vb = v + bh * Nk * D;
      const T* ob = o + bh * Nq * D;
      const T* dob = d_o + bh * Nq * D;
      T* dqb = dq + bh * Nq * D;
      T* dvb = dv + bh * Nk * D;
      head_operands(p, qb, kb, &h);
      dkh.assign(Nk * D, 0);
      for (int64_t x = 0; x < Nk * D; ++x) dvb[x] = 0;
      for (int64_t i = 0; i < Nq; ++i) {
        const T* doi = dob + i * D;
        T* ds_row = ds ? ds + (bh * Nq + i) * Nk : nullptr;
        if (ds_row)
          for (int64_t j = 0; j < Nk; ++j) ds_row[j] = 0;
        for (int64_t d = 0; d < D; ++d) dqh[d] = 0;
        if (logits_row(p, h, b, i, s.data()) > 0) {
          const T li = lse[bh * Nq + i];
          const T delta = dot(doi, ob + i * D, D);
          for (int64_t j = 0; j < Nk; ++j) {
            if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
            const T pij = std::exp(s[j] - li);
            for (int64_t d = 0; d < D; ++d) dvb[j * D + d] += pij * doi[d];
            const T dp = dot(doi, vb + j * D, D);
            const T dsij = pij * (dp - delta);
            if (ds_row) ds_row[j] = dsij;
            const T* khj = h.kh.data() + j * D;
            const T* qhi = h.qh.data() + i * D;
            if (qk) dg_sum += dsij * dot(qhi, khj, D);
            for (int64_t d = 0; d < D; ++d) {
              dqh[d] += dsij * khj[d];
              dkh[j * D + d] += dsij * qhi[d];
            }
          }
        }
        T* dqi = dqb + i * D;
        for (int64_t d = 0; d < D; ++d) dqi[d] = h.scale * dqh[d];
        if (qk)
          unit_normalize_backward(qb + i * D, h.qh.data() + i * D, h.qn[i],
                                  static_cast<T>(p.eps), D, dqi);
      }
      T* dkb = dk + bh * Nk * D;
      for (int64_t j = 0; j < Nk; ++j) {
        T* dkj = dkb + j * D;
        for (int64_t d = 0; d < D; ++d) dkj[d] = h.scale * dkh[j * D + d];
        if (qk)
          unit_normalize_backward(kb + j * D, h.kh.data() + j * D, h.kn[j],
                                  static_cast<T>(p.eps), D, dkj);
      }
    }
  *dg = dg_sum;
}

template <class T>
void scalenorm_forward(const ScaleNormProblem& p, const T* x, T* y) {
  const int64_t D = p.dim;
  const T g = static_cast<T>(p.g), eps = static_cast<T>(p.eps);
  for (int64_t r = 0; r < p.rows; ++r) {
    unit_normalize(x + r * D, D, eps, y + r * D);
    for (int64_t i = 0; i < D; ++i) y[r * D + i] *= g;
  }
}

template <class T>
void scalenorm_backward(const ScaleNormProblem& p, const T* x, const T* dy,
                        T* dx, T* dg) {
  const int64_t D = p.dim;
  const T g = static_cast<T>(p.g), eps = static_cast<T>(p.eps);
  std::vector<T> u(D);
  T dg_sum = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    T nrm = unit_normalize(x + r * D, D, eps, u.data());
    const T* dyr = dy + r * D;
    dg_sum += dot(dyr, u.data(), D);
    T* dxr = dx + r * D;
    for (int64_t i = 0; i < D; ++i) dxr[i] = g * dyr[i];
    unit_normalize_backward(x + r * D, u.data(), nrm, eps, D, dxr);
  }
  *dg = dg_sum;
}

#define QKNORM_REFERENCE_INSTANTIATE(T)                                       \
  template T nrm2<T>(const T*, int64_t);                                      \
  template void attention_forward<T>(const AttentionProblem&, const T*,       \
                                     const T*, const T*, T*, T*);             \
  template void attention_backward<T>(const AttentionProblem&, const T*,      \
                                      const T*, const T*, const T*, const T*, \
                                      const T*, T*, T*, T*, T*, T*);          \
  template void attention_probabilities<T>(const AttentionProblem&, const T*, \
                                           const T*, T*);                     \
  template void scalenorm_forward<T>(const ScaleNormProblem&, const T*, T*);  \
  template void scalenorm_backward<T>(const ScaleNormProblem&, const T*,      \
                                      const T*, T*, T*);
QKNORM_REFERENCE_INSTANTIATE(float)
QKNORM_REFERENCE_INSTANTIATE(double)
QKNORM_REFERENCE_INSTANTIATE(long double)

}  // namespace qknorm::reference
