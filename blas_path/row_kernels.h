// Row kernels of the BLAS path: everything between the GEMMs (softmax, its
// backward, row scaling). Each is a plain loop over one contiguous row, written
// with GCC/Clang vector extensions so that the summation order is fixed by the
// source (16 float / 8 double lanes, lanes added in index order at the end)
// and does not depend on the compiler's vectorizer or on the thread count.
// Each kernel is compiled three times (target_clones: x86-64-v4 = AVX-512,
// x86-64-v3 = AVX2+FMA, and the baseline); the loader picks one per process.
// The v4 and v3 clones compute the same bits (same lanes, same FMAs); the
// baseline clone has no FMA and differs in the last bits.
//
// exp2 (f32): x is clamped to [-127, 127], split x = n + r with n = rint(x)
// (exact: the 1.5*2^23 trick, no libm call), |r| <= 1/2, and 2^r is the
// degree-7 Taylor polynomial of e^(r ln 2). Truncation error <= (ln2/2)^8/8!
// * sqrt(2) / (1/sqrt(2)) < 1.1e-8 relative (0.2 u); Horner in f32 adds
// about 1 u. Measured max error over [-126, 0]: see tests/row_kernels_test.cc
// (kExp2MaxUlp). 2^n is built from its bits (exact); n = -127 gives the bit
// pattern 0, so inputs below -126.5 return 0 (subnormals are flushed): the
// absolute error there is < 2^-126, far below every tolerance of the suite.
// exp2 (f64): std::exp2 (glibc, < 1 ulp) lane by lane; f64 is the accuracy
// entry, not the performance one.
#ifndef QKNORM_BLAS_PATH_ROW_KERNELS_H_
#define QKNORM_BLAS_PATH_ROW_KERNELS_H_

#include <cstdint>

namespace qknorm::blas {

// 2^x for one value with exactly the arithmetic the vector kernels use on
// each lane (for tests and scalar tails).
float exp2_f32(float x);
double exp2_f64(double x);

// max of s[0..m), m >= 1.
float row_max(const float* s, int64_t m);
double row_max(const double* s, int64_t m);

// min of s[0..m), m >= 1.
float row_min(const float* s, int64_t m);
double row_min(const double* s, int64_t m);

// Forward softmax numerator, in place: s[j] = exp2(s[j] * alpha - shift)
// (one FMA where the clone has it) for j < m, s[j] = 0 for m <= j < ncols.
// Returns sum_{j<m} s[j] (after the update). Requires 1 <= m <= ncols.
float exp2_affine_row(float* s, int64_t m, int64_t ncols, float alpha,
                      float shift);
double exp2_affine_row(double* s, int64_t m, int64_t ncols, double alpha,
                       double shift);

// Backward softmax of one query row, fused:
//   e_j  = exp2((c_j * alpha2 - lse2_hi) - lse2_lo),  sigma = sum_{j<m} e_j
//   p_j  = e_j * (1 / sigma)
//   ds_j = p_j * (dp_j - delta)
// for j < m; p_j = ds_j = 0 for m <= j < ncols. lse2 = lse * log2(e) is
// passed as an unevaluated sum hi + lo, so that converting the natural-log
// lse to log2 units costs no rounding. The stored lse only SHIFTS the
// exponent: P is renormalized by its recomputed row sum (sigma = 1 up to the
// lse's own rounding), so P is the softmax of the recomputed logits. Without
// that, the f32 lse's rounding, up to half an ulp of |g| + log m (8 u at
// g = 12), would enter every P_ij as a relative error and dominate dV. The
// row is read twice (sum, then P and dS); the second pass hits L1.
// m = 1 gives p = 1 and ds = 0 exactly (the softmax of one logit is
// constant), as the oracle does.
// c is overwritten with p, dp with ds. Returns sum_{j<m} ds_j * c_j (this
// row's share of dg). m may be 0.
float softmax_backward_row(float* c, float* dp, int64_t m, int64_t ncols,
                           float alpha2, float lse2_hi, float lse2_lo,
                           float delta);
double softmax_backward_row(double* c, double* dp, int64_t m, int64_t ncols,
                            double alpha2, double lse2_hi, double lse2_lo,
                            double delta);

// x[0..n) /= a (one correctly rounded division per element, as O = acc / sum
// in the naive loops; the row is D wide, so the divisions cost nothing).
void divide_row(float* x, int64_t n, float a);
void divide_row(double* x, int64_t n, double a);

}  // namespace qknorm::blas

#endif  // QKNORM_BLAS_PATH_ROW_KERNELS_H_
