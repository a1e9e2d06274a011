#include "qknorm/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "qknorm/error.h"

namespace qknorm {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// a * b, or throws naming `what` if it overflows int64.
int64_t mul_checked(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(what, {}, "element count overflows int64");
  return r;
}

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

void check_dim(const char* what, int64_t v) {
  if (v < 1)
    throw Error(what, {},
                "dimension must be >= 1 (got " + std::to_string(v) + ")");
}

const char* kind_of(double x) {
  if (std::isnan(x)) return "NaN";
  return x > 0 ? "+Inf" : "-Inf";
}

void check_eps(double eps) {
  if (!std::isfinite(eps) || !(eps > 0))
    throw Error("eps", {}, "must be finite and > 0 (got " + num(eps) + ")");
}

// Element count of [B,H,rows,D] with the byte size checked too.
void check_count(const char* what, int64_t B, int64_t H, int64_t rows,
                 int64_t D) {
  int64_t n =
      mul_checked(mul_checked(mul_checked(B, H, what), rows, what), D, what);
  if (n > kMax / 8) throw Error(what, {}, "byte size overflows");
}

void check_lse(const AttentionProblem& p, int64_t size, const void* data,
               bool must_be_finite_or_neg_inf, const char* name) {
  int64_t need = p.batch * p.heads * p.q_len;
  if (data == nullptr) throw Error(name, {}, "null pointer");
  if (size != need)
    throw Error(name, {},
                "size must be B*H*q_len = " + std::to_string(need) + " (got " +
                    std::to_string(size) + ")");
  if (!must_be_finite_or_neg_inf) return;
  const double* l = static_cast<const double*>(data);
  for (int64_t i = 0; i < need; ++i) {
    if (std::isnan(l[i]) || l[i] == std::numeric_limits<double>::infinity()) {
      int64_t n = i % p.q_len, h = (i / p.q_len) % p.heads,
              b = i / (p.q_len * p.heads);
      throw Error(name, {b, h, n},
                  std::string("element is ") + kind_of(l[i]) +
                      " (finite, or -inf for a fully masked row, required)");
    }
  }
}

// g and eps as an entry computing in f32 (f32, bf16, f16 storage) converts
// them: an eps that rounds to 0 would turn a zero row into 0 / 0, one above
// the f32 range into a clamp at inf, a |g| above it into inf * 0 (found by
// the fuzzer, issue 7).
void check_compute_range(double g, double eps, Precision prec) {
  if (prec == Precision::kF64) return;
  constexpr double kF32Max = std::numeric_limits<float>::max();
  if (!(static_cast<float>(eps) > 0 && eps <= kF32Max))
    throw Error("eps", {},
                "must be > 0 and finite in f32, the compute precision of " +
                    std::string(name(prec)) + " entries (got " + num(eps) +
                    ")");
  if (!(std::fabs(g) <= kF32Max))
    throw Error("g", {},
                "outside the f32 range, the compute precision of " +
                    std::string(name(prec)) + " entries (got " + num(g) + ")");
}

// Rules of a consistent normalization description (attention.h).
void check_normalization(const AttentionProblem& p) {
  const Normalization& n = p.norm;
  const bool weighted = n.weight != ParamShape::kNone;
  if (n.bias && !weighted)
    throw Error("norm.bias", {}, "a bias needs a weight (weight is none)");
  if (n.one_plus_weight && !weighted)
    throw Error("norm.one_plus_weight", {},
                "(1 + w) needs a weight (weight is none)");
  if (n.round_before_weight && !weighted)
    throw Error("norm.round_before_weight", {},
                "rounding before the weight needs a weight (weight is none)");
  if (n.axis == NormAxis::kAllHeads) {
    if (n.kind == NormKind::kNone)
      throw Error("norm.axis", {},
                  "a normalization across heads needs a kind other than none");
    if (n.weight == ParamShape::kDim)
      throw Error("norm.weight", {},
                  "a normalization across heads takes a [heads, head_dim] "
                  "weight, not [head_dim]");
  }
  if (n.shared_qk_weight) {
    if (!weighted)
      throw Error("norm.shared_qk_weight", {},
                  "a shared q/k weight needs a weight (weight is none)");
    if (n.bias)
      throw Error("norm.shared_qk_weight", {},
                  "a shared q/k weight takes no bias");
    if (kv_heads_of(p) != p.heads)
      throw Error("norm.shared_qk_weight", {},
                  "a weight shared by q and k needs kv_heads = heads (got " +
                      std::to_string(kv_heads_of(p)) + " and " +
                      std::to_string(p.heads) + ")");
  }
}

// One learned parameter (or its gradient): exactly param_size() elements,
// non-null when non-empty, finite values for inputs.
void check_param(const char* name, const double* data, int64_t size,
                 int64_t need, bool input) {
  if (size != need)
    throw Error(name, {},
                "length must be " + std::to_string(need) +
                    " for this formulation (got " + std::to_string(size) + ")");
  if (need > 0 && data == nullptr) throw Error(name, {}, "null pointer");
  if (!input) return;
  for (int64_t i = 0; i < need; ++i)
    if (!std::isfinite(data[i]))
      throw Error(name, {i},
                  std::string("element is ") + kind_of(data[i]) +
                      " (finite input required)");
}

// Sinks (attention.h): off, or one finite logit per query head within
// f32's range (the f32 and 16-bit entries form them in f32, where a larger
// one would be inf and exp(inf - inf) a NaN).
void check_sinks(const AttentionProblem& p) {
  if (!has_sinks(p)) return;
  if (static_cast<int64_t>(p.sinks.size()) != p.heads)
    throw Error("sinks", {},
                "needs one sink per query head: " + std::to_string(p.heads) +
                    " (got " + std::to_string(p.sinks.size()) + ")");
  constexpr double kF32Max = std::numeric_limits<float>::max();
  for (size_t h = 0; h < p.sinks.size(); ++h)
    if (!(std::fabs(p.sinks[h]) <= kF32Max))
      throw Error("sinks", {static_cast<int64_t>(h)},
                  "must be finite and within f32's range, |sink| <= " +
                      num(kF32Max) + " (got " + num(p.sinks[h]) + ")");
}

void check_params(const AttentionProblem& p, const NormParams& a) {
  const int64_t nq = param_size(p, 0), nk = param_size(p, 1);
  const bool bias = p.variant == Variant::kQKNorm && p.norm.bias;
  check_param("q_weight", a.q_weight.data, a.q_weight.size, nq, true);
  check_param("k_weight", a.k_weight.data, a.k_weight.size, nk, true);
  check_param("q_bias", a.q_bias.data, a.q_bias.size, bias ? nq : 0, true);
  check_param("k_bias", a.k_bias.data, a.k_bias.size, bias ? nk : 0, true);
}

void check_rope(const AttentionProblem& p) {
  const Rope& r = p.rope;
  if (r.rotary_dim == 0) return;
  if (r.rotary_dim < 0 || r.rotary_dim % 2 != 0 || r.rotary_dim > p.head_dim)
    throw Error("rope.rotary_dim", {},
                "must be 0 (off) or even and <= head_dim=" +
                    std::to_string(p.head_dim) + " (got " +
                    std::to_string(r.rotary_dim) + ")");
  const int64_t pairs = r.rotary_dim / 2;
  if (r.inv_freq.empty()) {
    if (!(std::isfinite(r.theta) && r.theta > 1))
      throw Error("rope.theta", {},
                  "must be finite and > 1 (got " + num(r.theta) + ")");
  } else {
    if (static_cast<int64_t>(r.inv_freq.size()) != pairs)
      throw Error("rope.inv_freq", {},
                  "needs rotary_dim / 2 = " + std::to_string(pairs) +
                      " values (got " + std::to_string(r.inv_freq.size()) +
                      ")");
    for (int64_t e = 0; e < pairs; ++e)
      if (!(std::isfinite(r.inv_freq[e]) && r.inv_freq[e] >= 0 &&
            r.inv_freq[e] <= 1))
        throw Error(
            "rope.inv_freq", {e},
            "must be finite and in [0, 1] (got " + num(r.inv_freq[e]) + ")");
  }
  // Positions exact in f32 (an f32 angle's position) and angles whose
  // error the rule can state: |pos| <= 2^24.
  constexpr int64_t kMaxPos = int64_t{1} << 24;
  const int64_t lo = std::min<int64_t>(0, p.kv_len - p.q_len);
  const int64_t hi = p.kv_len - 1;
  if (r.position_offset < -kMaxPos || r.position_offset > kMaxPos ||
      lo + r.position_offset < -kMaxPos || hi + r.position_offset > kMaxPos)
    throw Error("rope.position_offset", {},
                "positions must stay within +-2^24 (offset " +
                    std::to_string(r.position_offset) + ", kv_len " +
                    std::to_string(p.kv_len) + ")");
  if (r.order == RopeOrder::kBeforeNorm && p.variant == Variant::kQKNorm) {
    const Normalization& n = p.norm;
    if (n.kind == NormKind::kLayer || n.weight != ParamShape::kNone || n.bias)
      throw Error("rope.order", {},
                  "RoPE before the normalization is modelled for l2, rms "
                  "and none without weight or bias (Llama 4's L2Norm); "
                  "this formulation has " +
                      std::string(n.kind == NormKind::kLayer ? "layer norm"
                                                             : "a weight or "
                                                               "bias"));
  }
}

}  // namespace

