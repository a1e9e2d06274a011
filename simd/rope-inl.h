// Rotary position embedding (RoPE, issue 34; attention.h "Rope") in the SIMD
// kernels: the per-call table of cos and sin, and the rotation of one head's
// row (its first rotary_dim dims). Per-target code, included by
// formulation-inl.h. The kernels rotate a row where they write it: the q and
// k operands while they are normalized (formulation-inl.h PrepSideTask, the
// attention kernels' LoadSide), the gradients where they leave the
// normalization backward; never as a separate sweep over a tensor.
//
// Table (BuildRopeTable): one row per position of the union of both sides'
// positions (attention.h rope_position: k row j at j + offset, q row i at
// kv_len - q_len + i + offset), max(q_len, kv_len) rows:
//   half-split  (e, e + r/2): r floats, c_0 .. c_{r/2-1}, s_0 .. s_{r/2-1}:
//                             y_a = x_a c - x_b s, y_b = x_b c + x_a s;
//   interleaved (2e, 2e + 1): 2 r floats, C then S expanded per dim, C[2e] =
//                             C[2e + 1] = c_e, S[2e] = -s_e, S[2e + 1] =
//                             +s_e: y = x C + x' S, x' = x with adjacent
//                             lanes swapped;
// (r = rotary_dim), c_e, s_e = cos, sin(pos inv_freq_e) in f64 rounded
// once to f32 (the compute format of every simd entry). The transpose
// (angle -t, the backward) negates the s terms. The half-split rows are
// compact (every head re-reads the table: at n = 512, r = 128 an expanded
// one is 512 KiB, a Zen core's whole L2).
//
// The angles are formed in f64 from the f64 inv_freq (rope_inv_freq<double>):
// the problem's own value, no angle_f32 or cos_sin_storage rounding (those
// are claims an entry may make; computing more accurately is always
// allowed). Cost: std::cos and std::sin per (position, pair) would be 32768
// pairs of libm calls at n = 512, r = 128 (estimated ~1 ms at ~15 ns each,
// against a 6 ms forward at 8 heads), so positions go in steps of
// kRopeStep by angle addition:
//   A = pos0 inv (f64, libm's cos and sin), b_k = k inv, k < kRopeStep,
//   (cos b_k, sin b_k) = (cos b_{k-1}, sin b_{k-1}) * (cos inv, sin inv)
//     (complex products from libm's cos inv, sin inv),
//   cos(A + b_k) = cos A cos b_k - sin A sin b_k,
//   sin(A + b_k) = sin A cos b_k + cos A sin b_k.
// Each complex product adds at most ~4 2^-53 (absolute; the error grows
// linearly in k, not as the Chebyshev recurrence's k^2), so every c, s is
// within ~(4 kRopeStep + 8) 2^-53 < 2^-44 of the exact cos, sin of an angle
// within an f64 rounding or two of pos inv (as RN(pos inv) is): the f32
// rounding is the correctly rounded one but for values within 2^-44 of a
// tie (then off by less than 2^-44 beyond half an f32 ulp, 2^-25 near 1).
// 2 + 2 ceil(rows / kRopeStep) libm calls per pair: 18 at n = 512.
// Positions stay within +-2^24 (attention.h).
//
// Rotation (RotateRow): per lane y = x C + x' S with at most three f32
// roundings (hn::MulAdd: fused where the target has FMA; the scalar tails
// multiply and add; the transpose negates x' S): |y - exact| <= 3u (|x C|
// + |x' S|) plus the table's half ulp in C and S, u = 2^-24. A pair with
// (c, s) = (1, 0) (position 0) is kept exactly (x' 0 = 0 for finite x').

#if defined(QKNORM_SIMD_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_ROPE_INL_H_
#undef QKNORM_SIMD_ROPE_INL_H_
#else
#define QKNORM_SIMD_ROPE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "qknorm/attention.h"
#include "simd/convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Positions per exact cos/sin evaluation of the table (angle addition
// within a step; top of file).
inline constexpr int64_t kRopeStep = 64;

