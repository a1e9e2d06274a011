// QKNorm attention (Henry et al. 2020) and the scaled dot-product baseline:
// problem description and non-owning tensor views shared by every backend.
//
// Math, per (batch b, head h), with Q [q_len, D], K, V [kv_len, D]:
//   qknorm: q_hat_i = q_i / max(||q_i||_2, eps), k_hat_j likewise (never v),
//           S_ij = g * (q_hat_i . k_hat_j)            (no 1/sqrt(D))
//   sdpa:   S_ij = (q_i . k_j) / sqrt(D)             (g and eps unused)
//   P_i = softmax over the keys j visible to query i, O_i = sum_j P_ij v_j,
//   lse_i = log sum_{visible j} exp(S_ij).
// Backward (shared/NUMERICS.md): dV = P^T dO, dP = dO V^T,
//   delta_i = rowsum(dO * O)_i, dS = P * (dP - delta), dg = sum dS * C with
//   C = Q_hat K_hat^T, dQ_hat = g dS K_hat, dK_hat = g dS^T Q_hat, then the
//   unit-normalization backward: dx = (du - u (u . du)) / ||x|| if ||x|| > eps,
//   dx = du / eps otherwise.
//
// Defined results for extreme but valid input:
// - A zero row (or any row with ||x|| <= eps) is divided by eps: q_hat is
//   x / eps (0 for a zero row), logits are finite, the gradient is du / eps.
// - A fully masked query row (no visible key) gives O_i = 0, lse_i = -inf (the
//   exact log of an empty sum; the only non-finite value any entry returns),
//   and contributes nothing to any gradient: dQ_i = 0, and it adds nothing to
//   dK, dV or dg.
// - Norms are computed with scaling, so no finite input overflows or
//   underflows in the normalization.
#ifndef QKNORM_ATTENTION_H_
#define QKNORM_ATTENTION_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace qknorm {

enum class Variant { kQKNorm, kSDPA };

// Default eps of the authors' code (framework default of F.normalize), applied
// as a clamp on the norm.
inline constexpr double kDefaultQKNormEps = 1e-12;

// The paper's initial g: g0 = log2(L^2 - L), L = 97.5th-percentile training
// sequence length (L = 72 gives 12.3197). Requires L > 1.
double g_init(double L);

// Which keys a query sees. All parts may be combined; a key is visible iff
// every part shows it.
//
// Sliding window (issue 34), FlashAttention's window_size = (left, right):
// bottom-right aligned and inclusive. With o = kv_len - q_len, query i sees
// key j iff
//   i + o - window_left <= j <= i + o + window_right,
// -1 leaving that side unbounded ((-1, -1): no window). Query i sits at key
// position i + o (the last query row at the last key); for q_len = 4,
// kv_len = 6 (o = 2) and window (2, 0):
//          key j:  0 1 2 3 4 5
//   query 0 (at 2) x x x . . .
//   query 1 (at 3) . x x x . .
//   query 2 (at 4) . . x x x .
//   query 3 (at 5) . . . x x x
// causal equals window (-1, 0); causal with window (l, r) is window
// (l, min(r, 0)). A model's "sliding_window = w" is (w - 1, 0) if its mask
// keeps i - j < w and (w, 0) if it keeps i - j <= w: the off-by-one of
// transformers #39408; read the model's own mask code to choose.
// The alignment uses kv_len, never a batch's key length: padded keys are
// masked keys at the end, not a shorter sequence.
struct Mask {
  // Key j visible to query i iff j <= i + kv_len - q_len (bottom-right
  // aligned; a square problem gets the usual lower triangle). With
  // kv_len < q_len the first q_len - kv_len rows are fully masked.
  bool causal = false;
  // Empty: no padding. Otherwise one entry per batch, 0 <= len <= kv_len:
  // keys j >= key_lengths[b] are invisible to every query of batch b.
  std::vector<int64_t> key_lengths;
  int64_t window_left = -1, window_right = -1;  // each -1 or >= 0
};

