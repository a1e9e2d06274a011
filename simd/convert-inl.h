// Vector conversions between f32 and the 16-bit storage formats, and the row
// load/store helpers built on them. Per-target code (include once per target,
// inside kernels.cc's foreach_target loop).
//
// Contract of every f32 -> 16-bit conversion here: IEEE 754 round to nearest,
// ties to even; overflow to +-Inf; gradual underflow to subnormals (f16); NaN
// stays NaN, quiet, sign kept, payload truncated (bf16: upper 16 bits | 0x40;
// f16: 0x7e00 | top 10 mantissa bits). Bitwise equal to qknorm::bf16_from_f32
// / f16_from_f32 for every input (tests/convert_test.cc checks every target).
// 16-bit -> f32 is exact. We do not use Highway 1.0.3's DemoteTo for these:
// its bf16 path truncates, and its f16 emulation on SSSE3/SSE4 truncates and
// mishandles Inf/NaN (shared/NUMERICS.md). Integer bit manipulation works
// identically on every target; only the f16 subnormal case uses one f32 add,
// which relies on the default rounding mode and no FTZ/DAZ (never changed by
// this library).

#if defined(QKNORM_SIMD_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_CONVERT_INL_H_
#undef QKNORM_SIMD_CONVERT_INL_H_
#else
#define QKNORM_SIMD_CONVERT_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "qknorm/precision.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DH = hn::Rebind<uint16_t, DF>;  // 16-bit lanes, as many as DF has

// Upper bound on Lanes(DF()) over all targets, for stack tail buffers.
inline constexpr size_t kMaxLanesF32 = HWY_MAX_BYTES / sizeof(float);

// ---------------------------------------------------------------- bf16

HWY_INLINE VF F32FromBF16(hn::Vec<DH> h) {
  const DF df;
  const DU du;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));
}

HWY_INLINE hn::Vec<DH> BF16FromF32(VF x) {
  const DI di;
  const DU du;
  const DH dh;
  const auto u = hn::BitCast(du, x);
  const auto abs = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu)));
  const auto is_nan = hn::RebindMask(du, hn::Gt(abs, hn::Set(di, 0x7f800000)));
  // RNE on the 16 dropped bits: add 0x7fff plus the lowest kept bit. A carry
  // out of the mantissa increments the exponent, which is the correct result
  // (up to Inf for the largest values). Cannot wrap for non-NaN input.
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded =
      hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), lsb));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  const auto r = hn::IfThenElse(is_nan, quiet_nan, rounded);
  // Every lane is <= 0xffff, so the saturating i32 -> u16 demotion is exact.
  return hn::DemoteTo(dh, hn::BitCast(di, r));
}

// ---------------------------------------------------------------- f16

HWY_INLINE VF F32FromF16(hn::Vec<DH> h16) {
  const DF df;
  const DI di;
  const DU du;
  const auto h = hn::BitCast(di, hn::PromoteTo(du, h16));
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(di, 0x8000)));
  const auto exp = hn::And(h, hn::Set(di, 0x7c00));
  const auto man = hn::And(h, hn::Set(di, 0x3ff));
  // Normal: move exponent+mantissa into place and rebias (127 - 15) << 23.
  const auto normal =
      hn::Add(hn::ShiftLeft<13>(hn::And(h, hn::Set(di, 0x7fff))),
              hn::Set(di, 0x38000000));
  // Inf/NaN: all-ones f32 exponent, mantissa kept.
  const auto infnan = hn::Or(hn::Set(di, 0x7f800000), hn::ShiftLeft<13>(man));
  // Subnormal or zero: man * 2^-24, exact in f32.
  const auto sub = hn::BitCast(
      di, hn::Mul(hn::ConvertTo(df, man), hn::Set(df, 5.9604644775390625e-8f)));
  auto r = hn::IfThenElse(hn::Eq(exp, hn::Set(di, 0x7c00)), infnan, normal);
  r = hn::IfThenElse(hn::Eq(exp, hn::Zero(di)), sub, r);
  return hn::BitCast(df, hn::Or(r, sign));
}

