// See normalize.h. Compiled with -ffp-contract=off.
#include "blas_path/normalize.h"

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "blas_path/clones.h"

namespace qknorm::blas {

bool RowNorm::above(double eps) const {
  if (mant == 0) return false;
  int ee = 0;
  const double em = std::frexp(eps, &ee);
  return exp > ee || (exp == ee && mant > em);
}

namespace {

constexpr int kAcc = 8;  // interleaved accumulators

QKNORM_BLAS_INLINE double sum_lanes(const double* acc) {
  double s = acc[0];
  for (int l = 1; l < kAcc; ++l) s += acc[l];
  return s;
}

template <class T>
QKNORM_BLAS_INLINE double dot_impl(const T* a, const T* b, int64_t n) {
  double acc[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int l = 0; l < kAcc; ++l)
      acc[l] += static_cast<double>(a[i + l]) * static_cast<double>(b[i + l]);
  for (int l = 0; i < n; ++i, ++l)
    acc[l] += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return sum_lanes(acc);
}

// max |x_i| in kAcc lanes (a ? : max vectorizes; the result is exact, in
// any order).
template <class T>
QKNORM_BLAS_INLINE double amax_impl(const T* x, int64_t n) {
  double acc[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int l = 0; l < kAcc; ++l) {
      const double a = std::fabs(static_cast<double>(x[i + l]));
      acc[l] = a > acc[l] ? a : acc[l];
    }
  for (int l = 0; i < n; ++i, ++l) {
    const double a = std::fabs(static_cast<double>(x[i]));
    acc[l] = a > acc[l] ? a : acc[l];
  }
  double m = acc[0];
  for (int l = 1; l < kAcc; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// Sum of (x_i * s1 * s2)^2.
template <class T>
QKNORM_BLAS_INLINE double sumsq_impl(const T* x, int64_t n, double s1,
                                     double s2) {
  double acc[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int l = 0; l < kAcc; ++l) {
      const double t = (static_cast<double>(x[i + l]) * s1) * s2;
      acc[l] += t * t;
    }
  for (int l = 0; i < n; ++i, ++l) {
    const double t = (static_cast<double>(x[i]) * s1) * s2;
    acc[l] += t * t;
  }
  return sum_lanes(acc);
}

// m * 2^e from a positive double s and an extra exponent e.
QKNORM_BLAS_INLINE RowNorm split(double s, int e) {
  if (s == 0) return {};
  int k = 0;
  const double m = std::frexp(s, &k);
  return {m, e + k};
}

QKNORM_BLAS_INLINE RowNorm norm_impl(const float* x, int64_t n) {
  return split(std::sqrt(sumsq_impl(x, n, 1.0, 1.0)), 0);
}

// 2^-e as two factors, each representable for every e in [-1074, 1025]; a
// product x * s1 * s2 is exact unless it falls below DBL_MIN.
struct InvPow2 {
  double s1, s2;
  explicit InvPow2(int e)
      : s1(std::ldexp(1.0, -e / 2)), s2(std::ldexp(1.0, -e - (-e / 2))) {}
};

QKNORM_BLAS_INLINE RowNorm norm_impl(const double* x, int64_t n) {
  const double amax = amax_impl(x, n);
  if (amax == 0) return {};
  int e = 0;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1)
  // Elements < 2^-1022 * amax lose bits in the scaling; their squares do
  // not matter.
  const InvPow2 s(e);
  return split(std::sqrt(sumsq_impl(x, n, s.s1, s.s2)), e);
}

// A double with exponent e (mantissa in [0.5, 1)) is normal and finite.
constexpr bool normal_exp(int e) { return e >= -1021 && e <= 1024; }

// A factor f = scale / den that is exact up to one rounding: normal and
// finite (or 0 because scale is 0).
QKNORM_BLAS_INLINE bool normal_factor(double f, double scale) {
  const double af = std::fabs(f);
  return scale == 0 || (af >= DBL_MIN && af <= DBL_MAX);
}

// den = max(||x||, eps) as m * 2^e.
QKNORM_BLAS_INLINE RowNorm clamp_den(RowNorm nrm, double eps) {
  return nrm.above(eps) ? nrm : split(eps, 0);
}

template <class T>
QKNORM_BLAS_INLINE RowNorm normalize_impl(const T* x, int64_t n, double eps,
                                          double scale, T* u) {
  const RowNorm nrm = norm_impl(x, n);
  const RowNorm den = clamp_den(nrm, eps);
  if (!normal_exp(den.exp)) {
    // den beyond DBL_MAX or subnormal: (2^-e x) / m, exact scaling (|x_i|
    // <= den, so 2^-e x_i <= 1 never overflows), then the division.
    const InvPow2 s(den.exp);
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>((static_cast<double>(x[i]) * s.s1) * s.s2 /
                            den.mant * scale);
    return nrm;
  }
  const double d = den.value();
  const double f = scale / d;
  if (std::is_same_v<T, float> && normal_factor(f, scale)) {
    // f32 storage: x * (scale / den) in double is within 2^-52 relative of
    // the exact quotient, so rounding it to f32 gives the correctly rounded
    // f32 quotient except in double-rounding ties (and +-1 exactly for a row
    // of one element); a multiply instead of a division per element keeps
    // the normalization off the profile at n = 128 (callgrind: the division
    // loop was the largest non-GEMM cost). A factor that overflows or is
    // subnormal (a subnormal eps, an extreme g) takes the divisions below.
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) * f);
  } else if (scale == 1) {
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) / d);
  } else {
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) / d * scale);
  }
  return nrm;
}