void validate_problem(const AttentionProblem& p) {
  check_dim("batch", p.batch);
  check_dim("heads", p.heads);
  check_dim("q_len", p.q_len);
  check_dim("kv_len", p.kv_len);
  check_dim("head_dim", p.head_dim);
  check_count("q", p.batch, p.heads, p.q_len, p.head_dim);
  check_count("k", p.batch, p.heads, p.kv_len, p.head_dim);
  if (p.kv_heads < 0 || (p.kv_heads > 0 && p.heads % p.kv_heads != 0))
    throw Error("kv_heads", {},
                "must divide heads=" + std::to_string(p.heads) + " (got " +
                    std::to_string(p.kv_heads) + ")");
  if (p.variant == Variant::kQKNorm) {
    check_eps(p.eps);
    if (!std::isfinite(p.g))
      throw Error("g", {}, "must be finite (got " + num(p.g) + ")");
    if (p.fixed_scale && !std::isfinite(p.scale))
      throw Error(
          "scale", {},
          "fixed logit scale must be finite (got " + num(p.scale) + ")");
    check_normalization(p);
  }
  // A cap is 0 (off) or a normal number: a subnormal one would not be held
  // to the relative rounding the rule counts (rule.h, "The logit softcap").
  if (!(std::isfinite(p.softcap) &&
        (p.softcap == 0 || p.softcap >= std::numeric_limits<double>::min())))
    throw Error("softcap", {},
                "must be 0 (off) or a finite normal number > 0 (got " +
                    num(p.softcap) + ")");
  check_rope(p);
  check_sinks(p);
  // A window side is -1 (unbounded) or a key count >= 0 (attention.h).
  if (p.mask.window_left < -1)
    throw Error("mask.window_left", {},
                "must be -1 (unbounded) or >= 0 (got " +
                    std::to_string(p.mask.window_left) + ")");
  if (p.mask.window_right < -1)
    throw Error("mask.window_right", {},
                "must be -1 (unbounded) or >= 0 (got " +
                    std::to_string(p.mask.window_right) + ")");
  const auto& kl = p.mask.key_lengths;
  if (!kl.empty()) {
    if (static_cast<int64_t>(kl.size()) != p.batch)
      throw Error("mask.key_lengths", {},
                  "needs one length per batch: " + std::to_string(p.batch) +
                      " (got " + std::to_string(kl.size()) + ")");
    for (size_t b = 0; b < kl.size(); ++b) {
      if (kl[b] < 0 || kl[b] > p.kv_len)
        throw Error(
            "mask.key_lengths", {static_cast<int64_t>(b)},
            "padding length must be in [0, kv_len=" + std::to_string(p.kv_len) +
                "] (got " + std::to_string(kl[b]) + ")");
    }
  }
}

