// The QK-norm formulations (issue 16) of the SIMD attention kernels: how each
// row of q and of k becomes the logit operand x_tilde, and the backward of
// that step with the gradients of the learned weight and bias. Per-target
// code, included by attention-inl.h.
//
// Each side (q: side 0, k: side 1) is one of three modes:
// - raw: sdpa, or kind none without a weight: x_tilde = x;
// - unit l2 (the paper): l2 per head without a weight: rows-inl.h's
//   NormalizeRow / NormalizeRowBackward, exactly as before issue 16;
// - generic: every other formulation (rms, layer, l2 or none with a weight
//   [D] or [H_x, D], Gemma's 1 + w, a bias, nGPT's shared weight, Qwen3's
//   x_hat rounded to storage before the weight, per head or across all heads
//   of a token: attention.h's NormRows).
// The generic row is x_hat = (x - mu) * inv with, in f64 lanes,
//   l2:    mu = 0, inv = 1 / max(||x||, eps)    (clamped: ||x|| <= eps)
//   rms:   mu = 0, inv = 1 / sqrt(sum x^2 / L + eps)
//   layer: mu = sum x / L, inv = 1 / sqrt(sum (x - mu)^2 / L + eps)
//   none:  mu = 0, inv = 1
// As for the paper's rows, every finite f32 square fits in a double (no
// overflow, no harmful underflow, no scaling needed), and the sums of a
// constant row are exact, so its mean is exact and x - mu = 0 (layer gives
// x_hat = 0 for it, rms and l2 for a zero row). x_tilde = x_hat * w + beta
// is formed in f64 and rounded ONCE to f32; with round_before_weight in
// bf16/f16 storage (Qwen3) x_hat is rounded to f32, then to storage (RNE),
// and x_tilde = RN_f32(x_hat_s * w) as the model computes it.
//
// RoPE (issue 34; rope-inl.h) is fused into this pass: each segment (one
// head's D values) of a row is rotated in place, before the statistics
// when the side rotates x (kBeforeNorm, raw sides), after x_tilde is
// written otherwise; the backward applies the transpose to the gradient
// before the normalization backward (after-norm) or to its result
// (before-norm, whose normalization backward reads the rotated x).
//
// Backward, per row, in f64 from the recomputed x_hat (the unrounded one; a
// cast is the identity for the gradient): du = dx_tilde * w,
//   dx = (du - a - x_hat c) * inv,  a = mean(du) (layer) else 0,
//   c = x_hat . du (l2, unclamped), (x_hat . du) / L (rms, layer), else 0,
// and the parameter gradients dw += dx_tilde * x_hat (the rounded x_hat when
// rounded), dbeta += dx_tilde. Rows are processed in fixed tasks of
// kRowBlock rows (by shape, never by thread count); each task sums its rows
// into its own f64 slot and the slots are added in task order: the
// parameter gradients are bitwise identical for every thread count.

#if defined(QKNORM_SIMD_FORMULATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKNORM_SIMD_FORMULATION_INL_H_
#undef QKNORM_SIMD_FORMULATION_INL_H_
#else
#define QKNORM_SIMD_FORMULATION_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "qknorm/attention.h"
#include "simd/convert-inl.h"
#include "simd/rope-inl.h"
#include "simd/rows-inl.h"
#include "simd/workspace.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

enum class SideMode { kRaw, kUnitL2, kGeneric };

// Rows per side task (forward preparation and backward).
inline constexpr int64_t kRowBlock = 64;