// dx_i = t_i * scale / den for t_i = get(i), rounded to T.
template <class T, class F>
QKNORM_BLAS_INLINE void scale_by_quotient(double scale, RowNorm den, int64_t n,
                                          T* dx, F get) {
  // scale / den = (sm / dm) * 2^(se - de): the mantissa ratio is in
  // (0.5, 2), rounded once.
  int se = 0;
  const double sm = std::frexp(scale, &se);
  const double ratio = sm / den.mant;
  const int e = se - den.exp;
  const double f = std::ldexp(ratio, e);
  if (normal_factor(f, scale)) {
    for (int64_t i = 0; i < n; ++i) dx[i] = static_cast<T>(get(i) * f);
    return;
  }
  // The factor itself is subnormal or overflows: apply the power of two
  // after the product (t_i halved first so that t_i * ratio cannot overflow
  // where the result does not).
  for (int64_t i = 0; i < n; ++i)
    dx[i] = static_cast<T>(std::ldexp((get(i) * 0.5) * ratio, e + 1));
}

template <class T>
QKNORM_BLAS_INLINE void normalize_backward_impl(const T* u, RowNorm nrm,
                                                double eps, double scale,
                                                const T* du, int64_t n, T* dx) {
  if (nrm.above(eps)) {
    const double c = dot_impl(u, du, n);
    scale_by_quotient(scale, nrm, n, dx, [&](int64_t i) {
      return static_cast<double>(du[i]) - static_cast<double>(u[i]) * c;
    });
  } else {
    scale_by_quotient(scale, split(eps, 0), n, dx,
                      [&](int64_t i) { return static_cast<double>(du[i]); });
  }
}

template <class T>
QKNORM_BLAS_INLINE void normalize_rows_impl(const T* x, int64_t rows,
                                            int64_t stride, int64_t n,
                                            double eps, T* u, RowNorm* norms) {
  for (int64_t r = 0; r < rows; ++r)
    norms[r] = normalize_impl(x + r * stride, n, eps, 1.0, u + r * n);
}

// mean(x) of a scaled row (|x_i| < 1: the sum cannot overflow).
QKNORM_BLAS_INLINE double mean_impl(const double* x, int64_t n) {
  double acc[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int l = 0; l < kAcc; ++l) acc[l] += x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += x[i];
  return sum_lanes(acc) / static_cast<double>(n);
}

// a * 2^ea >= b * 2^eb for positive normal a, b (exponents compared first).
QKNORM_BLAS_INLINE bool scaled_ge(double a, int ea, double b, int eb) {
  int ka = 0, kb = 0;
  const double fa = std::frexp(a, &ka), fb = std::frexp(b, &kb);
  return ka + ea != kb + eb ? ka + ea > kb + eb : fa >= fb;
}

