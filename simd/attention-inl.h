// Fused QKNorm / scaled-dot-product attention, forward and backward, for one
// storage precision P (f32, bf16, f16; math and accumulation in f32).
// Per-target code.
//
// Formulations (issue 16): q and k rows become their logit operands
// x_tilde as formulation-inl.h says (the paper's unit l2 rows exactly as
// before); the core below only sees x_tilde, the logit scale (g, a fixed
// scale or 1/sqrt(D)) and GQA: query head h reads kv head h / group. The
// backward's tasks are (batch, kv head, key group) and walk the group's
// query heads in order, so dK, dV are the group sums in a fixed order; dq_tilde
// and dk_tilde of generic sides then go through the side backward.
//
// Forward (flash-attention style; Dao et al. 2022, online softmax of Milakov
// & Gimelshein 2018): q and k rows are normalized ONCE per call into the
// workspace (rows-inl.h), k_hat is packed transposed in blocks of kKeyBlock
// keys. Each task owns kQueryBlock query rows of one (batch, head) and walks
// the key blocks with a running max m and sum l per row:
//   S = scale * Q_hat K_hat^T (micro-GEMM), m' = max(m, rowmax S),
//   P = exp(S - m'), l = l e^{m-m'} + rowsum P, O = O e^{m-m'} + P V;
// finally O /= l and lse = m + log l. The n x n matrix is never formed; per
// task only one kQueryBlock x kKeyBlock tile exists.
//
// Visibility is an interval per row: key j is visible to query i of batch b
// iff first(b, i) <= j < lim(b, i), attention.h's visible_keys (causal,
// padding and the sliding window, issue 34); without a window first = 0 and
// the keys are a prefix, lim = clamp(min(kl_b, i + 1 + kv_len - q_len), 0,
// kv_len). Both ends are nondecreasing in i. A row block walks only the key
// blocks from the one holding its smallest first to the one holding its
// largest lim (a window's cost follows the window, not kv_len); inside a
// block each group of micro-GEMM rows forms S, P and the products only up
// to its largest limit (GemmLimited, issue 18: a causal diagonal block
// costs about its visible half), the columns before a row's first key are
// masked (S = -inf, P = 0, selected, so a masked key's value never reaches
// a result) and O += P V starts at the group's smallest first key; masked P
// are 0. first >= lim (no visible key): O = 0, lse = -inf.
//
// Backward (FlashAttention-2 style): P is recomputed tile by tile from the
// saved lse, P = exp(S - lse); delta = rowsum(dO * O); dS = P (dP - delta).
// Tasks are (batch, head, key group g): group g owns key blocks g, g+G, ...,
// accumulates dK, dV for its blocks (written once, at the block's end) and a
// private partial dQ; a second pass sums the G partials in g order. A block
// walks only the query rows whose interval meets it (rows [i_first, i_end),
// the ends being nondecreasing); per key, dV and dK sum the rows from the
// first that sees it to the last whose window starts at or before it. With
// a window the partial dQ is zeroed up front (the rows of later blocks are
// no subset of the first block's), without one the first block writes it. G
// depends on the shape only (kTargetTasks), never on the thread count, and
// every element is a fixed-order FMA chain (gemm-inl.h), so results are bitwise
// identical for every thread count. dg = sum dS * C (C = Q_hat K_hat^T, not
// S / g: g may be 0): f32 per tile, then double per task, tasks summed in
// order.
//
// Exp: hwy/contrib/math Exp, max error 1 ULP (f32) on [-FLT_MAX, +104]
// (documented in math-inl.h); every argument here is <= 0 up to rounding, and
// Exp(-inf) = 0 (arguments below -104 return exactly 0). The fixed-shift
// forward (below), whose arguments lie in [-86, 0] up to rounding, uses
// ExpBounded: the same reduction and polynomial without the range handling,
// also 1 ULP there (its comment).
//
// lse: m + log(l) evaluated in f64 from the f32 m and l and returned as that
// f64 (attention.h stores lse as double); it is NOT rounded to f32, whose
// rounding (~1e-6 at |lse| ~ 25) the backward's P = exp(S - lse) would carry
// for the whole row. The backward reads it as an f32 pair hi + lo and forms
// (S - hi) - lo.
//
// Bounded logits (issue 18): a logit bound B_i per query row, derived from
// the data, replaces the running max by the fixed shift m_i = B_i when
// B_i <= kFixedShiftMax: P = exp(S - B_i) cannot overflow, and exp's
// argument stays above -2 kFixedShiftMax = -86 where f32's exp is still
// normal (e^-86 = 4e-38 > 2^-126): no flush. The tile loop then drops the
// max pass and every rescaling (alpha = 1 always). Every formulation
// qualifies when its data does (the paper's unit rows give B_i ~ |g|;
// Qwen3's rms rows with gamma ~ 1 give ~ sqrt(D) max|gamma|^2; even sdpa
// with small logits); a row whose bound exceeds 43 (or is not finite) stays
// online, other rows of the same tile are unaffected. Rows with one visible
// key keep their exactness by their own epilogue (O = V, lse = S of that
// key, as the online path gives them); fully masked rows are unchanged.
// ExecConfig::online_softmax forces the online path (bench compares the
// two) and skips the bound's cost.
// The bound, a true upper bound of |S_ij| as computed (LogitBound): let q,
// k be the f32 operand rows the GEMM reads (x_tilde, zero padded to
// n = Dp), K = max_j ||k_j|| over the row's visible keys (a prefix: the
// running max over the kv head's keys, gathered when they are packed; with
// a window, the interval's max by a monotone queue over per-key norms,
// RangeExtremes; likewise the shift cap below from the interval's min |v|),
// u = 2^-24, eta = 2^-149 (f32's subnormal spacing, twice any one
// operation's underflow error). The GEMM's chain c = fl(sum_d q_d k_d)
// (FMAs, or a multiply and an add without FMA) satisfies
// |c| <= (1 + gamma_n) sum |q_d k_d| + n eta, gamma_n = n u / (1 - n u)
// (Higham, Accuracy and Stability, 3.1), and sum |q_d k_d| <= ||q|| ||k||
// <= ||q|| K (Cauchy-Schwarz); S = RN(scale c) adds a factor (1 + u) and
// eta; the clamp of Logit only shrinks |S|. So
//   |S_ij| <= (1 + u) |scale| ((1 + gamma_n) ||q_i|| K + n eta) + eta,
// provided c cannot overflow ((1 + gamma_n) ||q_i|| K <= FLT_MAX, else B is
// inf). The norms of unit l2 rows are bounded by kUnitRowNorm; the others
// come from the f32 rows themselves in f64 (squares exact, a sum of n of
// them within gamma_n of f64, so each norm within n 2^-53 after the sqrt),
// and the bound is evaluated in f64 with a few more roundings: all are
// covered by the relative slack (n + kBoundF64Roundings) 2^-52 (twice the
// first-order sum), and B is finally rounded up to f32. B_i depends on
// q_i, the row's visible k and v and the shape only: never on the thread
// count, the task split or a masked key (CausalFuture and PaddingInvisible
// stay bitwise).
// Subnormal products: the online path's largest P is 1, the fixed path's
// P = exp(S - B_i) may be as small as e^-2B_i before the division by l, so
// a product P v that is subnormal in f32 keeps only ulp(0) absolutely, which
// the division by l < 1 then amplifies (found by the fuzz corpus,
// crash-simd-f32-stored-o-subnormal-dq: v ~ 1e-42, O = 0 against 4.7e-43).
// A row takes the fixed path only if its visible v hold no nonzero |v|
// below v_floor = e^(2 B_i) FLT_MIN (5.9e-28 at B = 12.32), i.e. only if
// B_i <= ln(min nonzero |v| / FLT_MIN) / 2 (the shift cap of the visible
// keys, ShiftCap): every product of the fixed path is then normal (up to
// exp's 1 ulp).
//
// Exactness kept on purpose (the tolerance rule's bound is 0 where the exact
// result is 0): S = RN(scale * c) and m is one of the S, so the largest P of
// a tile is exp(0) = 1; a row with one visible key gets l = 1, lse = S,
// O = V, backward P = 1, and delta = dO . O is computed with the exact
// operation sequence of dP = dO . V (rows-inl.h DotChain), so dS = 0, dQ = 0
// and dV = dO exactly.
//
// Sinks (issue 34; attention.h): head h's sink, rounded to f32 once, is one
// more term of each row's max and sum, a key without a value, merged at the
// row's end as the online softmax merges a block: m' = max(m, sink), l = l
// e^{m - m'} + e^{sink - m'}, O = O e^{m - m'}; a fixed-shift row then keeps
// m' = B_i (sink <= B_i) or becomes a row shifted by its sink (the hook's
// exp follows). lse = m' + log l includes the sink, and the backward's P =
// exp(S - lse) is unchanged in form; a fully masked row is the sink alone
// (O = 0, lse = sink). The one-visible-key exactness below does not apply
// (such a row's P is 1 / (1 + e^{sink - S})). Backward: dsinks_h = -sum_{b,
// i} exp(sink - lse) delta over the rows that see a key, the share formed
// as P is ((sink - hi) - lo, f32 exp), the product with delta exact in f64,
// summed per (b, h) task in row order, then over b in order (as dg): bitwise
// the same for every thread count.
//
// RoPE (issue 34; rope-inl.h): the q and k rows are rotated where they are
// formed, generic sides in formulation-inl.h's pass, raw and unit-l2 rows
// by LoadSide (x before the unit normalization under kBeforeNorm, u after
// it under kAfterNorm); the table of cos and sin is built once per call
// (PrepareSides). The core above only sees the rotated operands: S, P, dS
// and dg = sum dS * C (C of the rotated rows) are unchanged in form. Their
// gradients: the transpose R^T of the gradient of a raw row; for a unit-l2
// row the normalization backward reads the operand as the GEMMs do, then
// R^T, in either order. Exact for kBeforeNorm (u = x' / ||x'||, x' = R x,
// dx = R^T J(x') g); for kAfterNorm the operand is R u and dx = J(x)^T R^T
// g = (I - u u^T) R^T g / ||x|| = R^T (I - (R u)(R u)^T) g / ||x|| (R
// orthogonal): the same normalization backward of R u (||x|| the same;
// a clamped row's g / eps commutes too). Rows rotated after their
// normalization are unit rows up to the rotation's f32 roundings: the
// fixed shift's bound widens kUnitRowNorm by kRopeRowSlack (UnitRowNorm).
//
// Error: per element the forward's error is that of an f32 dot product of
// length head_dim (the logit, amplified by |g| in P) and an f32 weighted sum
// of length kv_len, plus 1 ULP per exp; the backward likewise. Unit
// normalization and its backward are in f64 (rows-inl.h). The suite's
// acceptance is the tolerance rule of validation/rule.h.

