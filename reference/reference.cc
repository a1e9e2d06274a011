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

// One normalization row of length n (attention.h): x_hat from x, and what
// the backward needs. l2 keeps the paper's code path (unit_normalize);
// rms and layer scale by amax = max |x_i - mu| first so that no finite
// input overflows or underflows harmfully: with y = (x - mu) / amax and
// m = mean(y^2), the divisor sqrt(var + eps) is d1 * d2 with
//   amax >= sqrt(eps): d1 = amax / 2,  d2 = 2 sqrt(m + (sqrt(eps) / amax)^2)
//   amax <  sqrt(eps): d1 = sqrt(eps), d2 = sqrt(1 + m (amax / sqrt(eps))^2)
// and x_hat = y (amax / (d1 d2)); amax itself is never formed (below).
template <class T>
RowStats<T> normalize_row(NormKind kind, const T* x, int64_t n, T eps, T* xh) {
  RowStats<T> st;
  switch (kind) {
    case NormKind::kNone:
      for (int64_t i = 0; i < n; ++i) xh[i] = x[i];
      return st;
    case NormKind::kL2:
      st.nrm = unit_normalize(x, n, eps, xh);
      return st;
    case NormKind::kRms:
    case NormKind::kLayer:
      break;
  }
  // mu = mean(x), from x / max|x| (no overflow of the sum).
  T xmax = 0;
  for (int64_t i = 0; i < n; ++i) xmax = std::max(xmax, std::fabs(x[i]));
  T mu = 0;
  if (kind == NormKind::kLayer && xmax > 0) {
    T s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i] / xmax;
    mu = s / static_cast<T>(n) * xmax;
  }
  // half = max |x_i - mu| / 2, from the halves: neither x_i - mu nor
  // max |x_i - mu| itself is formed, since either may exceed the largest
  // finite T (a row holding 1.8e308 and -1e308: fuzz finding
  // crash-f64-chameleon-layer-spread-overflow, where amax = inf gave
  // d2 = 0 and x_hat = 0 * inf = NaN). y = (x_i - mu) / amax is the same
  // quotient of the halves, and amax (d1 above) is carried as half with the
  // factor 2 moved into d2 (exact: a power of two).
  T half = 0;
  for (int64_t i = 0; i < n; ++i)
    half = std::max(half, std::fabs(x[i] / 2 - mu / 2));
  const T se = std::sqrt(eps);
  if (half == 0) {  // a zero (rms) or constant (layer) row: x_hat = 0
    for (int64_t i = 0; i < n; ++i) xh[i] = 0;
    st.d1 = se;
    return st;
  }
  T m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T y = (x[i] / 2 - mu / 2) / half;
    m += y * y;
  }
  m /= static_cast<T>(n);
  T f;                          // amax / (d1 d2)
  if (half >= se / 2) {         // amax >= sqrt(eps)
    const T r = se / 2 / half;  // sqrt(eps) / amax
    st.d1 = half;
    st.d2 = 2 * std::sqrt(m + r * r);
    f = 1 / std::sqrt(m + r * r);
  } else {
    const T r = 2 * half / se;  // amax / sqrt(eps), amax < sqrt(eps) here
    st.d1 = se;
    st.d2 = std::sqrt(1 + m * r * r);
    f = r / st.d2;
  }
  for (int64_t i = 0; i < n; ++i) xh[i] = (x[i] / 2 - mu / 2) / half * f;
  return st;
}