// rms / layer of formulation_row (normalize.h). xh receives the scaled,
// centred row y first, then x_hat.
QKNORM_BLAS_INLINE FormRow rms_layer_impl(bool layer, const double* x,
                                          int64_t n, double eps, double* xh) {
  FormRow st;
  const double se = std::sqrt(eps);
  const double xmax = amax_impl(x, n);
  st.dmant = se;  // a zero (rms) or constant (layer) row: x_hat = 0
  if (xmax == 0) {
    for (int64_t i = 0; i < n; ++i) xh[i] = 0;
    return st;
  }
  int e = 0;
  std::frexp(xmax, &e);
  const InvPow2 s(e);
  for (int64_t i = 0; i < n; ++i) xh[i] = (x[i] * s.s1) * s.s2;
  double a = (xmax * s.s1) * s.s2;  // max |y| (exact, in [0.5, 1))
  if (layer) {
    const double mu = mean_impl(xh, n);
    for (int64_t i = 0; i < n; ++i) xh[i] -= mu;
    a = amax_impl(xh, n);
    if (a == 0) {
      for (int64_t i = 0; i < n; ++i) xh[i] = 0;
      return st;
    }
  }
  // m = mean((y / a)^2) in [1/n, 1] (1 / a rounded: a relative 2^-53 on m).
  const double m = sumsq_impl(xh, n, 1 / a, 1.0) / static_cast<double>(n);
  int ka = 0, ks = 0;
  const double fa = std::frexp(a, &ka), fs = std::frexp(se, &ks);
  if (scaled_ge(a, e, se, 0)) {
    // r = sqrt(eps) / A <= 1 (may underflow: then it does not matter);
    // x_hat = y / (a d2).
    const double r = std::ldexp(fs / fa, ks - ka - e);
    const double d2 = std::sqrt(m + r * r);
    const double div = a * d2;
    for (int64_t i = 0; i < n; ++i) xh[i] /= div;
    st.dmant = div;
    st.dexp = e;
    return st;
  }
  // r = A / sqrt(eps) < 1; x_hat = y r / (a d2), the power of two applied
  // per element when r is not normal (a row far below sqrt(eps)).
  const double rm = fa / fs;
  const int re = ka + e - ks;
  const double r = std::ldexp(rm, re);
  const double d2 = std::sqrt(1 + m * r * r);
  if (r >= DBL_MIN) {
    const double f = r / (a * d2);
    for (int64_t i = 0; i < n; ++i) xh[i] *= f;
  } else {
    const double f = rm / (a * d2);
    for (int64_t i = 0; i < n; ++i) xh[i] = std::ldexp(xh[i] * f, re);
  }
  st.dmant = se * d2;
  return st;
}

QKNORM_BLAS_INLINE FormRow formulation_impl(NormKind kind, const double* x,
                                            int64_t n, double eps, double* xh) {
  switch (kind) {
    case NormKind::kL2: {
      FormRow st;
      st.nrm = normalize_impl(x, n, eps, 1.0, xh);
      return st;
    }
    case NormKind::kRms:
      return rms_layer_impl(false, x, n, eps, xh);
    case NormKind::kLayer:
      return rms_layer_impl(true, x, n, eps, xh);
    case NormKind::kNone:
      break;
  }
  for (int64_t i = 0; i < n; ++i) xh[i] = x[i];
  return {};
}