#if defined(QKNORM_SIMD_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_ATTENTION_INL_H_
#undef QKNORM_SIMD_ATTENTION_INL_H_
#else
#define QKNORM_SIMD_ATTENTION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "qknorm/attention.h"
#include "simd/convert-inl.h"
#include "simd/formulation-inl.h"
#include "simd/gemm-inl.h"
#include "simd/rows-inl.h"
#include "simd/workspace.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Keys per block: the n of the S = Q K^T micro-GEMM and the k of O += P V.
// 64 keys x 64 dims of packed K^T is 16 KiB, half of Zen 3's L1d.
inline constexpr size_t kKeyBlock = 64;
// Query rows per forward task / per backward step.
inline constexpr size_t kQueryBlock = 64;
// Backward: key groups per (batch, kv head) = ceil(kTargetTasks / (B*H)) (at
// most the number of key blocks), so small batches still offer ~16 tasks.
inline constexpr int64_t kTargetTasks = 16;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The largest logit bound for the fixed-shift softmax (above): exp(-2 * 43)
// is 4.4e-38, above f32's smallest normal 1.18e-38.
inline constexpr float kFixedShiftMax = 43.0f;
// f64 roundings of LogitBound's evaluation besides the two norms' sums: the
// two sqrts, the product of the norms, the slack factors themselves, the
// products by them and by |scale|, the two additions (top of file).
inline constexpr double kBoundF64Roundings = 8;
// The norm bound of a unit l2 row u = RN_f32(x * RN_f64(1 / max(||x||,
// eps))): each |u_d| <= |x_d| / max(||x||, eps) (1 + 2^-53)^2 (1 + 2^-24),
// so ||u|| <= 1 + 2^-23; the paper's rows skip their f64 norms (n = 128:
// ~170 instructions a row, more than the max pass the shift saves there).
inline constexpr double kUnitRowNorm = 1 + 0x1p-23;
// The growth of a unit row's norm by RoPE's f32 rotation (rope-inl.h):
// with the table's c, s within u = 2^-24 relative (c^2 + s^2 <= (1 +
// u)^2) and each lane's at most three roundings, |y_a - (x_a c + x_b s)| <=
// 3u (|x_a c| + |x_b s|) (first order), and by Cauchy-Schwarz per pair the
// 2-norm of those sums over the row is <= sqrt(2) (1 + u) ||x||: ||y|| <=
// ||x|| (1 + u + 3 sqrt(2) u + O(u^2)) <= ||x|| (1 + 8u). Exact in f64 as
// a product with kUnitRowNorm.
inline constexpr double kRopeRowSlack = 1 + 0x1p-21;
// A row's shift when it takes the online softmax (a bound is never < 0).
inline constexpr float kOnlineRow = -1.0f;

struct AttnShape {
  int64_t B, H, BH, Nq, Nk, D;
  int64_t Hk, BHk, group;  // kv heads (GQA), B * Hk, heads per kv head
  size_t Dp;               // head_dim padded to a multiple of Lanes
  size_t nkb;              // key blocks
  size_t Nkp;              // keys padded: nkb * kKeyBlock
  size_t nqb;              // query blocks of kQueryBlock
  bool qk;                 // qknorm (else sdpa)
  bool learned;            // qknorm with the learned g (dg is computed)
  float scale;  // g or the fixed scale (qknorm), 1/sqrt(D) (sdpa), in f32
  float eps;
  // The logit softcap (attention.h; 0: none), in f32, and fl(1 / cap).
  float cap, inv_cap;
};

inline AttnShape MakeShape(const AttentionProblem& p) {
  const size_t N = hn::Lanes(hn::ScalableTag<float>());
  AttnShape s;
  s.B = p.batch, s.H = p.heads, s.BH = p.batch * p.heads;
  s.Hk = kv_heads_of(p), s.BHk = p.batch * s.Hk, s.group = p.heads / s.Hk;
  s.Nq = p.q_len, s.Nk = p.kv_len, s.D = p.head_dim;
  s.Dp = (static_cast<size_t>(s.D) + N - 1) / N * N;
  s.nkb = (static_cast<size_t>(s.Nk) + kKeyBlock - 1) / kKeyBlock;
  s.Nkp = s.nkb * kKeyBlock;
  s.nqb = (static_cast<size_t>(s.Nq) + kQueryBlock - 1) / kQueryBlock;
  s.qk = p.variant == Variant::kQKNorm;
  s.learned = s.qk && !p.fixed_scale;
  // Same f32 scale as the naive f32 reference computes.
  s.scale = s.qk ? static_cast<float>(p.fixed_scale ? p.scale : p.g)
                 : 1.0f / std::sqrt(static_cast<float>(s.D));
  s.eps = EpsF32(p.eps);
  s.cap = static_cast<float>(p.softcap);
  s.inv_cap = s.cap > 0 ? 1.0f / s.cap : 0.0f;
  return s;
}

// The per-call factors of LogitBound (top of file, "Bounded logits") for
// operand rows of n floats: the chain's (1 + gamma_n) with the f64 slack,
// its absolute underflow term n eta, and |scale| (1 + u).
struct BoundFactors {
  double dot, dot_abs, scale;
};
inline BoundFactors MakeBoundFactors(float scale, size_t n) {
  const double u = 0x1p-24, eta = 0x1p-149, nd = static_cast<double>(n);
  const double nu = nd * u;
  const double slack = (nd + kBoundF64Roundings) * 0x1p-52;
  BoundFactors f;
  f.dot = nu < 0.5 ? (1 + nu / (1 - nu)) * (1 + slack)
                   : std::numeric_limits<double>::infinity();
  f.dot_abs = nd * eta;
  f.scale = std::fabs(static_cast<double>(scale)) * (1 + u);
  return f;
}

// B >= |S_ij| for every key of a key set whose largest k row norm is kn,
// for a query row of norm qn (both in f64 from the f32 rows), rounded up to
// f32; +inf when the f32 dot product could overflow or a norm is not
// finite.
inline float LogitBound(const BoundFactors& f, double qn, double kn) {
  constexpr double kEta = 0x1p-149;
  const double c = qn * kn * f.dot + f.dot_abs;
  if (!(c <= std::numeric_limits<float>::max()))
    return std::numeric_limits<float>::infinity();
  const double b = c * f.scale + kEta;
  float r = static_cast<float>(b);
  if (static_cast<double>(r) < b)
    r = std::nextafter(r, std::numeric_limits<float>::infinity());
  return r;
}

// The largest fixed shift a key set whose smallest nonzero |v| is v_min
// allows (subnormal products, top of file): min(kFixedShiftMax,
// ln(v_min / FLT_MIN) / 2), rounded down; kFixedShiftMax for a v without a
// nonzero finite value.
inline float ShiftCap(float v_min) {
  const double lim = 0.5 * std::log(static_cast<double>(v_min) /
                                    std::numeric_limits<float>::min());
  if (!(lim < kFixedShiftMax)) return kFixedShiftMax;
  float r = static_cast<float>(lim);
  if (static_cast<double>(r) > lim)
    r = std::nextafter(r, -std::numeric_limits<float>::infinity());
  return r;
}

// Running minimum of the nonzero |x[d]|, d < n (a multiple of Lanes(DF)).
HWY_INLINE VF MinNonzeroAbs(VF acc, const float* HWY_RESTRICT x, size_t n) {
  const DF df;
  const VF inf = hn::Set(df, std::numeric_limits<float>::infinity());
  for (size_t d = 0; d < n; d += hn::Lanes(df)) {
    const VF a = hn::Abs(hn::LoadU(df, x + d));
    acc = hn::Min(acc, hn::IfThenElse(hn::Eq(a, hn::Zero(df)), inf, a));
  }
  return acc;
}

// The visible keys of query i of batch b, an interval [first, lim) of
// [0, kv_len) (attention.h's visible_keys: causal, padding and the window):
// lim[b * Nq + i] and first[b * Nq + i], first = lim when the row sees no
// key. Without a window, first = 0 (a prefix). Both ends are nondecreasing
// in i within a batch (every mask part's bounds are).
inline void ComputeLimits(const AttentionProblem& p, int64_t* lim,
                          int64_t* first) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i) {
      const KeyRange kr = visible_keys(p.mask, b, i, p.q_len, p.kv_len);
      lim[b * p.q_len + i] = kr.end;
      first[b * p.q_len + i] = kr.begin;
    }
}

// Visible keys of a row with limit `lim` inside the key block starting at j0.
inline size_t VisibleInBlock(int64_t lim, size_t j0) {
  const int64_t left = lim - static_cast<int64_t>(j0);
  return left <= 0 ? 0 : std::min(kKeyBlock, static_cast<size_t>(left));
}

// The first visible column of a row whose first key is `first` inside the
// key block starting at j0 (0 without a window).
inline size_t FirstInBlock(int64_t first, size_t j0) {
  const int64_t left = first - static_cast<int64_t>(j0);
  return left <= 0 ? 0 : std::min(kKeyBlock, static_cast<size_t>(left));
}

// ext[r] = the largest (Max) or smallest x over the keys [F[r], L[r]), for
// every row r < mr with a nonempty interval (others are left as they are);
// both ends nondecreasing in r over those rows. A monotone queue of key
// indices (room for the keys spanned, at most kv_len): O(mr + keys). x
// holds no NaN.
template <bool Max, class T>
void RangeExtremes(const T* x, const int64_t* F, const int64_t* L, size_t mr,
                   int64_t* queue, T* ext) {
  size_t head = 0, tail = 0;
  int64_t next = 0;  // the next key to enter the queue
  for (size_t r = 0; r < mr; ++r) {
    if (F[r] >= L[r]) continue;
    next = std::max(next, F[r]);
    for (; next < L[r]; ++next) {
      while (tail > head && (Max ? !(x[queue[tail - 1]] > x[next])
                                 : !(x[queue[tail - 1]] < x[next])))
        --tail;
      queue[tail++] = next;
    }
    while (queue[head] < F[r]) ++head;  // the back is key L[r] - 1
    ext[r] = x[queue[head]];
  }
}

// Lanes of v at column positions >= kv (row-relative, j is v's first column)
// replaced by `fill`.
HWY_INLINE VF MaskColumns(VF v, size_t j, size_t kv, VF fill) {
  const DF df;
  const size_t N = hn::Lanes(df);
  if (j + N <= kv) return v;
  if (j >= kv) return fill;
  return hn::IfThenElse(hn::FirstN(df, kv - j), v, fill);
}

// Lanes of v at column positions < lo (a window's first visible column)
// replaced by `fill`; v itself when lo <= j (always without a window).
HWY_INLINE VF MaskColumnsBelow(VF v, size_t j, size_t lo, VF fill) {
  const DF df;
  const size_t N = hn::Lanes(df);
  if (j >= lo) return v;
  if (j + N <= lo) return fill;
  return hn::IfThenElse(hn::FirstN(df, lo - j), fill, v);
}

