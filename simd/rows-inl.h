// Row primitives shared by the attention and ScaleNorm kernels: unit
// normalization and its backward, dot products. Per-target code.
//
// Unit normalization u = x / max(||x||_2, eps) (QKNorm, Henry et al. 2020;
// ScaleNorm, Nguyen & Salazar 2019). The sum of squares, the norm and the
// division are done in f64 lanes: every finite f32 square fits in double
// (FLT_MAX^2 ~ 1.2e77, smallest subnormal^2 ~ 2e-90), so there is no
// overflow (a plain f32 sum of squares overflows once |x| > ~1.8e19) and no
// scaling is needed, and u is x / ||x|| rounded ONCE to f32 per element.
// That matters: a common relative error e in ||q_i|| scales every logit of
// row i by (1 + e), and with g ~ 25 a 2-ulp norm error (what f32 sums give)
// visibly changes P. The cost is O(rows x dim), negligible next to the
// O(n^2 dim) attention products.

#if defined(QKNORM_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_ROWS_INL_H_
#undef QKNORM_SIMD_ROWS_INL_H_
#else
#define QKNORM_SIMD_ROWS_INL_H_
#endif

#include <cfloat>
#include <cmath>
#include <cstddef>

#include "hwy/highway.h"
#include "simd/workspace.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// eps as the f32 the kernels compare and divide with; an eps below the
// smallest f32 subnormal is clamped to it (instead of 0, which would divide
// by zero).
inline float EpsF32(double eps) {
  const float e = static_cast<float>(eps);
  return e > 0 ? e : FLT_TRUE_MIN;
}

// sum_i a[i] b[i] over n (a multiple of Lanes) elements, f32.
HWY_INLINE float DotRow(const float* HWY_RESTRICT a,
                        const float* HWY_RESTRICT b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto acc = hn::Zero(d);
  for (size_t i = 0; i < n; i += N)
    acc = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc);
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

// DotChain: sum_k a[k] b[k] as ONE fused-multiply-add chain in increasing
// k, the exact operation sequence gemm-inl.h applies to each C element
// (broadcast times lane, MulAdd). The backward's delta_i = dO_i . O_i uses
// it, so that when O_i equals V_j bitwise (one visible key, P = 1) delta_i
// equals dP_ij bitwise and dS_ij = P (dP - delta) is exactly 0, as in exact
// arithmetic. DotChainRows: that chain for the R row pairs (a + t * lda,
// b + t * ldb), t < R, into out[t], interleaved (one chain alone is n
// dependent FMAs, ~4n cycles: the backward's delta at n = 128 spent ~100 us
// of ~900 in them, issue 18); each row's result is DotChain's.
template <size_t R>
HWY_INLINE void DotChainRows(const float* HWY_RESTRICT a, size_t lda,
                             const float* HWY_RESTRICT b, size_t ldb, size_t n,
                             float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  hn::Vec<decltype(d)> acc[R];
  for (size_t t = 0; t < R; ++t) acc[t] = hn::Zero(d);
  for (size_t k = 0; k < n; ++k)
    for (size_t t = 0; t < R; ++t)
      acc[t] = hn::MulAdd(hn::Set(d, a[t * lda + k]),
                          hn::Set(d, b[t * ldb + k]), acc[t]);
  for (size_t t = 0; t < R; ++t) out[t] = hn::GetLane(acc[t]);
}

HWY_INLINE float DotChain(const float* HWY_RESTRICT a,
                          const float* HWY_RESTRICT b, size_t n) {
  float out;
  DotChainRows<1>(a, 0, b, 0, n, &out);
  return out;
}

HWY_INLINE void ScaleRow(float* HWY_RESTRICT x, size_t n, float s) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  for (size_t i = 0; i < n; i += N)
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
}

// f64 lanes, and f32 lanes as many as there are f64 lanes (half vectors).
using DD = hn::ScalableTag<double>;
using DFH = hn::Rebind<float, DD>;

// sum x[d]^2 over n floats (n a multiple of Lanes(DD)) in f64 lanes: every
// f32 square is exact in f64, without overflow or underflow (above); one
// row's chain, for the fixed shift's norm bounds (attention-inl.h).
HWY_INLINE double SumSquaresF64(const float* HWY_RESTRICT x, size_t n) {
  const DD dd;
  const DFH dfh;
  auto acc = hn::Zero(dd);
  for (size_t i = 0; i < n; i += hn::Lanes(dd)) {
    const auto y = hn::PromoteTo(dd, hn::LoadU(dfh, x + i));
    acc = hn::MulAdd(y, y, acc);
  }
  return hn::GetLane(hn::SumOfLanes(dd, acc));
}