void validate_problem(const ScaleNormProblem& p) {
  check_dim("rows", p.rows);
  check_dim("dim", p.dim);
  check_count("x", 1, 1, p.rows, p.dim);
  check_eps(p.eps);
  if (!std::isfinite(p.g))
    throw Error("g", {}, "must be finite (got " + num(p.g) + ")");
}

void validate_tensor(const char* name, const void* data, int64_t size,
                     const Layout4& l, int64_t B, int64_t H, int64_t rows,
                     int64_t D) {
  if (data == nullptr) throw Error(name, {}, "null pointer");
  if (l.batch_stride < 0 || l.head_stride < 0 || l.row_stride < 0)
    throw Error(name, {}, "strides must be >= 0");
  if (l.row_stride < D)
    throw Error(name, {},
                "row_stride " + std::to_string(l.row_stride) + " < head_dim " +
                    std::to_string(D) + " (rows would overlap)");
  int64_t last = 0;
  bool ovf = false;
  int64_t t;
  ovf |= __builtin_mul_overflow(B - 1, l.batch_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  ovf |= __builtin_mul_overflow(H - 1, l.head_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  ovf |= __builtin_mul_overflow(rows - 1, l.row_stride, &t);
  ovf |= __builtin_add_overflow(last, t, &last);
  ovf |= __builtin_add_overflow(last, D - 1, &last);
  if (ovf) throw Error(name, {}, "last element offset overflows int64");
  if (last >= size)
    throw Error(name, {B - 1, H - 1, rows - 1, D - 1},
                "offset " + std::to_string(last) + " outside buffer of " +
                    std::to_string(size) + " elements (strides/size mismatch)");
}

void validate_finite(const char* name, const void* data, const Layout4& l,
                     int64_t B, int64_t H, int64_t rows, int64_t D,
                     Precision prec) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        size_t base = static_cast<size_t>(b * l.batch_stride +
                                          h * l.head_stride + n * l.row_stride);
        for (int64_t d = 0; d < D; ++d) {
          double x = decode(prec, data, base + static_cast<size_t>(d));
          if (!std::isfinite(x))
            throw Error(name, {b, h, n, d},
                        std::string("element is ") + kind_of(x) +
                            " (finite input required)");
        }
      }
}