// The logit S = RN(scale * c) clamped to [-FLT_MAX, FLT_MAX]; a NaN c (an
// sdpa dot product whose f32 terms overflowed with both signs) gives
// -FLT_MAX. Why: a logit that overflows f32 is +-inf, the running max is then
// inf, and S - m = inf - inf = NaN reaches hn::Exp, which converts it to int:
// UB on EMU128 (UBSan, fuzz finding crash-simd-emu128-nan-logit), garbage
// elsewhere. Clamped, every S - m is finite or -inf (Exp gives 0) and every
// output is finite. Such inputs are outside the f32 entries' representable
// domain (their values are not judged), but must stay defined. Max(x, lo)
// is lo for a NaN x on every attainable target: x86 maxps returns its second
// operand, EMU128 and SCALAR the non-NaN one (tested on every target:
// simd/tests/attention_test.cc, OverflowingLogitsStayFinite).
HWY_INLINE VF Logit(VF c, VF vscale) {
  const DF df;
  const VF lo = hn::Set(df, -std::numeric_limits<float>::max());
  const VF hi = hn::Set(df, std::numeric_limits<float>::max());
  return hn::Min(hn::Max(hn::Mul(c, vscale), lo), hi);
}

// The logits of a problem: Logit, then the softcap where it has one
// (attention.h): S' = cap Tanh(S fl(1 / cap)), Highway's Tanh within 4 ulp
// (the roundings rule.h's "The logit softcap" counts). A clamped logit caps
// to +-cap, so S' stays finite. |S'| <= |S|: a fixed shift B_i >= |S| of
// the uncapped logits (top of file) bounds the capped ones too.
struct Logits {
  VF vscale, vcap, vinv;
  bool capped;
  explicit Logits(const AttnShape& s) {
    const DF df;
    vscale = hn::Set(df, s.scale);
    vcap = hn::Set(df, s.cap);
    vinv = hn::Set(df, s.inv_cap);
    capped = s.cap > 0;
  }
  HWY_INLINE VF operator()(VF c) const {
    const VF x = Logit(c, vscale);
    if (!capped) return x;
    const DF df;
    return hn::Mul(vcap, hn::Tanh(df, hn::Mul(x, vinv)));
  }
  // d S' / d S = 1 - (S' / cap)^2 at the capped logit sc (capped only).
  HWY_INLINE VF Slope(VF sc) const {
    const DF df;
    const VF t = hn::Mul(sc, vinv);
    return hn::NegMulAdd(t, t, hn::Set(df, 1.0f));
  }
};

// exp(x) for x in [-86, 88] (the fixed-shift softmax's arguments S - B_i,
// >= -2 B_i >= -2 kFixedShiftMax up to rounding): hn::Exp's range reduction and
// polynomial without its range handling (issue 18: 121 -> 78 us of 664 at
// d64 n128, one thread). q = RN(x / ln 2) by adding 1.5 * 2^23 (t = M + q
// exactly: the sum's ulp is 1), where hn::Exp rounds x / ln 2 +- 1/2 and
// truncates: q differs only when x / ln 2 is within ~2^-17 of a half-integer,
// and then either reduced argument r = x - q ln 2 lies in hn::Exp's own
// range [-ln2/2, ln2/2] (up to that 2^-17), where its polynomial and the
// two-part ln 2 give its documented 1 ULP. 2^q is applied by adding q to the
// exponent field, exact when the result is normal (q >= -125, i.e. x >=
// -86.6), as are hn::Exp's two multiplications by powers of 2. Hence max
// error 1 ULP on the domain, and ExpBounded(0) = 1 exactly (r = 0, q = 0).
// Outside the domain the result is garbage: callers guarantee it.
HWY_INLINE VF ExpBounded(VF x) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const VF kMagic = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  const VF t =
      hn::MulAdd(x, hn::Set(df, 1.442695040888963407359924681f), kMagic);
  const VF qf = hn::Sub(t, kMagic);
  // hn::Exp's ExpReduce: kLn2Part0f + kLn2Part1f ~= -ln(2).
  VF r = hn::MulAdd(qf, hn::Set(df, -0.693145751953125f), x);
  r = hn::MulAdd(qf, hn::Set(df, -1.428606765330187045e-6f), r);
  // hn::Exp's ExpPoly.
  const VF k0 = hn::Set(df, +0.5f);
  const VF k1 = hn::Set(df, +0.166666671633720397949219f);
  const VF k2 = hn::Set(df, +0.0416664853692054748535156f);
  const VF k3 = hn::Set(df, +0.00833336077630519866943359f);
  const VF k4 = hn::Set(df, +0.00139304355252534151077271f);
  const VF k5 = hn::Set(df, +0.000198527617612853646278381f);
  const VF poly =
      hn::MulAdd(hwy::HWY_NAMESPACE::impl::Estrin(r, k0, k1, k2, k3, k4, k5),
                 hn::Mul(r, r), r);
  const VF y = hn::Add(poly, hn::Set(df, 1.0f));
  // (bits(t) << 23) = q << 23: bits(M) has 9 zero low bits.
  const auto e = hn::ShiftLeft<23>(hn::BitCast(di, t));
  return hn::BitCast(df, hn::Add(hn::BitCast(di, y), e));
}

// Writes row `r` (Dp floats) as column (j % kKeyBlock) of the transposed
// block layout [nkb][Dp][kKeyBlock].
HWY_INLINE void ScatterTransposed(const float* row, size_t j, size_t Dp,
                                  float* blocks) {
  float* col = blocks + (j / kKeyBlock) * Dp * kKeyBlock + (j % kKeyBlock);
  for (size_t d = 0; d < Dp; ++d) col[d * kKeyBlock] = row[d];
}

// Keys packed per PackTransposed call.
inline constexpr size_t kPackRows = 8;

// Writes the kPackRows rows rows[t * ld] (Dp floats each; keys j0 + t, j0 a
// multiple of kPackRows) as columns of the transposed block layout, as
// ScatterTransposed does one row at a time. On 256-bit x86 targets by 8 x 8
// register transposes: the scalar scatter was ~3 instructions per element,
// the largest part of the K/V setup at n = 128 after the v scan
// (callgrind, issue 18).
HWY_INLINE void PackTransposed(const float* HWY_RESTRICT rows, size_t ld,
                               size_t j0, size_t Dp,
                               float* HWY_RESTRICT blocks) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static_assert(kPackRows == 8 && kKeyBlock % 8 == 0, "8 x 8 transposes");
  const hn::Full256<float> d8;
  const hn::Full256<double> dd;
  float* dst = blocks + (j0 / kKeyBlock) * Dp * kKeyBlock + (j0 % kKeyBlock);
  size_t d = 0;
  for (; d + 8 <= Dp; d += 8) {
    using V8 = hn::Vec<decltype(d8)>;
    V8 r[8];
    for (size_t t = 0; t < 8; ++t) r[t] = hn::LoadU(d8, rows + t * ld + d);
    // Pairs of rows interleaved: t[2k] = (a0 b0 a1 b1 | a4 b4 a5 b5), ...
    V8 t[8];
    for (size_t k = 0; k < 4; ++k) {
      t[2 * k] = hn::InterleaveLower(d8, r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = hn::InterleaveUpper(d8, r[2 * k], r[2 * k + 1]);
    }
    // Quads: u[.] = (a_c b_c c_c d_c | a_c+4 b_c+4 c_c+4 d_c+4).
    hn::Vec<decltype(dd)> u[8];
    for (size_t k = 0; k < 2; ++k) {
      const auto x0 = hn::BitCast(dd, t[4 * k]),
                 x1 = hn::BitCast(dd, t[4 * k + 1]);
      const auto x2 = hn::BitCast(dd, t[4 * k + 2]),
                 x3 = hn::BitCast(dd, t[4 * k + 3]);
      u[4 * k + 0] = hn::InterleaveLower(dd, x0, x2);  // column 0 | 4
      u[4 * k + 1] = hn::InterleaveUpper(dd, x0, x2);  // column 1 | 5
      u[4 * k + 2] = hn::InterleaveLower(dd, x1, x3);  // column 2 | 6
      u[4 * k + 3] = hn::InterleaveUpper(dd, x1, x3);  // column 3 | 7
    }
    for (size_t c = 0; c < 4; ++c) {
      const V8 lo = hn::BitCast(d8, u[c]), hi = hn::BitCast(d8, u[4 + c]);
      hn::StoreU(hn::ConcatLowerLower(d8, hi, lo), d8,
                 dst + (d + c) * kKeyBlock);
      hn::StoreU(hn::ConcatUpperUpper(d8, hi, lo), d8,
                 dst + (d + c + 4) * kKeyBlock);
    }
  }
  for (; d < Dp; ++d)
    for (size_t t = 0; t < 8; ++t) dst[d * kKeyBlock + t] = rows[t * ld + d];
#else
  for (size_t t = 0; t < kPackRows; ++t)
    ScatterTransposed(rows + t * ld, j0 + t, Dp, blocks);
#endif
}

// The two sides (formulation-inl.h) and their per-row records.
struct Sides {
  SideSpec q, k;
  NormInfo *q_info, *k_info;
  RowStat *q_stats, *k_stats;
};

// Normalizes q into qh ([BH][Nq][Dp]) and k into kh ([BHk][Nk][Dp]), dense
// and zero padded, as each side's formulation says. generic_only: a side is
// prepared here only if it is generic; the kernels load and normalize raw
// and unit-l2 rows themselves (LoadSide), where the rows are used, several
// rows at a time (issue 18).
template <Precision P>
Sides PrepareSides(const AttentionProblem& p, const NormParams& prm,
                   const ConstTensor4& q, const ConstTensor4& k,
                   const AttnShape& s, SimdWorkspace& ws, ThreadPool& pool,
                   float* qh, float* kh, bool generic_only) {
  const size_t Dp = s.Dp;
  const size_t nq = ParamDoubles(p, 0, Dp);
  double* params = ws.params.Get(nq + ParamDoubles(p, 1, Dp));
  Sides sd;
  sd.q = MakeSide<P>(p, 0, Dp, prm, params);
  sd.k = MakeSide<P>(p, 1, Dp, prm, params + nq);
  sd.q_info = ws.q_info.Get(static_cast<size_t>(s.BH * s.Nq));
  sd.k_info = ws.k_info.Get(static_cast<size_t>(s.BHk * s.Nk));
  sd.q_stats = ws.q_stats.Get(static_cast<size_t>(s.BH * s.Nq));
  sd.k_stats = ws.k_stats.Get(static_cast<size_t>(s.BHk * s.Nk));
  // RoPE: one table of cos and sin per call, shared by both sides (their
  // positions overlap: rope-inl.h).
  if (has_rope(p)) {
    float* table = ws.rope.Get(RopeTableFloats(p));
    BuildRopeTable(p, table, ws.rope_scratch.Get(RopeScratchDoubles(p)));
    sd.q.rope = MakeRopeSide(p, 0, sd.q.mode == SideMode::kRaw, table);
    sd.k.rope = MakeRopeSide(p, 1, sd.k.mode == SideMode::kRaw, table);
  }
  const bool q_here = !generic_only || sd.q.mode == SideMode::kGeneric;
  const bool k_here = !generic_only || sd.k.mode == SideMode::kGeneric;
  const int64_t tq = q_here ? sd.q.prep_tasks() : 0;
  pool.Run(tq + (k_here ? sd.k.prep_tasks() : 0), [&](int64_t task, int) {
    if (task < tq)
      PrepSideTask<P>(sd.q, q, task, qh, sd.q_info, sd.q_stats);
    else
      PrepSideTask<P>(sd.k, k, task - tq, kh, sd.k_info, sd.k_stats);
  });
  return sd;
}

