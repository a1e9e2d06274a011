// Differential libFuzzer target for QKNorm / SDPA attention: every registry
// entry against the long-double oracle under the suite's tolerance rule.
//
// Input (byte format: fuzz_common.h). First byte: mode.
//   mode even: DIFFERENTIAL. B = 1 + u8 % 2, H = 1 + u8 % 2,
//     q_len = 1 + u8 % 16, kv_len = 1 + u8 % 16, D = 1 + u8 % 16, flags,
//     [key lengths], g, eps, then q, k, v, dO element by element (dense
//     [B,H,N,D] order). The case runs through the harness (checked_* front
//     doors, NaN-prefilled outputs, row_pad guard elements).
//   mode odd: LAYOUT. B, H, q_len, kv_len, D are dims (any int64), flags,
//     [key lengths], g, eps, then for q, k, v, o a layout (row/head/batch
//     stride kinds and a size delta), then the element values. Buffers hold
//     exactly `size` elements; unaddressed elements are NaN guards.
//   mode even with bit 2 set (0x04; no corpus file of issues 7-15 has it):
//     FORMULATION (issue 16). As DIFFERENTIAL, but H = 1 + u8 % 4, and after
//     eps a formulation block (decode_formulation below: a preset or a free
//     combination, and kv_heads); then q, k, v, dO (k and v of kv_heads
//     heads), then the learned parameters q_weight, k_weight, q_bias,
//     k_bias (param_size() elements each, scalars like the inputs).
//   mode even with bits 2 and 6 set (0x44; no corpus file before issue 34
//     has bit 6 with bit 2): VARIANT (issue 34). As FORMULATION, with a
//     variant block after the formulation block (decode_variants below:
//     the logit softcap, the sliding window and RoPE).
// flags: bit0 sdpa, bit1 causal, bit2 padding mask, bits3-4 row_pad,
//   bit5 check bitwise determinism across thread counts (1 vs 2),
//   bit6 add one key length too many (invalid), bit7 forward only.
// Key lengths (if bit2): one int8 per batch (B capped at 4 while reading).
//
// What is checked, per entry (the entry's precision decides rounding):
// - invalid input (the fuzzer's own model of validate.h: shapes, counts,
//   eps, g, key lengths, layouts, and elements non-finite after rounding to
//   storage) raises qknorm::Error and nothing else;
// - valid input inside the representable domain (in_domain below) must not
//   throw, and must pass check_attention (which also requires finite
//   results, lse = -inf exactly on fully masked rows); a failure aborts with
//   AgreementReport::failure_message() (entry, worst element, bound);
// - qknorm: the probabilities of the entry's attention_probabilities hook
//   satisfy the non-saturation bounds of shared/NUMERICS.md;
// - LAYOUT: strided outputs meet the same bound as the dense run, and no
//   entry writes an element its output layout does not address.
// Valid input outside the domain must not crash or raise anything but
// qknorm::Error; its values are not checked (their exact result, or an
// intermediate the algorithm must form, is not representable).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "validation/baseline_bounds.h"
#include "validation/check.h"
#include "validation/judge.h"
#include "validation/nonsaturation.h"
#include "validation/oracle.h"

