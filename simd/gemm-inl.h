// Register-blocked f32 micro-GEMM, the one building block of every product in
// the attention kernels (S = Q K^T, O += P V, dP = dO V^T, dV += P^T dO,
// dK += dS^T Q, dQ += dS K). Per-target code.
//
//   C[i][j] (+)= sum_{k < K} A[i * a_row + k * a_col] * B[k * ldb + j]
//   for i < m, j < n.
//
// A is read one scalar at a time (broadcast), so any strided view of A works,
// in particular a transposed one (a_row = 1). B and C rows are contiguous;
// n, ldb and ldc must be multiples of Lanes(DF()). No aliasing between A, B
// and C.
//
// Each C element is one chain of fused multiply-adds in increasing k order,
// starting from the old C (accumulate) or 0. The result of an element thus
// does not depend on m, n, the blocking or the thread that computes it, which
// is what makes the kernels bitwise reproducible. (On SSSE3/SSE4 there is no
// FMA: MulAdd is a multiply then an add.)
//
// Blocking: kGemmRows = 6 rows x 2 vectors of C live in registers (AVX2:
// 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers; 12
// independent FMA chains cover the 4-cycle FMA latency on both FMA ports,
// where 4 x 2 = 8 would only just do); per k: 2 vector loads of B and 6
// broadcasts of A for 12 FMAs.

#if defined(QKNORM_SIMD_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_GEMM_INL_H_
#undef QKNORM_SIMD_GEMM_INL_H_
#else
#define QKNORM_SIMD_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr size_t kGemmRows = 6;

template <size_t MR, size_t NV>
HWY_INLINE void GemmTile(size_t K, const float* HWY_RESTRICT A, ptrdiff_t a_row,
                         ptrdiff_t a_col, const float* HWY_RESTRICT B,
                         size_t ldb, float* HWY_RESTRICT C, size_t ldc,
                         bool accumulate) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  V c[MR][NV];
  HWY_UNROLL(8)
  for (size_t r = 0; r < MR; ++r) {
    HWY_UNROLL(2)
    for (size_t v = 0; v < NV; ++v)
      c[r][v] = accumulate ? hn::LoadU(d, C + r * ldc + v * N) : hn::Zero(d);
  }
  const float* a = A;
  for (size_t k = 0; k < K; ++k) {
    V b[NV];
    HWY_UNROLL(2)
    for (size_t v = 0; v < NV; ++v) b[v] = hn::LoadU(d, B + k * ldb + v * N);
    HWY_UNROLL(8)
    for (size_t r = 0; r < MR; ++r) {
      const V ar = hn::Set(d, a[static_cast<ptrdiff_t>(r) * a_row]);
      HWY_UNROLL(2)
      for (size_t v = 0; v < NV; ++v) c[r][v] = hn::MulAdd(ar, b[v], c[r][v]);
    }
    a += a_col;
  }
  HWY_UNROLL(8)
  for (size_t r = 0; r < MR; ++r) {
    HWY_UNROLL(2)
    for (size_t v = 0; v < NV; ++v) hn::StoreU(c[r][v], d, C + r * ldc + v * N);
  }
}

template <size_t MR>
HWY_INLINE void GemmRows(size_t n, size_t K, const float* HWY_RESTRICT A,
                         ptrdiff_t a_row, ptrdiff_t a_col,
                         const float* HWY_RESTRICT B, size_t ldb,
                         float* HWY_RESTRICT C, size_t ldc, bool accumulate) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  size_t j = 0;
  for (; j + 2 * N <= n; j += 2 * N)
    GemmTile<MR, 2>(K, A, a_row, a_col, B + j, ldb, C + j, ldc, accumulate);
  if (j < n)
    GemmTile<MR, 1>(K, A, a_row, a_col, B + j, ldb, C + j, ldc, accumulate);
}