inline bool has_window(const Mask& m) {
  return m.window_left >= 0 || m.window_right >= 0;
}
// True iff which keys a query sees depends on its position i (causal or a
// window); otherwise every query of a batch sees the same keys.
inline bool depends_on_position(const Mask& m) {
  return m.causal || has_window(m);
}

// The keys visible to query i of batch b: the interval [begin, end) of
// [0, kv_len) (empty iff begin >= end; then begin = end).
struct KeyRange {
  int64_t begin = 0, end = 0;
};
// A window side counts up to q_len + kv_len (a wider one sees as much), so
// that a side near INT64_MAX cannot overflow the arithmetic below.
inline int64_t window_side(int64_t side, int64_t q_len, int64_t kv_len) {
  return std::min(side, q_len + kv_len);
}
inline KeyRange visible_keys(const Mask& m, int64_t b, int64_t i, int64_t q_len,
                             int64_t kv_len) {
  const int64_t at = i + kv_len - q_len;  // the query's key position
  int64_t lo = 0, hi = kv_len;            // [lo, hi)
  if (m.causal) hi = std::min(hi, at + 1);
  if (m.window_right >= 0)
    hi = std::min(hi, at + window_side(m.window_right, q_len, kv_len) + 1);
  if (m.window_left >= 0)
    lo = std::max(lo, at - window_side(m.window_left, q_len, kv_len));
  if (!m.key_lengths.empty())
    hi = std::min(hi, m.key_lengths[static_cast<size_t>(b)]);
  hi = std::max<int64_t>(hi, 0);
  return {std::min(lo, hi), hi};
}

// True iff key j is visible to query i of batch b.
inline bool visible(const Mask& m, int64_t b, int64_t i, int64_t j,
                    int64_t q_len, int64_t kv_len) {
  if (m.causal && j > i + kv_len - q_len) return false;
  if (!m.key_lengths.empty() && j >= m.key_lengths[static_cast<size_t>(b)])
    return false;
  if (m.window_right >= 0 &&
      j > i + kv_len - q_len + window_side(m.window_right, q_len, kv_len))
    return false;
  if (m.window_left >= 0 &&
      j < i + kv_len - q_len - window_side(m.window_left, q_len, kv_len))
    return false;
  return true;
}

// The QK-norm formulations models ship (issue 16; shared/NUMERICS.md). For
// the qknorm variant, every row x of q (and of k) is normalized, weighted and
// shifted before the logits:
//   l2:    x_hat = x / max(||x||, eps)                     (the paper)
//   rms:   x_hat = x / sqrt(mean(x^2) + eps)
//   layer: x_hat = (x - mean(x)) / sqrt(var(x) + eps)      (biased variance)
//   none:  x_hat = x
//   x_tilde = x_hat * w + beta, w = gamma (or 1 + gamma: Gemma), per dim,
// and S_ij = scale * (q_tilde_i . k_tilde_j) with scale the learned g or a
// fixed value. The row is one head's head_dim values (kHead) or all heads of
// one token together (kAllHeads: OLMo2, H * head_dim values; q uses heads, k
// uses kv_heads). Defined results: rms and layer of a zero (resp. constant)
// row give x_hat = 0 (eps > 0 is required); l2 as the paper.
enum class NormKind { kL2, kRms, kLayer, kNone };
enum class NormAxis { kHead, kAllHeads };
// Shape of the learned weight gamma and bias beta of one side (q or k):
// none, [head_dim] shared by every head, or [heads_x, head_dim] with heads_x
// the side's head count (heads for q, kv_heads for k); kAllHeads needs
// kHeadDim (its row is [heads_x * head_dim]).
enum class ParamShape { kNone, kDim, kHeadDim };
struct Normalization {
  NormKind kind = NormKind::kL2;
  NormAxis axis = NormAxis::kHead;
  ParamShape weight = ParamShape::kNone;
  bool one_plus_weight = false;  // Gemma: x_hat * (1 + gamma)
  bool bias = false;             // beta, shaped as gamma (LayerNorm)
  // nGPT: one weight (s_qk) multiplies both q_hat and k_hat; its gradient is
  // the sum of both sides' (requires kv_heads == heads); k_weight is empty.
  bool shared_qk_weight = false;
  // Qwen3: x_hat is rounded to the storage format before the weight
  // multiply (HF casts back to the input dtype first); a no-op for f64/f32
  // storage. Otherwise the weight multiplies in the compute format.
  bool round_before_weight = false;
};