namespace qknorm::fuzz {
namespace {

using validation::AgreementReport;
using validation::AttentionCase;
using validation::AttentionResult;
using validation::OracleAttention;
using validation::PreparedAttention;
using LD = long double;

constexpr int64_t kMaxBatch = 4;  // key lengths read per input at most

// Headroom of the domain: every intermediate bound below must stay under
// max_finite(compute) / kHeadroom. The bounds are worst-case products, so
// 2^6 leaves room for the few extra roundings and reassociations of a
// blocked or vectorized kernel without admitting an overflowing input.
constexpr double kHeadroom = 64.0;

struct Decoded {
  AttentionProblem p;
  int64_t row_pad = 0;
  bool threads = false, forward_only = false;
  bool extra_key_length = false;
};

// The formulation block of FORMULATION mode (after g and eps):
//   sel u8. sel < 0x80: preset presets()[sel % 8] (apply_preset: norm, eps,
//     logit scale); the variant stays what flags bit 0 says (sdpa ignores
//     the normalization); bit 6: keep the decoded eps instead of the
//     preset's; bit 5: a scalar follows, the fixed scale (replacing the
//     preset's scale or learned g).
//   sel >= 0x80: a free combination: bits 0-1 kind (l2, rms, layer, none),
//     bit 2 axis across heads, bits 3-4 weight (0 none, 1 [D], 2 [H_x, D],
//     3 none), bit 5 one_plus_weight, bit 6 bias; then u8 f: bit 0
//     shared_qk_weight, bit 1 round_before_weight, bit 2 fixed scale (then a
//     scalar: the scale); eps is the decoded one.
//   kv u8. bit 7 clear: kv_heads = the (kv % n)-th of the n divisors of H,
//     ascending; set: kv_heads = the low 7 bits as a signed number (-64..63:
//     0 = heads, negative and non-divisors are invalid).
// Invalid combinations (bias without weight, ...) are decoded as they come:
// validation must reject them.
void decode_formulation(ByteReader& r, AttentionProblem* p) {
  const Variant variant = p->variant;
  const uint8_t sel = r.u8();
  if (sel < 0x80) {
    const double eps = p->eps;
    const auto& table = presets();
    apply_preset(table[sel % table.size()].name, p);
    p->variant = variant;
    if (sel & 0x40) p->eps = eps;
    if (sel & 0x20) {
      p->fixed_scale = true;
      p->scale = r.scalar(1.0);
    }
  } else {
    Normalization& n = p->norm;
    n.kind = static_cast<NormKind>(sel & 3);
    n.axis = (sel & 4) ? NormAxis::kAllHeads : NormAxis::kHead;
    const int w = (sel >> 3) & 3;
    n.weight = w == 1   ? ParamShape::kDim
               : w == 2 ? ParamShape::kHeadDim
                        : ParamShape::kNone;
    n.one_plus_weight = (sel & 0x20) != 0;
    n.bias = (sel & 0x40) != 0;
    const uint8_t f = r.u8();
    n.shared_qk_weight = (f & 1) != 0;
    n.round_before_weight = (f & 2) != 0;
    if (f & 4) {
      p->fixed_scale = true;
      p->scale = r.scalar(1.0);
    }
  }
  const uint8_t kv = r.u8();
  if (kv & 0x80) {
    p->kv_heads = static_cast<int8_t>(static_cast<uint8_t>(kv << 1)) / 2;
  } else {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= p->heads; ++d)
      if (p->heads % d == 0) divisors.push_back(d);
    p->kv_heads = divisors[kv % divisors.size()];
  }
}

// The variant block of VARIANT mode (after the formulation block):
//   v u8. bit 0: a logit softcap follows, a scalar (default 5; any value:
//     negative, subnormal, non-finite and out-of-f32 caps are invalid);
//   bit 1: a sliding window follows, two int8 (left, right; -1 unbounded,
//     below -1 invalid); bit 2 (with bit 1): the causal mask too, whatever
//     flags bit 1 said;
//   bit 3: RoPE follows (attention.h, Rope): u8 rotary_dim (odd or above
//     head_dim invalid), u8 flags (bit 0 interleaved, bit 1 before the
//     normalization, bit 2 angle_f32, bit 3 cos_sin_storage, bit 4 the
//     offset negative), u16 position offset, a scalar theta (default 1e4;
//     <= 1 or non-finite invalid);
//   bit 4: attention sinks follow (attention.h): one scalar per query head
//     (default 0.5; non-finite or beyond f32's range invalid).
void decode_variants(ByteReader& r, AttentionProblem* p) {
  const uint8_t v = r.u8();
  if (v & 1) p->softcap = r.scalar(5.0);
  if (v & 2) {
    p->mask.window_left = static_cast<int8_t>(r.u8());
    p->mask.window_right = static_cast<int8_t>(r.u8());
    if (v & 4) p->mask.causal = true;
  }
  if (v & 8) {
    Rope& rope = p->rope;
    rope.rotary_dim = r.u8();
    const uint8_t f = r.u8();
    rope.pairing = f & 1 ? RopePairing::kInterleaved : RopePairing::kHalf;
    rope.order = f & 2 ? RopeOrder::kBeforeNorm : RopeOrder::kAfterNorm;
    rope.angle_f32 = (f & 4) != 0;
    rope.cos_sin_storage = (f & 8) != 0;
    rope.position_offset = r.u16();
    if (f & 16) rope.position_offset = -rope.position_offset;
    rope.theta = r.scalar(1e4);
  }
  if (v & 16)
    for (int64_t h = 0; h < std::clamp<int64_t>(p->heads, 0, 64); ++h)
      p->sinks.push_back(r.scalar(0.5));
}

void decode_params(ByteReader& r, uint8_t flags, Decoded* d) {
  AttentionProblem& p = d->p;
  p.variant = (flags & 1) ? Variant::kSDPA : Variant::kQKNorm;
  p.mask.causal = (flags & 2) != 0;
  d->row_pad = (flags >> 3) & 3;
  d->threads = (flags & 0x20) != 0;
  d->extra_key_length = (flags & 0x40) != 0;
  d->forward_only = (flags & 0x80) != 0;
  if (flags & 4) {
    const int64_t n = std::clamp<int64_t>(p.batch, 0, kMaxBatch) +
                      (d->extra_key_length ? 1 : 0);
    for (int64_t b = 0; b < n; ++b)
      p.mask.key_lengths.push_back(static_cast<int8_t>(r.u8()));
  }
  p.g = r.scalar(1.0);
  p.eps = r.scalar(kDefaultQKNormEps);
}

// The fuzzer's model of validate_problem (written from validate.h, not from
// validate.cc, so a divergence shows up as a finding).
bool problem_valid(const AttentionProblem& p) {
  if (p.batch < 1 || p.heads < 1 || p.q_len < 1 || p.kv_len < 1 ||
      p.head_dim < 1)
    return false;
  for (int64_t rows : {p.q_len, p.kv_len}) {
    int64_t n;
    if (__builtin_mul_overflow(p.batch, p.heads, &n) ||
        __builtin_mul_overflow(n, rows, &n) ||
        __builtin_mul_overflow(n, p.head_dim, &n) ||
        n > std::numeric_limits<int64_t>::max() / 8)
      return false;
  }
  if (p.variant == Variant::kQKNorm &&
      (!std::isfinite(p.eps) || !(p.eps > 0) || !std::isfinite(p.g)))
    return false;
  // Issue 34 (attention.h): a softcap is 0 or a finite normal number > 0;
  // a window side is -1 or >= 0.
  if (!(p.softcap == 0 || (std::isfinite(p.softcap) &&
                           p.softcap >= std::numeric_limits<double>::min())))
    return false;
  if (p.mask.window_left < -1 || p.mask.window_right < -1) return false;
  // Sinks: none, or one per query head, each finite within f32's range.
  if (!p.sinks.empty()) {
    if (static_cast<int64_t>(p.sinks.size()) != p.heads) return false;
    for (double x : p.sinks)
      if (!(std::fabs(x) <= std::numeric_limits<float>::max())) return false;
  }
  // RoPE: rotary_dim 0, or even and <= head_dim; theta finite > 1 (no
  // table here); every position within +-2^24; before the normalization
  // only l2, rms or none without weight or bias.
  if (const Rope& r = p.rope; r.rotary_dim != 0) {
    if (r.rotary_dim < 0 || r.rotary_dim % 2 != 0 || r.rotary_dim > p.head_dim)
      return false;
    if (!(std::isfinite(r.theta) && r.theta > 1)) return false;
    const int64_t lim = int64_t{1} << 24;
    const int64_t lo = std::min<int64_t>(0, p.kv_len - p.q_len);
    if (std::abs(r.position_offset) > lim || lo + r.position_offset < -lim ||
        p.kv_len - 1 + r.position_offset > lim)
      return false;
    if (r.order == RopeOrder::kBeforeNorm && p.variant == Variant::kQKNorm &&
        (p.norm.kind == NormKind::kLayer ||
         p.norm.weight != ParamShape::kNone || p.norm.bias))
      return false;
  }
  const auto& kl = p.mask.key_lengths;
  if (!kl.empty()) {
    if (static_cast<int64_t>(kl.size()) != p.batch) return false;
    for (int64_t len : kl)
      if (len < 0 || len > p.kv_len) return false;
  }
  // Issue 16 (attention.h): kv_heads divides heads; a fixed scale is
  // finite; (1 + w), bias, x_hat rounding and a shared weight need a weight;
  // across heads needs a kind other than none and no [D] weight; a shared
  // weight takes no bias and needs kv_heads = heads.
  if (p.kv_heads < 0 || (p.kv_heads > 0 && p.heads % p.kv_heads != 0))
    return false;
  if (p.variant == Variant::kQKNorm) {
    if (p.fixed_scale && !std::isfinite(p.scale)) return false;
    const Normalization& n = p.norm;
    const bool weighted = n.weight != ParamShape::kNone;
    if (!weighted && (n.bias || n.one_plus_weight || n.round_before_weight ||
                      n.shared_qk_weight))
      return false;
    if (n.axis == NormAxis::kAllHeads &&
        (n.kind == NormKind::kNone || n.weight == ParamShape::kDim))
      return false;
    if (n.shared_qk_weight && (n.bias || kv_heads_of(p) != p.heads))
      return false;
  }
  return true;
}

// The compute-range rule applies to the logit scale in use: the learned g
// or the fixed scale.
// A softcap must also lie in the compute format's normal range (f32 for
// the f32 and 16-bit entries; attention.h).
bool qk_range_ok(const AttentionProblem& p, Precision prec) {
  if (p.softcap != 0 && prec != Precision::kF64) {
    const auto cap = static_cast<float>(p.softcap);
    if (!(std::isfinite(cap) && cap >= std::numeric_limits<float>::min()))
      return false;
  }
  return p.variant != Variant::kQKNorm ||
         compute_range_ok(p.fixed_scale ? p.scale : p.g, p.eps, prec);
}

// Largest row norm of a dense [rows, D] array, in long double (no overflow).
LD max_row_norm(const std::vector<double>& x, int64_t D) {
  LD m = 0;
  for (size_t r = 0; r < x.size(); r += static_cast<size_t>(D)) {
    LD s = 0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<LD>(x[r + d]) * x[r + d];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}

// The representable domain of a valid, rounded case for an entry of
// precision `s`: the oracle's outputs fit the storage format (lse and dg the
// compute format), and every intermediate the textbook algorithm forms fits
// the compute format with kHeadroom to spare:
//   logit amplitude A = |g| (qknorm) or max||q|| ||k|| / sqrt(D) (sdpa; also
//     bounds the q.k dot product before scaling, times sqrt(D));
//   softmax numerator sum_j e_j v_j <= Nk max|v|;
//   dP_ij = dO_i . v_j and delta_i <= D max|dO| max|v| =: P1;
//   dS <= 2 P1, dQ_hat / dK_hat <= A' N 2 P1 with A' = |g| / min(1, min
//     max(||x||, eps)) (qknorm: the normalization backward divides by it) or
//     the sdpa scale times max||k|| (resp. ||q||); dg <= B H Nq Nk 2 P1;
// and, for gradients, no q or k row sits on the clamp kink (near_clamp_kink).
// One side (q: 0, k: 1) of a formulation (issue 16), for in_domain:
//   x:   a bound on ||x_hat|| over one head's slice (l2: 1; rms, layer:
//        sqrt(len), len the normalization row's length; none: max ||x||);
//   w:   max |w| (or |1 + w|; 1 without a weight), b: max |beta|;
//   t:   w x + sqrt(D) b >= ||x_tilde|| of a head's slice;
//   den: the smallest divisor of a row (l2: max(||x||, eps); rms:
//        sqrt(mean x^2 + eps); layer: sqrt(var + eps); none: 1);
//   back: the normalization backward's growth (|dx| <= back |du| / den);
//   kink: (l2 gradients) some row's norm within rounding distance of eps.
struct SideBound {
  LD x = 1, w = 1, b = 0, t = 1, den = 1, back = 1;
  int64_t len = 1;
  bool kink = false;
};

SideBound side_bound(const AttentionCase& c, int side, Precision s) {
  const AttentionProblem& p = c.problem;
  const Normalization& n = p.norm;
  const NormRows rows = norm_rows(p, side);
  const std::vector<double>& x = side == 0 ? c.q : c.k;
  const std::vector<double>& w =
      side == 0 || n.shared_qk_weight ? c.q_weight : c.k_weight;
  const std::vector<double>& beta = side == 0 ? c.q_bias : c.k_bias;
  SideBound r;
  r.len = rows.len();
  const LD len = static_cast<LD>(r.len), eps = p.eps;
  r.den = std::numeric_limits<LD>::infinity();
  const LD tol = (len + 8) * compute_roundoff(s) * eps;
  for (int64_t i = 0; i < rows.rows(); ++i) {
    LD sum = 0, sq = 0;
    for (int64_t e = 0; e < rows.len(); ++e) {
      const LD v = x[static_cast<size_t>(rows.at(i, e))];
      sum += v, sq += v * v;
    }
    const LD mu = sum / len;
    LD var = 0;
    for (int64_t e = 0; e < rows.len(); ++e) {
      const LD v = x[static_cast<size_t>(rows.at(i, e))] - mu;
      var += v * v;
    }
    LD d = 1;
    switch (n.kind) {
      case NormKind::kL2:
        d = std::max(std::sqrt(sq), eps);
        r.kink |= std::fabs(std::sqrt(sq) - eps) <= tol;
        break;
      case NormKind::kRms:
        d = std::sqrt(sq / len + eps);
        break;
      case NormKind::kLayer:
        d = std::sqrt(var / len + eps);
        break;
      case NormKind::kNone:
        break;
    }
    r.den = std::min(r.den, d);
  }
  switch (n.kind) {
    case NormKind::kL2:
      r.back = 3;
      break;
    case NormKind::kRms:
    case NormKind::kLayer:
      r.x = std::sqrt(len);
      r.back = 3;
      break;
    case NormKind::kNone:
      r.x = max_row_norm(x, p.head_dim);
      r.den = 1;
      break;
  }
  if (n.weight != ParamShape::kNone) {
    r.w = 0;
    for (double v : w)
      r.w = std::max(r.w, std::fabs(n.one_plus_weight ? 1 + static_cast<LD>(v)
                                                      : static_cast<LD>(v)));
  }
  for (double v : beta) r.b = std::max<LD>(r.b, std::fabs(v));
  r.t = r.w * r.x + std::sqrt(static_cast<LD>(p.head_dim)) * r.b;
  return r;
}

// in_domain for the qknorm formulations other than the paper's (issue 16):
// the same checks with the operands x_tilde (bounds of side_bound) in place
// of the unit rows, plus the parameter gradients (sums over the rows of
// x_hat times dx_tilde, resp. dx_tilde).
bool in_domain_formulation(const AttentionCase& c, Precision s,
                           bool forward_only) {
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  const LD lim = max_finite(cf) / kHeadroom;
  const SideBound q = side_bound(c, 0, s), k = side_bound(c, 1, s);
  if (!forward_only && (q.kink || k.kink)) return false;
  const LD D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const LD N = std::max(Nq, Nk);
  const LD vmax = max_abs(c.v), domax = max_abs(c.d_o);
  const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
  const LD dot = q.t * k.t, amp = sc * dot;
  const LD rows = static_cast<LD>(p.batch) * p.heads * Nq * Nk;
  const LD p1 = D * domax * vmax;
  const LD grad_scale =
      sc * std::max(k.t * q.w * q.back / std::min<LD>(q.den, 1),
                    q.t * k.w * k.back / std::min<LD>(k.den, 1));
  const LD param = rows * 2 * p1 * sc * std::max(q.t, k.t) *
                   std::max({q.x, k.x, static_cast<LD>(1)});
  // The scaled dS itself (sc |dS_ij| <= sc 2 p1), which kernels form before
  // it meets the other side's operand: grad_scale and param bound it only
  // through max |x_tilde'|, 0 for zero weights (found by the CI mode with
  // formulations on, seed 3 at 535e52c: rms, zero [D] weights, g = 65504,
  // f64, dP up to 1.6e304: s dS = 1.97e308 overflowed in reference:f64,
  // and inf * 0 gave NaN dq, dk where the oracle's are 0). The paper's
  // checks hold it (grad_scale >= |g| there).
  const LD checks[] = {q.t,
                       k.t,
                       dot,
                       amp,
                       Nk * vmax,
                       p1,
                       grad_scale * N * 2 * p1,
                       rows * 2 * p1 * dot,
                       param,
                       sc * 2 * p1};
  const size_t n = forward_only ? 5 : 10;
  for (size_t i = 0; i < n; ++i)
    if (!(checks[i] <= lim)) return false;
  if (forward_only) return true;
  const LD len = static_cast<LD>(std::max(q.len, k.len));
  const LD o_store = D * domax * (unit_roundoff(s) * vmax + ulp(s, 0.0));
  const LD noise =
      (len + D + N + 8) * compute_roundoff(s) * std::max(checks[6], param) +
      grad_scale * N * 2 * o_store;
  return noise <= max_finite(s) / kHeadroom;
}

bool in_domain(const AttentionCase& c, const OracleAttention& orc, Precision s,
               bool forward_only) {
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  if (!representable(orc.o, s) || !representable(orc.lse, cf, true))
    return false;
  if (!forward_only &&
      (!representable(orc.dq, s) || !representable(orc.dk, s) ||
       !representable(orc.dv, s) || !representable(orc.dg, cf)))
    return false;
  if (!forward_only &&
      (!representable(orc.dq_weight, s) || !representable(orc.dk_weight, s) ||
       !representable(orc.dq_bias, s) || !representable(orc.dk_bias, s)))
    return false;
  if (p.variant == Variant::kQKNorm && !is_paper_formulation(p))
    return in_domain_formulation(c, s, forward_only);
  if (!forward_only && p.variant == Variant::kQKNorm &&
      (near_clamp_kink(c.q, p.head_dim, p.eps, s) ||
       near_clamp_kink(c.k, p.head_dim, p.eps, s)))
    return false;
  const LD lim = max_finite(cf) / kHeadroom;
  const LD D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
  const LD N = std::max(Nq, Nk);
  const LD vmax = max_abs(c.v), domax = max_abs(c.d_o);
  LD amp, grad_scale;
  if (p.variant == Variant::kQKNorm) {
    amp = std::fabs(p.g);
    // The normalization backward divides dQ_hat by max(||q_i||, eps), and
    // its rounding noise (u |dQ_hat|, from du - u (u . du)) with it: the
    // noise must stay representable too (found by the fuzzer: g = 9e18,
    // ||q|| ~ 1e-300, a true dq of 1e307 computed as inf).
    const LD den = std::min(min_row_norm(c.q, p.head_dim, p.eps),
                            min_row_norm(c.k, p.head_dim, p.eps));
    grad_scale = amp / std::min<LD>(den, 1);
  } else {
    const LD qn = max_row_norm(c.q, p.head_dim);
    const LD kn = max_row_norm(c.k, p.head_dim);
    amp = qn * kn;  // the unscaled dot product (>= the logit)
    grad_scale = std::max(qn, kn);
  }
  const LD p1 = D * domax * vmax;
  const LD checks[] = {amp, Nk * vmax, p1, grad_scale * N * 2 * p1,
                       static_cast<LD>(p.batch) * p.heads * Nq * Nk * 2 * p1};
  const size_t n = forward_only ? 2 : 5;
  for (size_t i = 0; i < n; ++i)
    if (!(checks[i] <= lim)) return false;
  // The rounding noise of those gradient terms, (D + N + 8) u_c times their
  // size, lands in the stored gradient: it must fit the storage format too
  // (found by the fuzzer: f16, a zero q row, du / eps with du = f32 noise
  // gave inf where the oracle's dq is 0).
  // The backward also reads the stored O: delta_i = dO_i . O_i carries O's
  // storage error, u_s |O| + ulp_s(0) per element (|O| <= max|v|), times
  // D max|dO|, and the same amplification grad_scale N 2 (found by the
  // fuzzer: f16, a zero q row, O = 2.98e-8 rounded to 0 in f16, so delta
  // lost 2.2e-8 and dq = g dS k_hat / eps gave 1.4e5 = inf in f16 where the
  // oracle's dq is exactly 0: a storage limit, not a kernel defect).
  const LD o_store = D * domax * (unit_roundoff(s) * vmax + ulp(s, 0.0));
  const LD noise = (D + N + 8) * compute_roundoff(s) * checks[3] +
                   grad_scale * N * 2 * o_store;
  return forward_only || noise <= max_finite(s) / kHeadroom;
}

std::string entry_ctx(const Backend& e, const AttentionCase& c) {
  char mags[160];
  std::snprintf(mags, sizeof mags,
                "\n  max|q|=%.3g max|k|=%.3g max|v|=%.3g max|dO|=%.3g",
                max_abs(c.q), max_abs(c.k), max_abs(c.v), max_abs(c.d_o));
  // The input class (validation/case.h) from the case's rows and mask: the
  // fuzzed bytes carry no distribution.
  std::string m = "entry " + e.name() + " on " + c.describe() +
                  " class=" + validation::name(validation::input_class(c)) +
                  mags;
  // Small cases print their values (minimized findings mostly are), enough
  // to rebuild the case without the fuzzer's byte format.
  if (c.q.size() + c.k.size() + c.v.size() + c.d_o.size() <= 128) {
    const char* names[] = {"q",        "k",        "v",      "dO",
                           "q_weight", "k_weight", "q_bias", "k_bias"};
    const std::vector<double>* ts[] = {&c.q,      &c.k,        &c.v,
                                       &c.d_o,    &c.q_weight, &c.k_weight,
                                       &c.q_bias, &c.k_bias};
    for (int t = 0; t < 8; ++t) {
      if (t >= 4 && ts[t]->empty()) continue;
      m += std::string("\n  ") + names[t] + ":";
      for (double x : *ts[t]) {
        char b[32];
        std::snprintf(b, sizeof b, " %.9g", x);
        m += b;
      }
    }
  }
  return m;
}

// The guarded buffers of one case in one storage precision, encoded once
// per input and copied for every run on it (run_attention's `fresh`,
// validation/run.h): each entry of the precision, the naive, the
// two-thread run and the probabilities hook get the bytes a new
// AttentionBuffers of the case holds (its inputs, NaN outputs, poison),
// without encoding the case again (issue 32: building the buffers was ~15%
// of an execution, perf).
class EncodedCase {
 public:
  // Built on first use, inside the caller's expect_outcome (building them
  // validates the case, as run_attention does).
  const validation::AttentionBuffers* get(const AttentionCase& c, Precision s) {
    if (!bufs_) bufs_.emplace(c, s);
    return &*bufs_;
  }
  // The case with row_pad 0 (the probabilities hook's dense buffers).
  const validation::AttentionBuffers& dense(const AttentionCase& c,
                                            Precision s) {
    if (c.row_pad == 0) return *get(c, s);
    if (!dense_) {
      AttentionCase d = c;
      d.row_pad = 0;
      dense_.emplace(d, s);
    }
    return *dense_;
  }

 private:
  std::optional<validation::AttentionBuffers> bufs_, dense_;
};

// Softmax non-saturation: the bound of validation/nonsaturation.h (its one
// definition) on the entry's own probabilities, at the rule's logit
// amplitude with the computed logits' error.
// ws: the workspace of the entry's judged run, so that the hook runs on the
// one thread that run used (simd/backend.cc) and allocates nothing new.
// *amp: the computed logit amplitude, a function of the case, the oracle
// and the precision only: computed for the first entry of a precision and
// kept (its long double operand magnitudes were ~4.5% of an execution).
// enc: the case's buffers in the entry's precision (a copy of its dense
// ones is the hook's).
void check_non_saturation(const Backend& e, const AttentionCase& c,
                          const OracleAttention& orc, Workspace* ws,
                          std::optional<double>* amp, EncodedCase* enc) {
  const AttentionProblem& p = c.problem;
  if (p.variant != Variant::kQKNorm) return;
  // The hook reads dense buffers (row_pad 0), as it always has here.
  validation::AttentionBuffers buf = enc->dense(c, e.precision());
  const int64_t Nq = p.q_len, Nk = p.kv_len;
  std::vector<double> probs(static_cast<size_t>(p.batch * p.heads * Nq * Nk),
                            std::numeric_limits<double>::quiet_NaN());
  if (!e.attention_probabilities(p, buf.forward_args(), probs.data(), ws))
    return;
  if (const auto g = buf.guard_violations(); !g.empty())
    fail("probabilities hook wrote outside its views",
         entry_ctx(e, c) + "\n  " + g.front().message());
  if (!amp->has_value())
    *amp = validation::computed_logit_amplitude(c, &orc, e.precision(),
                                                validation::logit_amplitude(c));
  const std::string v =
      validation::check_nonsaturation(p, probs, nullptr, **amp, e.precision());
  if (!v.empty()) fail(v.substr(0, v.find(':')), entry_ctx(e, c) + "\n  " + v);
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 8) == 0);
}

