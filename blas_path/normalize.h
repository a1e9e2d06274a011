// Row normalization of the BLAS path (QKNorm's q_hat, k_hat and ScaleNorm),
// forward and backward, one contiguous row at a time.
//
// Arithmetic: every row is processed in double, whatever the storage type,
// and rounded to storage once at the end. The cost is O(rows * D) against the
// O(n^2 D) of the GEMMs, and it makes the norm robust without a scaling pass
// for f32 input:
// - f32 rows: sum of squares of the exact double images. No overflow (FLT_MAX^2
//   * D < 2^257 << DBL_MAX) and no underflow (the smallest f32 subnormal
//   squared is 2^-298 > DBL_MIN) for any finite input, so no scaling is needed.
// - f64 rows: the squares could over/underflow, so the row is first scaled by
//   2^-e, e = exponent of max|x| (two exact power-of-two multiplies, so that
//   2^-e itself never needs to be representable), as nrm2 with max-abs scaling.
// The norm is returned as m * 2^e (RowNorm), never rounded to one double: an
// f64 row's norm can exceed DBL_MAX (up to sqrt(n) DBL_MAX for rows at the
// largest finite value) or be subnormal (rows of subnormals with a subnormal
// eps), and as one double it would be inf or lose bits (found by the fuzzer:
// rows near DBL_MAX gave u = x / inf = 0; fuzz/corpus/*/crash-blas-f64-*).
// Sums use 8 interleaved accumulators added in index order at the end: the
// loops vectorize and the order is fixed by the source (built with
// -ffp-contract=off, so every clone rounds identically).
// u = x / max(||x||, eps): for f64 a true division (then times scale if
// scale != 1), so a row of one element gives u = +-1 exactly (and dx = 0
// exactly, as the oracle has it). For f32 storage x * (scale / den) in
// double, rounded to f32: the same f32 result up to double-rounding ties,
// still +-1 exactly for one element, and a multiply per element instead of
// a division (measured: the division loop was the largest non-GEMM cost at
// n = 128). Zero rows (||x|| <= eps): u = x / eps, backward dx = du / eps, as
// include/qknorm/attention.h specifies.
// Extreme rows: when den = max(||x||, eps) is not a normal double (norm
// beyond DBL_MAX, or subnormal), the forward divides 2^-e x (exact scaling)
// by den's mantissa; when scale / den is not a normal double (a subnormal g
// over a row norm of 32, or a huge g over a tiny norm), the backward
// multiplies by the mantissa ratio and applies the power of two per element
// (found by the fuzzer: g = 1.05e-321, ||x|| = 32 gave a subnormal factor,
// dx 4% off). Both are per-row decisions; ordinary rows keep the fast loops.
#ifndef QKNORM_BLAS_PATH_NORMALIZE_H_
#define QKNORM_BLAS_PATH_NORMALIZE_H_

#include <cmath>
#include <cstdint>

#include "qknorm/attention.h"

namespace qknorm::blas {

// ||x||_2 = mant * 2^exp with mant in [0.5, 1), or mant = 0 for a zero row.
struct RowNorm {
  double mant = 0;
  int exp = 0;
  // The norm as one double (inf beyond DBL_MAX, rounded when subnormal).
  double value() const { return std::ldexp(mant, exp); }
  // ||x|| > eps, decided exactly (eps > 0 finite).
  bool above(double eps) const;
};

// ||x||_2 of x[0..n), computed as described above.
RowNorm row_norm(const float* x, int64_t n);
RowNorm row_norm(const double* x, int64_t n);

// u = scale * x / max(||x||, eps), rounded to T; returns ||x||.
RowNorm normalize_row(const float* x, int64_t n, double eps, double scale,
                      float* u);
RowNorm normalize_row(const double* x, int64_t n, double eps, double scale,
                      double* u);

// normalize_row(x + r * stride, n, eps, 1, u + r * n) for r < rows, norms[r]
// = ||x_r||: one call per head, so that consecutive rows' sqrt/divide
// latency chains overlap (measured: per-row calls cost ~10% of the forward
// at n = 128).
void normalize_rows(const float* x, int64_t rows, int64_t stride, int64_t n,
                    double eps, float* u, RowNorm* norms);
void normalize_rows(const double* x, int64_t rows, int64_t stride, int64_t n,
                    double eps, double* u, RowNorm* norms);

// Unit-normalization backward: given u = x / max(nrm, eps) and du,
//   dx = (du - u (u . du)) / nrm   if nrm > eps,   dx = du / eps otherwise,
// times `scale`, rounded to T. dx may alias du.
void normalize_backward_row(const float* u, RowNorm nrm, double eps,
                            double scale, const float* du, int64_t n,
                            float* dx);
void normalize_backward_row(const double* u, RowNorm nrm, double eps,
                            double scale, const double* du, int64_t n,
                            double* dx);

// The formulations of issue 16 (attention.h), one normalization row of n
// values given as their exact double images, computed in double:
//   l2:    x_hat = x / max(||x||, eps) (normalize_row's arithmetic),
//   rms:   x_hat = x / sqrt(mean(x^2) + eps),
//   layer: x_hat = (x - mean(x)) / sqrt(var(x) + eps) (biased variance),
//   none:  x_hat = x.
// rms and layer never form a square or a sum that overflows or underflows
// harmfully: the row is scaled by 2^-e (e the exponent of max|x|, exact),
// centred (layer), and divided by a = max|y| (y the centred scaled row), so
// that m = mean((y / a)^2) lies in [1/n, 1]; with A = a 2^e (the true
// max|x - mu|, kept as a and e since it may exceed DBL_MAX) the divisor is
//   A >= sqrt(eps): A * sqrt(m + (sqrt(eps) / A)^2)
//   A <  sqrt(eps): sqrt(eps) * sqrt(1 + m (A / sqrt(eps))^2)
// and x_hat = (y / a) * A / divisor. A zero row (rms) or constant row
// (layer) gives x_hat = 0 with the divisor sqrt(eps) (its derivative).
struct FormRow {
  RowNorm nrm;       // l2: ||x||
  double dmant = 1;  // rms, layer: the divisor is dmant * 2^dexp
  int dexp = 0;
};
// x_hat of x[0..n) into xh (may not alias x).
FormRow formulation_row(NormKind kind, const double* x, int64_t n, double eps,
                        double* xh);
// Backward of formulation_row: du (the gradient of x_hat) -> dx, in place;
// xh and st as the forward returned them.
void formulation_row_backward(NormKind kind, const double* xh, FormRow st,
                              double eps, int64_t n, double* du);

// RoPE (issue 34, attention.h Rope) of one head's D values x (in place, in
// double): pair e of the rotation's first rotary_dim dims turned by the
// angle whose cosine and sine are cs[2e], cs[2e + 1] (one position's row of
// the table), or by its negative (the transpose) when `inverse`:
//   y_a = x_a c -+ x_b s,   y_b = x_b c +- x_a s.
void rope_rotate_row(const Rope& r, const double* cs, bool inverse, double* x);

// sum_i a_i b_i in double (8 accumulators, fixed order).
double dot_double(const float* a, const float* b, int64_t n);
double dot_double(const double* a, const double* b, int64_t n);

}  // namespace qknorm::blas

#endif  // QKNORM_BLAS_PATH_NORMALIZE_H_