// Rotary position embedding (RoPE; issue 34) of the logit operands.
// rotary_dim 0 is off; otherwise the first rotary_dim dims (even, <=
// head_dim; the rest pass unchanged: partial rotary) of every q and k row
// form rotary_dim / 2 pairs, pair e of dims
//   half-split (NeoX, HF rotate_half):  (e, e + rotary_dim / 2)
//   interleaved (GPT-J, Meta's llama):  (2e, 2e + 1)
// each rotated by the angle t = pos * inv_freq_e:
//   y_a = x_a cos t - x_b sin t,   y_b = x_b cos t + x_a sin t,
// inv_freq_e = theta^(-2e / rotary_dim), or the given table inv_freq
// (rotary_dim / 2 values: linear, Llama 3 and YaRN scalings precompute it).
// Positions (rope_position): k row j at j + position_offset, q row i at
// kv_len - q_len + i + position_offset, the bottom-right alignment of the
// causal mask (decode: the one query sits at the last key). The rotation
// acts on each head's head_dim slice of the dense [B, H, N, D] tensor, per
// head whatever the normalization's axis.
//   after the normalization (kAfterNorm; Qwen3, Gemma 3, OLMo2, Chameleon):
//     the logit operand is R x_tilde (x_tilde = x_hat w + beta below);
//   before it (kBeforeNorm; Llama 4's weightless "L2Norm" on its RoPE
//     layers, TransformerEngine's default qk_norm_before_rope = False):
//     x_hat is the normalization of R x. Modelled for l2, rms and none
//     without weight or bias (validate refuses the rest);
//   sdpa: the raw q and k are rotated (order does not matter).
// Rounding points an entry may claim (the rule widens its bound for them,
// validation/rule.h "RoPE"; the oracle rotates exactly either way, and an
// entry that rounds where it does not claim to FAILs at long positions):
//   angle_f32        the angle formed in f32 (pos and inv_freq in f32, as
//                    Hugging Face's rotary embedding does); else in double;
//   cos_sin_storage  cos and sin rounded to the storage format (HF casts
//                    them to the model dtype; vLLM's cos_sin_cache); a
//                    no-op claim for f32 and f64 storage.
// Positions stay within +-2^24 (exact in f32).
enum class RopePairing { kHalf, kInterleaved };
enum class RopeOrder { kAfterNorm, kBeforeNorm };
struct Rope {
  int64_t rotary_dim = 0;  // 0: no RoPE
  RopePairing pairing = RopePairing::kHalf;
  RopeOrder order = RopeOrder::kAfterNorm;
  double theta = 10000.0;        // used when inv_freq is empty
  std::vector<double> inv_freq;  // empty, or rotary_dim / 2 values
  int64_t position_offset = 0;
  bool angle_f32 = false;
  bool cos_sin_storage = false;
};