// x[0..n) *= s in f64 lanes, each product rounded once to f32 (n a multiple
// of Lanes(DF)).
HWY_INLINE void ScaleRowF64(float* HWY_RESTRICT x, size_t n, double s) {
  const DD dd;
  const DFH dfh;
  const size_t ND = hn::Lanes(dd);
  const auto vs = hn::Set(dd, s);
  for (size_t i = 0; i < n; i += ND)
    hn::StoreU(hn::DemoteTo(
                   dfh, hn::Mul(hn::PromoteTo(dd, hn::LoadU(dfh, x + i)), vs)),
               dfh, x + i);
}

// In place: x[0..n) -> u (n a multiple of Lanes(DF); zero padding stays
// zero; n is then also a multiple of Lanes(DD)), for the R rows x + t * ld
// (t < R) at once. Each row is one sum-of-squares FMA chain in increasing
// index, then sqrt, a reciprocal and the scaling, the same operation sequence
// whatever R is: results are bitwise those of NormalizeRow. Interleaving R
// rows overlaps their chains (a row of 64 is a chain of 16 dependent f64
// FMAs, 4 cycles each, and row-at-a-time left the FMA units mostly idle:
// issue 18 measured 51 -> 27 us for the forward's 1024 q rows at d = 64).
template <size_t R>
HWY_INLINE void NormalizeRowsT(float* HWY_RESTRICT x, size_t ld, size_t n,
                               float eps, NormInfo* HWY_RESTRICT info) {
  const DD dd;
  const DFH dfh;
  const size_t ND = hn::Lanes(dd);
  hn::Vec<DD> acc[R];
  for (size_t t = 0; t < R; ++t) acc[t] = hn::Zero(dd);
  for (size_t i = 0; i < n; i += ND) {
    for (size_t t = 0; t < R; ++t) {
      const auto y = hn::PromoteTo(dd, hn::LoadU(dfh, x + t * ld + i));
      acc[t] = hn::MulAdd(y, y, acc[t]);
    }
  }
  // All R square roots and reciprocals first: each is ~30 cycles of
  // latency, which the scaling pass of the same row would otherwise wait for.
  double inv[R];
  for (size_t t = 0; t < R; ++t) {
    NormInfo& in = info[t];
    in.norm = std::sqrt(hn::GetLane(hn::SumOfLanes(dd, acc[t])));
    in.clamped = in.norm > static_cast<double>(eps) ? 0 : 1;
    // x * (1 / den) in f64 is within ~2^-52 relative of x / den, so the one
    // f32 rounding that follows gives the correctly rounded quotient except
    // at near-ties (f64 division would cost ~8 cycles per 4 lanes).
    inv[t] = 1.0 / (in.clamped ? static_cast<double>(eps) : in.norm);
  }
  for (size_t t = 0; t < R; ++t) {
    const auto vinv = hn::Set(dd, inv[t]);
    float* HWY_RESTRICT xr = x + t * ld;
    for (size_t i = 0; i < n; i += ND) {
      const auto y = hn::PromoteTo(dd, hn::LoadU(dfh, xr + i));
      hn::StoreU(hn::DemoteTo(dfh, hn::Mul(y, vinv)), dfh, xr + i);
    }
  }
}

inline constexpr size_t kNormRows = 8;

// NormalizeRowsT for `rows` rows, kNormRows at a time; info[t] of row t.
HWY_INLINE void NormalizeRows(float* HWY_RESTRICT x, size_t ld, size_t rows,
                              size_t n, float eps,
                              NormInfo* HWY_RESTRICT info) {
  size_t t = 0;
  for (; t + kNormRows <= rows; t += kNormRows)
    NormalizeRowsT<kNormRows>(x + t * ld, ld, n, eps, info + t);
  for (; t < rows; ++t) NormalizeRowsT<1>(x + t * ld, ld, n, eps, info + t);
}