// Entries run on one thread (both modes): every result judged is a
// one-thread result, and in DIFFERENTIAL mode flag bit 5 (check_threads)
// requires the two-thread result to equal it bit for bit. The threaded path
// is thus exercised only by inputs with bit 5 set (before, every input ran
// two threads), and there it must match a judged result exactly. Issue 14:
// two threads per call spent a quarter of each execution waking workers
// (perf), and their scheduling varied the coverage a run sees, and so
// libFuzzer's path, between two runs of the same seed.
constexpr ExecConfig kOneThread{1};

// enc: the case's buffers, encoded once for every entry of the precision
// (null: new ones, as for invalid input, which must meet each check of the
// front doors).
AttentionResult run(const Backend& e, const AttentionCase& c, bool fwd_only,
                    const ExecConfig& cfg = kOneThread, Workspace* ws = nullptr,
                    EncodedCase* enc = nullptr) {
  if (enc != nullptr)
    return validation::run_attention_on(e, c, *enc->get(c, e.precision()),
                                        !fwd_only, cfg, ws);
  return fwd_only ? run_attention_forward(e, c, cfg, ws)
                  : run_attention(e, c, cfg, ws);
}

// a: the entry's judged result, a one-thread run on a fresh workspace (the
// same run this check made for itself before, which repeated it).
void check_threads(const Backend& e, const AttentionCase& c, bool fwd_only,
                   const AttentionResult& a, EncodedCase* enc) {
  const ExecConfig two{2};
  const AttentionResult b = run(e, c, fwd_only, two, nullptr, enc);
  if (!bitwise_equal(a.o, b.o) || !bitwise_equal(a.lse, b.lse) ||
      !bitwise_equal(a.dq, b.dq) || !bitwise_equal(a.dk, b.dk) ||
      !bitwise_equal(a.dv, b.dv) ||
      std::memcmp(&a.dg, &b.dg, sizeof a.dg) != 0 ||
      !bitwise_equal(a.dq_weight, b.dq_weight) ||
      !bitwise_equal(a.dk_weight, b.dk_weight) ||
      !bitwise_equal(a.dq_bias, b.dq_bias) ||
      !bitwise_equal(a.dk_bias, b.dk_bias))
    fail("results differ between 1 and 2 threads", entry_ctx(e, c));
}

