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

HWY_NOINLINE void Gemm(size_t m, size_t n, size_t K,
                       const float* HWY_RESTRICT A, ptrdiff_t a_row,
                       ptrdiff_t a_col, const float* HWY_RESTRICT B, size_t ldb,
                       float* HWY_RESTRICT C, size_t ldc, bool accumulate) {
  size_t i = 0;
  for (; i + kGemmRows <= m; i += kGemmRows) {
    GemmRows<kGemmRows>(n, K, A + static_cast<ptrdiff_t>(i) * a_row, a_row,
                        a_col, B, ldb, C + i * ldc, ldc, accumulate);
  }
  const float* Ai = A + static_cast<ptrdiff_t>(i) * a_row;
  float* Ci = C + i * ldc;
  static_assert(kGemmRows <= 6, "add tail cases");
  switch (m - i) {
    case 5:
      return GemmRows<5>(n, K, Ai, a_row, a_col, B, ldb, Ci, ldc, accumulate);
    case 4:
      return GemmRows<4>(n, K, Ai, a_row, a_col, B, ldb, Ci, ldc, accumulate);
    case 3:
      return GemmRows<3>(n, K, Ai, a_row, a_col, B, ldb, Ci, ldc, accumulate);
    case 2:
      return GemmRows<2>(n, K, Ai, a_row, a_col, B, ldb, Ci, ldc, accumulate);
    case 1:
      return GemmRows<1>(n, K, Ai, a_row, a_col, B, ldb, Ci, ldc, accumulate);
    default:
      return;
  }
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_GEMM_INL_H_