struct SideSpec {
  SideMode mode = SideMode::kRaw;
  NormKind kind = NormKind::kNone;
  bool all_heads = false;
  int64_t B = 1, Hx = 1, N = 1, D = 1;
  size_t Dp = 1;
  bool weight = false, bias = false, head_params = false, round = false;
  double eps = 0;     // rms, layer: inside the sqrt
  double eps_l2 = 0;  // l2: the clamp, as the f32 the paper path uses
  // Padded [Hw][Dp] f64: the effective weight (1 + w for Gemma) and bias,
  // Hw = Hx for [H_x, D] parameters, else 1.
  const double* gw = nullptr;
  const double* gb = nullptr;
  int64_t nblk = 1;  // row blocks per row group
  // RoPE (rope-inl.h): set by the attention kernels' PrepareSides after
  // MakeSide; rotates each segment (one head's D values) of a row.
  RopeSide rope;
  int64_t nseg() const { return all_heads ? Hx : 1; }
  int64_t groups() const { return all_heads ? B : B * Hx; }
  int64_t tasks() const {
    return mode == SideMode::kGeneric ? groups() * nblk : 0;
  }
  int64_t prep_tasks() const { return groups() * nblk; }
  size_t slot() const { return static_cast<size_t>(nseg()) * Dp; }
  int64_t param_heads() const { return head_params ? Hx : 1; }
};

// The side's spec; its f64 parameters are written to `params` (param_doubles
// of them).
inline size_t ParamDoubles(const AttentionProblem& p, int side, size_t Dp) {
  const NormRows sh = norm_rows(p, side);
  const int64_t hw = p.norm.weight == ParamShape::kHeadDim ? sh.H : 1;
  return 2 * static_cast<size_t>(hw) * Dp;
}

template <Precision P>
SideSpec MakeSide(const AttentionProblem& p, int side, size_t Dp,
                  const NormParams& prm, double* params) {
  const NormRows sh = norm_rows(p, side);
  SideSpec sp;
  sp.B = sh.B, sp.Hx = sh.H, sp.N = sh.N, sp.D = sh.D, sp.Dp = Dp;
  sp.all_heads = sh.all_heads;
  sp.nblk = (sh.N + kRowBlock - 1) / kRowBlock;
  sp.eps = p.eps;
  sp.eps_l2 = static_cast<double>(EpsF32(p.eps));
  const Normalization& nm = p.norm;
  if (p.variant != Variant::kQKNorm ||
      (nm.kind == NormKind::kNone && nm.weight == ParamShape::kNone)) {
    sp.mode = SideMode::kRaw;
    sp.all_heads = false;
    return sp;
  }
  sp.kind = nm.kind;
  if (nm.kind == NormKind::kL2 && !sp.all_heads &&
      nm.weight == ParamShape::kNone) {
    sp.mode = SideMode::kUnitL2;
    return sp;
  }
  sp.mode = SideMode::kGeneric;
  sp.weight = nm.weight != ParamShape::kNone;
  sp.head_params = nm.weight == ParamShape::kHeadDim;
  sp.bias = sp.weight && nm.bias;
  sp.round = nm.round_before_weight && P != Precision::kF32;
  if (!sp.weight) return sp;
  const size_t n = static_cast<size_t>(sp.param_heads()) * Dp;
  double* gw = params;
  double* gb = params + n;
  std::fill(params, params + 2 * n, 0.0);
  const ParamRef& w =
      side == 0 || nm.shared_qk_weight ? prm.q_weight : prm.k_weight;
  const ParamRef& b = side == 0 ? prm.q_bias : prm.k_bias;
  const size_t D = static_cast<size_t>(sp.D);
  for (size_t h = 0; h < static_cast<size_t>(sp.param_heads()); ++h)
    for (size_t d = 0; d < D; ++d) {
      // The parameters are values of the model's format: f32 holds them.
      const double w32 = static_cast<float>(w.data[h * D + d]);
      double g = nm.one_plus_weight ? 1.0 + w32 : w32;
      // Rounded x_hat: the weight multiply is the model's f32 multiply.
      if (sp.round) g = static_cast<float>(g);
      gw[h * Dp + d] = g;
      if (sp.bias) gb[h * Dp + d] = static_cast<float>(b.data[h * D + d]);
    }
  sp.gw = gw;
  sp.gb = gb;
  return sp;
}

HWY_INLINE hn::Vec<DD> LoadD(const float* HWY_RESTRICT p) {
  return hn::PromoteTo(DD(), hn::LoadU(DFH(), p));
}
HWY_INLINE void StoreD(hn::Vec<DD> v, float* HWY_RESTRICT p) {
  hn::StoreU(hn::DemoteTo(DFH(), v), DFH(), p);
}