// Runs `e` on a valid case outside the domain: anything but a crash, UB or
// a non-qknorm exception is acceptable.
void run_unchecked(const Backend& e, const AttentionCase& c, bool fwd_only,
                   EncodedCase* enc) {
  try {
    run(e, c, fwd_only, kOneThread, nullptr, enc);
  } catch (const Error&) {
  } catch (const std::exception& ex) {
    fail("exception other than qknorm::Error",
         entry_ctx(e, c) + "\n  what(): " + ex.what());
  }
}

// One scratch for every oracle this process computes: oracle_attention's
// result does not depend on it (validation/oracle.h), and its arrays keep
// their memory from input to input instead of a new set per oracle.
validation::OracleWorkspace& oracle_workspace() {
  static validation::OracleWorkspace ws;
  return ws;
}

// Every input tensor of a and b is bitwise the same.
bool same_values(const AttentionCase& a, const AttentionCase& b) {
  for (auto t :
       {&AttentionCase::q, &AttentionCase::k, &AttentionCase::v,
        &AttentionCase::d_o, &AttentionCase::q_weight, &AttentionCase::k_weight,
        &AttentionCase::q_bias, &AttentionCase::k_bias})
    if (!bitwise_equal(a.*t, b.*t)) return false;
  return true;
}

// formulation: FORMULATION mode (H up to 4, the formulation block, k and v
// of kv_heads heads, the learned parameters after dO); variants: VARIANT
// mode (the variant block after the formulation block).
void differential(ByteReader& r, bool formulation, bool variants) {
  Decoded d;
  AttentionProblem& p = d.p;
  p.batch = 1 + r.u8() % 2;
  p.heads = 1 + r.u8() % (formulation ? 4 : 2);
  p.q_len = 1 + r.u8() % 16;
  p.kv_len = 1 + r.u8() % 16;
  p.head_dim = 1 + r.u8() % 16;
  decode_params(r, r.u8(), &d);
  if (formulation) decode_formulation(r, &p);
  if (variants) decode_variants(r, &p);
  AttentionCase c;
  c.problem = p;
  c.row_pad = d.row_pad;
  const size_t nq =
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.head_dim);
  const size_t nk =
      static_cast<size_t>(p.batch * kv_heads_of(p) * p.kv_len * p.head_dim);
  for (auto* t : {&c.q, &c.k, &c.v, &c.d_o}) {
    const size_t n = (t == &c.q || t == &c.d_o) ? nq : nk;
    for (size_t i = 0; i < n; ++i) t->push_back(r.scalar(1.0));
  }
  if (formulation && p.variant == Variant::kQKNorm) {
    // Weights default to the identity (1, or 0 for Gemma's 1 + w), biases
    // to 0.
    const double w0 = p.norm.one_plus_weight ? 0.0 : 1.0;
    const bool bias = p.norm.bias;
    for (int side = 0; side < 2; ++side) {
      auto& w = side == 0 ? c.q_weight : c.k_weight;
      for (int64_t i = 0; i < param_size(p, side); ++i)
        w.push_back(r.scalar(w0));
    }
    for (int side = 0; side < 2 && bias; ++side) {
      auto& b = side == 0 ? c.q_bias : c.k_bias;
      for (int64_t i = 0; i < param_size(p, side); ++i)
        b.push_back(r.scalar(0.0));
    }
  }
  const bool pvalid = problem_valid(p);
  // The oracle (long double) and the naive baseline's result are the same
  // for every entry of a precision: computed once per input and precision,
  // then each entry is run and judged against them (judge_attention, the
  // rule check_attention applies). Issue 14: this alone changed the rate
  // little (the oracle is under 1% of an execution, perf); the gain came from
  // one thread per call and -entropic=0 (fuzz/README.md, "Rate").
  struct PerPrecision {
    bool done = false, valid = false, domain = false, naive_done = false;
    AttentionCase rc;
    OracleAttention own;  // the oracle, unless another precision's is rc's
    const OracleAttention* oracle = nullptr;
    AttentionResult naive;
    // What judge_attention derives from all but the entry's result (the
    // rule's tables, the naive's margins): the same for every entry of the
    // precision, so prepared once (judge.h: the same report).
    std::optional<PreparedAttention> prepared;
    std::optional<double> amplitude;  // check_non_saturation's
    EncodedCase enc;                  // rc's buffers (valid rc only)
  } per[4];
  // The oracle of another precision whose rounded inputs are rc's, when
  // the oracle does not tell the two storages apart (f32, bf16 and f16
  // unless x_hat rounds to storage: oracle_storage_equivalent); null if
  // none. Small fuzzed values (kSmall, m / 4) round alike in all three.
  auto shared_oracle = [&](const AttentionCase& rc) -> const OracleAttention* {
    for (const PerPrecision& o : per)
      if (o.done && o.valid &&
          validation::oracle_storage_equivalent(p, o.rc.storage, rc.storage) &&
          same_values(o.rc, rc))
        return o.oracle;
    return nullptr;
  };
  for (const Backend* e : all_backends().entries()) {
    if (!e->available()) continue;
    // A plug-in entry (QKNORM_PLUGIN) meets only the problems it declares.
    if (pvalid && !e->supports(p)) continue;
    PerPrecision& pp = per[static_cast<int>(e->precision())];
    if (!pp.done) {
      pp.done = true;
      pp.rc = validation::round_inputs(c, e->precision());
      pp.valid = pvalid && qk_range_ok(p, e->precision()) &&
                 all_finite(pp.rc.q) && all_finite(pp.rc.k) &&
                 all_finite(pp.rc.v) &&
                 (d.forward_only || all_finite(pp.rc.d_o)) &&
                 all_finite(pp.rc.q_weight) && all_finite(pp.rc.k_weight) &&
                 all_finite(pp.rc.q_bias) && all_finite(pp.rc.k_bias);
      if (pp.valid) {
        pp.oracle = shared_oracle(pp.rc);
        if (pp.oracle == nullptr) {
          pp.own = validation::oracle_attention(pp.rc, nullptr, {},
                                                &oracle_workspace());
          pp.oracle = &pp.own;
        }
        pp.domain =
            in_domain(pp.rc, *pp.oracle, e->precision(), d.forward_only);
      }
    }
    const Context ctx([&] { return entry_ctx(*e, pp.rc); });
    if (!pp.valid) {
      expect_outcome(true, ctx, [&] { run(*e, pp.rc, d.forward_only); });
      continue;
    }
    if (!pp.domain) {
      run_unchecked(*e, pp.rc, d.forward_only, &pp.enc);
      continue;
    }
    const Backend& nb = validation::naive_for(e->precision());
    if (!pp.naive_done) {  // the naive entry answers for its own failure
      expect_outcome(false, Context([&] { return entry_ctx(nb, pp.rc); }), [&] {
        pp.naive = run(nb, pp.rc, d.forward_only, kOneThread, nullptr, &pp.enc);
      });
      pp.naive_done = true;
    }
    // One workspace per entry and input: the judged run and the
    // probabilities hook share it (a fresh one per input: nothing of an
    // earlier input carries over).
    const std::unique_ptr<Workspace> ws = e->make_workspace();
    AgreementReport rep;
    AttentionResult judged;
    expect_outcome(false, ctx, [&] {
      judged = run(*e, pp.rc, d.forward_only, kOneThread, ws.get(), &pp.enc);
      if (!pp.prepared)
        pp.prepared =
            validation::prepare_attention(pp.rc, e->precision(), *pp.oracle,
                                          &pp.naive, d.forward_only, nb.name());
      rep = validation::judge_attention(*pp.prepared, pp.rc, e->precision(),
                                        *pp.oracle, judged, e->name());
    });
    log_verdict(rep, ctx);
    if (!rep.pass)
      fail("entry disagrees with the oracle",
           rep.failure_message() + ctx.str());
    // The a-priori bounds of baseline_bounds.h are the paper's (and
    // sdpa's) without GQA.
    if (e == &validation::naive_for(e->precision()) && is_paper_formulation(p))
      check_baseline(
          rep, validation::baseline_bounds(pp.rc, *pp.oracle, e->precision()),
          {{validation::Field::kO,
            underflow_slack(e->precision(), p.head_dim + p.kv_len,
                            max_abs(pp.rc.v))},
           {validation::Field::kLse,
            underflow_slack(e->precision(), p.head_dim + p.kv_len)}});
    check_non_saturation(*e, pp.rc, *pp.oracle, ws.get(), &pp.amplitude,
                         &pp.enc);
    if (d.threads) check_threads(*e, pp.rc, d.forward_only, judged, &pp.enc);
  }
}