// One row (in place), as above.
HWY_INLINE NormInfo NormalizeRow(float* HWY_RESTRICT x, size_t n, float eps) {
  NormInfo info;
  NormalizeRowsT<1>(x, 0, n, eps, &info);
  return info;
}

// In place: du -> dx for the row normalized to u with `info`:
//   ||x|| > eps:  dx = (du - u (u . du)) / ||x||
//   ||x|| <= eps: dx = du / eps                     (shared/NUMERICS.md)
// All in f64 lanes, rounded once to f32: when du is nearly parallel to u the
// projection du - u (u . du) cancels, and f32 roundings of u . du and of the
// products would be amplified by |du| / |dx| (seen with |q| small and g
// large); in f64 only du's own f32 rounding remains. ||x|| may exceed
// FLT_MAX, which f64 also covers. NormalizeRowsBackwardT: the R rows
// (u + t * ldu, du + t * lddu) at once, each row's operation sequence that
// of NormalizeRowBackward (bitwise its results); the u . du chains are
// interleaved, as NormalizeRowsT's sums of squares.
template <size_t R>
HWY_INLINE void NormalizeRowsBackwardT(const float* HWY_RESTRICT u, size_t ldu,
                                       const NormInfo* HWY_RESTRICT info,
                                       float eps, float* HWY_RESTRICT du,
                                       size_t lddu, size_t n) {
  const DD dd;
  const DFH dfh;
  const size_t ND = hn::Lanes(dd);
  // The R rows' u . du chains interleaved (a clamped row's is unused).
  hn::Vec<DD> acc[R];
  for (size_t t = 0; t < R; ++t) acc[t] = hn::Zero(dd);
  for (size_t i = 0; i < n; i += ND)
    for (size_t t = 0; t < R; ++t)
      acc[t] = hn::MulAdd(hn::PromoteTo(dd, hn::LoadU(dfh, u + t * ldu + i)),
                          hn::PromoteTo(dd, hn::LoadU(dfh, du + t * lddu + i)),
                          acc[t]);
  for (size_t t = 0; t < R; ++t) {
    const float* HWY_RESTRICT ur = u + t * ldu;
    float* HWY_RESTRICT dr = du + t * lddu;
    // Multiply by the f64 reciprocal, as in NormalizeRowsT.
    const auto inv = hn::Set(
        dd, 1.0 / (info[t].clamped ? static_cast<double>(eps) : info[t].norm));
    if (info[t].clamped) {
      for (size_t i = 0; i < n; i += ND) {
        const auto x = hn::PromoteTo(dd, hn::LoadU(dfh, dr + i));
        hn::StoreU(hn::DemoteTo(dfh, hn::Mul(x, inv)), dfh, dr + i);
      }
      continue;
    }
    const auto c = hn::Set(dd, hn::GetLane(hn::SumOfLanes(dd, acc[t])));
    for (size_t i = 0; i < n; i += ND) {
      const auto x = hn::NegMulAdd(hn::PromoteTo(dd, hn::LoadU(dfh, ur + i)), c,
                                   hn::PromoteTo(dd, hn::LoadU(dfh, dr + i)));
      hn::StoreU(hn::DemoteTo(dfh, hn::Mul(x, inv)), dfh, dr + i);
    }
  }
}

// NormalizeRowsBackwardT for `rows` rows, kNormRows at a time (each row's
// result is NormalizeRowBackward's; interleaved as NormalizeRows).
HWY_INLINE void NormalizeRowsBackward(const float* HWY_RESTRICT u, size_t ldu,
                                      const NormInfo* HWY_RESTRICT info,
                                      float eps, float* HWY_RESTRICT du,
                                      size_t lddu, size_t rows, size_t n) {
  size_t t = 0;
  for (; t + kNormRows <= rows; t += kNormRows)
    NormalizeRowsBackwardT<kNormRows>(u + t * ldu, ldu, info + t, eps,
                                      du + t * lddu, lddu, n);
  for (; t < rows; ++t)
    NormalizeRowsBackwardT<1>(u + t * ldu, ldu, info + t, eps, du + t * lddu,
                              lddu, n);
}

HWY_INLINE void NormalizeRowBackward(const float* HWY_RESTRICT u,
                                     const NormInfo& info, float eps,
                                     float* HWY_RESTRICT du, size_t n) {
  NormalizeRowsBackwardT<1>(u, 0, &info, eps, du, 0, n);
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_ROWS_INL_H_