namespace {
void in4(const char* name, const ConstTensor4& t, int64_t B, int64_t H,
         int64_t rows, int64_t D, Precision prec) {
  validate_tensor(name, t.data, t.size, t.layout, B, H, rows, D);
  validate_finite(name, t.data, t.layout, B, H, rows, D, prec);
}
void out4(const char* name, const MutTensor4& t, int64_t B, int64_t H,
          int64_t rows, int64_t D) {
  validate_tensor(name, t.data, t.size, t.layout, B, H, rows, D);
}

// What forward and backward check alike: the problem, the logit scale's
// range in the compute format, and the q, k, v inputs.
void validate_problem_and_qkv(const AttentionProblem& p, const ConstTensor4& q,
                              const ConstTensor4& k, const ConstTensor4& v,
                              Precision prec) {
  validate_problem(p);
  if (p.variant == Variant::kQKNorm)
    check_compute_range(p.fixed_scale ? p.scale : p.g, p.eps, prec);
  // The cap in the compute format: f32 for the f32 and 16-bit entries, where
  // a cap outside f32's normal range would become inf or 0.
  if (p.softcap > 0 && prec != Precision::kF64) {
    const auto cap = static_cast<float>(p.softcap);
    if (!(cap >= std::numeric_limits<float>::min() && std::isfinite(cap)))
      throw Error("softcap", {},
                  "outside the f32 normal range, the compute precision of " +
                      std::string(name(prec)) + " entries (got " +
                      num(p.softcap) + ")");
  }
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
  in4("q", q, B, H, p.q_len, D, prec);
  in4("k", k, B, Hk, p.kv_len, D, prec);
  in4("v", v, B, Hk, p.kv_len, D, prec);
}
}  // namespace