// ---- LAYOUT mode ----------------------------------------------------------

// A stride: kind = tag % 4: 0 dense, 1 dense + u8 % 8 extra, 2 zero (rows
// or heads alias: allowed for inputs), 3 raw int64.
int64_t decode_stride(ByteReader& r, int64_t dense) {
  const uint8_t tag = r.u8();
  switch (tag % 4) {
    case 0:
      return dense;
    case 1:
      return sat_add(dense, r.u8() % 8);
    case 2:
      return 0;
    default:
      return static_cast<int64_t>(r.u64());
  }
}

// Largest buffer the layout mode allocates; a layout needing more is only
// run with a small buffer, where validation must reject it.
constexpr int64_t kMaxElements = 1 << 15;
constexpr int64_t kSmallBuffer = 16;

struct LayoutSpec {
  Layout4 layout;
  int64_t size = kSmallBuffer;
  bool valid = false;  // the model of validate_tensor
};

LayoutSpec decode_layout(ByteReader& r, int64_t H, int64_t rows, int64_t D,
                         int64_t B, bool dims_small) {
  LayoutSpec s;
  // Dense strides, saturated so that huge dims do not overflow here.
  auto sat_mul = [](int64_t a, int64_t b) {
    int64_t x;
    return __builtin_mul_overflow(a, b, &x)
               ? std::numeric_limits<int64_t>::max()
               : x;
  };
  s.layout.row_stride = decode_stride(r, D);
  s.layout.head_stride = decode_stride(r, sat_mul(rows, s.layout.row_stride));
  s.layout.batch_stride = decode_stride(r, sat_mul(H, s.layout.head_stride));
  const int delta = static_cast<int8_t>(r.u8()) % 4;  // -3..3
  const int64_t need = required_size(s.layout, B, H, rows, D);
  // need may be INT64_MAX itself (D + (rows - 1) row_stride without
  // overflow): need + 3 would overflow (UBSan, CI fuzz run of 183cdfc).
  if (dims_small && need > 0 && need <= kMaxElements - 3)
    s.size = std::max<int64_t>(1, need + delta);
  s.valid =
      dims_small && need > 0 && s.layout.row_stride >= D && s.size >= need;
  return s;
}