// du (the gradient of x_hat) -> dx, in place.
template <class T>
void normalize_row_backward(NormKind kind, const T* x, const T* xh,
                            const RowStats<T>& st, T eps, int64_t n, T* du) {
  switch (kind) {
    case NormKind::kNone:
      return;
    case NormKind::kL2:
      unit_normalize_backward(x, xh, st.nrm, eps, n, du);
      return;
    case NormKind::kRms: {
      // dx = (du - x_hat (x_hat . du) / n) / (d1 d2)
      const T c = dot(xh, du, n) / static_cast<T>(n);
      for (int64_t i = 0; i < n; ++i)
        du[i] = (du[i] - xh[i] * c) / st.d1 / st.d2;
      return;
    }
    case NormKind::kLayer: {
      // dx = (du - mean(du) - x_hat mean(du x_hat)) / (d1 d2)
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += du[i];
      const T mdu = s / static_cast<T>(n);
      const T c = dot(xh, du, n) / static_cast<T>(n);
      for (int64_t i = 0; i < n; ++i)
        du[i] = (du[i] - mdu - xh[i] * c) / st.d1 / st.d2;
      return;
    }
  }
}

// x_hat and x_tilde of one side, and the per-row statistics, owned (the
// functions that take no prepared operands).
template <class T>
struct SideOperand {
  NormRows sh{};
  std::vector<T> xh, xu, xt;  // dense [B,H_x,N,D]; xu empty: == xh
  std::vector<RowStats<T>> stats;
  OperandView<T> view() const {
    return {sh, xh.data(), xu.empty() ? xh.data() : xu.data(), xt.data(),
            stats.data()};
  }
};

// RoPE before the normalization (and sdpa): x rotated into *buf (below).
template <class T>
const T* rope_input(const AttentionProblem& p, int side, const T* x,
                    const NormArgs<T>& w, std::vector<T>* buf);

template <class T>
void side_operand(const AttentionProblem& p, int side, const T* x,
                  const NormArgs<T>& w, SideOperand<T>* out) {
  const NormRows sh = norm_rows(p, side);
  out->sh = sh;
  const auto total = static_cast<size_t>(sh.rows() * sh.len());
  out->xh.resize(total);
  out->xt.resize(total);
  out->xu.resize(rounds_x_hat(p, w.storage) ? total : 0);
  out->stats.assign(static_cast<size_t>(sh.rows()), RowStats<T>{});
  prepare_operand(p, side, x, w, out->xh.data(),
                  out->xu.empty() ? nullptr : out->xu.data(), out->xt.data(),
                  out->stats.data());
}

// Backward of the side's operands: dxt (the gradient of x_tilde, dense) ->
// dx, and the parameter gradients accumulated into dweight / dbias (may be
// null).
template <class T>
void side_operand_backward(const AttentionProblem& p, int side, const T* x_in,
                           const NormArgs<T>& w, const OperandView<T>& op,
                           const T* dxt_in, T* dx, T* dweight, T* dbias) {
  const NormRows& sh = op.rows;
  const int64_t L = sh.len();
  // RoPE: the rotation's transpose on the way back, before the
  // normalization backward (after the normalization) or after it (before
  // it, which also reads the rotated x; sdpa: either).
  const bool rope = has_rope(p);
  const bool rope_first = rope && (p.variant != Variant::kQKNorm ||
                                   p.rope.order == RopeOrder::kAfterNorm);
  RopeTable<T> table;
  if (rope) table = rope_table<T>(p, side, w.storage, w.exact_rope);
  std::vector<T> dxt_rot, rotated;
  const T* dxt = dxt_in;
  if (rope_first) {
    dxt_rot.assign(dxt_in, dxt_in + sh.rows() * L);
    rope_rotate(p, side, table, dxt_rot.data(), true);
    dxt = dxt_rot.data();
  }
  const T* x = rope_first ? x_in : rope_input(p, side, x_in, w, &rotated);
  if (p.variant != Variant::kQKNorm) {
    for (int64_t i = 0; i < sh.rows() * L; ++i) dx[i] = dxt[i];
    return;
  }
  const Normalization& nm = p.norm;
  const T* weight = side == 0 || nm.shared_qk_weight ? w.q_weight : w.k_weight;
  std::vector<T> row(static_cast<size_t>(L)), rh(static_cast<size_t>(L)),
      du(static_cast<size_t>(L));
  for (int64_t r = 0; r < sh.rows(); ++r) {
    for (int64_t e = 0; e < L; ++e) {
      const int64_t o = sh.at(r, e);
      row[e] = x[o];
      rh[e] = op.xh[o];
      T g = 1;
      if (nm.weight != ParamShape::kNone) {
        const int64_t pi = sh.param(r, e, nm.weight);
        g = nm.one_plus_weight ? 1 + weight[pi] : weight[pi];
        if (dweight) dweight[pi] += dxt[o] * rh[e];
        if (nm.bias && dbias) dbias[pi] += dxt[o];
      }
      du[e] = dxt[o] * g;
    }
    // The normalization backward reads the unrounded x_hat (rounding to
    // storage is the identity for the gradient, as a cast is in autograd):
    // prepare_operand kept it (normalize_row's own result, bit for bit).
    if (nm.round_before_weight)
      for (int64_t e = 0; e < L; ++e) rh[e] = op.xu[sh.at(r, e)];
    normalize_row_backward(nm.kind, row.data(), rh.data(),
                           op.stats[static_cast<size_t>(r)],
                           static_cast<T>(p.eps), L, du.data());
    for (int64_t e = 0; e < L; ++e) dx[sh.at(r, e)] = du[e];
  }
  if (rope && !rope_first) rope_rotate(p, side, table, dx, true);
}