// In place: x[0..n) rounded to storage P and back (RNE); n a multiple of
// Lanes(DF). Identity for f32.
template <Precision P>
HWY_INLINE void RoundToStorage(float* HWY_RESTRICT x, size_t n) {
  if constexpr (P == Precision::kBF16) {
    const DF df;
    for (size_t i = 0; i < n; i += hn::Lanes(df))
      hn::StoreU(F32FromBF16(BF16FromF32(hn::LoadU(df, x + i))), df, x + i);
  } else if constexpr (P == Precision::kF16) {
    const DF df;
    for (size_t i = 0; i < n; i += hn::Lanes(df))
      hn::StoreU(F32FromF16(F16FromF32(hn::LoadU(df, x + i))), df, x + i);
  } else {
    (void)x, (void)n;
  }
}

// The statistics of the row whose segment s (D values, zero padded to Dp)
// is at x + s * stride.
inline RowStat ComputeStat(const SideSpec& sp, const float* x, size_t stride) {
  const DD dd;
  const size_t ND = hn::Lanes(dd), Dp = sp.Dp, D = static_cast<size_t>(sp.D);
  const double L = static_cast<double>(sp.nseg() * sp.D);
  RowStat st;
  if (sp.kind == NormKind::kNone) return st;
  auto acc = hn::Zero(dd);
  if (sp.kind == NormKind::kLayer) {
    for (int64_t s = 0; s < sp.nseg(); ++s) {
      const float* seg = x + static_cast<size_t>(s) * stride;
      for (size_t i = 0; i < Dp; i += ND) acc = hn::Add(acc, LoadD(seg + i));
    }
    st.mu = hn::GetLane(hn::SumOfLanes(dd, acc)) / L;
    const auto vmu = hn::Set(dd, st.mu);
    acc = hn::Zero(dd);
    for (int64_t s = 0; s < sp.nseg(); ++s) {
      const float* seg = x + static_cast<size_t>(s) * stride;
      for (size_t i = 0; i < Dp; i += ND) {
        auto y = hn::Sub(LoadD(seg + i), vmu);
        if (i + ND > D)
          y = hn::IfThenElseZero(hn::FirstN(dd, i >= D ? 0 : D - i), y);
        acc = hn::MulAdd(y, y, acc);
      }
    }
  } else {
    for (int64_t s = 0; s < sp.nseg(); ++s) {
      const float* seg = x + static_cast<size_t>(s) * stride;
      for (size_t i = 0; i < Dp; i += ND) {
        const auto y = LoadD(seg + i);
        acc = hn::MulAdd(y, y, acc);
      }
    }
  }
  const double ss = hn::GetLane(hn::SumOfLanes(dd, acc));
  if (sp.kind == NormKind::kL2) {
    const double nrm = std::sqrt(ss);
    st.clamped = nrm > sp.eps_l2 ? 0 : 1;
    st.inv = 1.0 / (st.clamped ? sp.eps_l2 : nrm);
  } else {
    st.inv = 1.0 / std::sqrt(ss / L + sp.eps);
  }
  return st;
}

// Segment s of a row: the offset of its parameters in the [Hw][Dp] arrays
// (h: the row's head, per head).
HWY_INLINE size_t ParamOffset(const SideSpec& sp, int64_t s, int64_t h) {
  if (!sp.head_params) return 0;
  return static_cast<size_t>(sp.all_heads ? s : h) * sp.Dp;
}