struct LayoutCase {
  Decoded d;
  LayoutSpec q, k, v, o;
  std::vector<double> qv, kv, vv;  // dense values
};

// What the dense judging of one input needs per storage precision: the
// values as stored and loaded back, the oracle and the naive baseline's
// result. The same for every entry of a precision (the values after the
// same storage and aliasing), so computed once per input and precision, as
// DIFFERENTIAL mode does.
struct LayoutDense {
  bool done = false, domain = false, naive_done = false;
  OracleAttention orc;
  AttentionResult naive;
  std::optional<PreparedAttention> prepared;  // both judges' (judge.h)
  EncodedCase enc;                            // the dense runs' buffers
};

void run_layout_entry(const Backend& e, const LayoutCase& lc, bool valid,
                      LayoutDense& dense) {
  const AttentionProblem& p = lc.d.p;
  const Precision s = e.precision();
  const bool small = valid;  // valid implies dims and buffers are small
  const int64_t B = small ? p.batch : 1, H = small ? p.heads : 1;
  const int64_t Nq = small ? p.q_len : 1, Nk = small ? p.kv_len : 1;
  const int64_t D = small ? p.head_dim : 1;
  TensorBuffer q("q", s, {B, H, Nq, D}, lc.q.layout, lc.q.size);
  TensorBuffer k("k", s, {B, H, Nk, D}, lc.k.layout, lc.k.size);
  TensorBuffer v("v", s, {B, H, Nk, D}, lc.v.layout, lc.v.size);
  TensorBuffer o("o", s, {B, H, Nq, D}, lc.o.layout, lc.o.size);
  if (small) {
    q.store(lc.qv);
    k.store(lc.kv);
    v.store(lc.vv);
  }
  // lse: B*H*q_len doubles when that is small, else a short buffer (the
  // shape or the layouts are invalid then anyway).
  std::vector<double> lse(small ? static_cast<size_t>(B * H * Nq) : 1,
                          std::numeric_limits<double>::quiet_NaN());
  ForwardArgs a{q.cview(), k.cview(),  v.cview(),
                o.view(),  lse.data(), static_cast<int64_t>(lse.size()),
                {}};
  AttentionCase c;
  c.problem = p;
  c.storage = s;  // the values below are s's (load): the oracle's arithmetic
  if (small) {
    c.q = q.load();
    c.k = k.load();
    c.v = v.load();
    c.d_o.assign(c.q.size(), 0.0);
  }
  // Values after storage rounding and aliasing decide validity too.
  const bool finite = all_finite(c.q) && all_finite(c.k) && all_finite(c.v);
  const Context ctx([&] { return "LAYOUT " + entry_ctx(e, c); });
  auto ws = e.make_workspace();
  const bool ran = expect_outcome(
      !(valid && finite && qk_range_ok(p, s)), ctx,
      [&] { checked_attention_forward(e, p, a, ws.get(), kOneThread); });
  if (!ran) return;
  if (!o.guards_intact())
    fail("entry wrote outside its output layout", ctx.str());
  // The same values, dense, through the harness: the strided result must
  // meet the bound the dense run is held to.
  const Backend& nb = validation::naive_for(s);
  if (!dense.done) {
    dense.done = true;
    dense.orc =
        validation::oracle_attention(c, nullptr, {}, &oracle_workspace());
    dense.domain = in_domain(c, dense.orc, s, true);
  }
  if (!dense.domain || o.overlapping()) return;
  if (!dense.naive_done) {
    dense.naive_done = true;
    dense.naive = run(nb, c, true, kOneThread, nullptr, &dense.enc);
    dense.prepared = validation::prepare_attention(
        c, s, dense.orc, &dense.naive, true, nb.name());
  }
  const OracleAttention& orc = dense.orc;
  const PreparedAttention& prep = *dense.prepared;
  AgreementReport rep = validation::judge_attention(
      prep, c, s, orc, run(e, c, true, kOneThread, nullptr, &dense.enc),
      e.name());
  log_verdict(rep, ctx);
  if (!rep.pass)
    fail("entry disagrees with the oracle", rep.failure_message() + ctx.str());
  // The strided result, judged by the same verdict.
  AttentionResult strided;
  strided.o = o.load();
  strided.lse = lse;
  const AgreementReport srep = validation::judge_attention(
      prep, c, s, orc, strided, e.name() + " (strided)");
  log_verdict(srep, ctx);
  if (!srep.pass)
    fail("strided result outside the tolerance bound",
         srep.failure_message() + ctx.str());
}