template <class T>
T logit_scale(const AttentionProblem& p) {
  if (p.variant != Variant::kQKNorm)
    return T(1) / std::sqrt(static_cast<T>(p.head_dim));
  return static_cast<T>(p.fixed_scale ? p.scale : p.g);
}

// Row i of S into s[0..kv_len) (masked entries untouched); returns the count
// of visible keys. qt: query head (b, h)'s rows; kt: its kv head's.
// Each logit is RN(scale * c) clamped to [-max, max] of T, and a NaN (c =
// inf - inf: terms that overflow with both signs) becomes -max, as the simd
// kernels' Logit does. Why: an overflowing logit made the running max inf
// and exp(inf - inf) a NaN in O (fuzz finding crash-f64-chameleon-logit-
// overflow: layer norm with [H, D] weights and biases ~1e200, f64). Such
// inputs are outside the representable domain and their values are not
// judged (fuzz in_domain), but every output must stay finite. Unreachable
// in the long-double oracle from double inputs (|c| <= 1e617 there).
// With a softcap (attention.h) the clamped logit x becomes cap tanh(x / cap)
// in T, on visible keys only (a masked key is skipped, never capped).
template <class T>
int64_t logits_row(const AttentionProblem& p, const T* qt, const T* kt, T scale,
                   int64_t b, int64_t i, T* s) {
  const int64_t D = p.head_dim;
  const T big = std::numeric_limits<T>::max();
  const T cap = static_cast<T>(p.softcap);
  int64_t m = 0;
  for (int64_t j = 0; j < p.kv_len; ++j) {
    if (!visible(p.mask, b, i, j, p.q_len, p.kv_len)) continue;
    const T x = scale * dot(qt + i * D, kt + j * D, D);
    s[j] = std::isnan(x) ? -big : std::clamp(x, -big, big);
    if (cap > 0) s[j] = cap * std::tanh(s[j] / cap);
    ++m;
  }
  return m;
}

// The softcap's derivative at a capped logit s = cap tanh(x / cap):
// d s / d x = 1 - (s / cap)^2 (1 without a cap).
template <class T>
T softcap_slope(const AttentionProblem& p, T s) {
  if (p.softcap == 0) return 1;
  const T t = s / static_cast<T>(p.softcap);
  return 1 - t * t;
}