void validate_forward(const AttentionProblem& p, const ForwardArgs& a,
                      Precision prec) {
  validate_problem_and_qkv(p, a.q, a.k, a.v, prec);
  out4("o", a.o, p.batch, p.heads, p.q_len, p.head_dim);
  check_lse(p, a.lse_size, a.lse, false, "lse");
  check_params(p, a.params);
}

void validate_backward(const AttentionProblem& p, const BackwardArgs& a,
                       Precision prec) {
  validate_problem_and_qkv(p, a.q, a.k, a.v, prec);
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
  in4("o", a.o, B, H, p.q_len, D, prec);
  in4("d_o", a.d_o, B, H, p.q_len, D, prec);
  check_lse(p, a.lse_size, a.lse, true, "lse");
  out4("dq", a.dq, B, H, p.q_len, D);
  out4("dk", a.dk, B, Hk, p.kv_len, D);
  out4("dv", a.dv, B, Hk, p.kv_len, D);
  if (a.dg == nullptr) throw Error("dg", {}, "null pointer");
  check_params(p, a.params);
  check_param("d_sinks", a.d_sinks, a.d_sinks_size, has_sinks(p) ? p.heads : 0,
              false);
  const NormParamGrads& g = a.d_params;
  const int64_t nq = param_size(p, 0), nk = param_size(p, 1);
  const int64_t nb = p.variant == Variant::kQKNorm && p.norm.bias ? 1 : 0;
  check_param("d_q_weight", g.q_weight.data, g.q_weight.size, nq, false);
  check_param("d_k_weight", g.k_weight.data, g.k_weight.size, nk, false);
  check_param("d_q_bias", g.q_bias.data, g.q_bias.size, nb * nq, false);
  check_param("d_k_bias", g.k_bias.data, g.k_bias.size, nb * nk, false);
}

namespace {
Layout4 layout2(int64_t row_stride) { return Layout4{0, 0, row_stride}; }
// A ScaleNorm [rows, dim] tensor: addressable, and (inputs) finite.
void in2(const char* name, const ConstTensor2& t, const ScaleNormProblem& p,
         Precision prec) {
  validate_tensor(name, t.data, t.size, layout2(t.row_stride), 1, 1, p.rows,
                  p.dim);
  validate_finite(name, t.data, layout2(t.row_stride), 1, 1, p.rows, p.dim,
                  prec);
}
void out2(const char* name, const MutTensor2& t, const ScaleNormProblem& p) {
  validate_tensor(name, t.data, t.size, layout2(t.row_stride), 1, 1, p.rows,
                  p.dim);
}
void validate_scalenorm_problem(const ScaleNormProblem& p, Precision prec) {
  validate_problem(p);
  check_compute_range(p.g, p.eps, prec);
}
}  // namespace

void validate_scalenorm_forward(const ScaleNormProblem& p,
                                const ScaleNormForwardArgs& a, Precision prec) {
  validate_scalenorm_problem(p, prec);
  in2("x", a.x, p, prec);
  out2("y", a.y, p);
}

void validate_scalenorm_backward(const ScaleNormProblem& p,
                                 const ScaleNormBackwardArgs& a,
                                 Precision prec) {
  validate_scalenorm_problem(p, prec);
  in2("x", a.x, p, prec);
  in2("dy", a.dy, p, prec);
  out2("dx", a.dx, p);
  if (a.dg == nullptr) throw Error("dg", {}, "null pointer");
}

}  // namespace qknorm