void layout(ByteReader& r) {
  LayoutCase lc;
  AttentionProblem& p = lc.d.p;
  p.batch = r.dim();
  p.heads = r.dim();
  p.q_len = r.dim();
  p.kv_len = r.dim();
  p.head_dim = r.dim();
  const uint8_t flags = r.u8();
  decode_params(r, static_cast<uint8_t>(flags | 0x80), &lc.d);
  const bool pvalid = problem_valid(p);
  const bool small = pvalid && p.batch <= 2 && p.heads <= 2 && p.q_len <= 16 &&
                     p.kv_len <= 16 && p.head_dim <= 16;
  lc.q = decode_layout(r, p.heads, p.q_len, p.head_dim, p.batch, small);
  lc.k = decode_layout(r, p.heads, p.kv_len, p.head_dim, p.batch, small);
  lc.v = decode_layout(r, p.heads, p.kv_len, p.head_dim, p.batch, small);
  lc.o = decode_layout(r, p.heads, p.q_len, p.head_dim, p.batch, small);
  const bool valid =
      small && lc.q.valid && lc.k.valid && lc.v.valid && lc.o.valid;
  if (small) {
    const size_t nq =
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.head_dim);
    const size_t nk =
        static_cast<size_t>(p.batch * p.heads * p.kv_len * p.head_dim);
    for (size_t i = 0; i < nq; ++i) lc.qv.push_back(r.scalar());
    for (size_t i = 0; i < nk; ++i) lc.kv.push_back(r.scalar());
    for (size_t i = 0; i < nk; ++i) lc.vv.push_back(r.scalar());
  }
  // A shape that is valid but too large to allocate is exercised with small
  // buffers, which validation must reject.
  LayoutDense dense[4];
  for (const Backend* e : all_backends().entries())
    if (e->available() && (!valid || e->supports(lc.d.p)))
      run_layout_entry(*e, lc, valid, dense[static_cast<int>(e->precision())]);
}

}  // namespace
}  // namespace qknorm::fuzz