// Row i's softmax over its visible logits s (and head h's sink, attention.h:
// a key with no value): returns the maximum m and writes sum_j exp(s_j - m)
// (+ exp(sink - m)) to *sum, exp(s_j - m) to e[j] where visible (e may be
// null). The row has at least one visible key.
template <class T>
T softmax_row(const AttentionProblem& p, int64_t b, int64_t h, int64_t i,
              const T* s, T* e, T* sum) {
  const int64_t Nq = p.q_len, Nk = p.kv_len;
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < Nk; ++j)
    if (visible(p.mask, b, i, j, Nq, Nk)) mx = std::max(mx, s[j]);
  const T sink = has_sinks(p) ? static_cast<T>(p.sinks[h]) : 0;
  if (has_sinks(p)) mx = std::max(mx, sink);
  T total = 0;
  for (int64_t j = 0; j < Nk; ++j) {
    if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
    const T x = std::exp(s[j] - mx);
    total += x;
    if (e) e[j] = x;
  }
  if (has_sinks(p)) total += std::exp(sink - mx);
  *sum = total;
  return mx;
}

// lse of a row with no visible key: -inf, or the sink alone (attention.h).
template <class T>
T empty_row_lse(const AttentionProblem& p, int64_t h) {
  return has_sinks(p) ? static_cast<T>(p.sinks[h])
                      : -std::numeric_limits<T>::infinity();
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

bool rounds_x_hat(const AttentionProblem& p, Precision storage) {
  return p.variant == Variant::kQKNorm && p.norm.round_before_weight &&
         (storage == Precision::kBF16 || storage == Precision::kF16);
}

template <class T>
RopeTable<T> rope_table(const AttentionProblem& p, int side, Precision storage,
                        bool exact) {
  RopeTable<T> t;
  const Rope& r = p.rope;
  if (!has_rope(p)) return t;
  t.pairs = r.rotary_dim / 2;
  const int64_t N = side == 0 ? p.q_len : p.kv_len;
  const auto size = static_cast<size_t>(N * t.pairs);
  t.cos.resize(size);
  t.sin.resize(size);
  const bool round_cs =
      !exact && r.cos_sin_storage &&
      (storage == Precision::kBF16 || storage == Precision::kF16);
  for (int64_t e = 0; e < t.pairs; ++e) {
    // The claimed f32 angle: Hugging Face's inv_freq = 1 / theta^(2e / r)
    // in f32 and pos * inv_freq in f32.
    float inv32 = 0;
    if (!exact && r.angle_f32)
      inv32 = r.inv_freq.empty()
                  ? 1.0f / std::pow(static_cast<float>(r.theta),
                                    static_cast<float>(2 * e) /
                                        static_cast<float>(r.rotary_dim))
                  : static_cast<float>(r.inv_freq[static_cast<size_t>(e)]);
    const T inv = rope_inv_freq<T>(r, e);
    const double inv64 = rope_inv_freq<double>(r, e);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t pos = rope_position(p, side, n);
      T c, s;
      if (exact) {
        const T a = static_cast<T>(pos) * inv;
        c = std::cos(a);
        s = std::sin(a);
      } else if (r.angle_f32) {
        const float a = static_cast<float>(pos) * inv32;
        c = static_cast<T>(std::cos(a));
        s = static_cast<T>(std::sin(a));
      } else {
        const double a = static_cast<double>(pos) * inv64;
        c = static_cast<T>(std::cos(a));
        s = static_cast<T>(std::sin(a));
      }
      if (round_cs) {
        c = static_cast<T>(round_to(storage, static_cast<double>(c)));
        s = static_cast<T>(round_to(storage, static_cast<double>(s)));
      }
      t.cos[static_cast<size_t>(n * t.pairs + e)] = c;
      t.sin[static_cast<size_t>(n * t.pairs + e)] = s;
    }
  }
  return t;
}