// In place: x (loaded, zero padded) -> x_tilde, zero padded.
template <Precision P>
HWY_INLINE void WriteTilde(const SideSpec& sp, const RowStat& st, float* x,
                           size_t stride, int64_t h) {
  const DD dd;
  const size_t ND = hn::Lanes(dd), Dp = sp.Dp, D = static_cast<size_t>(sp.D);
  const auto vmu = hn::Set(dd, st.mu), vinv = hn::Set(dd, st.inv);
  for (int64_t s = 0; s < sp.nseg(); ++s) {
    float* seg = x + static_cast<size_t>(s) * stride;
    const double* g = sp.gw + (sp.weight ? ParamOffset(sp, s, h) : 0);
    const double* b = sp.gb + (sp.bias ? ParamOffset(sp, s, h) : 0);
    if (!sp.round) {
      for (size_t i = 0; i < Dp; i += ND) {
        auto y = hn::Mul(hn::Sub(LoadD(seg + i), vmu), vinv);
        if (sp.weight) y = hn::Mul(y, hn::LoadU(dd, g + i));
        if (sp.bias) y = hn::Add(y, hn::LoadU(dd, b + i));
        StoreD(y, seg + i);
      }
    } else {
      for (size_t i = 0; i < Dp; i += ND)
        StoreD(hn::Mul(hn::Sub(LoadD(seg + i), vmu), vinv), seg + i);
      RoundToStorage<P>(seg, Dp);
      if (sp.weight)
        for (size_t i = 0; i < Dp; i += ND) {
          // Exact in f64 (a 16-bit value times an f32): one f32 rounding,
          // the f32 multiply.
          StoreD(hn::Mul(LoadD(seg + i), hn::LoadU(dd, g + i)), seg + i);
          // The bias adds to that f32 product (its own f32 rounding).
          if (sp.bias)
            StoreD(hn::Add(LoadD(seg + i), hn::LoadU(dd, b + i)), seg + i);
        }
    }
    std::fill(seg + D, seg + Dp, 0.0f);
  }
}

// Storage row n of head h, batch b of a view.
template <Precision P>
HWY_INLINE const StorageT<P>* RowPtr(const ConstTensor4& t, int64_t b,
                                     int64_t h, int64_t n) {
  return static_cast<const StorageT<P>*>(t.data) + b * t.layout.batch_stride +
         h * t.layout.head_stride + n * t.layout.row_stride;
}
template <Precision P>
HWY_INLINE StorageT<P>* RowPtr(const MutTensor4& t, int64_t b, int64_t h,
                               int64_t n) {
  return static_cast<StorageT<P>*>(t.data) + b * t.layout.batch_stride +
         h * t.layout.head_stride + n * t.layout.row_stride;
}

// f(r, b, h, n, off, stride) for every normalization row of side task
// `task`: r indexes the row's statistics, (b, h, n) is its first segment
// (h = 0 across heads), off the offset of that segment in the dense padded
// [B * H_x][N][Dp] buffer, stride the distance of its segments there.
template <class F>
HWY_INLINE void ForEachTaskRow(const SideSpec& sp, int64_t task, const F& f) {
  const int64_t g = task / sp.nblk, n0 = task % sp.nblk * kRowBlock;
  const int64_t n1 = std::min(sp.N, n0 + kRowBlock);
  const size_t N = static_cast<size_t>(sp.N), Dp = sp.Dp;
  for (int64_t n = n0; n < n1; ++n) {
    const size_t r = static_cast<size_t>(g) * N + static_cast<size_t>(n);
    if (sp.all_heads)
      f(r, g, int64_t{0}, n,
        (static_cast<size_t>(g * sp.Hx) * N + static_cast<size_t>(n)) * Dp,
        N * Dp);
    else
      f(r, g / sp.Hx, g % sp.Hx, n, r * Dp, Dp);
  }
}

// The row's segments from storage into dst (segment s at dst + s * stride).
template <Precision P>
HWY_INLINE void LoadSegments(const SideSpec& sp, const ConstTensor4& x,
                             int64_t b, int64_t h, int64_t n, float* dst,
                             size_t stride) {
  for (int64_t s = 0; s < sp.nseg(); ++s)
    LoadRow<P>(RowPtr<P>(x, b, h + s, n), static_cast<size_t>(sp.D),
               dst + static_cast<size_t>(s) * stride, sp.Dp);
}

// RoPE of the row n's segments (segment s at x + s * stride); kInverse:
// the transpose.
template <bool kInverse>
HWY_INLINE void RotateSegments(const SideSpec& sp, int64_t n, float* x,
                               size_t stride) {
  const float* tr = sp.rope.Row(n);
  for (int64_t s = 0; s < sp.nseg(); ++s)
    RotateRow<kInverse>(sp.rope, tr, x + static_cast<size_t>(s) * stride);
}

