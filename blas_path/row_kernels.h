// Row kernels of the BLAS path: everything between the GEMMs (softmax, its
// backward, row scaling). Each is a plain loop over one contiguous row, written
// with GCC/Clang vector extensions so that the summation order is fixed by the
// source (lanes summed by a fixed pairwise tree at the end)
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
// Base of the exponential: 2 for float (the kernels' "exp" is exp2_f32, and
// attention.cc folds log2(e) into the logit scale), e for double (std::exp,
// glibc, < 1 ulp, lane by lane: f64 is the accuracy entry, not the
// performance one). In base e the logit's own value enters the exponential
// without a change of units: a logit 0 minus the lse is exactly -lse, as in
// the naive loops, where base 2 would round (lse * log2 e) once more.
#ifndef QKNORM_BLAS_PATH_ROW_KERNELS_H_
#define QKNORM_BLAS_PATH_ROW_KERNELS_H_

#include <cstdint>

namespace qknorm::blas {

// 2^x for one value with exactly the arithmetic the vector kernels use on
// each lane (for tests).
float exp2_f32(float x);

// max of s[0..m), m >= 1.
float row_max(const float* s, int64_t m);
double row_max(const double* s, int64_t m);

// min of s[0..m), m >= 1.
float row_min(const float* s, int64_t m);
double row_min(const double* s, int64_t m);

// In what follows exp is the type's base (2 for float, e for double).
// Forward softmax numerator, in place: s[j] = exp(s[j] * alpha - shift)
// (one FMA where the clone has it) for j < m, s[j] = 0 for m <= j < ncols.
// Returns sum_{j<m} s[j] (after the update). Requires 1 <= m <= ncols.
float exp_affine_row(float* s, int64_t m, int64_t ncols, float alpha,
                     float shift);
double exp_affine_row(double* s, int64_t m, int64_t ncols, double alpha,
                      double shift);

// Backward softmax of one query row, fused. With r the key of the row's
// largest logit alpha2 * c_r (exp in the type's base):
//   e_j = exp(c_j * alpha2 - alpha2 * c_r),  sigma = sum_{j<m} e_j,
//   p_j = e_j / sigma,  delta' = sum_{j<m} p_j (dp_j - dp_r),
//   ds_j = p_j ((dp_j - dp_r) - delta')
// for j < m; p_j = ds_j = 0 for m <= j < ncols. Mathematically ds_j =
// p_j (dp_j - delta) with delta = sum_k p_k dp_k = rowsum(dO * O); the form
// above is chosen for accuracy:
// - Shift: e_j is bit for bit the forward's numerator (same shift, same
//   FMA), so P is the softmax the forward applied. The saved lse could serve
//   as the shift (as in FlashAttention), but it is a rounded number of
//   magnitude |g| + log m, whose half ulp then enters every key far from it.
// - delta from P and dP themselves (not from the stored, rounded O), so the
//   rows of dS sum to 0 up to roundoff; O and lse are not read at all.
// - Reference dp_r: when one key dominates (p_r -> 1, as QKNorm's large g
//   and zero or tiny-norm rows produce), dp_r - delta = sum_k p_k (dp_r -
//   dp_k) is ~ (1 - p_r) |dp| while dp_r and delta are ~ |dp|: subtracting
//   them loses a factor 1 / (1 - p_r) (2e5 at g = 12.32) of relative
//   accuracy. Measured on the sweep before this change: dk of zero k rows 9%
//   off against the naive loops' 1.2%. Relative to dp_r, the dominant term
//   contributes exactly 0 to delta' and the cancellation is gone. The form is
//   used when p_r > 1/2 (sigma < 2); for a spread row, ds_j = p_j (dp_j -
//   (dp_r + delta')) saves the extra rounding of dp_j - dp_r.
// The row is read twice (sums, then P and dS); the second pass hits L1.
// m = 1 gives p = 1 and ds = 0 exactly (the softmax of one logit is
// constant), as the oracle does. c is overwritten with p, dp with
// scale * ds: the logit scale s, so that the dS GEMMs (alpha = 1) multiply
// s dS, which the exact gradients bound, by the other side's operand. With
// alpha = s instead they formed dS x_tilde' first, which may overflow when
// s is 0 or tiny, and OpenBLAS then gave 0 * inf = NaN or inf for an exact
// 0 or a finite value (fuzz finding crash-blas-f64-rms-scale0-huge-do-dk-nan,
// attention.cc). Returns sum_{j<m} ds_j * c_j (this row's share of dg,
// unscaled). m may be 0 (without a sink).
// Attention sink (attention.h), where sink_delta is not null: `sink` is the
// sink's logit in the units of alpha2 c (times log2 e for float), a key
// with dp = 0 in sigma: sigma = sum_j e_j + exp(sink - shift), the shift
// and the reference key being the sink where it exceeds alpha2 c_r (dp_r
// is then 0, and delta' = delta is formed directly: a dominant sink leaves
// delta ~ (1 - p_sink) |dp|, which dp_r + (delta - dp_r) would lose).
// *sink_delta receives p_sink delta, p_sink = exp(sink - shift) / sigma,
// delta = dp_ref + delta' (the sink's dS is -p_sink delta). m = 1 is then
// no constant softmax; m >= 1.
float softmax_backward_row(float* c, float* dp, int64_t m, int64_t ncols,
                           float alpha2, float scale, float sink = 0,
                           float* sink_delta = nullptr);
double softmax_backward_row(double* c, double* dp, int64_t m, int64_t ncols,
                            double alpha2, double scale, double sink = 0,
                            double* sink_delta = nullptr);

// x[0..n) /= a (one correctly rounded division per element, as O = acc / sum
// in the naive loops; the row is D wide, so the divisions cost nothing).
void divide_row(float* x, int64_t n, float a);
void divide_row(double* x, int64_t n, double a);

// The float kernels of each vector width, for tests: the functions above
// dispatch to w64 (AVX-512, 16 lanes) where v4_supported(), else to w32 (8
// lanes). Tests run both where the CPU allows, so a defect of the width the
// dispatcher does not pick on the test machine is still seen.
namespace detail {
bool v4_supported();
float row_max_w32(const float* s, int64_t m);
float row_min_w32(const float* s, int64_t m);
float exp_affine_row_w32(float* s, int64_t m, int64_t ncols, float alpha,
                         float shift);
float softmax_backward_row_w32(float* c, float* dp, int64_t m, int64_t ncols,
                               float alpha2, float scale, float sink = 0,
                               float* sink_delta = nullptr);
float row_max_w64(const float* s, int64_t m);
float row_min_w64(const float* s, int64_t m);
float exp_affine_row_w64(float* s, int64_t m, int64_t ncols, float alpha,
                         float shift);
float softmax_backward_row_w64(float* c, float* dp, int64_t m, int64_t ncols,
                               float alpha2, float scale, float sink = 0,
                               float* sink_delta = nullptr);
}  // namespace detail

}  // namespace qknorm::blas

#endif  // QKNORM_BLAS_PATH_ROW_KERNELS_H_