template <class T>
void rope_rotate(const AttentionProblem& p, int side, const RopeTable<T>& t,
                 T* x, bool inverse) {
  if (t.pairs == 0) return;
  const int64_t D = p.head_dim, N = side == 0 ? p.q_len : p.kv_len;
  const int64_t rows = p.batch * (side == 0 ? p.heads : kv_heads_of(p)) * N;
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x + r * D;
    const size_t at = static_cast<size_t>((r % N) * t.pairs);
    for (int64_t e = 0; e < t.pairs; ++e) {
      const RopePair pr = rope_pair(p.rope, e);
      const T c = t.cos[at + static_cast<size_t>(e)];
      const T s = inverse ? -t.sin[at + static_cast<size_t>(e)]
                          : t.sin[at + static_cast<size_t>(e)];
      const T xa = row[pr.a], xb = row[pr.b];
      row[pr.a] = xa * c - xb * s;
      row[pr.b] = xb * c + xa * s;
    }
  }
}

namespace {
// x rotated (RoPE before the normalization) into *buf, else x itself.
template <class T>
const T* rope_input(const AttentionProblem& p, int side, const T* x,
                    const NormArgs<T>& w, std::vector<T>* buf) {
  if (!has_rope(p) ||
      (p.variant == Variant::kQKNorm && p.rope.order != RopeOrder::kBeforeNorm))
    return x;
  const NormRows sh = norm_rows(p, side);
  buf->assign(x, x + sh.rows() * sh.len());
  rope_rotate(p, side, rope_table<T>(p, side, w.storage, w.exact_rope),
              buf->data(), false);
  return buf->data();
}
// RoPE after the normalization: x_tilde rotated in place.
template <class T>
void rope_output(const AttentionProblem& p, int side, const NormArgs<T>& w,
                 T* xt) {
  if (!has_rope(p) || p.variant != Variant::kQKNorm ||
      p.rope.order != RopeOrder::kAfterNorm)
    return;
  rope_rotate(p, side, rope_table<T>(p, side, w.storage, w.exact_rope), xt,
              false);
}
}  // namespace

template <class T>
void prepare_operand(const AttentionProblem& p, int side, const T* x_in,
                     const NormArgs<T>& w, T* xh_out, T* xu_out, T* xt_out,
                     RowStats<T>* stats) {
  const NormRows sh = norm_rows(p, side);
  const int64_t L = sh.len();
  for (int64_t r = 0; r < sh.rows(); ++r) stats[r] = RowStats<T>{};
  std::vector<T> rotated;
  const T* x = rope_input(p, side, x_in, w, &rotated);
  if (p.variant != Variant::kQKNorm) {
    std::copy(x, x + sh.rows() * L, xh_out);
    std::copy(x, x + sh.rows() * L, xt_out);
    if (xu_out) std::copy(x, x + sh.rows() * L, xu_out);
    return;
  }
  const Normalization& nm = p.norm;
  const T* weight = side == 0 || nm.shared_qk_weight ? w.q_weight : w.k_weight;
  const T* bias = side == 0 ? w.q_bias : w.k_bias;
  const bool round = rounds_x_hat(p, w.storage);
  std::vector<T> row(static_cast<size_t>(L)), rh(static_cast<size_t>(L));
  for (int64_t r = 0; r < sh.rows(); ++r) {
    for (int64_t e = 0; e < L; ++e) row[e] = x[sh.at(r, e)];
    stats[r] =
        normalize_row(nm.kind, row.data(), L, static_cast<T>(p.eps), rh.data());
    for (int64_t e = 0; e < L; ++e) {
      T xh = rh[e];
      if (round)
        xh = static_cast<T>(round_to(w.storage, static_cast<double>(xh)));
      T xt = xh;
      if (nm.weight != ParamShape::kNone) {
        const int64_t pi = sh.param(r, e, nm.weight);
        const T g = nm.one_plus_weight ? 1 + weight[pi] : weight[pi];
        xt = xh * g;
        if (nm.bias) xt += bias[pi];
      }
      const int64_t o = sh.at(r, e);
      xh_out[o] = xh;
      xt_out[o] = xt;
      if (xu_out) xu_out[o] = rh[e];
    }
  }
  rope_output(p, side, w, xt_out);
}