// QKNORM_FUZZ_FORMULATIONS=0 skips FORMULATION-mode inputs: for an
// exploration while that mode has an open finding of the verdict
// (fuzz/findings/README.md); run_ci.sh's fixed-seed exploration sets it
// while one is open.
bool formulations_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("QKNORM_FUZZ_FORMULATIONS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// ASan's defaults for this target (ASAN_OPTIONS overrides each key; unused
// in builds without ASan). An execution allocates ~0.9 MB in ~1100 blocks
// (ASan print_stats, after the buffer pool of validation/buffers.h), and
// ASan stores an allocation and a free stack for each; its default 256 MB
// quarantine is ~300 executions of frees, whose fresh pages the first
// executions fault in. Measured side by side (issue 32, seed 1, 2000 runs,
// two rounds): 1.25x the executions per CPU second with both, no clear gain
// with either alone. What a report loses: a heap report's allocation and
// free stacks show 5 frames instead of 30 (the faulting access's stack is
// whole); a use-after-free is caught while the block is among the last
// 16 MB freed, ~15 executions instead of ~300: always within the execution
// that freed it. Heap overflows are caught as before.
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=16:malloc_context_size=5";
}

// QKNORM_FUZZ_MODE=variant decodes every input in VARIANT mode (its first
// byte's mode bits read as 0x44): an exploration of the variants alone
// (issue 34's 10^4 executions per seed, fuzz/README.md).
bool variants_only() {
  static const bool on = [] {
    const char* v = std::getenv("QKNORM_FUZZ_MODE");
    return v != nullptr && std::string(v) == "variant";
  }();
  return on;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qknorm::fuzz::ByteReader r(data, size);
  uint8_t mode = r.u8();
  if (variants_only()) mode = static_cast<uint8_t>((mode & ~1) | 0x44);
  if (mode & 1)
    qknorm::fuzz::layout(r);
  else if ((mode & 4) == 0 || formulations_enabled())
    qknorm::fuzz::differential(r, (mode & 4) != 0, (mode & 0x44) == 0x44);
  return 0;
}