// Forward preparation of task `task` (< sp.prep_tasks()): rows of x into
// the dense padded [B * H_x][N][Dp] f32 buffer xt as x_tilde, with their
// statistics (unit l2: info; generic: st), both indexed group * N + n.
template <Precision P>
void PrepSideTask(const SideSpec& sp, const ConstTensor4& x, int64_t task,
                  float* xt, NormInfo* info, RowStat* st) {
  ForEachTaskRow(sp, task,
                 [&](size_t r, int64_t b, int64_t h, int64_t n, size_t off,
                     size_t stride) {
                   float* row = xt + off;
                   LoadSegments<P>(sp, x, b, h, n, row, stride);
                   if (sp.rope.on() && sp.rope.before)
                     RotateSegments<false>(sp, n, row, stride);
                   if (sp.mode == SideMode::kUnitL2) {
                     info[r] = NormalizeRow(row, sp.Dp,
                                            static_cast<float>(sp.eps_l2));
                   } else if (sp.mode == SideMode::kGeneric) {
                     st[r] = ComputeStat(sp, row, stride);
                     WriteTilde<P>(sp, st[r], row, stride, h);
                   }
                   // After the normalization: x_tilde rotated while the
                   // row is in L1 (fused with the pass that wrote it).
                   if (sp.rope.on() && !sp.rope.before)
                     RotateSegments<false>(sp, n, row, stride);
                 });
}

// In place: dxt (segment s at dxt + s * dstride) -> dx of the row x
// (segments at x + s * Dp) with statistics st; parameter gradients added to
// dw, db (slots of nseg * Dp). xr: nseg * Dp scratch.
template <Precision P>
HWY_INLINE void RowBackward(const SideSpec& sp, const RowStat& st,
                            const float* x, float* xr, float* dxt,
                            size_t dstride, int64_t h, double* dw, double* db) {
  const DD dd;
  const size_t ND = hn::Lanes(dd), Dp = sp.Dp;
  const double L = static_cast<double>(sp.nseg() * sp.D);
  const auto vmu = hn::Set(dd, st.mu), vinv = hn::Set(dd, st.inv);
  auto acc_c = hn::Zero(dd), acc_a = hn::Zero(dd);
  for (int64_t s = 0; s < sp.nseg(); ++s) {
    const size_t so = static_cast<size_t>(s) * Dp;
    const float* xs = x + so;
    const float* ds = dxt + static_cast<size_t>(s) * dstride;
    const double* g = sp.gw + (sp.weight ? ParamOffset(sp, s, h) : 0);
    if (sp.round && sp.weight) {  // the x_hat the forward weighted
      for (size_t i = 0; i < Dp; i += ND)
        StoreD(hn::Mul(hn::Sub(LoadD(xs + i), vmu), vinv), xr + so + i);
      RoundToStorage<P>(xr + so, Dp);
    }
    for (size_t i = 0; i < Dp; i += ND) {
      const auto xh = hn::Mul(hn::Sub(LoadD(xs + i), vmu), vinv);
      const auto t = LoadD(ds + i);
      auto du = t;
      if (sp.weight) {
        const auto used = sp.round ? LoadD(xr + so + i) : xh;
        hn::StoreU(hn::MulAdd(t, used, hn::LoadU(dd, dw + so + i)), dd,
                   dw + so + i);
        if (sp.bias)
          hn::StoreU(hn::Add(hn::LoadU(dd, db + so + i), t), dd, db + so + i);
        du = hn::Mul(t, hn::LoadU(dd, g + i));
      }
      acc_c = hn::MulAdd(xh, du, acc_c);
      acc_a = hn::Add(acc_a, du);
    }
  }
  double c = 0, a = 0;
  switch (sp.kind) {
    case NormKind::kL2:
      c = st.clamped ? 0.0 : hn::GetLane(hn::SumOfLanes(dd, acc_c));
      break;
    case NormKind::kRms:
      c = hn::GetLane(hn::SumOfLanes(dd, acc_c)) / L;
      break;
    case NormKind::kLayer:
      c = hn::GetLane(hn::SumOfLanes(dd, acc_c)) / L;
      a = hn::GetLane(hn::SumOfLanes(dd, acc_a)) / L;
      break;
    case NormKind::kNone:
      break;
  }
  const auto vc = hn::Set(dd, c), va = hn::Set(dd, a);
  for (int64_t s = 0; s < sp.nseg(); ++s) {
    const size_t so = static_cast<size_t>(s) * Dp;
    const float* xs = x + so;
    float* ds = dxt + static_cast<size_t>(s) * dstride;
    const double* g = sp.gw + (sp.weight ? ParamOffset(sp, s, h) : 0);
    for (size_t i = 0; i < Dp; i += ND) {
      const auto xh = hn::Mul(hn::Sub(LoadD(xs + i), vmu), vinv);
      auto du = LoadD(ds + i);
      if (sp.weight) du = hn::Mul(du, hn::LoadU(dd, g + i));
      StoreD(hn::Mul(hn::NegMulAdd(xh, vc, hn::Sub(du, va)), vinv), ds + i);
    }
  }
}