template <class T>
void normalized_operand(const AttentionProblem& p, int side, const T* x,
                        const NormArgs<T>& w, T* out) {
  SideOperand<T> op;
  side_operand(p, side, x, w, &op);
  std::copy(op.xt.begin(), op.xt.end(), out);
}

namespace {
// f(b, bh, bk, qt, kt, scale) for every (batch, query head): bh indexes the
// query head's rows, bk its kv head's; qt and kt are their logit operands.
template <class T, class F>
void each_head(const AttentionProblem& p, const OperandView<T>& qo,
               const OperandView<T>& ko, F&& f) {
  const int64_t D = p.head_dim, group = p.heads / kv_heads_of(p);
  const T scale = logit_scale<T>(p);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      const int64_t bh = b * p.heads + hd, bk = b * kv_heads_of(p) + hd / group;
      f(b, bh, bk, qo.xt + bh * p.q_len * D, ko.xt + bk * p.kv_len * D, scale);
    }
}
}  // namespace

template <class T>
void attention_forward(const AttentionProblem& p, const T* q, const T* k,
                       const T* v, T* o, T* lse, const NormArgs<T>& w) {
  SideOperand<T> qo, ko;
  side_operand(p, 0, q, w, &qo);
  side_operand(p, 1, k, w, &ko);
  attention_forward(p, qo.view(), ko.view(), v, o, lse);
}

template <class T>
void attention_forward(const AttentionProblem& p, const OperandView<T>& qo,
                       const OperandView<T>& ko, const T* v, T* o, T* lse,
                       T* probs, T* logits) {
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  std::vector<T> s_own(Nk), acc(D), e_row(Nk);
  each_head(p, qo, ko,
            [&](int64_t b, int64_t bh, int64_t bk, const T* qt, const T* kt,
                T scale) {
              const T* vb = v + bk * Nk * D;
              for (int64_t i = 0; i < Nq; ++i) {
                T* oi = o + (bh * Nq + i) * D;
                T* s = logits ? logits + (bh * Nq + i) * Nk : s_own.data();
                T* pr = probs ? probs + (bh * Nq + i) * Nk : nullptr;
                if (pr)
                  for (int64_t j = 0; j < Nk; ++j) pr[j] = 0;
                const int64_t hd = bh % p.heads;
                if (logits_row(p, qt, kt, scale, b, i, s) == 0) {
                  for (int64_t d = 0; d < D; ++d) oi[d] = 0;
                  lse[bh * Nq + i] = empty_row_lse<T>(p, hd);
                  continue;
                }
                T sum = 0;
                const T mx = softmax_row(p, b, hd, i, s, e_row.data(), &sum);
                for (int64_t d = 0; d < D; ++d) acc[d] = 0;
                for (int64_t j = 0; j < Nk; ++j) {
                  if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
                  const T e = e_row[j];
                  if (pr) pr[j] = e;
                  for (int64_t d = 0; d < D; ++d) acc[d] += e * vb[j * D + d];
                }
                for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] / sum;
                lse[bh * Nq + i] = mx + std::log(sum);
                // P as attention_probabilities forms it: the same exponentials
                // over the same sum.
                if (pr)
                  for (int64_t j = 0; j < Nk; ++j) pr[j] /= sum;
              }
            });
}

template <class T>
void attention_probabilities(const AttentionProblem& p, const T* q, const T* k,
                             T* probs, const NormArgs<T>& w) {
  SideOperand<T> qo, ko;
  side_operand(p, 0, q, w, &qo);
  side_operand(p, 1, k, w, &ko);
  attention_probabilities(p, qo.view(), ko.view(), probs);
}

