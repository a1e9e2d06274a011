// ScaleNorm (Nguyen & Salazar 2019), y = g x / max(||x||_2, eps) per row,
// forward and backward, for one storage precision P (math in f32).
// Per-target code.
//
// Rows are independent; tasks are blocks of kScaleNormRows rows. The norm is
// the scaled one of rows-inl.h (no overflow for any finite input). Backward:
// dx = normalization backward of g dy; dg = sum over rows of dy . u, each row
// an f32 dot, rows summed in double per task and tasks summed in order, so
// dg is bitwise identical for every thread count. Zero rows: y = 0,
// dx = g dy / eps.

#if defined(QKNORM_SIMD_SCALENORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_SCALENORM_INL_H_
#undef QKNORM_SIMD_SCALENORM_INL_H_
#else
#define QKNORM_SIMD_SCALENORM_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "qknorm/scalenorm.h"
#include "simd/convert-inl.h"
#include "simd/rows-inl.h"
#include "simd/workspace.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr size_t kScaleNormRows = 64;

template <Precision P>
void ScaleNormForward(const ScaleNormProblem& p, const ScaleNormForwardArgs& a,
                      SimdWorkspace& ws, int threads) {
  const size_t N = hn::Lanes(DF());
  const size_t D = static_cast<size_t>(p.dim), Dp = (D + N - 1) / N * N;
  const size_t rows = static_cast<size_t>(p.rows);
  const float g = static_cast<float>(p.g), eps = EpsF32(p.eps);
  float* scratch = ws.scratch.Get(Dp * static_cast<size_t>(threads));
  const auto* x = static_cast<const StorageT<P>*>(a.x.data);
  auto* y = static_cast<StorageT<P>*>(a.y.data);
  const int64_t tasks =
      static_cast<int64_t>((rows + kScaleNormRows - 1) / kScaleNormRows);
  ws.pool(threads).Run(tasks, [&](int64_t task, int worker) {
    float* row = scratch + Dp * static_cast<size_t>(worker);
    const size_t r0 = static_cast<size_t>(task) * kScaleNormRows;
    for (size_t r = r0; r < std::min(rows, r0 + kScaleNormRows); ++r) {
      LoadRow<P>(x + r * static_cast<size_t>(a.x.row_stride), D, row, Dp);
      NormalizeRow(row, Dp, eps);
      ScaleRow(row, Dp, g);
      StoreRow<P>(row, D, y + r * static_cast<size_t>(a.y.row_stride));
    }
  });
}

template <Precision P>
void ScaleNormBackward(const ScaleNormProblem& p,
                       const ScaleNormBackwardArgs& a, SimdWorkspace& ws,
                       int threads) {
  const size_t N = hn::Lanes(DF());
  const size_t D = static_cast<size_t>(p.dim), Dp = (D + N - 1) / N * N;
  const size_t rows = static_cast<size_t>(p.rows);
  const float g = static_cast<float>(p.g), eps = EpsF32(p.eps);
  float* scratch = ws.scratch.Get(2 * Dp * static_cast<size_t>(threads));
  const auto* x = static_cast<const StorageT<P>*>(a.x.data);
  const auto* dy = static_cast<const StorageT<P>*>(a.dy.data);
  auto* dx = static_cast<StorageT<P>*>(a.dx.data);
  const int64_t tasks =
      static_cast<int64_t>((rows + kScaleNormRows - 1) / kScaleNormRows);
  double* task_dg = ws.task_sums.Get(static_cast<size_t>(tasks));
  ws.pool(threads).Run(tasks, [&](int64_t task, int worker) {
    float* u = scratch + 2 * Dp * static_cast<size_t>(worker);
    float* t = u + Dp;
    const size_t r0 = static_cast<size_t>(task) * kScaleNormRows;
    double dg = 0;
    for (size_t r = r0; r < std::min(rows, r0 + kScaleNormRows); ++r) {
      LoadRow<P>(x + r * static_cast<size_t>(a.x.row_stride), D, u, Dp);
      const NormInfo info = NormalizeRow(u, Dp, eps);
      LoadRow<P>(dy + r * static_cast<size_t>(a.dy.row_stride), D, t, Dp);
      dg += static_cast<double>(DotRow(t, u, Dp));
      ScaleRow(t, Dp, g);
      NormalizeRowBackward(u, info, eps, t, Dp);
      StoreRow<P>(t, D, dx + r * static_cast<size_t>(a.dx.row_stride));
    }
    task_dg[task] = dg;
  });
  double dg = 0;
  for (int64_t t = 0; t < tasks; ++t) dg += task_dg[t];
  *a.dg = dg;
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_SCALENORM_INL_H_