// One side's view of the table: no rotation when table is null.
struct RopeSide {
  const float* table = nullptr;
  size_t r = 0;  // rotary_dim
  bool interleaved = false;
  // qknorm before the normalization (kBeforeNorm), sdpa, or a raw side (no
  // normalization: either order is the same): x is rotated; else the
  // operand x_tilde is.
  bool before = false;
  int64_t base = 0;  // table row of the side's row 0
  bool on() const { return table != nullptr; }
  // Floats per table row.
  size_t ld() const { return interleaved ? 2 * r : r; }
  // The table row of the side's row n.
  const float* Row(int64_t n) const {
    return table + static_cast<size_t>(base + n) * ld();
  }
};

// Rows of the table of problem p (0 without RoPE).
inline size_t RopeTableRows(const AttentionProblem& p) {
  return has_rope(p) ? static_cast<size_t>(std::max(p.q_len, p.kv_len)) : 0;
}
// Floats of the table of problem p.
inline size_t RopeTableFloats(const AttentionProblem& p) {
  const size_t per = p.rope.pairing == RopePairing::kInterleaved ? 2 : 1;
  return RopeTableRows(p) * per * static_cast<size_t>(p.rope.rotary_dim);
}

// The first table row's position: the smaller of both sides' first.
inline int64_t RopeFirstPosition(const AttentionProblem& p) {
  return std::min(rope_position(p, 0, 0), rope_position(p, 1, 0));
}

// Doubles of BuildRopeTable's scratch for problem p.
inline size_t RopeScratchDoubles(const AttentionProblem& p) {
  return has_rope(p) ? static_cast<size_t>(p.rope.rotary_dim) *
                           static_cast<size_t>(kRopeStep + 1)
                     : 0;
}

// Fills the table of problem p (RopeTableFloats(p) floats; top of file).
// scratch: RopeScratchDoubles(p) doubles. Each table row is written whole,
// in order (pair-major writes, one pair across all rows at a time, strided
// by the row: 2 r floats apart, cost ~4x more at n = 512, r = 128: perf).
inline void BuildRopeTable(const AttentionProblem& p, float* HWY_RESTRICT t,
                           double* HWY_RESTRICT scratch) {
  const Rope& rope = p.rope;
  const int64_t r = rope.rotary_dim, half = r / 2;
  const int64_t rows = static_cast<int64_t>(RopeTableRows(p));
  const int64_t pos0 = RopeFirstPosition(p);
  // cos, sin of b_k = k inv_e, [k][e]; then of A_e for the current block.
  double* cb = scratch;
  double* sb = cb + kRopeStep * half;
  double* ca = sb + kRopeStep * half;
  double* sa = ca + half;
  for (int64_t e = 0; e < half; ++e) {
    const double f = rope_inv_freq<double>(rope, e);
    const double c1 = std::cos(f), s1 = std::sin(f);
    cb[e] = 1, sb[e] = 0;
    for (int64_t k = 1; k < kRopeStep; ++k) {
      const double c0 = cb[(k - 1) * half + e], s0 = sb[(k - 1) * half + e];
      cb[k * half + e] = c0 * c1 - s0 * s1;
      sb[k * half + e] = s0 * c1 + c0 * s1;
    }
  }
  const bool interleaved = rope.pairing == RopePairing::kInterleaved;
  for (int64_t n0 = 0; n0 < rows; n0 += kRopeStep) {
    for (int64_t e = 0; e < half; ++e) {
      const double a =
          static_cast<double>(pos0 + n0) * rope_inv_freq<double>(rope, e);
      ca[e] = std::cos(a);
      sa[e] = std::sin(a);
    }
    const int64_t n1 = std::min(rows, n0 + kRopeStep);
    for (int64_t n = n0; n < n1; ++n) {
      const double* cbk = cb + (n - n0) * half;
      const double* sbk = sb + (n - n0) * half;
      float* C = t + static_cast<size_t>(n * (interleaved ? 2 * r : r));
      float* S = C + (interleaved ? r : half);
      for (int64_t e = 0; e < half; ++e) {
        // k = 0: cos A and sin A themselves (cb = 1, sb = 0 exactly).
        const float c = static_cast<float>(ca[e] * cbk[e] - sa[e] * sbk[e]);
        const float s = static_cast<float>(sa[e] * cbk[e] + ca[e] * sbk[e]);
        if (interleaved) {
          C[2 * e] = C[2 * e + 1] = c;
          S[2 * e] = -s, S[2 * e + 1] = s;
        } else {
          C[e] = c, S[e] = s;
        }
      }
    }
  }
}