template <class T>
void attention_probabilities(const AttentionProblem& p,
                             const OperandView<T>& qo, const OperandView<T>& ko,
                             T* probs) {
  const int64_t Nq = p.q_len, Nk = p.kv_len;
  std::vector<T> s(Nk);
  each_head(
      p, qo, ko,
      [&](int64_t b, int64_t bh, int64_t, const T* qt, const T* kt, T scale) {
        for (int64_t i = 0; i < Nq; ++i) {
          T* pr = probs + (bh * Nq + i) * Nk;
          for (int64_t j = 0; j < Nk; ++j) pr[j] = 0;
          if (logits_row(p, qt, kt, scale, b, i, s.data()) == 0) continue;
          T sum = 0;
          softmax_row(p, b, bh % p.heads, i, s.data(), pr, &sum);
          for (int64_t j = 0; j < Nk; ++j) pr[j] /= sum;
        }
      });
}

template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds, const NormArgs<T>& w,
                        const NormGrads<T>& dw) {
  SideOperand<T> qo, ko;
  side_operand(p, 0, q, w, &qo);
  side_operand(p, 1, k, w, &ko);
  attention_backward(p, q, k, qo.view(), ko.view(), v, o, d_o, lse, dq, dk, dv,
                     dg, ds, w, dw, static_cast<const T*>(nullptr));
}

template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const OperandView<T>& qo, const OperandView<T>& ko,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds, const NormArgs<T>& w,
                        const NormGrads<T>& dw, const T* logits) {
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len,
                Hk = kv_heads_of(p), group = p.heads / Hk;
  const bool learned =
      p.variant == Variant::kQKNorm && !p.fixed_scale && dg != nullptr;
  const T scale = logit_scale<T>(p);
  const auto q_size = static_cast<size_t>(p.batch * p.heads * Nq * D),
             k_size = static_cast<size_t>(p.batch * Hk * Nk * D);
  // Gradients of q_tilde and k_tilde (k summed over each kv head's group),
  // for the outputs asked for.
  std::vector<T> dqt(dq ? q_size : 0, 0), dkt(dk ? k_size : 0, 0), s(Nk);
  if (dv)
    for (size_t x = 0; x < k_size; ++x) dv[x] = 0;
  T dg_sum = 0;
  if (dw.sinks)
    for (int64_t h = 0; h < p.heads; ++h) dw.sinks[h] = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hd = 0; hd < p.heads; ++hd) {
      const int64_t bh = b * p.heads + hd, bk = b * Hk + hd / group;
      const T* qt = qo.xt + bh * Nq * D;
      const T* kt = ko.xt + bk * Nk * D;
      const T* vb = v + bk * Nk * D;
      const T* ob = o + bh * Nq * D;
      const T* dob = d_o + bh * Nq * D;
      T* dvb = dv ? dv + bk * Nk * D : nullptr;
      T* dkb = dk ? dkt.data() + bk * Nk * D : nullptr;
      for (int64_t i = 0; i < Nq; ++i) {
        const T* doi = dob + i * D;
        T* ds_row = ds ? ds + (bh * Nq + i) * Nk : nullptr;
        if (ds_row)
          for (int64_t j = 0; j < Nk; ++j) ds_row[j] = 0;
        T* dqi = dq ? dqt.data() + (bh * Nq + i) * D : nullptr;
        const T* si = s.data();
        if (logits != nullptr) {  // given: skip the row if nothing is visible
          si = logits + (bh * Nq + i) * Nk;
          bool any = false;
          for (int64_t j = 0; j < Nk && !any; ++j)
            any = visible(p.mask, b, i, j, Nq, Nk);
          if (!any) continue;
        } else if (logits_row(p, qt, kt, scale, b, i, s.data()) == 0) {
          continue;
        }
        const T li = lse[bh * Nq + i];
        const T delta = dot(doi, ob + i * D, D);
        // The sink's share exp(sink - lse) of the row (attention.h).
        if (dw.sinks && has_sinks(p))
          dw.sinks[hd] -= std::exp(static_cast<T>(p.sinks[hd]) - li) * delta;
        const T* qti = qt + i * D;
        for (int64_t j = 0; j < Nk; ++j) {
          if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
          const T pij = std::exp(si[j] - li);
          if (dvb)
            for (int64_t d = 0; d < D; ++d) dvb[j * D + d] += pij * doi[d];
          const T dp = dot(doi, vb + j * D, D);
          // dS' = P (dP - delta) of the capped logit, through the cap.
          const T dsij = pij * (dp - delta) * softcap_slope(p, si[j]);
          if (ds_row) ds_row[j] = dsij;
          const T* ktj = kt + j * D;
          if (learned) dg_sum += dsij * dot(qti, ktj, D);
          if (dqi)
            for (int64_t d = 0; d < D; ++d) dqi[d] += scale * dsij * ktj[d];
          if (dkb)
            for (int64_t d = 0; d < D; ++d)
              dkb[j * D + d] += scale * dsij * qti[d];
        }
      }
    }
  const int64_t nq = param_size(p, 0), nk = param_size(p, 1);
  for (T* g : {dw.q_weight, dw.q_bias})
    if (g)
      for (int64_t x = 0; x < nq; ++x) g[x] = 0;
  for (T* g : {dw.k_weight, dw.k_bias})
    if (g)
      for (int64_t x = 0; x < nk; ++x) g[x] = 0;
  if (dq)
    side_operand_backward(p, 0, q, w, qo, dqt.data(), dq, dw.q_weight,
                          dw.q_bias);
  if (dk)
    side_operand_backward(p, 1, k, w, ko, dkt.data(), dk,
                          p.norm.shared_qk_weight ? dw.q_weight : dw.k_weight,
                          dw.k_bias);
  if (dg) *dg = dg_sum;
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