HWY_INLINE hn::Vec<DH> F16FromF32(VF x) {
  const DF df;
  const DI di;
  const DH dh;
  const auto u = hn::BitCast(di, x);
  const auto a = hn::And(u, hn::Set(di, 0x7fffffff));
  // Bit 15 of u >> 16 is the sign bit whether or not the shift sign-extends.
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(di, 0x8000));
  const auto is_nan = hn::Gt(a, hn::Set(di, 0x7f800000));
  const auto quiet_nan = hn::Or(
      hn::Set(di, 0x7e00), hn::And(hn::ShiftRight<13>(a), hn::Set(di, 0x3ff)));
  // |x| >= 65520 (halfway between 65504, the largest f16, and 2^16) rounds to
  // Inf; the tie goes up because 65504's last mantissa bit is odd.
  const auto to_inf = hn::Gt(a, hn::Set(di, 0x477fefff));
  // |x| < 2^-14: f16 subnormal. x + 0.5f has ulp 2^-24, so the f32 add rounds
  // x to a multiple of 2^-24 (RNE); subtracting 0.5f's bits leaves that
  // multiple, 0..1024 (1024 encodes the smallest normal, correctly).
  const auto is_sub = hn::Gt(hn::Set(di, 0x38800000), a);
  const auto sub =
      hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
              hn::Set(di, 0x3f000000));
  // Normal: rebias, then RNE on the 13 dropped bits (carry into the exponent
  // is correct; to_inf catches the carry into Inf).
  const auto lsb = hn::And(hn::ShiftRight<13>(a), hn::Set(di, 1));
  const auto normal = hn::ShiftRight<13>(hn::Add(
      hn::Sub(a, hn::Set(di, 0x38000000)), hn::Add(hn::Set(di, 0xfff), lsb)));
  auto r = hn::IfThenElse(is_sub, sub, normal);
  r = hn::IfThenElse(to_inf, hn::Set(di, 0x7c00), r);
  r = hn::IfThenElse(is_nan, quiet_nan, r);
  return hn::DemoteTo(dh, hn::Or(r, sign));
}

// ---------------------------------------------------------------- storage

// Storage element of each precision: f32 as float, bf16/f16 as raw bits.
template <Precision P>
using StorageT = std::conditional_t<P == Precision::kF32, float, uint16_t>;

template <Precision P>
HWY_INLINE VF LoadStorage(const StorageT<P>* HWY_RESTRICT p) {
  if constexpr (P == Precision::kF32) {
    return hn::LoadU(DF(), p);
  } else if constexpr (P == Precision::kBF16) {
    return F32FromBF16(hn::LoadU(DH(), p));
  } else {
    return F32FromF16(hn::LoadU(DH(), p));
  }
}

template <Precision P>
HWY_INLINE void StoreStorage(VF v, StorageT<P>* HWY_RESTRICT p) {
  if constexpr (P == Precision::kF32) {
    hn::StoreU(v, DF(), p);
  } else if constexpr (P == Precision::kBF16) {
    hn::StoreU(BF16FromF32(v), DH(), p);
  } else {
    hn::StoreU(F16FromF32(v), DH(), p);
  }
}

// dst[0..padded) = src[0..n) converted to f32, then zeros. padded must be a
// multiple of Lanes(DF()) and >= n. The tail goes through a zeroed stack
// buffer so the same vector conversion handles every element.
template <Precision P>
HWY_INLINE void LoadRow(const StorageT<P>* HWY_RESTRICT src, size_t n,
                        float* HWY_RESTRICT dst, size_t padded) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(LoadStorage<P>(src + i), df, dst + i);
  if (i < n) {
    StorageT<P> tail[kMaxLanesF32] = {};
    std::memcpy(tail, src + i, (n - i) * sizeof(StorageT<P>));
    hn::StoreU(LoadStorage<P>(tail), df, dst + i);
    i += N;
  }
  for (; i < padded; i += N) hn::StoreU(hn::Zero(df), df, dst + i);
}

// dst[0..n) = src[0..n) rounded to storage (RNE). src may be read up to the
// next multiple of Lanes(DF()).
template <Precision P>
HWY_INLINE void StoreRow(const float* HWY_RESTRICT src, size_t n,
                         StorageT<P>* HWY_RESTRICT dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) StoreStorage<P>(hn::LoadU(df, src + i), dst + i);
  if (i < n) {
    StorageT<P> tail[kMaxLanesF32];
    StoreStorage<P>(hn::LoadU(df, src + i), tail);
    std::memcpy(dst + i, tail, (n - i) * sizeof(StorageT<P>));
  }
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_CONVERT_INL_H_
