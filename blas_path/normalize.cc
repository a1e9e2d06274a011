// See normalize.h. Compiled with -ffp-contract=off.
#include "blas_path/normalize.h"

#include <cmath>
#include <type_traits>

#include "blas_path/clones.h"

namespace qknorm::blas {
namespace {

constexpr int kAcc = 8;  // interleaved accumulators
// Below this denominator 1 / den could overflow: divide instead.
constexpr double kMinReciprocalDen = 0x1p-1000;

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

QKNORM_BLAS_INLINE double norm_impl(const float* x, int64_t n) {
  return std::sqrt(sumsq_impl(x, n, 1.0, 1.0));
}

QKNORM_BLAS_INLINE double norm_impl(const double* x, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  if (amax == 0) return 0;
  int e = 0;
  std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1)
  // 2^-e split in two factors, each representable for every e in
  // [-1073, 1024]; the products are exact unless they fall below DBL_MIN,
  // i.e. for elements < 2^-1022 * amax, whose squares do not matter.
  const double s1 = std::ldexp(1.0, -e / 2);
  const double s2 = std::ldexp(1.0, -e - (-e / 2));
  return std::ldexp(std::sqrt(sumsq_impl(x, n, s1, s2)), e);
}

template <class T>
QKNORM_BLAS_INLINE double normalize_impl(const T* x, int64_t n, double eps,
                                         double scale, T* u) {
  const double nrm = norm_impl(x, n);
  const double den = nrm > eps ? nrm : eps;
  if (std::is_same_v<T, float> && den >= kMinReciprocalDen) {
    // f32 storage: x * (scale / den) in double is within 2^-52 relative of
    // the exact quotient, so rounding it to f32 gives the correctly rounded
    // f32 quotient except in double-rounding ties (and +-1 exactly for a row
    // of one element); a multiply instead of a division per element keeps
    // the normalization off the profile at n = 128 (callgrind: the division
    // loop was the largest non-GEMM cost).
    const double f = scale / den;
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) * f);
  } else if (scale == 1) {
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) / den);
  } else {
    for (int64_t i = 0; i < n; ++i)
      u[i] = static_cast<T>(static_cast<double>(x[i]) / den * scale);
  }
  return nrm;
}

template <class T>
QKNORM_BLAS_INLINE void normalize_backward_impl(const T* u, double nrm,
                                                double eps, double scale,
                                                const T* du, int64_t n, T* dx) {
  if (nrm > eps) {
    const double c = dot_impl(u, du, n);
    const double f = scale / nrm;
    for (int64_t i = 0; i < n; ++i)
      dx[i] = static_cast<T>(
          (static_cast<double>(du[i]) - static_cast<double>(u[i]) * c) * f);
  } else {
    for (int64_t i = 0; i < n; ++i)
      dx[i] = static_cast<T>(static_cast<double>(du[i]) / eps * scale);
  }
}

template <class T>
QKNORM_BLAS_INLINE void normalize_rows_impl(const T* x, int64_t rows,
                                            int64_t stride, int64_t n,
                                            double eps, T* u, double* norms) {
  for (int64_t r = 0; r < rows; ++r)
    norms[r] = normalize_impl(x + r * stride, n, eps, 1.0, u + r * n);
}

}  // namespace

QKNORM_BLAS_CLONES void normalize_rows(const float* x, int64_t rows,
                                       int64_t stride, int64_t n, double eps,
                                       float* u, double* norms) {
  normalize_rows_impl(x, rows, stride, n, eps, u, norms);
}
QKNORM_BLAS_CLONES void normalize_rows(const double* x, int64_t rows,
                                       int64_t stride, int64_t n, double eps,
                                       double* u, double* norms) {
  normalize_rows_impl(x, rows, stride, n, eps, u, norms);
}

QKNORM_BLAS_CLONES double row_norm(const float* x, int64_t n) {
  return norm_impl(x, n);
}
QKNORM_BLAS_CLONES double row_norm(const double* x, int64_t n) {
  return norm_impl(x, n);
}
QKNORM_BLAS_CLONES double normalize_row(const float* x, int64_t n, double eps,
                                        double scale, float* u) {
  return normalize_impl(x, n, eps, scale, u);
}
QKNORM_BLAS_CLONES double normalize_row(const double* x, int64_t n, double eps,
                                        double scale, double* u) {
  return normalize_impl(x, n, eps, scale, u);
}
QKNORM_BLAS_CLONES void normalize_backward_row(const float* u, double nrm,
                                               double eps, double scale,
                                               const float* du, int64_t n,
                                               float* dx) {
  normalize_backward_impl(u, nrm, eps, scale, du, n, dx);
}
QKNORM_BLAS_CLONES void normalize_backward_row(const double* u, double nrm,
                                               double eps, double scale,
                                               const double* du, int64_t n,
                                               double* dx) {
  normalize_backward_impl(u, nrm, eps, scale, du, n, dx);
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