// The rows [n0, n0 + rows) of head (b, h) of a raw or unit-l2 side (not
// generic) into dst (stride Dp), normalized if unit l2, their records in
// info (info[t] for row n0 + t): what PrepareSides gives them.
template <Precision P>
HWY_INLINE void LoadSide(const SideSpec& sp, const ConstTensor4& x, int64_t b,
                         int64_t h, size_t n0, size_t rows, const AttnShape& s,
                         float* HWY_RESTRICT dst, NormInfo* HWY_RESTRICT info) {
  for (size_t t = 0; t < rows; ++t)
    LoadRow<P>(RowPtr<P>(x, b, h, static_cast<int64_t>(n0 + t)),
               static_cast<size_t>(s.D), dst + t * s.Dp, s.Dp);
  // RoPE (rope-inl.h) while the rows are in L1: x before the unit
  // normalization (kBeforeNorm, raw rows), u after it (kAfterNorm).
  const bool rope = sp.rope.on();
  const int64_t n = static_cast<int64_t>(n0);
  if (rope && sp.rope.before) RotateRows<false>(sp.rope, n, rows, dst, s.Dp);
  if (sp.mode == SideMode::kUnitL2)
    NormalizeRows(dst, s.Dp, rows, s.Dp, s.eps, info);
  if (rope && !sp.rope.before) RotateRows<false>(sp.rope, n, rows, dst, s.Dp);
}

// The norm bound of a side's rows as the GEMM reads them where they are
// unit l2 rows, else 0 (the bound computes their norms): kUnitRowNorm, or
// under RoPE after the normalization (y = R u, rotated in f32) that times
// kRopeRowSlack (its derivation there). Before it, u = x' / ||x'|| of the
// rotated x' keeps kUnitRowNorm.
HWY_INLINE double UnitRowNorm(const SideSpec& sp) {
  if (sp.mode != SideMode::kUnitL2) return 0;
  return sp.rope.on() && !sp.rope.before ? kUnitRowNorm * kRopeRowSlack
                                         : kUnitRowNorm;
}

// ------------------------------------------------------------------ forward

// Prefetches the rows [n0, n0 + rows) of head (b, h) of a view (row n0 <
// the view's rows; rows past `n` are skipped), D elements each, into the
// cache; for writing (prefetchw) where Write. Windows at large n: the input
// rows of the next key and query blocks and the output rows are then
// fetched while the products run (without it, copying them in was ~20% of
// the forward at n = 4096, d = 128: perf).
template <Precision P, bool Write, class Tensor>
HWY_INLINE void PrefetchRows(const Tensor& t, int64_t b, int64_t h, size_t n0,
                             size_t rows, size_t n, size_t D) {
  const size_t bytes = D * sizeof(StorageT<P>);
  for (size_t r = n0; r < std::min(n, n0 + rows); ++r) {
    const char* row = reinterpret_cast<const char*>(
        RowPtr<P>(t, b, h, static_cast<int64_t>(r)));
    for (size_t o = 0; o < bytes; o += 64)
      __builtin_prefetch(row + o, Write ? 1 : 0, 3);
    __builtin_prefetch(row + bytes - 1, Write ? 1 : 0, 3);
  }
}

// The key blocks [first block, end block) holding every visible key of the
// query rows with intervals [F[r], L[r]), r < mr (an empty range when no
// row sees a key).
struct BlockSpan {
  size_t first, end;
};
inline BlockSpan KeyBlocksOf(const int64_t* F, const int64_t* L, size_t mr,
                             int64_t Nk) {
  int64_t max_lim = 0, min_first = Nk;
  for (size_t r = 0; r < mr; ++r)
    if (L[r] > F[r]) {
      max_lim = std::max(max_lim, L[r]);
      min_first = std::min(min_first, F[r]);
    }
  const size_t end = (static_cast<size_t>(max_lim) + kKeyBlock - 1) / kKeyBlock;
  return {max_lim > 0 ? static_cast<size_t>(min_first) / kKeyBlock : end, end};
}

// The fixed shift's running inputs over a kv head's keys (no window): the
// largest ||k||^2 and its sqrt (NaN once a row's is: the rows that see it
// stay online), the smallest nonzero |v| and its cap.
struct PackRunning {
  double k2 = 0, kn = 0;
  float v_min = std::numeric_limits<float>::infinity(), cap = kFixedShiftMax;
};