struct AttentionProblem {
  int64_t batch = 1, heads = 1, q_len = 1, kv_len = 1;
  int64_t head_dim = 1;  // also the value dimension
  Variant variant = Variant::kQKNorm;
  double g = 1.0;  // one learned scalar shared by all heads (qknorm only)
  double eps = kDefaultQKNormEps;  // l2: norm clamp; rms, layer: in the sqrt
  Mask mask;
  // Grouped-query attention: k, v (and dk, dv) have kv_heads heads; query
  // head h reads kv head h / (heads / kv_heads). 0 means kv_heads = heads.
  // kv_heads must divide heads.
  int64_t kv_heads = 0;
  Normalization norm;  // qknorm variant only (sdpa: raw q, k)
  // qknorm variant: the logit scale is the learned g unless fixed_scale, in
  // which case it is `scale` and dg is 0. sdpa: always 1/sqrt(head_dim).
  bool fixed_scale = false;
  double scale = 1.0;
  // Logit softcap (Gemma 2, Grok; issue 34): 0 is off; otherwise every
  // visible logit S (the scaled dot above, either variant) becomes
  //   S' = softcap * tanh(S / softcap)
  // before the mask and the softmax, so |S'| <= softcap, and the backward
  // carries dS' through dS = dS' (1 - (S' / softcap)^2). Masked keys stay
  // masked (probability exactly 0): the cap applies to visible logits only.
  // Must be 0 or a finite normal number > 0 (in f32 too for the f32 and
  // 16-bit entries, which compute in f32). Entries declare it through
  // supports() (the default refuses it).
  double softcap = 0.0;
  Rope rope;  // above; off by default
  // Attention sinks (gpt-oss; issue 34): empty is off; otherwise `heads`
  // values, one learned logit per query head (in the units of the scaled,
  // capped logits S'; the sink itself is neither scaled nor capped). It
  // joins every row's softmax denominator as a key with no value:
  //   lse_i = log(sum_{visible j} exp(S'_ij) + exp(sink_h)),
  //   P_ij  = exp(S'_ij - lse_i),   O_i = sum_{visible j} P_ij v_j,
  // so each row's probabilities sum to 1 - exp(sink_h - lse_i), the sink's
  // share, and lse (which kernels return and the backward reads) includes
  // the sink. A fully masked row is the sink alone: O_i = 0, lse_i =
  // sink_h (finite, where without a sink it is -inf). The backward returns
  //   dsinks_h = -sum_{b, i} exp(sink_h - lse_bhi) delta_bhi,
  //   delta_bhi = dO_bhi . O_bhi,
  // in BackwardArgs::d_sinks. Values must be finite and within f32's range
  // (every entry but f64 forms them in f32); entries declare sinks through
  // supports() (the default refuses them).
  std::vector<double> sinks;
};

// kv_heads with 0 resolved to heads.
inline int64_t kv_heads_of(const AttentionProblem& p) {
  return p.kv_heads > 0 ? p.kv_heads : p.heads;
}
inline bool has_rope(const AttentionProblem& p) {
  return p.rope.rotary_dim > 0;
}
inline bool has_sinks(const AttentionProblem& p) { return !p.sinks.empty(); }
// The position of row n of side 0 (q) or 1 (k): Rope above.
inline int64_t rope_position(const AttentionProblem& p, int side, int64_t n) {
  return n + p.rope.position_offset + (side == 0 ? p.kv_len - p.q_len : 0);
}
// The two dims of pair e (0 <= e < rotary_dim / 2).
struct RopePair {
  int64_t a = 0, b = 0;
};
inline RopePair rope_pair(const Rope& r, int64_t e) {
  if (r.pairing == RopePairing::kHalf) return {e, e + r.rotary_dim / 2};
  return {2 * e, 2 * e + 1};
}
// inv_freq_e in T's arithmetic (the problem's value; an entry claiming f32
// angles forms its own f32 value and is allowed that error).
template <class T>
T rope_inv_freq(const Rope& r, int64_t e) {
  if (!r.inv_freq.empty()) return static_cast<T>(r.inv_freq[e]);
  using std::pow;
  return pow(static_cast<T>(r.theta),
             -static_cast<T>(2 * e) / static_cast<T>(r.rotary_dim));
}
// The paper's formulation (l2 per head, no weight or bias, learned g, no
// GQA) or sdpa without GQA, neither with a softcap, a window, RoPE or sinks:
// what every entry has always supported.
bool is_paper_formulation(const AttentionProblem& p);
// Number of elements of the q (side 0) or k (side 1) weight (and bias): 0
// when the formulation has none (k with a shared weight: 0).
int64_t param_size(const AttentionProblem& p, int side);