#define QKNORM_REFERENCE_INSTANTIATE(T)                                        \
  template T nrm2<T>(const T*, int64_t);                                       \
  template RopeTable<T> rope_table<T>(const AttentionProblem&, int, Precision, \
                                      bool);                                   \
  template void rope_rotate<T>(const AttentionProblem&, int,                   \
                               const RopeTable<T>&, T*, bool);                 \
  template void attention_forward<T>(const AttentionProblem&, const T*,        \
                                     const T*, const T*, T*, T*,               \
                                     const NormArgs<T>&);                      \
  template void attention_backward<T>(                                         \
      const AttentionProblem&, const T*, const T*, const T*, const T*,         \
      const T*, const T*, T*, T*, T*, T*, T*, const NormArgs<T>&,              \
      const NormGrads<T>&);                                                    \
  template void attention_probabilities<T>(const AttentionProblem&, const T*,  \
                                           const T*, T*, const NormArgs<T>&);  \
  template void normalized_operand<T>(const AttentionProblem&, int, const T*,  \
                                      const NormArgs<T>&, T*);                 \
  template void prepare_operand<T>(const AttentionProblem&, int, const T*,     \
                                   const NormArgs<T>&, T*, T*, T*,             \
                                   RowStats<T>*);                              \
  template void attention_forward<T>(                                          \
      const AttentionProblem&, const OperandView<T>&, const OperandView<T>&,   \
      const T*, T*, T*, T*, T*);                                               \
  template void attention_backward<T>(                                         \
      const AttentionProblem&, const T*, const T*, const OperandView<T>&,      \
      const OperandView<T>&, const T*, const T*, const T*, const T*, T*, T*,   \
      T*, T*, T*, const NormArgs<T>&, const NormGrads<T>&, const T*);          \
  template void attention_probabilities<T>(const AttentionProblem&,            \
                                           const OperandView<T>&,              \
                                           const OperandView<T>&, T*);         \
  template void scalenorm_forward<T>(const ScaleNormProblem&, const T*, T*);   \
  template void scalenorm_backward<T>(const ScaleNormProblem&, const T*,       \
                                      const T*, T*, T*);
QKNORM_REFERENCE_INSTANTIATE(float)
QKNORM_REFERENCE_INSTANTIATE(double)
QKNORM_REFERENCE_INSTANTIATE(long double)

}  // namespace qknorm::reference