// Backward of task `task` (< sp.tasks()): dxt (dense padded [B * H_x][N][Dp]
// f32, the gradient of x_tilde; overwritten) -> dx in storage; the task's
// parameter gradients into its slots dw, db (sp.slot() doubles each, zeroed
// here). scratch: 2 * sp.slot() floats.
template <Precision P>
void BackSideTask(const SideSpec& sp, const ConstTensor4& x,
                  const MutTensor4& dx, int64_t task, float* dxt,
                  const RowStat* st, float* scratch, double* dw, double* db) {
  std::fill(dw, dw + sp.slot(), 0.0);
  std::fill(db, db + sp.slot(), 0.0);
  float* xrow = scratch;
  float* xr = scratch + sp.slot();
  ForEachTaskRow(sp, task,
                 [&](size_t r, int64_t b, int64_t h, int64_t n, size_t off,
                     size_t stride) {
                   LoadSegments<P>(sp, x, b, h, n, xrow, sp.Dp);
                   float* d = dxt + off;
                   // RoPE: dxt is the gradient of the rotated operand. After
                   // the normalization, the transpose first (then the
                   // normalization backward of the unrotated x_tilde);
                   // before it, the normalization backward reads the
                   // rotated x (as the forward normalized it) and its
                   // result goes through the transpose.
                   if (sp.rope.on()) {
                     if (sp.rope.before)
                       RotateSegments<false>(sp, n, xrow, sp.Dp);
                     else
                       RotateSegments<true>(sp, n, d, stride);
                   }
                   RowBackward<P>(sp, st[r], xrow, xr, d, stride, h, dw, db);
                   if (sp.rope.on() && sp.rope.before)
                     RotateSegments<true>(sp, n, d, stride);
                   for (int64_t s = 0; s < sp.nseg(); ++s)
                     StoreRow<P>(d + static_cast<size_t>(s) * stride,
                                 static_cast<size_t>(sp.D),
                                 RowPtr<P>(dx, b, h + s, n));
                 });
}

// Adds the task slots (in task order) into the parameter gradients.
inline void ReduceParams(const SideSpec& sp, const double* dw_slots,
                         const double* db_slots, double* dw, double* db) {
  const size_t D = static_cast<size_t>(sp.D);
  for (int64_t t = 0; t < sp.tasks(); ++t) {
    const int64_t h = t / sp.nblk % sp.Hx;
    const size_t o = static_cast<size_t>(t) * sp.slot();
    for (int64_t s = 0; s < sp.nseg(); ++s) {
      const size_t base =
          sp.head_params ? static_cast<size_t>(sp.all_heads ? s : h) * D : 0;
      const size_t so = o + static_cast<size_t>(s) * sp.Dp;
      for (size_t d = 0; d < D; ++d) {
        if (dw) dw[base + d] += dw_slots[so + d];
        if (db) db[base + d] += db_slots[so + d];
      }
    }
  }
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKNORM_SIMD_FORMULATION_INL_H_