// The side's view of the table t of problem p (side 0: q, 1: k); `raw`: the
// side has no normalization (sdpa, or kind none without a weight).
inline RopeSide MakeRopeSide(const AttentionProblem& p, int side, bool raw,
                             const float* t) {
  RopeSide rs;
  if (!has_rope(p)) return rs;
  rs.table = t;
  rs.r = static_cast<size_t>(p.rope.rotary_dim);
  rs.interleaved = p.rope.pairing == RopePairing::kInterleaved;
  rs.before = raw || p.variant != Variant::kQKNorm ||
              p.rope.order == RopeOrder::kBeforeNorm;
  rs.base = rope_position(p, side, 0) - RopeFirstPosition(p);
  return rs;
}

// In place: the first rs.r dims of x rotated by the table row tr (C, then
// S; top of file); kInverse: by the transpose. x and tr do not alias.
template <bool kInverse>
HWY_INLINE void RotateRow(const RopeSide& rs, const float* HWY_RESTRICT tr,
                          float* HWY_RESTRICT x) {
  const DF df;
  const size_t N = hn::Lanes(df), r = rs.r;
  if (!rs.interleaved) {
    // Pairs (e, e + h), compact row: c then s (h each).
    const size_t h = r / 2, hv = h / N * N;
    const float* C = tr;
    const float* S = tr + h;
    for (size_t e = 0; e < hv; e += N) {
      const VF xa = hn::LoadU(df, x + e), xb = hn::LoadU(df, x + e + h);
      const VF c = hn::LoadU(df, C + e), s = hn::LoadU(df, S + e);
      const VF pa = hn::Mul(xb, s), pb = hn::Mul(xa, s);
      hn::StoreU(hn::MulAdd(xa, c, kInverse ? pa : hn::Neg(pa)), df, x + e);
      hn::StoreU(hn::MulAdd(xb, c, kInverse ? hn::Neg(pb) : pb), df, x + e + h);
    }
    for (size_t e = hv; e < h; ++e) {
      const float xa = x[e], xb = x[e + h];
      const float pa = xb * S[e], pb = xa * S[e];
      x[e] = xa * C[e] + (kInverse ? pa : -pa);
      x[e + h] = xb * C[e] + (kInverse ? -pb : pb);
    }
    return;
  }
  // Pairs (2e, 2e + 1), expanded row C, S: the partner is the adjacent lane
  // (Reverse2; N is even but on HWY_SCALAR, which takes the scalar loop).
  const float* C = tr;
  const float* S = tr + r;
  const size_t rv = N >= 2 ? r / N * N : 0;
  for (size_t d = 0; d < rv; d += N) {
    const VF v = hn::LoadU(df, x + d);
    VF sw = hn::Mul(hn::Reverse2(df, v), hn::LoadU(df, S + d));
    if (kInverse) sw = hn::Neg(sw);
    hn::StoreU(hn::MulAdd(v, hn::LoadU(df, C + d), sw), df, x + d);
  }
  for (size_t d = rv; d < r; d += 2) {
    const float xa = x[d], xb = x[d + 1];
    const float pa = xb * S[d], pb = xa * S[d + 1];
    x[d] = xa * C[d] + (kInverse ? -pa : pa);
    x[d + 1] = xb * C[d + 1] + (kInverse ? -pb : pb);
  }
}

// RotateRow for the side's rows n0 .. n0 + rows - 1 at x + t * ld.
template <bool kInverse>
HWY_INLINE void RotateRows(const RopeSide& rs, int64_t n0, size_t rows,
                           float* HWY_RESTRICT x, size_t ld) {
  for (size_t t = 0; t < rows; ++t)
    RotateRow<kInverse>(rs, rs.Row(n0 + static_cast<int64_t>(t)), x + t * ld);
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_ROPE_INL_H_