template <Precision P>
void AttentionForward(const AttentionProblem& p, const ForwardArgs& a,
                      SimdWorkspace& ws, int threads, double* probs) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const AttnShape s = MakeShape(p);
  const size_t Dp = s.Dp, Kb = kKeyBlock, Mq = kQueryBlock;
  const size_t Nq = static_cast<size_t>(s.Nq), Nk = static_cast<size_t>(s.Nk);

  const size_t BHk = static_cast<size_t>(s.BHk);
  const size_t T = static_cast<size_t>(threads);
  float* qh = ws.qh.Get(static_cast<size_t>(s.BH) * Nq * Dp);
  float* kh = ws.kh.Get(BHk * Nk * Dp);
  int64_t* lim = ws.limits.Get(2 * static_cast<size_t>(s.B) * Nq);
  int64_t* first = lim + static_cast<size_t>(s.B) * Nq;
  const bool window = has_window(p.mask);
  // Per worker: S/P tile, O accumulator, m, l, one row, the q rows.
  const size_t per_worker =
      (Mq * Kb + 2 * Mq * Dp + 2 * Mq + Dp + 15) / 16 * 16;
  float* scratch = ws.scratch.Get(per_worker * T);
  ComputeLimits(p, lim, first);
  ThreadPool& pool = ws.pool(threads);

  // Windows (issue 34): K/V are packed inside the tasks that read them, per
  // (batch, kv head) and chunk of query blocks, into a per-worker ring of
  // `ring` key blocks (the most any query block spans) just before the
  // query block that first needs them: the blocks are then still in cache
  // when the products read them (packing every head up front staged n x Dp
  // floats per kv head and tensor, read back from memory at n >= 1024).
  // Each key block is packed once per chunk (chunks = tasks of one kv
  // head), so at most `chunks - 1` times (ring - 1) blocks are packed twice;
  // used where that is at most half the blocks. The packed values do not
  // depend on where they are packed: results are the same bitwise.
  size_t ring = 0, chunks = 1;
  if (window) {
    for (int64_t b = 0; b < s.B; ++b)
      for (size_t i0 = 0; i0 < Nq; i0 += Mq) {
        const size_t o = static_cast<size_t>(b) * Nq + i0;
        const BlockSpan sp =
            KeyBlocksOf(first + o, lim + o, std::min(Mq, Nq - i0), s.Nk);
        if (sp.end > sp.first) ring = std::max(ring, sp.end - sp.first);
      }
    const size_t want = std::max<size_t>(kTargetTasks, 4 * T);
    chunks = std::min(s.nqb, std::max<size_t>(1, (want + BHk - 1) / BHk));
    if (ring == 0 || (chunks - 1) * (ring - 1) * 2 > s.nkb) ring = 0;
  }
  const bool local = ring > 0;
  const size_t kt_floats = local ? T * ring * Kb * Dp : BHk * s.Nkp * Dp;
  float* kt = ws.kt.Get(kt_floats);
  float* vv = ws.v.Get(kt_floats);
  // Per kv head (per worker when local), by key: the fixed shift's inputs.
  const size_t key_rows = local ? T * Nk : BHk * Nk;
  // Windows: per worker a queue of key indices (RangeExtremes), then the
  // ring's tags (the key block each slot holds).
  int64_t* queues = window ? ws.key_queue.Get((Nk + ring) * T) : nullptr;

  // Generic sides are prepared here (their formulation); raw and unit-l2 k
  // rows are loaded and normalized by the packing below, which packs k_tilde
  // transposed and v, one task per (batch, kv head) (windows: inside the
  // tasks, above); raw and unit-l2 q rows by each attention task, for its
  // own rows (fused: the rows are then in L1 for the first product).
  const Sides sd =
      PrepareSides<P>(p, a.params, a.q, a.k, s, ws, pool, qh, kh, true);
  // The fixed shift's inputs (top of file), per kv head and key prefix
  // [0, j]: the largest k row norm and the shift cap of v, gathered while
  // the rows are in L1. Prefixes, so that a row's bound depends on its
  // visible keys only (masked keys change nothing, bitwise). With a window
  // the rows' keys are intervals: then per key j its own norm (+inf for a
  // NaN one: the rows that see it stay online) and its min nonzero |v|
  // (+inf: none), which each task reduces over its rows' intervals.
  const bool bound = !ws.online_softmax;
  const double q_unit = UnitRowNorm(sd.q), k_unit = UnitRowNorm(sd.k);
  double* k_norm = ws.k_norm.Get(key_rows);
  float* shift_cap = ws.shift_cap.Get(key_rows);
  // Packs the kPackRows keys j0.. (j0 a multiple of kPackRows) of kv head bk
  // = (b, hk): k_tilde transposed into the key block at ktblk, v into the
  // block at vblk (rows by key), the fixed shift's inputs into knb[j],
  // capb[j]; the k rows are staged in `stage` (normalized here unless the
  // side is generic).
  auto pack_rows = [&](int64_t b, int64_t hk, size_t bk, size_t j0,
                       float* HWY_RESTRICT stage, float* HWY_RESTRICT ktblk,
                       float* HWY_RESTRICT vblk, double* knb, float* capb,
                       PackRunning& run) {
    const size_t jb = j0 % Kb;
    const float* khb = kh + bk * Nk * Dp;
    NormInfo info[kPackRows];
    for (size_t t = 0; t < kPackRows; ++t) {
      const size_t j = j0 + t;
      float* kr = stage + t * Dp;
      float* vr = vblk + (jb + t) * Dp;
      if (j >= Nk) {
        std::fill(vr, vr + Dp, 0.0f);
        std::fill(kr, kr + Dp, 0.0f);
        continue;
      }
      LoadRow<P>(RowPtr<P>(a.v, b, hk, static_cast<int64_t>(j)),
                 static_cast<size_t>(s.D), vr, Dp);
      if (bound && window) {
        const float vm = hn::GetLane(hn::MinOfLanes(
            df,
            MinNonzeroAbs(hn::Set(df, std::numeric_limits<float>::infinity()),
                          vr, Dp)));
        capb[j] = std::isnan(vm) ? std::numeric_limits<float>::infinity() : vm;
      } else if (bound) {
        const float vm = hn::GetLane(
            hn::MinOfLanes(df, MinNonzeroAbs(hn::Set(df, run.v_min), vr, Dp)));
        if (vm < run.v_min)
          run.v_min = vm, run.cap = ShiftCap(vm);  // rarely: a log
        capb[j] = run.cap;
      }
      if (sd.k.mode == SideMode::kGeneric)
        std::copy(khb + j * Dp, khb + (j + 1) * Dp, kr);
    }
    if (sd.k.mode != SideMode::kGeneric && j0 < Nk)
      LoadSide<P>(sd.k, a.k, b, hk, j0, std::min(kPackRows, Nk - j0), s, stage,
                  info);
    // The k rows as the GEMM reads them: the running norm bound.
    for (size_t t = 0; bound && t < kPackRows && j0 + t < Nk; ++t) {
      const double r2 =
          k_unit > 0 ? k_unit * k_unit : SumSquaresF64(stage + t * Dp, Dp);
      if (window) {
        knb[j0 + t] = std::isnan(r2) ? std::numeric_limits<double>::infinity()
                                     : std::sqrt(r2);
        continue;
      }
      if (!(r2 <= run.k2) && !std::isnan(run.k2))
        run.k2 = r2, run.kn = std::sqrt(r2);
      knb[j0 + t] = run.kn;
    }
    PackTransposed(stage, Dp, jb, Dp, ktblk);
  };
  if (!local) {
    pool.Run(s.BHk, [&](int64_t bk, int worker) {
      const size_t k = static_cast<size_t>(bk);
      float* stage = scratch + per_worker * static_cast<size_t>(worker);
      float* ktb = kt + k * s.Nkp * Dp;
      float* vb = vv + k * s.Nkp * Dp;
      PackRunning run;
      for (size_t j0 = 0; j0 < s.Nkp; j0 += kPackRows) {
        const size_t kb = j0 / Kb;
        pack_rows(bk / s.Hk, bk % s.Hk, k, j0, stage, ktb + kb * Dp * Kb,
                  vb + kb * Kb * Dp, k_norm + k * Nk, shift_cap + k * Nk, run);
      }
    });
  }

  const VF neg_inf = hn::Set(df, kNegInf);
  const Logits logit(s);
  const bool sinks = has_sinks(p);
  const BoundFactors bf = MakeBoundFactors(s.scale, Dp);
  float* row_shift =
      probs ? ws.row_shift.Get(static_cast<size_t>(s.BH) * Nq) : nullptr;
  // The query block at row i0 of head bh, its key block kb at kt_of(kb)
  // (transposed) and v_of(kb) (rows), the fixed shift's per-key inputs of
  // its kv head at knb[j], capb[j].
  auto attend = [&](int64_t bh, size_t i0, int worker, auto kt_of, auto v_of,
                    const double* knb, const float* capb) {
    const int64_t b = bh / s.H, h = bh % s.H;
    const size_t mr = std::min(Mq, Nq - i0);
    // The head's sink in f32 (top of file, "Sinks").
    const float sink =
        sinks ? static_cast<float>(p.sinks[static_cast<size_t>(h)]) : 0.0f;
    const int64_t* L = lim + static_cast<size_t>(b) * Nq + i0;
    const int64_t* F = first + static_cast<size_t>(b) * Nq + i0;
    float* S = scratch + per_worker * static_cast<size_t>(worker);
    float* O = S + Mq * Kb;
    float* m = O + Mq * Dp;
    float* l = m + Mq;
    // Raw and unit-l2 q rows are loaded (and normalized) here, for this
    // task's rows, into the worker's scratch (staying in cache); generic ones
    // were prepared by PrepareSides.
    float* qrows = sd.q.mode == SideMode::kGeneric
                       ? qh + (static_cast<size_t>(bh) * Nq + i0) * Dp
                       : l + Mq + Dp;
    if (sd.q.mode != SideMode::kGeneric) {
      NormInfo info[kQueryBlock];
      LoadSide<P>(sd.q, a.q, b, h, i0, mr, s, qrows, info);
    }
    // Per row: the fixed shift B_i of bounded logits (top of file), or
    // kOnlineRow: the online softmax.
    float shift[kQueryBlock];
    // Windows: each row's largest k norm and smallest nonzero |v| over its
    // keys [F, L).
    double k_max[kQueryBlock];
    float v_low[kQueryBlock];
    if (bound && window) {
      int64_t* queue = queues + (Nk + ring) * static_cast<size_t>(worker);
      RangeExtremes<true>(knb, F, L, mr, queue, k_max);
      RangeExtremes<false>(capb, F, L, mr, queue, v_low);
    }
    // ShiftCap of the last row's v_low: neighbouring window rows mostly
    // share it (a log saved per row).
    float cap_of = std::numeric_limits<float>::quiet_NaN(), cap_is = 0;
    for (size_t r = 0; r < mr; ++r) {
      shift[r] = kOnlineRow;
      if (bound && L[r] > F[r]) {
        const size_t last = static_cast<size_t>(L[r] - 1);
        const double qn =
            q_unit > 0 ? q_unit : std::sqrt(SumSquaresF64(qrows + r * Dp, Dp));
        const float B = LogitBound(bf, qn, window ? k_max[r] : knb[last]);
        float cap = capb[last];
        if (window) {
          if (!(v_low[r] == cap_of))
            cap_of = v_low[r], cap_is = ShiftCap(cap_of);
          cap = cap_is;
        }
        if (B <= cap) shift[r] = B;
      }
      m[r] = shift[r] >= 0 ? shift[r] : kNegInf;
      l[r] = 0;
    }
    std::fill(O, O + mr * Dp, 0.0f);
    // The key blocks [kb_first, nblocks) hold every visible key of the
    // task's rows (kb_first = 0 without a window).
    const BlockSpan span = KeyBlocksOf(F, L, mr, s.Nk);
    const size_t kb_first = span.first, nblocks = span.end;

    // Per-row limits of the masked tiles: row r needs the keys [klo[r],
    // kvr[r]) of the block (kvr = 0: none; klo = 0 without a window); S is
    // formed, exponentiated and multiplied into V only up to each row
    // group's largest kvr (GemmLimited), so the blocks on a causal diagonal
    // cost about their visible half; the columns before klo are masked (P =
    // 0), and S (from its vector holding it) and O += P V start at the
    // group's smallest klo (a window's first block: its upper triangle).
    size_t kvr[kQueryBlock], klo[kQueryBlock], width[kQueryBlock];
    for (size_t kb = kb_first; kb < nblocks; ++kb) {
      const size_t j0 = kb * Kb;
      for (size_t r = 0; r < mr; ++r) {
        const size_t hi = VisibleInBlock(L[r], j0);
        const size_t lo = window ? FirstInBlock(F[r], j0) : 0;
        kvr[r] = lo < hi ? hi : 0;
        klo[r] = lo < hi ? lo : Kb;
      }
      // Columns of S each row's group forms (a multiple of N): P is defined
      // (0 past kv) on all of them, the k range of the O += P V group.
      for (size_t r0 = 0; r0 < mr; r0 += kGemmRows) {
        const size_t r1 = std::min(mr, r0 + kGemmRows);
        const size_t w =
            (*std::max_element(kvr + r0, kvr + r1) + N - 1) / N * N;
        std::fill(width + r0, width + r1, w);
      }
      GemmLimited(mr, Kb, Dp, qrows, static_cast<ptrdiff_t>(Dp), 1, kt_of(kb),
                  Kb, S, Kb, /*accumulate=*/false,
                  RowLimits{kvr, nullptr, nullptr, window ? klo : nullptr});
      for (size_t r = 0; r < mr; ++r) {
        float* sr = S + r * Kb;
        const size_t kv = kvr[r];
        // Vectors holding a visible key: [0, kvv); zeros on [kvv, width).
        const size_t kvv = (kv + N - 1) / N * N;
        for (size_t j = kvv; j < width[r]; j += N)
          hn::StoreU(hn::Zero(df), df, sr + j);
        if (kv == 0) continue;
        // Window: vectors before the row's first key hold P = 0 (jlo = 0
        // without a window).
        const size_t lo = klo[r], jlo = lo / N * N;
        for (size_t j = 0; j < jlo; j += N)
          hn::StoreU(hn::Zero(df), df, sr + j);
        if (shift[r] >= 0) {  // P = exp(S - B_i): one pass, no rescaling
          const VF vshift = hn::Set(df, shift[r]);
          // A row's only visible key: keep its logit for the epilogue
          // (without a sink: with one the row is no single key).
          if (!sinks && L[r] - F[r] == 1 && static_cast<size_t>(F[r]) >= j0)
            m[r] = hn::GetLane(logit(hn::Set(df, sr[F[r] - j0])));
          VF vsum = hn::Zero(df);
          for (size_t j = jlo; j < kvv; j += N) {
            const VF x = logit(hn::LoadU(df, sr + j));
            const VF e =
                MaskColumnsBelow(MaskColumns(ExpBounded(hn::Sub(x, vshift)), j,
                                             kv, hn::Zero(df)),
                                 j, lo, hn::Zero(df));
            hn::StoreU(e, df, sr + j);
            vsum = hn::Add(vsum, e);
          }
          l[r] += hn::GetLane(hn::SumOfLanes(df, vsum));
          continue;
        }
        // m is the running max of the logits S = RN(c * scale); P = exp(S -
        // m), so the key holding the max gets P = exp(0) = 1 exactly and a
        // row with one visible key gets l = 1, lse = S and O = V exactly (as
        // does the naive reference; the fixed path above gets these rows
        // from its own epilogue: exp(S - B_i) carries exp's 1 ulp).
        // The max pass stores the logits in place, so the exp pass reads
        // them instead of forming them again (the clamp of Logit would
        // otherwise cost ~7% of the forward at n = 128, measured).
        VF vmax = neg_inf;
        for (size_t j = jlo; j < kvv; j += N) {
          const VF x = logit(hn::LoadU(df, sr + j));
          hn::StoreU(x, df, sr + j);
          vmax = hn::Max(vmax, MaskColumnsBelow(MaskColumns(x, j, kv, neg_inf),
                                                j, lo, neg_inf));
        }
        const float m_new =
            std::max(m[r], hn::GetLane(hn::MaxOfLanes(df, vmax)));
        const float alpha = m[r] == m_new     ? 1.0f
                            : m[r] == kNegInf ? 0.0f
                                              : std::exp(m[r] - m_new);
        const VF vm = hn::Set(df, m_new);
        VF vsum = hn::Zero(df);
        for (size_t j = jlo; j < kvv; j += N) {
          const VF e = MaskColumnsBelow(
              MaskColumns(hn::Exp(df, hn::Sub(hn::LoadU(df, sr + j), vm)), j,
                          kv, hn::Zero(df)),
              j, lo, hn::Zero(df));
          hn::StoreU(e, df, sr + j);
          vsum = hn::Add(vsum, e);
        }
        l[r] = l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, vsum));
        if (alpha != 1.0f) ScaleRow(O + r * Dp, Dp, alpha);
        m[r] = m_new;
      }
      // O += P V over each group's visible keys (P = 0 on the rest).
      GemmLimited(mr, Dp, Kb, S, static_cast<ptrdiff_t>(Kb), 1, v_of(kb), Dp, O,
                  Dp, /*accumulate=*/true,
                  RowLimits{nullptr, window ? klo : nullptr, kvr});
    }

    // Sinks: the sink as the row's last term (top of file, "Sinks"), on
    // either path; a fully masked row is the sink alone (below). O's factor
    // e^{m - m'} (f64: it may be far below f32's normal range where O / l
    // is not) joins the epilogue's 1 / l.
    double o_alpha[kQueryBlock];
    for (size_t r = 0; sinks && r < mr; ++r) {
      o_alpha[r] = 1.0;
      if (L[r] <= F[r]) continue;
      const float m_new = std::max(m[r], sink);
      if (m[r] != m_new)
        o_alpha[r] = m[r] == kNegInf ? 0.0
                                     : std::exp(static_cast<double>(m[r]) -
                                                static_cast<double>(m_new));
      l[r] = l[r] * static_cast<float>(o_alpha[r]) + std::exp(sink - m_new);
      m[r] = m_new;
    }

    for (size_t r = 0; r < mr; ++r) {
      const size_t i = i0 + r;
      float* orow = O + r * Dp;
      double lse;
      if (L[r] <= F[r]) {
        std::fill(orow, orow + Dp, 0.0f);
        lse = sinks ? static_cast<double>(sink)
                    : -std::numeric_limits<double>::infinity();
      } else if (!sinks && shift[r] >= 0 && L[r] - F[r] == 1) {
        // One visible key (key F): what the online path gives exactly,
        // O = V, lse = S (held in m), P = exp(S - lse) = 1 in the backward.
        const float* vf = v_of(static_cast<size_t>(F[r]) / Kb) +
                          static_cast<size_t>(F[r]) % Kb * Dp;
        std::copy(vf, vf + Dp, orow);
        lse = static_cast<double>(m[r]);
        m[r] = shift[r];  // the hook's shift (l = exp(S - B_i))
      } else {
        // O / l as O * (1 / l) in f64 lanes: 1 / l is within 2^-53
        // relative of the quotient's, so the one f32 rounding gives the
        // correctly rounded O / l except at near-ties (as NormalizeRowsT's
        // scaling), and l = 1 gives O exactly; ~12% of the epilogue cheaper
        // than vdivps at d = 64 (issue 18).
        ScaleRowF64(orow, Dp,
                    (sinks ? o_alpha[r] : 1.0) / static_cast<double>(l[r]));
        // In double: the f32 m and l are exact there, so lse is not rounded
        // to f32 (at |lse| ~ 25 that rounding is ~1e-6, and the backward's
        // P = exp(S - lse) would inherit it for the whole row).
        lse = static_cast<double>(m[r]) + std::log(static_cast<double>(l[r]));
      }
      StoreRow<P>(orow, static_cast<size_t>(s.D),
                  RowPtr<P>(a.o, b, h, static_cast<int64_t>(i)));
      a.lse[static_cast<size_t>(bh) * Nq + i] = lse;
    }

    if (probs == nullptr) return;
    // Inspection hook: the final probabilities exp(S - m) / l with the m, l
    // and the same S, Exp and masking as above (m = B_i on a fixed row, but
    // the sink where it exceeds B_i: then Exp), and each row's shift for
    // tests (workspace.h). With a sink, P over the real keys (a row sums to
    // 1 - e^{sink - lse}).
    std::copy(shift, shift + mr, row_shift + static_cast<size_t>(bh) * Nq + i0);
    for (size_t r = 0; r < mr; ++r) {
      double* pr = probs + (static_cast<size_t>(bh) * Nq + i0 + r) * Nk;
      std::fill(pr, pr + Nk, 0.0);
    }
    for (size_t kb = kb_first; kb < nblocks; ++kb) {
      const size_t j0 = kb * Kb;
      Gemm(mr, Kb, Dp, qrows, static_cast<ptrdiff_t>(Dp), 1, kt_of(kb), Kb, S,
           Kb, false);
      for (size_t r = 0; r < mr; ++r) {
        const size_t kv = VisibleInBlock(L[r], j0);
        const size_t lo = window ? FirstInBlock(F[r], j0) : 0;
        if (kv <= lo) continue;
        float* sr = S + r * Kb;
        const VF vm = hn::Set(df, m[r]), vl = hn::Set(df, l[r]);
        const bool bounded = shift[r] >= 0 && m[r] == shift[r];
        for (size_t j = 0; j < Kb; j += N) {
          const VF x = hn::Sub(logit(hn::LoadU(df, sr + j)), vm);
          // Fixed rows: x <= 0 up to rounding on the visible keys; the
          // lanes of masked keys (past kv, never copied out) may fall
          // outside ExpBounded's domain and hold garbage.
          const VF e = bounded ? ExpBounded(x) : hn::Exp(df, x);
          hn::StoreU(hn::Div(e, vl), df, sr + j);
        }
        double* pr = probs + (static_cast<size_t>(bh) * Nq + i0 + r) * Nk + j0;
        for (size_t j = lo; j < kv; ++j) pr[j] = static_cast<double>(sr[j]);
      }
    }
  };

  if (!local) {
    pool.Run(s.BH * static_cast<int64_t>(s.nqb), [&](int64_t task, int worker) {
      const int64_t bh = task / static_cast<int64_t>(s.nqb);
      const size_t i0 =
          static_cast<size_t>(task % static_cast<int64_t>(s.nqb)) * Mq;
      const size_t bk =
          static_cast<size_t>(bh / s.H * s.Hk + bh % s.H / s.group);
      const float* ktb = kt + bk * s.Nkp * Dp;
      const float* vb = vv + bk * s.Nkp * Dp;
      attend(
          bh, i0, worker, [&](size_t kb) { return ktb + kb * Dp * Kb; },
          [&](size_t kb) { return vb + kb * Kb * Dp; }, k_norm + bk * Nk,
          shift_cap + bk * Nk);
    });
    return;
  }
  // Windows: one task per (batch, kv head, chunk of query blocks); each
  // query block first packs the key blocks it needs that its worker's ring
  // does not hold yet, then runs for every query head of the kv head.
  pool.Run(s.BHk * static_cast<int64_t>(chunks), [&](int64_t task, int worker) {
    const size_t bk = static_cast<size_t>(task) / chunks;
    const size_t c = static_cast<size_t>(task) % chunks;
    const int64_t b = static_cast<int64_t>(bk) / s.Hk;
    const int64_t hk = static_cast<int64_t>(bk) % s.Hk;
    const size_t w = static_cast<size_t>(worker);
    float* rk = kt + w * ring * Kb * Dp;
    float* rv = vv + w * ring * Kb * Dp;
    double* knb = k_norm + w * Nk;
    float* capb = shift_cap + w * Nk;
    int64_t* tag = queues + (Nk + ring) * w + Nk;
    std::fill(tag, tag + ring, int64_t{-1});
    float* stage = scratch + per_worker * w;
    auto kt_of = [&](size_t kb) { return rk + kb % ring * Dp * Kb; };
    auto v_of = [&](size_t kb) { return rv + kb % ring * Kb * Dp; };
    for (size_t qb = c * s.nqb / chunks; qb < (c + 1) * s.nqb / chunks; ++qb) {
      const size_t i0 = qb * Mq, o = static_cast<size_t>(b) * Nq + i0;
      const BlockSpan sp =
          KeyBlocksOf(first + o, lim + o, std::min(Mq, Nq - i0), s.Nk);
      for (size_t kb = sp.first; kb < sp.end; ++kb) {
        int64_t& t = tag[kb % ring];
        if (t == static_cast<int64_t>(kb)) continue;
        PackRunning run;  // unused with a window
        for (size_t j0 = kb * Kb; j0 < (kb + 1) * Kb; j0 += kPackRows)
          pack_rows(b, hk, bk, j0, stage, kt_of(kb), v_of(kb), knb, capb, run);
        t = static_cast<int64_t>(kb);
      }
      // The next query block's new keys (mostly block sp.end) are read from
      // memory while this one runs.
      const size_t D = static_cast<size_t>(s.D);
      PrefetchRows<P, false>(a.k, b, hk, sp.end * Kb, Kb, Nk, D);
      PrefetchRows<P, false>(a.v, b, hk, sp.end * Kb, Kb, Nk, D);
      for (int64_t g = 0; g < s.group; ++g) {
        const int64_t h = hk * s.group + g;
        // This block's o rows (written at its end), the next q rows.
        PrefetchRows<P, true>(a.o, b, h, i0, Mq, Nq, D);
        if (g + 1 < s.group)
          PrefetchRows<P, false>(a.q, b, h + 1, i0, Mq, Nq, D);
        else
          PrefetchRows<P, false>(a.q, b, hk * s.group, i0 + Mq, Mq, Nq, D);
        attend(b * s.H + h, i0, worker, kt_of, v_of, knb, capb);
      }
    }
  });
}