// GemmRows for a run-time row count 1 <= rows <= MR.
template <size_t MR>
HWY_INLINE void GemmRowsN(size_t rows, size_t n, size_t K,
                          const float* HWY_RESTRICT A, ptrdiff_t a_row,
                          ptrdiff_t a_col, const float* HWY_RESTRICT B,
                          size_t ldb, float* HWY_RESTRICT C, size_t ldc,
                          bool accumulate) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return GemmRowsN<MR - 1>(rows, n, K, A, a_row, a_col, B, ldb, C, ldc,
                               accumulate);
  }
  GemmRows<MR>(n, K, A, a_row, a_col, B, ldb, C, ldc, accumulate);
}

HWY_NOINLINE void Gemm(size_t m, size_t n, size_t K,
                       const float* HWY_RESTRICT A, ptrdiff_t a_row,
                       ptrdiff_t a_col, const float* HWY_RESTRICT B, size_t ldb,
                       float* HWY_RESTRICT C, size_t ldc, bool accumulate) {
  size_t i = 0;
  for (; i + kGemmRows <= m; i += kGemmRows) {
    GemmRows<kGemmRows>(n, K, A + static_cast<ptrdiff_t>(i) * a_row, a_row,
                        a_col, B, ldb, C + i * ldc, ldc, accumulate);
  }
  if (i < m)
    GemmRowsN<kGemmRows - 1>(m - i, n, K, A + static_cast<ptrdiff_t>(i) * a_row,
                             a_row, a_col, B, ldb, C + i * ldc, ldc,
                             accumulate);
}

// Per-row limits of GemmLimited (nullptr: no limit). Row i of C needs the
// columns [n_lo[i], n[i]) and the terms k in [k_lo[i], k_hi[i]).
struct RowLimits {
  const size_t* n = nullptr;
  const size_t* k_lo = nullptr;
  const size_t* k_hi = nullptr;
  const size_t* n_lo = nullptr;
};

// Gemm for masked tiles (issue 18): each group of kGemmRows rows computes
// only the columns [min n_lo, max n) of its rows, rounded outwards to
// multiples of Lanes (a window's rows start past column 0: issue 34), and
// only the terms [min k_lo, max k_hi) of its rows; a group with no column
// is skipped, and so is one with no term when accumulating (otherwise its
// columns are set to 0). The caller guarantees that every skipped term is an
// exact zero (A = 0 there, B finite): a skipped term would have added +-0 to
// the chain, so every computed element equals Gemm's except possibly the sign
// of a zero. Columns of C outside a group's columns are left untouched. The
// limits depend on the mask and the shape only, so results stay bitwise
// identical for every thread count.
HWY_NOINLINE void GemmLimited(size_t m, size_t n, size_t K,
                              const float* HWY_RESTRICT A, ptrdiff_t a_row,
                              ptrdiff_t a_col, const float* HWY_RESTRICT B,
                              size_t ldb, float* HWY_RESTRICT C, size_t ldc,
                              bool accumulate, const RowLimits& lim) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  for (size_t i = 0; i < m; i += kGemmRows) {
    const size_t rows = std::min(kGemmRows, m - i);
    size_t ng = lim.n ? 0 : n, k0 = lim.k_lo ? K : 0, k1 = lim.k_hi ? 0 : K;
    size_t c0 = lim.n_lo ? n : 0;
    for (size_t r = i; r < i + rows; ++r) {
      if (lim.n) ng = std::max(ng, lim.n[r]);
      if (lim.n_lo) c0 = std::min(c0, lim.n_lo[r]);
      if (lim.k_lo) k0 = std::min(k0, lim.k_lo[r]);
      if (lim.k_hi) k1 = std::max(k1, lim.k_hi[r]);
    }
    ng = std::min(n, (ng + N - 1) / N * N);
    c0 = c0 / N * N;
    if (k1 < k0) k1 = k0;
    if (ng <= c0 || (accumulate && k1 == k0)) continue;
    const float* Ai = A + static_cast<ptrdiff_t>(i) * a_row +
                      static_cast<ptrdiff_t>(k0) * a_col;
    const float* Bk = B + k0 * ldb + c0;
    float* Ci = C + i * ldc + c0;
    GemmRowsN<kGemmRows>(rows, ng - c0, k1 - k0, Ai, a_row, a_col, Bk, ldb, Ci,
                         ldc, accumulate);
  }
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_GEMM_INL_H_