// The rows the normalization of one side sees, in a dense [B, H_x, N, D]
// tensor (side 0: q, H_x = heads, N = q_len; side 1: k, H_x = kv_heads, N =
// kv_len): per head one row per (b, h, n) of D values; across heads
// (kAllHeads) one row per (b, n) of H_x * D values, head-major.
struct NormRows {
  int64_t B = 1, H = 1, N = 1, D = 1;
  bool all_heads = false;
  int64_t rows() const { return all_heads ? B * N : B * H * N; }
  int64_t len() const { return all_heads ? H * D : D; }
  // Offset in the dense tensor of element e of row r.
  int64_t at(int64_t r, int64_t e) const {
    if (!all_heads) return r * D + e;
    const int64_t b = r / N, n = r % N, h = e / D, d = e % D;
    return ((b * H + h) * N + n) * D + d;
  }
  // Index of element e of row r in the side's weight (and bias).
  int64_t param(int64_t r, int64_t e, ParamShape s) const {
    if (s == ParamShape::kDim) return all_heads ? e % D : e;
    if (all_heads) return e;
    return ((r / N) % H) * D + e;
  }
};
inline NormRows norm_rows(const AttentionProblem& p, int side) {
  return {p.batch, side == 0 ? p.heads : kv_heads_of(p),
          side == 0 ? p.q_len : p.kv_len, p.head_dim,
          p.variant == Variant::kQKNorm && p.norm.axis == NormAxis::kAllHeads};
}

// Learned parameters of the normalization, dense doubles (their values are
// those of the model's storage format). Sizes must equal param_size().
struct ParamRef {
  const double* data = nullptr;
  int64_t size = 0;
};
struct MutParamRef {
  double* data = nullptr;
  int64_t size = 0;
};
struct NormParams {
  ParamRef q_weight, k_weight, q_bias, k_bias;
};
// Their gradients, reduced as the model reduces them: over batch and tokens
// (and heads for a [head_dim] weight); a shared weight's gradient (in
// dq_weight) sums both sides.
struct NormParamGrads {
  MutParamRef q_weight, k_weight, q_bias, k_bias;
};

// Strides in elements of a [B, H, N, D] tensor; the D dimension is always
// contiguous (stride 1). Element (b, h, n, d) is at
//   b * batch_stride + h * head_stride + n * row_stride + d.
struct Layout4 {
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};
// Dense row-major layout of a [*, heads, rows, dim] tensor.
inline Layout4 contiguous_layout(int64_t heads, int64_t rows, int64_t dim) {
  return Layout4{heads * rows * dim, rows * dim, dim};
}

// Non-owning view of a 4-D tensor. `size` is the number of elements the
// buffer holds (the validator checks every addressed element lies inside).
// The element type is the Precision of the entry that reads it.
template <class Ptr>
struct TensorRef4 {
  Ptr data = nullptr;
  int64_t size = 0;
  Layout4 layout;
};
using ConstTensor4 = TensorRef4<const void*>;
using MutTensor4 = TensorRef4<void*>;

// lse is dense [B, H, q_len] doubles for every precision (a f32 entry stores
// its f32 value exactly).
struct ForwardArgs {
  ConstTensor4 q, k, v;  // q [B,H,q_len,D], k and v [B,kv_heads,kv_len,D]
  MutTensor4 o;          // [B,H,q_len,D]
  double* lse = nullptr;
  int64_t lse_size = 0;
  NormParams params;  // the formulation's learned weights (may be empty)
};

// Outputs must not alias inputs. dg receives the sum over batch and heads
// (0 for sdpa).
struct BackwardArgs {
  ConstTensor4 q, k, v, o, d_o;  // o and lse as returned by forward
  const double* lse = nullptr;
  int64_t lse_size = 0;
  MutTensor4 dq, dk, dv;
  double* dg = nullptr;
  NormParams params;
  NormParamGrads d_params;
  // With sinks (AttentionProblem::sinks): `heads` values, dsinks_h summed
  // over batch and query rows; null and 0 without sinks.
  double* d_sinks = nullptr;
  int64_t d_sinks_size = 0;
};

}  // namespace qknorm

#endif  // QKNORM_ATTENTION_H_