// ----------------------------------------------------------------- backward

template <Precision P>
void AttentionBackward(const AttentionProblem& p, const BackwardArgs& a,
                       SimdWorkspace& ws, int threads) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const AttnShape s = MakeShape(p);
  const size_t Dp = s.Dp, Kb = kKeyBlock, Mq = kQueryBlock;
  const size_t Nq = static_cast<size_t>(s.Nq), Nk = static_cast<size_t>(s.Nk);
  const size_t BH = static_cast<size_t>(s.BH), BHk = static_cast<size_t>(s.BHk);
  const size_t group = static_cast<size_t>(s.group);
  // Key groups per kv head: ~kTargetTasks (query head x key group) units of
  // work in all (a GQA task walks its group's query heads).
  const size_t G =
      std::min<size_t>(s.nkb, static_cast<size_t>(std::max<int64_t>(
                                  1, (kTargetTasks + s.BH - 1) / s.BH)));

  float* qh = ws.qh.Get(BH * Nq * Dp);
  float* kh = ws.kh.Get(BHk * Nk * Dp);
  float* kt = ws.kt.Get(BHk * s.Nkp * Dp);
  float* vt = ws.vt.Get(BHk * s.Nkp * Dp);
  float* dO = ws.d_o.Get(BH * Nq * Dp);
  // delta, and lse split into f32 hi + lo (lse = hi + lo to ~2^-48
  // relative), so that S - lse = (c * scale - hi) - lo keeps the double lse.
  float* stats = ws.row_stats.Get(3 * BH * Nq);
  float* delta = stats;
  float* lse_hi = stats + BH * Nq;
  float* lse_lo = stats + 2 * BH * Nq;
  float* dq_part = ws.dq_partial.Get(G * BH * Nq * Dp);
  // Per task dg, then (sinks) per (batch, head) its rows' dsinks terms.
  const bool sinks = has_sinks(p);
  double* task_dg = ws.task_sums.Get(BHk * G + (sinks ? BH : 0));
  double* task_dsink = task_dg + BHk * G;
  int64_t* lim = ws.limits.Get(2 * static_cast<size_t>(s.B) * Nq);
  int64_t* first = lim + static_cast<size_t>(s.B) * Nq;
  const bool window = has_window(p.mask);
  // Per worker: S/P and dP/dS tiles, dK and dV accumulators, two rows.
  const size_t per_worker = (2 * Mq * Kb + 2 * Kb * Dp + 2 * Dp + 15) / 16 * 16;
  float* scratch = ws.scratch.Get(per_worker * static_cast<size_t>(threads));
  ComputeLimits(p, lim, first);
  ThreadPool& pool = ws.pool(threads);

  // Generic sides here; raw and unit-l2 q rows are loaded (and normalized)
  // by the delta tasks below, k rows by the packing tasks.
  const Sides sd =
      PrepareSides<P>(p, a.params, a.q, a.k, s, ws, pool, qh, kh, true);
  // Generic sides leave dk_tilde here (and dq_tilde in dq_part's slot 0) for
  // the side backward.
  float* dkt =
      sd.k.mode == SideMode::kGeneric ? ws.dkt.Get(BHk * Nk * Dp) : nullptr;
  pool.Run(s.BH + s.BHk, [&](int64_t t, int worker) {
    float* row = scratch + per_worker * static_cast<size_t>(worker);
    if (t < s.BH) {
      const int64_t bh = t, b = bh / s.H, h = bh % s.H;
      if (sd.q.mode != SideMode::kGeneric)
        LoadSide<P>(sd.q, a.q, b, h, 0, Nq, s,
                    qh + static_cast<size_t>(bh) * Nq * Dp,
                    sd.q_info + static_cast<size_t>(bh) * Nq);
      // delta = dO . O with DotChain's sequence, kNormRows rows at a time
      // (O staged in `row`).
      const size_t R = kNormRows;
      for (size_t i = 0; i < Nq; ++i) {
        const int64_t ii = static_cast<int64_t>(i);
        const size_t r = static_cast<size_t>(bh) * Nq + i;
        LoadRow<P>(RowPtr<P>(a.d_o, b, h, ii), static_cast<size_t>(s.D),
                   dO + r * Dp, Dp);
        LoadRow<P>(RowPtr<P>(a.o, b, h, ii), static_cast<size_t>(s.D),
                   row + (i % R) * Dp, Dp);
        if (i % R == R - 1)
          DotChainRows<kNormRows>(dO + (r + 1 - R) * Dp, Dp, row, Dp, Dp,
                                  delta + r + 1 - R);
        else if (i == Nq - 1)
          for (size_t i1 = i - i % R; i1 <= i; ++i1)
            DotChainRows<1>(dO + (r - i + i1) * Dp, Dp, row + (i1 % R) * Dp, Dp,
                            Dp, delta + r - i + i1);
        const double l = a.lse[r];
        lse_hi[r] = static_cast<float>(l);
        lse_lo[r] = std::isfinite(l)
                        ? static_cast<float>(l - static_cast<double>(lse_hi[r]))
                        : 0.0f;
      }
      if (!sinks) return;
      // -sum_i exp(sink - lse_i) delta_i over the rows that see a key (top
      // of file, "Sinks"): the share as P is formed, times delta exactly.
      const float sink = static_cast<float>(p.sinks[static_cast<size_t>(h)]);
      const int64_t* L = lim + static_cast<size_t>(b) * Nq;
      const int64_t* F = first + static_cast<size_t>(b) * Nq;
      double sum = 0;
      for (size_t i = 0; i < Nq; ++i) {
        if (L[i] <= F[i]) continue;
        const size_t r = static_cast<size_t>(bh) * Nq + i;
        const float share = std::exp((sink - lse_hi[r]) - lse_lo[r]);
        sum += static_cast<double>(share) * static_cast<double>(delta[r]);
      }
      task_dsink[bh] = -sum;
      return;
    }
    const int64_t bk = t - s.BH, b = bk / s.Hk, h = bk % s.Hk;
    float* khb = kh + static_cast<size_t>(bk) * Nk * Dp;
    float* ktb = kt + static_cast<size_t>(bk) * s.Nkp * Dp;
    float* vtb = vt + static_cast<size_t>(bk) * s.Nkp * Dp;
    // kPackRows rows of v (and of k_tilde past the last key) staged, then
    // packed transposed at once.
    float* vst = row;
    float* kst = row + kPackRows * Dp;
    for (size_t j0 = 0; j0 < s.Nkp; j0 += kPackRows) {
      const bool full = j0 + kPackRows <= Nk;
      if (sd.k.mode != SideMode::kGeneric && j0 < Nk)
        LoadSide<P>(sd.k, a.k, b, h, j0, std::min(kPackRows, Nk - j0), s,
                    khb + j0 * Dp,
                    sd.k_info + static_cast<size_t>(bk) * Nk + j0);
      for (size_t t = 0; t < kPackRows; ++t) {
        const size_t j = j0 + t;
        if (j < Nk) {
          LoadRow<P>(RowPtr<P>(a.v, b, h, static_cast<int64_t>(j)),
                     static_cast<size_t>(s.D), vst + t * Dp, Dp);
          if (!full) std::copy(khb + j * Dp, khb + (j + 1) * Dp, kst + t * Dp);
        } else {
          std::fill(vst + t * Dp, vst + (t + 1) * Dp, 0.0f);
          std::fill(kst + t * Dp, kst + (t + 1) * Dp, 0.0f);
        }
      }
      PackTransposed(full ? khb + j0 * Dp : kst, Dp, j0, Dp, ktb);
      PackTransposed(vst, Dp, j0, Dp, vtb);
    }
  });

  // dK, dV and partial dQ: one task per (batch, kv head, key group); the
  // query heads of the kv head's group are walked in order, so dK and dV
  // sum over the group in a fixed order (GQA).
  pool.Run(s.BHk * static_cast<int64_t>(G), [&](int64_t task, int worker) {
    const size_t bk = static_cast<size_t>(task) / G,
                 g = static_cast<size_t>(task) % G;
    const int64_t b = static_cast<int64_t>(bk) / s.Hk,
                  hk = static_cast<int64_t>(bk) % s.Hk;
    const int64_t* L = lim + static_cast<size_t>(b) * Nq;
    const int64_t* F = first + static_cast<size_t>(b) * Nq;
    float* S = scratch + per_worker * static_cast<size_t>(worker);
    float* dP = S + Mq * Kb;
    float* dK = dP + Mq * Kb;
    float* dV = dK + Kb * Dp;
    const size_t bh0 = static_cast<size_t>(b * s.H + hk * s.group);
    const float* khb = kh + bk * Nk * Dp;
    const float* ktb = kt + bk * s.Nkp * Dp;
    const float* vtb = vt + bk * s.Nkp * Dp;
    const VF vscale = hn::Set(df, s.scale);
    const Logits logit(s);
    size_t kvr[kQueryBlock], rlo[kQueryBlock], klo[kKeyBlock], khi[kKeyBlock];
    double dg = 0;
    // Windows: the rows seeing a block are not a subset of those seeing the
    // group's first block; the partial dQ is zeroed up front instead and
    // every block accumulates into it.
    if (window)
      for (size_t m = 0; m < group; ++m) {
        float* dqp = dq_part + (g * BH + bh0 + m) * Nq * Dp;
        std::fill(dqp, dqp + Nq * Dp, 0.0f);
      }
    for (size_t kb = g; kb < s.nkb; kb += G) {
      const size_t j0 = kb * Kb, kc = std::min(Kb, Nk - j0);
      size_t i_first = 0;
      while (i_first < Nq && L[i_first] <= static_cast<int64_t>(j0)) ++i_first;
      // The rows [i_first, i_end) see keys of the block, the others none
      // (both ends of the rows' intervals are nondecreasing in i); i_end
      // = Nq without a window.
      const size_t i_end =
          window
              ? static_cast<size_t>(
                    std::partition_point(F + i_first, F + Nq,
                                         [&](int64_t f) {
                                           return f <
                                                  static_cast<int64_t>(j0 + kc);
                                         }) -
                    F)
              : Nq;
      // No zero fills of the accumulators: the group's first block writes
      // its partial dQ rows [i_first, Nq) (accumulate = false; the later
      // blocks' rows are a subset, the limits being nondecreasing in i) and
      // zeros the rows before; the block's first product writes dK and dV.
      const bool first_kb = kb == g && !window;
      bool fresh = true;
      for (size_t m = 0; m < group; ++m) {
        const size_t bh = bh0 + m;
        const float* qb = qh + bh * Nq * Dp;
        const float* dob = dO + bh * Nq * Dp;
        float* dqp = dq_part + (g * BH + bh) * Nq * Dp;
        if (first_kb) std::fill(dqp, dqp + i_first * Dp, 0.0f);
        for (size_t i0 = i_first; i0 < i_end; i0 += Mq) {
          const size_t mr = std::min(Mq, i_end - i0);
          // Masked tiles (issue 18): S and dP are formed per row group up
          // to its largest visible key (GemmLimited); every row of P and
          // dS is then defined on the whole block (0 outside its keys
          // [rlo, kvr)), and the products skip the terms that are zero by
          // the mask: key j of dV, dK sums the rows from the first that
          // sees it (klo) to the last whose window starts at or before it
          // (khi; windows only), row r of dQ the keys [rlo, kvr).
          for (size_t r = 0; r < mr; ++r) {
            const size_t hi = VisibleInBlock(L[i0 + r], j0);
            const size_t lo = window ? FirstInBlock(F[i0 + r], j0) : 0;
            kvr[r] = lo < hi ? hi : 0;
            rlo[r] = lo < hi ? lo : Kb;
          }
          {
            size_t jj = 0;
            for (size_t r = 0; r < mr; ++r)
              while (jj < std::min(kvr[r], kc)) klo[jj++] = r;
            while (jj < kc) klo[jj++] = mr;
          }
          if (window) {
            size_t jj = 0;
            for (size_t r = 0; r < mr; ++r)
              if (kvr[r] > 0)
                while (jj < std::min(rlo[r], kc)) khi[jj++] = r;
            while (jj < kc) khi[jj++] = mr;
          }
          const RowLimits by_prefix{kvr, nullptr, nullptr};
          GemmLimited(mr, Kb, Dp, qb + i0 * Dp, static_cast<ptrdiff_t>(Dp), 1,
                      ktb + kb * Dp * Kb, Kb, S, Kb, false, by_prefix);
          GemmLimited(mr, Kb, Dp, dob + i0 * Dp, static_cast<ptrdiff_t>(Dp), 1,
                      vtb + kb * Dp * Kb, Kb, dP, Kb, false, by_prefix);
          VF vdg = hn::Zero(df);
          for (size_t r = 0; r < mr; ++r) {
            const size_t i = i0 + r;
            float* sr = S + r * Kb;
            float* dpr = dP + r * Kb;
            const size_t kv = kvr[r];
            const size_t kvv = (kv + N - 1) / N * N;
            for (size_t j = kvv; j < Kb; j += N) {
              hn::StoreU(hn::Zero(df), df, sr + j);
              hn::StoreU(hn::Zero(df), df, dpr + j);
            }
            if (kv == 0) continue;
            // Window: P = dS = 0 before the row's first key (jlo = 0
            // without one); masked lanes select 0, so a masked key's
            // logit or dP (any value) reaches neither dS nor dg.
            const size_t lo = rlo[r], jlo = lo / N * N;
            for (size_t j = 0; j < jlo; j += N) {
              hn::StoreU(hn::Zero(df), df, sr + j);
              hn::StoreU(hn::Zero(df), df, dpr + j);
            }
            const VF vhi = hn::Set(df, lse_hi[bh * Nq + i]);
            const VF vlo = hn::Set(df, lse_lo[bh * Nq + i]);
            const VF vd = hn::Set(df, delta[bh * Nq + i]);
            for (size_t j = jlo; j < kvv; j += N) {
              const VF c = hn::LoadU(df, sr + j);
              const VF sc = logit(c);
              const VF x = hn::Sub(hn::Sub(sc, vhi), vlo);
              const VF pr = MaskColumnsBelow(
                  MaskColumns(hn::Exp(df, x), j, kv, hn::Zero(df)), j, lo,
                  hn::Zero(df));
              VF ds = hn::Mul(pr, hn::Sub(hn::LoadU(df, dpr + j), vd));
              // Capped: dS = dS' (1 - (S' / cap)^2), the cosine's gradient.
              if (logit.capped) ds = hn::Mul(ds, logit.Slope(sc));
              ds = MaskColumnsBelow(ds, j, lo, hn::Zero(df));
              vdg =
                  hn::MulAdd(ds, MaskColumnsBelow(c, j, lo, hn::Zero(df)), vdg);
              hn::StoreU(pr, df, sr + j);
              // s dS, not dS: the products below would otherwise form dS
              // Q_tilde and dS K_tilde unscaled, which overflow to inf for
              // a huge dS (huge dO, v) and become NaN times s = 0 (an f32
              // scale below f32's range) where the answer is 0 (found by
              // the fixed-seed fuzz run with the Zen 3 CI's entries; the
              // blas path's row kernel was fixed the same way in issue 32).
              hn::StoreU(hn::Mul(ds, vscale), df, dpr + j);
            }
          }
          dg += static_cast<double>(hn::GetLane(hn::SumOfLanes(df, vdg)));
          // dV += P^T dO, dK_tilde += (s dS)^T Q_tilde, dQ_tilde partial
          // += (s dS) K_tilde.
          const RowLimits by_first{nullptr, klo, window ? khi : nullptr};
          GemmLimited(kc, Dp, mr, S, 1, static_cast<ptrdiff_t>(Kb),
                      dob + i0 * Dp, Dp, dV, Dp, !fresh, by_first);
          GemmLimited(kc, Dp, mr, dP, 1, static_cast<ptrdiff_t>(Kb),
                      qb + i0 * Dp, Dp, dK, Dp, !fresh, by_first);
          fresh = false;
          GemmLimited(mr, Dp, kc, dP, static_cast<ptrdiff_t>(Kb), 1,
                      khb + j0 * Dp, Dp, dqp + i0 * Dp, Dp, !first_kb,
                      RowLimits{nullptr, window ? rlo : nullptr, kvr});
        }
      }
      if (fresh) std::fill(dK, dK + 2 * Kb * Dp, 0.0f);  // no query sees it
      if (sd.k.mode == SideMode::kUnitL2)
        NormalizeRowsBackward(khb + j0 * Dp, Dp, sd.k_info + bk * Nk + j0,
                              s.eps, dK, Dp, kc, Dp);
      // RoPE of a raw or unit-l2 side: the transpose of the gradient,
      // after the unit normalization backward in either order (top of
      // file, "RoPE").
      if (sd.k.rope.on() && sd.k.mode != SideMode::kGeneric)
        RotateRows<true>(sd.k.rope, static_cast<int64_t>(j0), kc, dK, Dp);
      for (size_t jj = 0; jj < kc; ++jj) {
        const size_t j = j0 + jj;
        float* dkr = dK + jj * Dp;
        if (sd.k.mode == SideMode::kGeneric)
          std::copy(dkr, dkr + Dp, dkt + (bk * Nk + j) * Dp);
        else
          StoreRow<P>(dkr, static_cast<size_t>(s.D),
                      RowPtr<P>(a.dk, b, hk, static_cast<int64_t>(j)));
        StoreRow<P>(dV + jj * Dp, static_cast<size_t>(s.D),
                    RowPtr<P>(a.dv, b, hk, static_cast<int64_t>(j)));
      }
    }
    task_dg[task] = dg;
  });

  // dQ: sum the G partials in g order, normalization backward (or,
  // generic q side, dq_tilde left in slot 0 for the side backward).
  pool.Run(s.BH * static_cast<int64_t>(s.nqb), [&](int64_t task, int worker) {
    const size_t bh = static_cast<size_t>(task) / s.nqb;
    const size_t i0 = static_cast<size_t>(task) % s.nqb * Mq;
    const int64_t b = static_cast<int64_t>(bh) / s.H,
                  h = static_cast<int64_t>(bh) % s.H;
    // The block's rows staged in the worker's scratch (Mq * Dp <= 2 Kb Dp).
    float* rows = scratch + per_worker * static_cast<size_t>(worker);
    const size_t i1 = std::min(Nq, i0 + Mq);
    for (size_t i = i0; i < i1; ++i) {
      float* row = rows + (i - i0) * Dp;
      float* src = dq_part + (bh * Nq + i) * Dp;
      std::copy(src, src + Dp, row);
      for (size_t g = 1; g < G; ++g) {
        const float* part = dq_part + ((g * BH + bh) * Nq + i) * Dp;
        for (size_t d = 0; d < Dp; d += N)
          hn::StoreU(hn::Add(hn::LoadU(df, row + d), hn::LoadU(df, part + d)),
                     df, row + d);
      }
      if (sd.q.mode == SideMode::kGeneric) std::copy(row, row + Dp, src);
    }
    if (sd.q.mode == SideMode::kGeneric) return;
    if (sd.q.mode == SideMode::kUnitL2)
      NormalizeRowsBackward(qh + (bh * Nq + i0) * Dp, Dp,
                            sd.q_info + bh * Nq + i0, s.eps, rows, Dp, i1 - i0,
                            Dp);
    if (sd.q.rope.on())  // raw or unit l2 (top of file, "RoPE")
      RotateRows<true>(sd.q.rope, static_cast<int64_t>(i0), i1 - i0, rows, Dp);
    for (size_t i = i0; i < i1; ++i)
      StoreRow<P>(rows + (i - i0) * Dp, static_cast<size_t>(s.D),
                  RowPtr<P>(a.dq, b, h, static_cast<int64_t>(i)));
  });

  // The generic sides' backward and their parameter gradients.
  const int64_t tq = sd.q.tasks(), tk = sd.k.tasks();
  const size_t sq = sd.q.slot(), sk = sd.k.slot();
  const size_t nq = static_cast<size_t>(tq) * sq;
  const size_t nk = static_cast<size_t>(tk) * sk;
  double* q_dw = nullptr;
  double* q_db = nullptr;
  double* k_dw = nullptr;
  double* k_db = nullptr;
  if (tq + tk > 0) {
    q_dw = ws.param_partials.Get(2 * (nq + nk));
    q_db = q_dw + nq;
    k_dw = q_db + nq;
    k_db = k_dw + nk;
    const size_t rs = 2 * std::max(sq, sk);
    float* rscratch = ws.row_scratch.Get(rs * static_cast<size_t>(threads));
    pool.Run(tq + tk, [&](int64_t t, int worker) {
      float* sc = rscratch + rs * static_cast<size_t>(worker);
      if (t < tq) {
        BackSideTask<P>(sd.q, a.q, a.dq, t, dq_part, sd.q_stats, sc,
                        q_dw + static_cast<size_t>(t) * sq,
                        q_db + static_cast<size_t>(t) * sq);
      } else {
        const size_t u = static_cast<size_t>(t - tq);
        BackSideTask<P>(sd.k, a.k, a.dk, t - tq, dkt, sd.k_stats, sc,
                        k_dw + u * sk, k_db + u * sk);
      }
    });
  }
  const NormParamGrads& dp = a.d_params;
  for (const MutParamRef* r :
       {&dp.q_weight, &dp.k_weight, &dp.q_bias, &dp.k_bias})
    if (r->data != nullptr) std::fill(r->data, r->data + r->size, 0.0);
  if (tq > 0 && sd.q.weight)
    ReduceParams(sd.q, q_dw, q_db, dp.q_weight.data,
                 sd.q.bias ? dp.q_bias.data : nullptr);
  if (tk > 0 && sd.k.weight)
    ReduceParams(sd.k, k_dw, k_db,
                 p.norm.shared_qk_weight ? dp.q_weight.data : dp.k_weight.data,
                 sd.k.bias ? dp.k_bias.data : nullptr);

  double dg = 0;
  if (s.learned)
    for (size_t t = 0; t < BHk * G; ++t) dg += task_dg[t];
  *a.dg = dg;
  // dsinks_h: the (b, h) tasks' sums in b order.
  if (sinks && a.d_sinks != nullptr)
    for (int64_t h = 0; h < s.H; ++h) {
      double sum = 0;
      for (int64_t b = 0; b < s.B; ++b)
        sum += task_dsink[static_cast<size_t>(b * s.H + h)];
      a.d_sinks[h] = sum;
    }
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_ATTENTION_INL_H_