QKNORM_BLAS_INLINE void formulation_backward_impl(NormKind kind,
                                                  const double* xh, FormRow st,
                                                  double eps, int64_t n,
                                                  double* du) {
  const double inv_n = 1 / static_cast<double>(n);
  switch (kind) {
    case NormKind::kL2:
      normalize_backward_impl(xh, st.nrm, eps, 1.0, du, n, du);
      return;
    case NormKind::kRms: {
      // dx = (du - x_hat (x_hat . du) / n) / divisor
      const double c = dot_impl(xh, du, n) * inv_n;
      scale_by_quotient(1.0, split(st.dmant, st.dexp), n, du,
                        [&](int64_t i) { return du[i] - xh[i] * c; });
      return;
    }
    case NormKind::kLayer: {
      // dx = (du - mean(du) - x_hat mean(x_hat du)) / divisor
      double acc[kAcc] = {};
      int64_t i = 0;
      for (; i + kAcc <= n; i += kAcc)
        for (int l = 0; l < kAcc; ++l) acc[l] += du[i + l];
      for (int l = 0; i < n; ++i, ++l) acc[l] += du[i];
      const double mdu = sum_lanes(acc) * inv_n;
      const double c = dot_impl(xh, du, n) * inv_n;
      scale_by_quotient(1.0, split(st.dmant, st.dexp), n, du,
                        [&](int64_t j) { return du[j] - mdu - xh[j] * c; });
      return;
    }
    case NormKind::kNone:
      return;
  }
}

}  // namespace

QKNORM_BLAS_CLONES void normalize_rows(const float* x, int64_t rows,
                                       int64_t stride, int64_t n, double eps,
                                       float* u, RowNorm* norms) {
  normalize_rows_impl(x, rows, stride, n, eps, u, norms);
}
QKNORM_BLAS_CLONES void normalize_rows(const double* x, int64_t rows,
                                       int64_t stride, int64_t n, double eps,
                                       double* u, RowNorm* norms) {
  normalize_rows_impl(x, rows, stride, n, eps, u, norms);
}

QKNORM_BLAS_CLONES RowNorm row_norm(const float* x, int64_t n) {
  return norm_impl(x, n);
}
QKNORM_BLAS_CLONES RowNorm row_norm(const double* x, int64_t n) {
  return norm_impl(x, n);
}
QKNORM_BLAS_CLONES RowNorm normalize_row(const float* x, int64_t n, double eps,
                                         double scale, float* u) {
  return normalize_impl(x, n, eps, scale, u);
}
QKNORM_BLAS_CLONES RowNorm normalize_row(const double* x, int64_t n, double eps,
                                         double scale, double* u) {
  return normalize_impl(x, n, eps, scale, u);
}
QKNORM_BLAS_CLONES void normalize_backward_row(const float* u, RowNorm nrm,
                                               double eps, double scale,
                                               const float* du, int64_t n,
                                               float* dx) {
  normalize_backward_impl(u, nrm, eps, scale, du, n, dx);
}
QKNORM_BLAS_CLONES void normalize_backward_row(const double* u, RowNorm nrm,
                                               double eps, double scale,
                                               const double* du, int64_t n,
                                               double* dx) {
  normalize_backward_impl(u, nrm, eps, scale, du, n, dx);
}
QKNORM_BLAS_CLONES FormRow formulation_row(NormKind kind, const double* x,
                                           int64_t n, double eps, double* xh) {
  return formulation_impl(kind, x, n, eps, xh);
}
QKNORM_BLAS_CLONES void formulation_row_backward(NormKind kind,
                                                 const double* xh, FormRow st,
                                                 double eps, int64_t n,
                                                 double* du) {
  formulation_backward_impl(kind, xh, st, eps, n, du);
}
void rope_rotate_row(const Rope& r, const double* cs, bool inverse, double* x) {
  const int64_t pairs = r.rotary_dim / 2;
  const double sign = inverse ? -1.0 : 1.0;
  for (int64_t e = 0; e < pairs; ++e) {
    const RopePair pr = rope_pair(r, e);
    const double c = cs[2 * e], s = sign * cs[2 * e + 1];
    const double xa = x[pr.a], xb = x[pr.b];
    x[pr.a] = xa * c - xb * s;
    x[pr.b] = xb * c + xa * s;
  }
}

QKNORM_BLAS_CLONES double dot_double(const float* a, const float* b,
                                     int64_t n) {
  return dot_impl(a, b, n);
}
QKNORM_BLAS_CLONES double dot_double(const double* a, const double* b,
                                     int64_t n) {
  return dot_impl(a, b, n);
}

}  // namespace qknorm::blas
