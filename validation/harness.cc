#include "validation/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"
#include "reference/reference.h"
#include "reference/register.h"
#include "validation/operands.h"

namespace qknorm::validation {
namespace {

const char* variant_name(Variant v) {
  return v == Variant::kQKNorm ? "qknorm" : "sdpa";
}

std::string mask_desc(const Mask& m) {
  std::string s = m.causal ? "causal" : "";
  if (!m.key_lengths.empty()) {
    if (!s.empty()) s += "+";
    s += "pad[";
    for (size_t i = 0; i < m.key_lengths.size(); ++i)
      s += (i ? "," : "") + std::to_string(m.key_lengths[i]);
    s += "]";
  }
  return s.empty() ? "none" : s;
}

// Fills `rows` rows of length D drawn from dist; `scale_rows` applies the
// per-row magnitude spread (q and k only) and zero rows.
// `v_operand` marks v (kMixedScaleV scales its rows).
void fill(Rng& rng, Distribution dist, int64_t rows, int64_t D, bool qk_operand,
          Precision range, std::vector<double>* out, bool v_operand = false) {
  out->resize(static_cast<size_t>(rows * D));
  // Exponent range of kWideMagnitude row scales, clamped to the format:
  // 8 sqrt(D) below max_finite leaves room for the row's norm (Gaussian
  // entries), and 4x more for apply_structure's multiples 2^e x src, e <= 2
  // (generators.cc). Without the 4x, f16 rows of dim 1 with a parallel-row
  // structure rounded to +-inf: invalid input, and a false alarm in the
  // property soak (issue 15's findings, property-soak-d7649ef.txt:
  // Determinism, Orthogonality, ZeroDO on simd f16 entries).
  const double hi = std::min(
      30.0, std::log10(max_finite(range) / (32 * std::sqrt(double(D)))));
  const double lo = std::max(-30.0, std::log10(min_normal(range) * 0x1p12));
  for (int64_t r = 0; r < rows; ++r) {
    double row_scale = 1;
    if (qk_operand && dist == Distribution::kWideMagnitude)
      row_scale = std::pow(10.0, rng.uniform(lo, hi));
    if (qk_operand && dist == Distribution::kOutlierRows &&
        rng.uniform() < 0.125)
      row_scale = std::pow(10.0, std::min(rng.uniform(3, 5), hi));
    if (v_operand && dist == Distribution::kMixedScaleV)
      row_scale =
          std::pow(10.0, rng.uniform(std::max(-3.0, lo), std::min(3.0, hi)));
    const bool zero =
        qk_operand && dist == Distribution::kZeroRows && rng.uniform() < 0.25;
    for (int64_t d = 0; d < D; ++d) {
      double x;
      switch (dist) {
        case Distribution::kUniform:
          x = rng.uniform(-1, 1);
          break;
        case Distribution::kHeavyTailed:
          x = rng.student_t3();
          break;
        default:
          x = rng.normal();
          break;
      }
      (*out)[static_cast<size_t>(r * D + d)] = zero ? 0.0 : x * row_scale;
    }
  }
}

std::vector<double> rounded(const std::vector<double>& x, Precision p) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = round_to(p, x[i]);
  return r;
}

// A storage buffer holding a [B,H,rows,D] tensor with `pad` extra elements
// after each row, prefilled with NaN (caught if an output is left unwritten).
struct Buffer {
  Precision prec;
  int64_t B, H, rows, D, pad;
  std::vector<unsigned char> bytes;
  Layout4 layout;
  Buffer(Precision p, int64_t B_, int64_t H_, int64_t rows_, int64_t D_,
         int64_t pad_)
      : prec(p), B(B_), H(H_), rows(rows_), D(D_), pad(pad_) {
    const int64_t rs = D + pad;
    layout = Layout4{H * rows * rs, rows * rs, rs};
    bytes.resize(static_cast<size_t>(B * H * rows * rs) * element_bytes(p));
    for (size_t i = 0; i < static_cast<size_t>(B * H * rows * rs); ++i)
      encode(p, std::numeric_limits<double>::quiet_NaN(), bytes.data(), i);
  }
  int64_t size() const { return B * H * rows * (D + pad); }
  size_t offset(int64_t idx) const {
    const int64_t d = idx % D, r = idx / D;
    return static_cast<size_t>(r * (D + pad) + d);
  }
  void store(const std::vector<double>& x) {
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      encode(prec, x[static_cast<size_t>(i)], bytes.data(), offset(i));
  }
  std::vector<double> load() const {
    std::vector<double> x(static_cast<size_t>(B * H * rows * D));
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      x[static_cast<size_t>(i)] = decode(prec, bytes.data(), offset(i));
    return x;
  }
  ConstTensor4 cview() const { return {bytes.data(), size(), layout}; }
  MutTensor4 view() { return {bytes.data(), size(), layout}; }
};

std::vector<LD> widen(const std::vector<double>& x) {
  return {x.begin(), x.end()};
}

}  // namespace

const char* name(Distribution d) {
  switch (d) {
    case Distribution::kGaussian:
      return "gaussian";
    case Distribution::kUniform:
      return "uniform";
    case Distribution::kHeavyTailed:
      return "heavy";
    case Distribution::kWideMagnitude:
      return "wide";
    case Distribution::kZeroRows:
      return "zerorows";
    case Distribution::kOutlierRows:
      return "outliers";
    case Distribution::kMixedScaleV:
      return "mixedv";
  }
  return "?";
}

bool parse_distribution(const std::string& s, Distribution* out) {
  for (Distribution d :
       {Distribution::kGaussian, Distribution::kUniform,
        Distribution::kHeavyTailed, Distribution::kWideMagnitude,
        Distribution::kZeroRows, Distribution::kOutlierRows,
        Distribution::kMixedScaleV}) {
    if (s == name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

std::string AttentionCase::describe() const {
  const AttentionProblem& p = problem;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "B=%lld H=%lld Nq=%lld Nk=%lld D=%lld %s g=%.17g eps=%.3g "
                "mask=%s dist=%s seed=%llu row_pad=%lld",
                (long long)p.batch, (long long)p.heads, (long long)p.q_len,
                (long long)p.kv_len, (long long)p.head_dim,
                variant_name(p.variant), p.g, p.eps, mask_desc(p.mask).c_str(),
                name(dist), (unsigned long long)seed, (long long)row_pad);
  if (is_paper_formulation(p)) return buf;
  return std::string(buf) + " formulation=" + describe_formulation(p) +
         " storage=" + std::string(qknorm::name(storage));
}

std::string ScaleNormCase::describe() const {
  char buf[192];
  std::snprintf(
      buf, sizeof buf,
      "scalenorm rows=%lld dim=%lld g=%.17g eps=%.3g dist=%s seed=%llu",
      (long long)problem.rows, (long long)problem.dim, problem.g, problem.eps,
      name(dist), (unsigned long long)seed);
  return buf;
}

AttentionCase overflowing_logits_case(double big, bool with_nan_key) {
  AttentionCase c;
  c.problem.variant = Variant::kSDPA;
  c.problem.q_len = 1;
  c.problem.kv_len = with_nan_key ? 4 : 3;
  c.problem.head_dim = 2;
  c.q = {big, big};
  c.k = {big, big, -big, -big, 1, 1};
  c.v = {1, 2, 3, 4, 5, 6};
  if (with_nan_key) {
    c.k.insert(c.k.end(), {big, -big});
    c.v.insert(c.v.end(), {7, 8});
  }
  c.d_o = {0.5, -0.25};
  return c;
}

AttentionCase make_attention_case(const AttentionProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range) {
  AttentionCase c;
  c.problem = problem;
  c.seed = seed;
  c.dist = dist;
  Rng rng(seed);
  const int64_t BH = problem.batch * problem.heads, D = problem.head_dim,
                BHk = problem.batch * kv_heads_of(problem);
  fill(rng, dist, BH * problem.q_len, D, true, range, &c.q);
  fill(rng, dist, BHk * problem.kv_len, D, true, range, &c.k);
  fill(rng, dist, BHk * problem.kv_len, D, false, range, &c.v, true);
  fill(rng, dist, BH * problem.q_len, D, false, range, &c.d_o);
  // Learned parameters as trained models hold them: weights near their
  // init (gamma ~ 1 + N(0, 1/4), Gemma's w ~ N(0, 1/4)), biases N(0, 1/10).
  const Normalization& n = problem.norm;
  auto params = [&](int side, std::vector<double>* w, std::vector<double>* b) {
    const int64_t m = param_size(problem, side);
    w->resize(static_cast<size_t>(m));
    for (double& x : *w) x = (n.one_plus_weight ? 0 : 1) + 0.25 * rng.normal();
    if (!n.bias) return;
    b->resize(static_cast<size_t>(m));
    for (double& x : *b) x = 0.1 * rng.normal();
  };
  if (problem.variant == Variant::kQKNorm) {
    params(0, &c.q_weight, &c.q_bias);
    params(1, &c.k_weight, &c.k_bias);
  }
  return c;
}

ScaleNormCase make_scalenorm_case(const ScaleNormProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range) {
  ScaleNormCase c;
  c.problem = problem;
  c.seed = seed;
  c.dist = dist;
  Rng rng(seed);
  fill(rng, dist, problem.rows, problem.dim, true, range, &c.x);
  fill(rng, dist, problem.rows, problem.dim, false, range, &c.dy);
  return c;
}

AttentionCase round_inputs(const AttentionCase& c, Precision prec) {
  AttentionCase r = c;
  r.q = rounded(c.q, prec);
  r.k = rounded(c.k, prec);
  r.v = rounded(c.v, prec);
  r.d_o = rounded(c.d_o, prec);
  r.q_weight = rounded(c.q_weight, prec);
  r.k_weight = rounded(c.k_weight, prec);
  r.q_bias = rounded(c.q_bias, prec);
  r.k_bias = rounded(c.k_bias, prec);
  r.storage = prec;
  return r;
}

ScaleNormCase round_inputs(const ScaleNormCase& c, Precision prec) {
  ScaleNormCase r = c;
  r.x = rounded(c.x, prec);
  r.dy = rounded(c.dy, prec);
  return r;
}

namespace {
// The case's tensors must have the problem's element counts before they are
// copied into the entry's buffers: a case edited by hand (kv_heads changed,
// a tensor resized) is bad input, named like every other.
void check_case_length(const char* name, const std::vector<double>& x,
                       int64_t want, const char* dims) {
  if (static_cast<int64_t>(x.size()) == want) return;
  throw Error(std::string("case ") + name, {},
              "length must be " + std::string(dims) + " = " +
                  std::to_string(want) + " (got " + std::to_string(x.size()) +
                  ")");
}

AttentionResult run_impl(const Backend& b, const AttentionCase& c,
                         const ExecConfig& cfg, Workspace* ws, bool backward) {
  const AttentionProblem& p = c.problem;
  validate_problem(p);
  {
    const int64_t Hk = kv_heads_of(p);
    const int64_t nq = p.batch * p.heads * p.q_len * p.head_dim,
                  nk = p.batch * Hk * p.kv_len * p.head_dim;
    check_case_length("q", c.q, nq, "batch*heads*q_len*head_dim");
    check_case_length("k", c.k, nk, "batch*kv_heads*kv_len*head_dim");
    check_case_length("v", c.v, nk, "batch*kv_heads*kv_len*head_dim");
    if (backward)
      check_case_length("d_o", c.d_o, nq, "batch*heads*q_len*head_dim");
  }
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, pad = c.row_pad,
                Hk = kv_heads_of(p);
  Buffer q(s, B, H, p.q_len, D, pad), k(s, B, Hk, p.kv_len, D, pad),
      v(s, B, Hk, p.kv_len, D, pad), o(s, B, H, p.q_len, D, pad);
  q.store(c.q);
  k.store(c.k);
  v.store(c.v);
  AttentionResult r;
  r.lse.assign(static_cast<size_t>(B * H * p.q_len),
               std::numeric_limits<double>::quiet_NaN());
  auto ref = [](const std::vector<double>& x) {
    return ParamRef{x.empty() ? nullptr : x.data(),
                    static_cast<int64_t>(x.size())};
  };
  const NormParams params{ref(c.q_weight), ref(c.k_weight), ref(c.q_bias),
                          ref(c.k_bias)};
  ForwardArgs fa{q.cview(), k.cview(),    v.cview(),
                 o.view(),  r.lse.data(), static_cast<int64_t>(r.lse.size()),
                 params};
  checked_attention_forward(b, p, fa, ws, cfg);
  r.o = o.load();
  if (!backward) return r;
  Buffer d_o(s, B, H, p.q_len, D, pad), dq(s, B, H, p.q_len, D, pad),
      dk(s, B, Hk, p.kv_len, D, pad), dv(s, B, Hk, p.kv_len, D, pad);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.dq_weight.assign(c.q_weight.size(), nan);
  r.dk_weight.assign(c.k_weight.size(), nan);
  r.dq_bias.assign(c.q_bias.size(), nan);
  r.dk_bias.assign(c.k_bias.size(), nan);
  auto mref = [](std::vector<double>& x) {
    return MutParamRef{x.empty() ? nullptr : x.data(),
                       static_cast<int64_t>(x.size())};
  };
  d_o.store(c.d_o);
  r.dg = std::numeric_limits<double>::quiet_NaN();
  BackwardArgs ba{
      q.cview(),
      k.cview(),
      v.cview(),
      o.cview(),
      d_o.cview(),
      r.lse.data(),
      static_cast<int64_t>(r.lse.size()),
      dq.view(),
      dk.view(),
      dv.view(),
      &r.dg,
      params,
      {mref(r.dq_weight), mref(r.dk_weight), mref(r.dq_bias), mref(r.dk_bias)}};
  checked_attention_backward(b, p, ba, ws, cfg);
  r.dq = dq.load();
  r.dk = dk.load();
  r.dv = dv.load();
  return r;
}
}  // namespace

AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, true);
}

AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, false);
}

ScaleNormResult run_scalenorm(const Backend& b, const ScaleNormCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  const ScaleNormProblem& p = c.problem;
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  Buffer x(s, 1, 1, p.rows, p.dim, 0), y(s, 1, 1, p.rows, p.dim, 0),
      dy(s, 1, 1, p.rows, p.dim, 0), dx(s, 1, 1, p.rows, p.dim, 0);
  x.store(c.x);
  dy.store(c.dy);
  ScaleNormResult r;
  ScaleNormForwardArgs fa{{x.bytes.data(), x.size(), p.dim},
                          {y.bytes.data(), y.size(), p.dim}};
  checked_scalenorm_forward(b, p, fa, ws, cfg);
  r.y = y.load();
  r.dg = std::numeric_limits<double>::quiet_NaN();
  ScaleNormBackwardArgs ba{{x.bytes.data(), x.size(), p.dim},
                           {dy.bytes.data(), dy.size(), p.dim},
                           {dx.bytes.data(), dx.size(), p.dim},
                           &r.dg};
  checked_scalenorm_backward(b, p, ba, ws, cfg);
  r.dx = dx.load();
  return r;
}

reference::NormArgs<LD> norm_args(const AttentionCase& c,
                                  std::array<std::vector<LD>, 4>* store) {
  (*store)[0] = widen(c.q_weight);
  (*store)[1] = widen(c.k_weight);
  (*store)[2] = widen(c.q_bias);
  (*store)[3] = widen(c.k_bias);
  auto ptr = [](const std::vector<LD>& x) {
    return x.empty() ? nullptr : x.data();
  };
  reference::NormArgs<LD> w;
  w.q_weight = ptr((*store)[0]);
  w.k_weight = ptr((*store)[1]);
  w.q_bias = ptr((*store)[2]);
  w.k_bias = ptr((*store)[3]);
  w.storage = c.storage;
  return w;
}

namespace {

// The normalization row (NormRows) holding dense element offset o.
size_t row_of(const NormRows& nr, size_t o) {
  const auto D = static_cast<size_t>(nr.D);
  if (!nr.all_heads) return o / D;
  const auto N = static_cast<size_t>(nr.N), H = static_cast<size_t>(nr.H);
  return o / (H * N * D) * N + (o / D) % N;
}

}  // namespace

void fill_operand_mags(const AttentionCase& c, int side, const LD* x,
                       const reference::NormArgs<LD>& w, OperandMags* mp) {
  const AttentionProblem& p = c.problem;
  const bool qk = p.variant == Variant::kQKNorm;
  OperandMags& m = *mp;
  m.rows = norm_rows(p, side);
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  const auto size = static_cast<size_t>(nr.rows() * L);
  // One normalization gives both x_hat (unrounded, unweighted) and x_tilde:
  // where the formulation rounds x_hat before the weight, the rounded x_hat
  // goes to xr and the unrounded one to xh.
  const bool round = reference::rounds_x_hat(p, c.storage);
  m.xh.resize(size);
  m.xt.resize(size);
  m.xr.resize(round ? size : 0);
  m.stats.resize(static_cast<size_t>(nr.rows()));
  reference::prepare_operand<LD>(
      p, side, x, w, round ? m.xr.data() : m.xh.data(),
      round ? m.xh.data() : nullptr, m.xt.data(), m.stats.data());
  // The loop below writes every element of wv, xa and sh.
  m.wv.resize(size);
  m.xa.resize(size);
  m.sh.resize(size);
  m.den.assign(static_cast<size_t>(nr.rows()), 1);
  m.shr.assign(static_cast<size_t>(nr.rows()), 0);
  // wmax and xa_finite in locals: as members, the compiler stored and
  // reloaded them for every element (the arrays' stores might alias them).
  LD wmax = 1;
  bool xa_finite = true;
  const Normalization& n = p.norm;
  const std::vector<double>& wt =
      side == 0 || n.shared_qk_weight ? c.q_weight : c.k_weight;
  const std::vector<double>& bs = side == 0 ? c.q_bias : c.k_bias;
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    // The sums only where the row's divisor reads them (l2, rms: s2;
    // layer: s1).
    LD s1 = 0, s2 = 0;
    if (qk && (n.kind == NormKind::kL2 || n.kind == NormKind::kRms))
      for (int64_t e = 0; e < L; ++e) {
        const LD xe = x[static_cast<size_t>(nr.at(r0, e))];
        s2 += xe * xe;
      }
    if (qk && n.kind == NormKind::kLayer)
      for (int64_t e = 0; e < L; ++e)
        s1 += x[static_cast<size_t>(nr.at(r0, e))];
    const LD Ld = static_cast<LD>(L), eps = static_cast<LD>(p.eps);
    if (qk) {
      switch (n.kind) {
        case NormKind::kL2:
          m.den[static_cast<size_t>(r0)] = std::max(std::sqrt(s2), eps);
          break;
        case NormKind::kRms:
          m.den[static_cast<size_t>(r0)] = std::sqrt(s2 / Ld + eps);
          break;
        case NormKind::kLayer: {
          const LD mu = s1 / Ld;
          LD var = 0;
          for (int64_t e = 0; e < L; ++e) {
            const LD t = x[static_cast<size_t>(nr.at(r0, e))] - mu;
            var += t * t;
          }
          m.den[static_cast<size_t>(r0)] = std::sqrt(var / Ld + eps);
          LD a1 = 0;
          for (int64_t e = 0; e < L; ++e)
            a1 += std::fabs(x[static_cast<size_t>(nr.at(r0, e))]);
          m.shr[static_cast<size_t>(r0)] =
              static_cast<LD>(sum_units(static_cast<double>(L))) * (a1 / Ld) /
              m.den[static_cast<size_t>(r0)];
          break;
        }
        case NormKind::kNone:
          break;
      }
    }
    for (int64_t e = 0; e < L; ++e) {
      const size_t o = static_cast<size_t>(nr.at(r0, e));
      LD wv = 1, bias = 0;
      if (qk && n.weight != ParamShape::kNone) {
        const auto pi = static_cast<size_t>(nr.param(r0, e, n.weight));
        wv = n.one_plus_weight ? 1 + static_cast<LD>(wt[pi]) : wt[pi];
        if (n.bias) bias = bs[pi];
      }
      m.wv[o] = wv;
      wmax = std::max(wmax, std::fabs(wv));
      m.xa[o] = std::fabs(m.xh[o]) * std::fabs(wv) + std::fabs(bias);
      xa_finite = xa_finite && std::isfinite(m.xa[o]);
      m.sh[o] = m.shr[static_cast<size_t>(r0)] * std::fabs(wv);
    }
  }
  m.wmax = wmax;
  m.xa_finite = xa_finite;
}

OperandMags operand_mags(const AttentionCase& c, int side) {
  const std::vector<LD> x = widen(side == 0 ? c.q : c.k);
  std::array<std::vector<LD>, 4> store;
  OperandMags m;
  fill_operand_mags(c, side, x.data(), norm_args(c, &store), &m);
  return m;
}

reference::OperandView<LD> OperandMags::view() const {
  return {rows, xr.empty() ? xh.data() : xr.data(), xh.data(), xt.data(),
          stats.data()};
}

namespace {

// |dx| magnitudes of one normalization row (length L) from its |du|
// magnitudes (du: the gradient of x_hat), in place:
//   l2:    (|du| + |u| (|u|.|du|)) / den
//   rms:   (|du| + |x_hat| (|x_hat|.|du|) / L) / den
//   layer: (|du| + mean|du| + |x_hat| (|x_hat|.|du|) / L) / den
void norm_backward_mag(const AttentionProblem& p, const LD* u, LD den,
                       int64_t L, std::vector<LD>* du) {
  if (p.variant != Variant::kQKNorm || p.norm.kind == NormKind::kNone) return;
  LD c = 0, m = 0;
  for (int64_t e = 0; e < L; ++e) {
    c += std::fabs(u[e]) * (*du)[static_cast<size_t>(e)];
    m += (*du)[static_cast<size_t>(e)];
  }
  const LD Ld = static_cast<LD>(L);
  if (p.norm.kind != NormKind::kL2) c /= Ld;
  m = p.norm.kind == NormKind::kLayer ? m / Ld : 0;
  for (int64_t e = 0; e < L; ++e)
    (*du)[static_cast<size_t>(e)] =
        ((*du)[static_cast<size_t>(e)] + m + std::fabs(u[e]) * c) / den;
}

// x_hat's absolute resolution per ulp_c(0) in one normalization row of
// length L and divisor den (exact: m.den), below the compute format's
// normal range. The one place it is derived; the row's own x_hat reads it
// (the normalization backward and the weight gradient) and, through
// operand_resolution, the other side's gradients:
//   l2: 1 (u = x / n rounds once; tiny rows are scaled exactly first);
//   rms, layer: kOpUnits (sqrt(L) + 1 / den). (a) x_hat = y f from the
//     scaled row y (its subnormal elements resolved to ulp_c(0), each
//     rounding) and f <= sqrt(L): (f + 1) / 2 ulp_c(0) per rounding,
//     kOpUnits sqrt(L) bounds it (found by the fuzzer, issue 16: qwen3,
//     f64, a q row spanning 7e240 to 1e-80, reference:f64's dq 12 bounds
//     off where x_hat was subnormal). (b) The operations a kernel performs
//     on the row at the input's own scale before it divides by den (x_e / 2
//     and mu / 2 against overflow, x_e - mu) round a subnormal result to
//     ulp_c(0) / 2 each, and the division by den (as low as sqrt(eps))
//     multiplies that: two such roundings (x_e / 2 and mu / 2, each at half
//     scale) cost 2 ulp_c(0) / den, kOpUnits / den bounds them (found by
//     the CI's fuzz run with formulations on: qwen3, f64, x_e = ulp(0) in a
//     q row of max|x| = 1e-12, den = sqrt(eps) = 1e-3: reference:f64's x_e /
//     2 rounds to 0, x_hat_e = 4.9e-321 (1000 ulp(0)) becomes 0, and dq_e =
//     -x_hat_e c / den = 1.3e-282 is returned as 0; margin 1.28);
//   none: 0 (x_hat = x).
// scaled_row_resolution is part (a) alone (l2 1, rms and layer kOpUnits
// sqrt(L)): the resolution at the scaled row's magnitude, where the
// normalization backward forms du (oracle_attention's `side`).
LD scaled_row_resolution(const AttentionProblem& p, int64_t L) {
  if (p.variant != Variant::kQKNorm) return 0;
  switch (p.norm.kind) {
    case NormKind::kNone:
      return 0;
    case NormKind::kL2:
      return 1;
    case NormKind::kRms:
    case NormKind::kLayer:
      break;
  }
  return kOpUnits * std::sqrt(static_cast<LD>(L));
}

LD x_hat_resolution(const AttentionProblem& p, int64_t L, LD den) {
  const bool by_den =
      p.variant == Variant::kQKNorm &&
      (p.norm.kind == NormKind::kRms || p.norm.kind == NormKind::kLayer);
  return by_den ? kOpUnits * (std::sqrt(static_cast<LD>(L)) + 1 / den)
                : scaled_row_resolution(p, L);
}

// The logit operand x_tilde_e = x_hat_e w_e + beta_e of one side, per
// element, resolved per ulp_c(0) to its x_hat's resolution (the row's
// x_hat_resolution) times |w_e|, plus one ulp_c(0) for the product and one
// for the bias addition where the formulation has them. The other side's
// gradients read it through dx_tilde = s sum dS x_tilde' (found by the CI's
// fuzz run with formulations on: olmo2, f64, a k element of 4 ulp(0) in a
// row whose max is 1.7e38: k_hat_e = 1.3 ulp(0) returns as 0 and k_tilde_e =
// -2 k_hat_e is 2.6 ulp(0) off, times s dS = 2.9e24 in dq_tilde; dq_weight
// 2.8e-299 returned as 0 where one ulp(0) per key was counted, margin 1.32;
// and a k row of rms 0.31 whose k_hat_e = 9.6 ulp(0) is 6.4 ulp(0) off,
// times w_e = 1.5, margin 2.34).
// Into *out (resized; a workspace array, not a fresh n x D allocation per
// sampled sub-case).
void operand_resolution(const AttentionProblem& p, const OperandMags& m,
                        std::vector<LD>* out_v) {
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  const bool qk = p.variant == Variant::kQKNorm;
  const LD ops = (qk && p.norm.weight != ParamShape::kNone ? 1 : 0) +
                 (qk && p.norm.bias ? 1 : 0);
  std::vector<LD>& out = *out_v;
  out.resize(m.wv.size());
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    const LD res = x_hat_resolution(p, L, m.den[static_cast<size_t>(r0)]);
    for (int64_t e = 0; e < L; ++e) {
      const auto o = static_cast<size_t>(nr.at(r0, e));
      out[o] = res * std::fabs(m.wv[o]) + ops;
    }
  }
}

}  // namespace

// OracleAttention::logit_flip: an element of x_hat is ambiguous when its
// distance to the storage format's rounding midpoint is within a correct
// kernel's error of x_hat, (sum_units(L) / 2 + 2) u_c |x_hat| (an L-term
// sum of squares, its square root, the product); a flip moves x_tilde by
// ulp_s(x_hat) |w|. The logit moves by at most s times (the row's flips)
// times the other side's largest operand element, per side.
LD logit_flip(const AttentionCase& c, const OperandMags& qm,
              const OperandMags& km, LD s) {
  const AttentionProblem& p = c.problem;
  const Precision st = c.storage;
  if (p.variant != Variant::kQKNorm || !p.norm.round_before_weight ||
      (st != Precision::kBF16 && st != Precision::kF16))
    return 0;
  const double uc = compute_roundoff(st);
  auto side_flip = [&](const OperandMags& m) {
    const NormRows& nr = m.rows;
    const double rel = (sum_units(static_cast<double>(nr.len())) / 2 + 2) * uc;
    LD worst = 0;
    for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
      LD f = 0;
      for (int64_t e = 0; e < nr.len(); ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        const double x = static_cast<double>(m.xh[o]);
        const double sp = ulp(st, std::fabs(x));
        const double rd = round_to(st, x);
        const double to_mid = std::fabs(sp / 2 - std::fabs(x - rd));
        if (to_mid <= rel * std::fabs(x) + ulp(Precision::kF32, 0))
          f += static_cast<LD>(sp) * std::fabs(m.wv[o]);
      }
      worst = std::max(worst, f);
    }
    return worst;
  };
  auto max_abs = [](const std::vector<LD>& x) {
    LD a = 0;
    for (LD e : x) a = std::max(a, std::fabs(e));
    return a;
  };
  return s * (side_flip(qm) * max_abs(km.xa) + side_flip(km) * max_abs(qm.xa));
}

// The oracle's scratch arrays, kept from call to call (OracleWorkspace).
struct OracleWorkspace::Arrays {
  std::vector<LD> q, k, v, d_o, probs, logits, sdp, av, du_q, du_k, ads_q,
      ads_k, adr_q, adr_k, res_q, res_k;
  OperandMags qm, km;
  std::array<std::vector<LD>, 7> mq, mk;
};

OracleWorkspace::OracleWorkspace() : arrays(std::make_unique<Arrays>()) {}
OracleWorkspace::~OracleWorkspace() = default;

namespace {

// P_ij = exp(S_ij - lse_i) with the given lse (0 where masked), and S_ij
// (where S is not null) as the reference's backward forms it: the scale
// times the D-term dot of the logit operands.
void given_probabilities(const AttentionCase& c, const OperandMags& qm,
                         const OperandMags& km, const std::vector<LD>& lse,
                         LD* probs, LD* S) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len,
                Hk = kv_heads_of(p), group = p.heads / Hk;
  const LD sc = p.variant != Variant::kQKNorm
                    ? 1 / std::sqrt(static_cast<LD>(D))
                : p.fixed_scale ? static_cast<LD>(p.scale)
                                : static_cast<LD>(p.g);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hq = 0; hq < p.heads; ++hq) {
      const int64_t bh = b * p.heads + hq, bk = b * Hk + hq / group;
      for (int64_t i = 0; i < Nq; ++i) {
        const LD* qt = qm.xt.data() + (bh * Nq + i) * D;
        const LD l = lse[static_cast<size_t>(bh * Nq + i)];
        for (int64_t j = 0; j < Nk; ++j) {
          LD t = 0;
          const LD* kt = km.xt.data() + (bk * Nk + j) * D;
          for (int64_t d = 0; d < D; ++d) t += qt[d] * kt[d];
          const auto e = static_cast<size_t>((bh * Nq + i) * Nk + j);
          probs[e] =
              visible(p.mask, b, i, j, Nq, Nk) ? std::exp(sc * t - l) : 0;
          if (S != nullptr) S[e] = sc * t;
        }
      }
    }
}

}  // namespace

OracleAttention oracle_attention(const AttentionCase& c, const GivenRows* given,
                                 const RowCounts& counts, OracleWorkspace* ws) {
  const AttentionProblem& p = c.problem;
  OracleAttention r;
  OracleWorkspace::Arrays own;
  OracleWorkspace::Arrays& a = ws != nullptr ? *ws->arrays : own;
  std::vector<LD>&q = a.q, &k = a.k, &v = a.v, &d_o = a.d_o;
  q.assign(c.q.begin(), c.q.end());
  k.assign(c.k.begin(), c.k.end());
  v.assign(c.v.begin(), c.v.end());
  d_o.assign(c.d_o.begin(), c.d_o.end());
  std::array<std::vector<LD>, 4> store;
  const reference::NormArgs<LD> w = norm_args(c, &store);
  // Both sides' logit operands, normalized once: the forward, backward,
  // probabilities and magnitudes below all read them (OperandMags::view).
  fill_operand_mags(c, 0, q.data(), w, &a.qm);
  fill_operand_mags(c, 1, k.data(), w, &a.km);
  const OperandMags &qm = a.qm, &km = a.km;
  const reference::OperandView<LD> qv = qm.view(), kv = km.view();
  // RowCounts: the outputs of a side the caller does not need are not
  // formed, nor, in a sub-case (either side off), the case-wide scalars.
  const bool qs = counts.q_side, ks = counts.k_side, whole = qs && ks;
  r.o.resize(q.size());
  r.lse.resize(static_cast<size_t>(p.batch * p.heads * p.q_len));
  // P, and in a sub-case S for the backward: there the forward (or the
  // given rows' loop) returns them, the logits formed once instead of in
  // each of forward, probabilities and backward (the full oracle keeps no
  // S: as large as P).
  const bool cache = !whole;
  const auto pairs =
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len);
  std::vector<LD>&probs = a.probs, &logits = a.logits;
  probs.resize(pairs);
  logits.resize(cache ? pairs : 0);
  LD* const S = cache ? logits.data() : nullptr;
  if (given == nullptr) {
    reference::attention_forward<LD>(p, qv, kv, v.data(), r.o.data(),
                                     r.lse.data(),
                                     cache ? probs.data() : nullptr, S);
    if (!cache) reference::attention_probabilities<LD>(p, qv, kv, probs.data());
  } else {
    // The rows' lse as given, and an O whose dO . O is the given delta (the
    // backward reads delta from O): O_i = delta_i dO_i / ||dO_i||^2.
    const auto D = static_cast<size_t>(p.head_dim);
    const size_t rows = static_cast<size_t>(p.batch * p.heads * p.q_len);
    for (const std::vector<LD>* x :
         {&given->lse, &given->delta, &given->del, &given->ds_l1, &given->o_abs,
          &given->p_del})
      if (x->size() != rows)
        throw Error("oracle_attention", {},
                    "GivenRows holds " + std::to_string(x->size()) +
                        " values of a statistic where the case has " +
                        std::to_string(rows) + " query rows");
    r.lse = given->lse;
    r.given_units = given->units;
    r.given_soft_units = given->soft_units;
    for (size_t row = 0; row < r.lse.size(); ++row) {
      const LD* doi = d_o.data() + row * D;
      LD ss = 0;
      for (size_t d = 0; d < D; ++d) ss += doi[d] * doi[d];
      for (size_t d = 0; d < D; ++d)
        r.o[row * D + d] = ss > 0 ? given->delta[row] / ss * doi[d] : 0;
    }
    given_probabilities(c, qm, km, r.lse, probs.data(), S);
  }
  r.dq.resize(qs ? q.size() : 0);
  r.dk.resize(ks ? k.size() : 0);
  r.dv.resize(ks ? v.size() : 0);
  r.dq_weight.resize(c.q_weight.size());
  r.dk_weight.resize(c.k_weight.size());
  r.dq_bias.resize(c.q_bias.size());
  r.dk_bias.resize(c.k_bias.size());
  reference::NormGrads<LD> dw;
  auto ptr = [](std::vector<LD>& x) { return x.empty() ? nullptr : x.data(); };
  dw.q_weight = ptr(r.dq_weight);
  dw.k_weight = ptr(r.dk_weight);
  dw.q_bias = ptr(r.dq_bias);
  dw.k_bias = ptr(r.dk_bias);
  reference::attention_backward<LD>(
      p, q.data(), k.data(), qv, kv, v.data(), r.o.data(), d_o.data(),
      r.lse.data(), qs ? r.dq.data() : nullptr, ks ? r.dk.data() : nullptr,
      ks ? r.dv.data() : nullptr, whole ? &r.dg : nullptr, nullptr, w, dw, S);
  // dg sums dS_ij C_ij with dS_ij = P_ij (dP_ij - delta_i): the rounding
  // error of those terms scales with P_ij (|dP_ij| + |delta_i|), not with
  // |dS_ij|, which cancels to ~0 when the visible v_j are alike (found by the
  // fuzzer, issue 7: v = 7e4 everywhere, sum |dS| = 0, correct kernels 1e-2
  // apart). dg_scale is that pre-cancellation magnitude (>= sum |dS|).
  //
  // dq, dk and dv are sums of the same kind of terms, and they too can cancel
  // to ~0 (head_dim 1, where the projection removes everything; symmetric
  // rows; saturated rows): their scales are the magnitudes of their terms
  // before cancellation, max over elements of
  //   |dv_jd|:  sum_i P_ij |dO_id|
  //   |du_id|:  s sum_j T_ij |k_hat_jd|, T_ij = P_ij (|dO_i|.|v_j| + Del_i),
  //             Del_i = sum_k P_ik |dO_i|.|v_k|,
  //             s = |g| (qknorm) or 1/sqrt(D) (sdpa); |du_jd| for keys with
  //             T^T and q_hat;
  //   |dx_d|:   (|du_d| + |u_d| sum_e |u_e| |du_e|) / max(||x||, eps) through
  //             the normalization backward (qknorm).
  // |x|.|y| = sum_d |x_d||y_d| is the magnitude a dot product's rounding
  // error scales with (Higham, Accuracy and Stability, 3.1), not |x . y|:
  // dP_ij = dO_i . v_j and delta_i = sum_k P_ik dP_ik = dO_i . O_i can both
  // cancel (found by the fuzzer, issue 7: sdpa, q = 0, P uniform over 7
  // keys, delta = 0.036 from terms of ~3; a correct blas:f64 dq was 17 ulp
  // of |dq| off where the old scale, built on |dP| and |delta|, allowed 4).
  // Del_i bounds both ways of computing delta (|dO_i|.|O_i| <= Del_i).
  //
  // The backward also reads the stored O (delta = dO . O), and each entry
  // stores its own: below the normal range the storage format resolves O
  // only to ulp_s(0), absolutely, so two correct entries' O differ by that
  // much whatever their relative accuracy. Its effect on a gradient is the
  // sensitivity *_o_sens times ulp_s(0) (verdict), with
  //   dS_ij per unit of O error: P_ij sum_d |dO_id|
  // carried through the same sums as T_ij (found by the fuzzer, issue 7:
  // f32, zero q rows, O ~ 1e-42 stored with 1.4e-45 resolution, dq = g dS
  // k_hat / eps with eps = 2.9e-36: a correct simd dq 4% off, the naive 0.6%).
  //
  // Likewise the compute format resolves its own intermediates only to
  // ulp_c(0) below the normal range: dP_ij and delta_i (D products and sums
  // each, <= D ulp_c(0)), dS_ij = P_ij (dP_ij - delta_i) (<= P_ij (2D + 1)
  // + 1), du = s sum_j dS_ij k_hat_j (+ Nk for its own sums) and the
  // normalization backward's u . du (+ D + 2). *_uf_sens is that count per
  // ulp_c(0), carried through the normalization backward (found by the
  // fuzzer, issue 7: f32, zero q rows, eps = 2.9e-36, dO ~ 4.6e-40: dP is a
  // subnormal with a few bits, a correct blas:f32 dq returned 0 for -3.9e-9,
  // the naive -5.7e-9). A kernel that scales dS before the product with the
  // other operand, (s dS_ij) k_j, rounds s dS_ij once more: one ulp_c(0)
  // per pair not scaled by s, so the count adds |x_tilde'| per pair outside
  // the factor s (found by the CI's fixed-seed fuzz run of issue 19: sdpa,
  // f32, dP ~ 1e-40 and dS ~ 7 ulp(0): reference:f32, which forms
  // scale * dS first, had dk 1.0-1.5 bounds off on a whole row).
  // Outside subnormal intermediates both terms are far below u * scale.
  {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len,
                  Hk = kv_heads_of(p), group = p.heads / Hk;
    const bool qk = p.variant == Variant::kQKNorm;
    // The logit operands of both sides (x_tilde signed, and its magnitude
    // before cancellation |x_hat| |w| + |beta|), x_hat and each row's
    // divisor (OperandMags).
    const LD s = qk ? std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g))
                    : 1 / std::sqrt(static_cast<LD>(D));
    const bool learned = qk && !p.fixed_scale;
    const bool layer = qk && p.norm.kind == NormKind::kLayer;
    LD logit_shift = 0;
    const bool ch6_zero = std::isfinite(s) && qm.xa_finite && km.xa_finite;
    auto absdot = [D](const LD* a, const LD* b) {
      LD t = 0;
      for (int64_t d = 0; d < D; ++d) t += std::fabs(a[d]) * std::fabs(b[d]);
      return t;
    };
    auto norm2 = [D](const LD* a) {
      LD t = 0;
      for (int64_t d = 0; d < D; ++d) t += a[d] * a[d];
      return std::sqrt(t);
    };
    // Six channels carried through the same sums: 0 the rounding scale
    // (weight T_ij), 1 the stored-O sensitivity (P_ij sum_d |dO_id|), 2 the
    // subnormal-intermediate count of dS_ij (P_ij (2D + 1) + 1; channel 2
    // adds its own sums' count to du before the normalization backward), 3
    // the stored-O relative sensitivity (P_ij |dO_i|.|O_i|), 4 |dS_ij| =
    // P_ij |dP_ij - delta_i| (exact), the size of the terms the softmax's
    // conditioning perturbs (tolerance.cc), 5 P_ij's own resolution
    // (|dP_ij - delta_i| for every visible P_ij, plus P_ij p_del_i: every
    // P_ik's resolution moves delta_i by up to |dO_i|.|v_k|, and dS_ij by
    // P_ij times that; found by the fuzzer in the CI's fixed-seed run of
    // issue 19: sdpa, f32, a key of P = 7e-45 (five ulp(0)) with |v| ~ 2^66
    // beside the key of P = 1: delta, so dS of that key and dq, 2% off in
    // reference:f32, margin 167; the CI's case returned dq = 0 for 7.8e-20,
    // margin 7.9e3). They are accumulated per
    // element of the logit operands' gradients (dq_tilde, dk_tilde; dk's
    // summed over each kv head's group of query heads), then carried
    // through the weight and the normalization backward per row.
    constexpr int kCh = 7;
    std::array<std::vector<LD>, kCh>&mq = a.mq, &mk = a.mk;
    // A side the caller does not judge (RowCounts) gets none of its
    // per-element arrays: a sampled row's sub-case of a long problem would
    // otherwise fill hundreds of MB it never reads.
    for (int ch = 0; ch < kCh; ++ch) {
      if (qs) mq[ch].assign(q.size(), 0);
      if (ks) mk[ch].assign(k.size(), 0);
    }
    // Signed du (the true gradients of q_tilde, k_tilde) and, per element
    // of each, s sum |dS| times the other side's operand resolution
    // (operand_resolution), for unit_resolution.
    std::vector<LD>&du_q = a.du_q, &du_k = a.du_k, &ads_q = a.ads_q,
    &ads_k = a.ads_k;
    du_q.assign(qs ? q.size() : 0, 0);
    du_k.assign(ks ? k.size() : 0, 0);
    ads_q.assign(qs ? q.size() : 0, 0);
    ads_k.assign(ks ? k.size() : 0, 0);
    // And s sum |dS| per logit-operand row, unweighted (adr): the per-row
    // terms that per-element ads does not replace (see `side` below).
    std::vector<LD>&adr_q = a.adr_q, &adr_k = a.adr_k;
    adr_q.assign(static_cast<size_t>(p.batch * p.heads * Nq), 0);
    adr_k.assign(static_cast<size_t>(p.batch * Hk * Nk), 0);
    // The other side's operand resolution, for the side that reads it.
    std::vector<LD>&res_q = a.res_q, &res_k = a.res_k;
    if (ks) operand_resolution(p, qm, &res_q);
    if (qs) operand_resolution(p, km, &res_k);
    if (qs) {
      r.o_mag.assign(q.size(), 0);
      r.o_dev_mag.assign(q.size(), 0);
      r.o_p_sens_e.assign(q.size(), 0);
    }
    if (ks) {
      r.dv_p_sens_e.assign(v.size(), 0);
      r.dv_mag.assign(v.size(), 0);
    }
    std::vector<LD>&sdp = a.sdp, &av = a.av;
    sdp.resize(static_cast<size_t>(Nk));
    av.resize(static_cast<size_t>(Nk));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hq = 0; hq < p.heads; ++hq) {
        const int64_t bh = b * p.heads + hq, bk = b * Hk + hq / group;
        LD* dv_mag = ks ? r.dv_mag.data() + bk * Nk * D : nullptr;
        LD* dv_uf = ks ? r.dv_p_sens_e.data() + bk * Nk * D : nullptr;
        for (int64_t i = 0; i < Nq; ++i) {
          const size_t qi = static_cast<size_t>((bh * Nq + i) * D);
          const LD* doi = d_o.data() + qi;
          const LD* pi = probs.data() + (bh * Nq + i) * Nk;
          const LD* qti = qm.xt.data() + qi;
          const LD* qai = qm.xa.data() + qi;
          const LD qan = norm2(qai);
          LD* omag = qs ? r.o_mag.data() + qi : nullptr;
          LD del = 0, do_l1 = 0, sdel = 0;
          for (int64_t j = 0; j < Nk; ++j) {
            const LD* vj = v.data() + (bk * Nk + j) * D;
            LD t = 0, ta = 0;  // dO_i . v_j and |dO_i|.|v_j|, one loop
            for (int64_t d = 0; d < D; ++d) {
              ta += std::fabs(doi[d]) * std::fabs(vj[d]);
              t += doi[d] * vj[d];
            }
            av[static_cast<size_t>(j)] = ta;
            del += pi[j] * ta;
            sdp[static_cast<size_t>(j)] = t;
            sdel += pi[j] * t;
          }
          // sum_k P_ik |dP_ik - delta_i|: delta_i's own perturbation by the
          // softmax's conditioning, per unit of |dS| perturbation.
          LD ds_l1 = 0;
          for (int64_t j = 0; j < Nk; ++j)
            ds_l1 += pi[j] * std::fabs(sdp[static_cast<size_t>(j)] - sdel);
          // sum_k |dO_i|.|v_k| over the visible keys: delta_i's error per
          // unit of absolute error in every P_ik (summed directly, sum_k P_ik
          // dP_ik, or through O, dO_i . O_i), channel 5's term P_ij p_del_i.
          LD p_del = 0;
          for (int64_t j = 0; j < Nk; ++j)
            if (pi[j] > 0) p_del += av[static_cast<size_t>(j)];
          const size_t row = static_cast<size_t>(bh * Nq + i);
          if (given != nullptr) {  // the whole row's, not the sub-case's
            del = given->del[row];
            sdel = given->delta[row];
            ds_l1 = given->ds_l1[row];
            p_del = given->p_del[row];
          }
          const LD* oi = r.o.data() + qi;
          LD* odev = qs ? r.o_dev_mag.data() + qi : nullptr;
          LD* ouf = qs ? r.o_p_sens_e.data() + qi : nullptr;
          for (int64_t d = 0; d < D; ++d) do_l1 += std::fabs(doi[d]);
          // |dO_i|.|O_i|: delta_i's error per relative error of the stored O.
          const LD o_abs_dot =
              given != nullptr ? given->o_abs[row] : absdot(doi, oi);
          for (int64_t j = 0; j < Nk; ++j) {
            const LD pij = pi[j];
            const LD dpd = sdp[static_cast<size_t>(j)] - sdel;
            const LD wt[kCh] = {pij * (av[static_cast<size_t>(j)] + del),
                                pij * do_l1,
                                pij * (2 * D + 1) + 1,
                                pij * o_abs_dot,
                                pij * (std::fabs(dpd) + ds_l1 / 2),
                                pij > 0 ? std::fabs(dpd) + pij * p_del : 0,
                                0};  // 6: added below, from the shifts
            const size_t kj = static_cast<size_t>((bk * Nk + j) * D);
            const LD* ktj = km.xt.data() + kj;
            const LD* kaj = km.xa.data() + kj;
            // The layer mean shifts' change of C_ij = q_tilde . k_tilde (per
            // u_c, first order): a shift d of q's row moves it by d sum_e
            // w_e k_tilde_je (signed: 0 for a layer-normed k with a uniform
            // weight), and k's the same way.
            LD dc = 0;
            if (layer && whole) {
              LD wk = 0, wq = 0;
              for (int64_t d = 0; d < D; ++d) {
                wk += qm.wv[qi + static_cast<size_t>(d)] * ktj[d];
                wq += km.wv[kj + static_cast<size_t>(d)] * qti[d];
              }
              dc = qm.shr[row_of(qm.rows, qi)] * std::fabs(wk) +
                   km.shr[row_of(km.rows, kj)] * std::fabs(wq);
            }
            logit_shift = std::max(logit_shift, s * dc);
            if (learned && whole) {
              // dS_ij C_ij with |C_ij| <= ||q_a|| ||k_a|| (1 for the paper's
              // unit rows).
              const LD cm = std::max<LD>(1, qan * norm2(kaj));
              r.dg_shift += pij * std::fabs(dpd) * dc;
              r.dg_scale += wt[0] * cm;
              r.dg_o_sens += wt[1] * cm;
              r.dg_o_rel_sens += wt[3] * cm;
              r.dg_uf_sens += wt[2] * cm + 1;  // + the product and its sum
              r.dg_p_sens += wt[5] * cm;
            }
            const LD* vj = v.data() + (bk * Nk + j) * D;
            const LD dsv = pij * dpd;
            // Each term below is (s w) x: s times the pair's weight formed
            // once per pair instead of once per element (the same product,
            // so the same sums; the element loops were 40% of a sub-case at
            // n = 4096, perf). Channel 6's weight is 0: its term adds +0 to
            // a sum of nonnegative terms, which changes nothing while s and
            // every operand magnitude are finite (ch6_zero).
            LD sw[kCh];
            for (int ch = 0; ch < kCh; ++ch) sw[ch] = s * wt[ch];
            const LD s_dsv = s * dsv, s_adsv = s * std::fabs(dsv);
            const int nch = ch6_zero ? kCh - 1 : kCh;
            // layer: dx_tilde = s sum dS x_tilde' of shifted x' (ch 6);
            // pij > 0: P_ij's absolute resolution (smallest normal).
            if (qs) {
              LD* mqi[kCh];
              for (int ch = 0; ch < kCh; ++ch) mqi[ch] = mq[ch].data() + qi;
              LD* duq = du_q.data() + qi;
              LD* adq = ads_q.data() + qi;
              const LD* rk = res_k.data() + kj;
              const LD* ksh = km.sh.data() + kj;
              for (int64_t d = 0; d < D; ++d) {
                const LD x = kaj[d];
                for (int ch = 0; ch < nch; ++ch) mqi[ch][d] += sw[ch] * x;
                // (s dS_ij) x_tilde': the scaled dS rounds once more to
                // ulp_c(0), unscaled (above).
                mqi[2][d] += x;
                if (layer) mqi[6][d] += s_adsv * ksh[d];
                duq[d] += s_dsv * ktj[d];
                adq[d] += s_adsv * rk[d];
                omag[d] += pij * std::fabs(vj[d]);
                if (pij > 0) ouf[d] += std::fabs(vj[d]);
                odev[d] += pij * std::fabs(vj[d] - oi[d]);
              }
            }
            if (ks) {
              LD* mkj[kCh];
              for (int ch = 0; ch < kCh; ++ch) mkj[ch] = mk[ch].data() + kj;
              LD* duk = du_k.data() + kj;
              LD* adk = ads_k.data() + kj;
              const LD* rq = res_q.data() + qi;
              const LD* qsh = qm.sh.data() + qi;
              LD* dvm = dv_mag + j * D;
              LD* dvu = dv_uf + j * D;
              for (int64_t d = 0; d < D; ++d) {
                const LD x = qai[d];
                for (int ch = 0; ch < nch; ++ch) mkj[ch][d] += sw[ch] * x;
                mkj[2][d] += x;
                if (layer) mkj[6][d] += s_adsv * qsh[d];
                duk[d] += s_dsv * qti[d];
                adk[d] += s_adsv * rq[d];
                dvm[d] += pij * std::fabs(doi[d]);
                if (pij > 0) dvu[d] += std::fabs(doi[d]);
              }
            }
            adr_q[static_cast<size_t>(bh * Nq + i)] += s_adsv;
            adr_k[static_cast<size_t>(bk * Nk + j)] += s_adsv;
          }
        }
      }
    // Through the weight and the normalization backward, per side row.
    // The subnormal count of the sums forming du (Nk products and
    // additions, the normalization backward's L + 2), each of which the
    // scale s may multiply afterwards (found by the property suite: f32,
    // keys below eps, q_hat_d = 3.7e-39: g dS q_hat_d = 4.8e-43 formed as
    // (dS q_hat_d) g carries 13 half-ulps of 2^-149).
    auto side = [&](int sd, const OperandMags& m,
                    std::array<std::vector<LD>, kCh>& ch_in,
                    const std::vector<LD>& du, const std::vector<LD>& ads,
                    const std::vector<LD>& adr, int64_t terms,
                    const std::array<std::vector<LD>*, kCh>& dst,
                    std::array<std::vector<LD>, kCh>* dw,
                    std::array<std::vector<LD>, kCh>* db, LD* out_max) {
      const NormRows& nr = m.rows;
      const int64_t L = nr.len();
      const LD add[kCh] = {0, 0, (1 + s) * static_cast<LD>(terms + L + 2), 0, 0,
                           0, 0};
      for (int ch = 0; ch < kCh; ++ch) dst[ch]->assign(ch_in[ch].size(), 0);
      const int64_t np = param_size(p, sd) > 0           ? param_size(p, sd)
                         : p.norm.shared_qk_weight && qk ? param_size(p, 0)
                                                         : 0;
      for (int ch = 0; ch < kCh; ++ch) {
        if (dw) (*dw)[ch].assign(static_cast<size_t>(np), 0);
        if (db) (*db)[ch].assign(static_cast<size_t>(np), 0);
      }
      std::vector<LD> row(static_cast<size_t>(L)), u(static_cast<size_t>(L)),
          dus(static_cast<size_t>(L));
      for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
        for (int64_t e = 0; e < L; ++e) {
          const size_t o = static_cast<size_t>(nr.at(r0, e));
          u[static_cast<size_t>(e)] = m.xh[o];
          dus[static_cast<size_t>(e)] = du[o] * m.wv[o];
        }
        for (int ch = 0; ch < kCh; ++ch) {
          for (int64_t e = 0; e < L; ++e) {
            const size_t o = static_cast<size_t>(nr.at(r0, e));
            const LD g = ch_in[ch][o] + add[ch];
            if (np > 0 && dw) {
              const auto pi =
                  static_cast<size_t>(nr.param(r0, e, p.norm.weight));
              (*dw)[ch][pi] += g * std::fabs(u[static_cast<size_t>(e)]);
              if (p.norm.bias && db) (*db)[ch][pi] += g;
            }
            row[static_cast<size_t>(e)] = g * std::fabs(m.wv[o]);
          }
          norm_backward_mag(p, u.data(), m.den[static_cast<size_t>(r0)], L,
                            &row);
          for (int64_t e = 0; e < L; ++e) {
            const size_t o = static_cast<size_t>(nr.at(r0, e));
            (*dst[ch])[o] = row[static_cast<size_t>(e)];
            if (ch < 3) out_max[ch] = std::max(out_max[ch], row[e]);
          }
        }
        // Layer: this row's own mean shift (every x_hat_e off by up to shr,
        // per u_c) enters the weight gradient sum dx_tilde_e x_hat_e as
        // |dx_tilde_e| shr, and the backward dx = (du - mean(du) - x_hat c)
        // / den, c = x_hat . du / L, as shr (|c| + |x_hat_e| |sum du| / L) /
        // den (first order, so the true dx_tilde and du = dx_tilde w; the
        // divisor does not move: sum (x - mu) = 0).
        const LD shr = m.shr[static_cast<size_t>(r0)];
        if (shr > 0) {
          LD c0 = 0, s0 = 0;
          for (int64_t e = 0; e < L; ++e) {
            const size_t o = static_cast<size_t>(nr.at(r0, e));
            c0 += u[static_cast<size_t>(e)] * dus[static_cast<size_t>(e)];
            s0 += dus[static_cast<size_t>(e)];
            if (np > 0 && dw)
              (*dw)[6][static_cast<size_t>(nr.param(r0, e, p.norm.weight))] +=
                  std::fabs(du[o]) * shr;
          }
          const LD Ld = static_cast<LD>(L),
                   den = m.den[static_cast<size_t>(r0)];
          for (int64_t e = 0; e < L; ++e)
            (*dst[6])[static_cast<size_t>(nr.at(r0, e))] +=
                shr *
                (std::fabs(c0) +
                 std::fabs(u[static_cast<size_t>(e)]) * std::fabs(s0)) /
                Ld / den;
        }
        // The unit rows' own absolute resolution ulp_c(0): x_hat_d of a
        // row whose components span many binades is subnormal, and the
        // normalization backward dx = (du - x_hat (x_hat . du)) / n
        // multiplies its error by |x_hat . du| / n; the other operand's
        // unit rows enter du = s sum dS x_hat' with weight s sum |dS| (found
        // by the fuzzer, issue 15: f64, q_hat_d below 2^-1022 beside
        // |q_hat . du| ~ 1e45, a correct dq 2400 u off). Per ulp_c(0), added
        // to *_uf_sens_e:
        //   (|w_d| a_d + |x_hat_d| sum_e |x_hat_e| |w_e| a_e
        //    + res (|x_hat . du| + |x_hat_d| sum |du|)) / n
        // with a_d = s sum_j |dS_ij| res'_jd (ads), res'_jd the other
        // side's operand resolution (operand_resolution; 1 for the paper's
        // unit rows), res this row's x_hat resolution (x_hat_resolution)
        // and du the true du (signed). rms and layer scale the same terms
        // by 1 / L or less: the l2 form bounds them.
        // The parameter gradients sum dx_tilde_e x_hat_e over rows, and
        // dx_tilde_e = s sum dS x_tilde' reads the other side's operand,
        // resolved only to operand_resolution's ulp_c(0) where it is
        // subnormal (a subnormal weight: found by the fuzzer, issue 16:
        // timm, f64, w_q = 8.4e-315, dk_weight 2.4 bounds off in
        // reference:f64 and blas:f64 alike): a_e = s sum |dS| times that
        // (ads) per row element, times |x_hat_e| for the weight. This row's
        // own x_hat is resolved to x_hat_resolution's ulp_c(0).
        const LD own_res =
            x_hat_resolution(p, L, m.den[static_cast<size_t>(r0)]);
        // The per-row terms the per-element ones above were first meant to
        // replace stay beside them (found by the fuzz CI mode with
        // formulations on, once they were gone: rms with [D] weights of
        // ~1e-12, f32, a correct dq = -0 for -1.9e-35, margin 1.1e5; qwen3,
        // f64, subnormal dq ~6e-320 about 495 ulp(0) off, margin 99). A
        // product w_e du_e that lands below the normal range rounds to
        // ulp_c(0) whatever |w_e| is, and rms and layer kernels form du at the
        // scaled row's magnitude (scaled_row_resolution): adr = s sum |dS|
        // per row, times max(1, max |w|) (m.wmax) and that resolution.
        auto adr_at = [&](int64_t e) {
          const int64_t idx =
              nr.all_heads ? ((r0 / nr.N) * nr.H + e / nr.D) * nr.N + r0 % nr.N
                           : r0;
          return adr[static_cast<size_t>(idx)];
        };
        if (np > 0 && dw) {
          for (int64_t e = 0; e < L; ++e) {
            const LD a = ads[static_cast<size_t>(nr.at(r0, e))] + adr_at(e);
            const auto pi = static_cast<size_t>(nr.param(r0, e, p.norm.weight));
            // And this row's own x_hat_e, resolved to own_res ulp_c(0)
            // (below), times |dx_tilde_e| (found by the fuzzer, issue 16:
            // olmo2, f64, k_e = 1e-323 in a row of rms 0.44: x_hat_e = 2e-323
            // to 25%, dk_weight 1.2e-320 off by 800 ulp(0) in reference:f64).
            const LD own = ch_in[0][static_cast<size_t>(nr.at(r0, e))];
            (*dw)[2][pi] +=
                a * std::fabs(u[static_cast<size_t>(e)]) + own_res * own;
            if (p.norm.bias && db) (*db)[2][pi] += a;
          }
        }
        if (qk && p.norm.kind != NormKind::kNone) {
          // wa[e] = |w_e| a_e: du_e's error from the other side's operand;
          // a1 = sum_e |x_hat_e| wa[e]: that error in x_hat . du.
          LD cdot = 0, l1 = 0, a1 = 0, u1 = 0, a_row = 0;
          const int64_t heads_in_row = nr.all_heads ? nr.H : 1;
          for (int64_t hh = 0; hh < heads_in_row; ++hh)
            a_row += adr_at(hh * nr.D);
          a_row *= m.wmax;
          const LD res_row = scaled_row_resolution(p, L);
          for (int64_t e = 0; e < L; ++e) {
            const size_t o = static_cast<size_t>(nr.at(r0, e));
            cdot += u[static_cast<size_t>(e)] * dus[static_cast<size_t>(e)];
            l1 += std::fabs(dus[static_cast<size_t>(e)]);
            u1 += std::fabs(u[static_cast<size_t>(e)]);
            row[static_cast<size_t>(e)] = std::fabs(m.wv[o]) * ads[o];
            a1 += std::fabs(u[static_cast<size_t>(e)]) *
                  row[static_cast<size_t>(e)];
          }
          const LD den = m.den[static_cast<size_t>(r0)];
          for (int64_t e = 0; e < L; ++e) {
            const LD ue = std::fabs(u[static_cast<size_t>(e)]);
            (*dst[2])[static_cast<size_t>(nr.at(r0, e))] +=
                (row[static_cast<size_t>(e)] + ue * a1 +
                 res_row * a_row * (1 + ue * u1) +
                 own_res * (std::fabs(cdot) + ue * l1)) /
                den;
          }
          // The roundings at du's own scale, after the weight. add[2]
          // counts (1 + s) (terms + L + 2) ulp_c(0) per element of
          // dx_tilde (its sums and the normalization backward's operations)
          // and the row then carries it times |w_e|: right for dx_tilde's
          // own sums, formed before the weight, but the product du_e = w_e
          // dx_tilde_e and the normalization backward's operations on du
          // (its dot x_hat . du, the L products and sums, the division by L
          // or the mean, x_hat_e c and the subtraction: the L + 2 of add[2])
          // round at du's magnitude, to ulp_c(0) below the normal range
          // whatever |w_e| is, and the division by den multiplies them by 1
          // / den. So each du_e carries (1 + s) (1 + L + 2) ulp_c(0)
          // unweighted (s: a kernel may scale after these operations, as
          // add[2] allows), through the same backward as the other channels
          // (norm_backward_mag): (1 + s) (L + 3) (1 + |x_hat_e| sum |x_hat|
          // / L) / den for rms. Found by the fuzz CI mode with formulations
          // on: rms, [D] weight with w_7 = 7.0e-309 (the others 1.9e-314,
          // 3 ulp(0) or 0), f64, a q row of eight -2.0e-4 (den = 2.0e-4):
          // dx_tilde_7 = 1.7e-4 and du_7 = 1.17e-312, resolved to 0.42
          // ulp(0) in reference:f64, which 1 / den = 5011 made 2500 ulp(0)
          // of dq_7 = 5.1e-309, where the weighted count gave nothing and
          // the bound was 1667 ulp(0) (margin 1.5). 0 without a weight: then
          // add[2] counts these operations with |w_e| = 1.
          if (p.norm.weight != ParamShape::kNone) {
            const LD du_ops = (1 + s) * static_cast<LD>(L + 3);
            for (int64_t e = 0; e < L; ++e)
              row[static_cast<size_t>(e)] = du_ops;
            norm_backward_mag(p, u.data(), den, L, &row);
            for (int64_t e = 0; e < L; ++e)
              (*dst[2])[static_cast<size_t>(nr.at(r0, e))] +=
                  row[static_cast<size_t>(e)];
          }
        }
      }
    };
    LD dq_out[3] = {}, dk_out[3] = {};
    std::array<std::vector<LD>*, kCh> dq_dst = {
        &r.dq_mag,    &r.dq_o_sens_e, &r.dq_uf_sens_e, &r.dq_o_rel_e,
        &r.dq_ds_mag, &r.dq_p_sens_e, &r.dq_shift_e};
    std::array<std::vector<LD>*, kCh> dk_dst = {
        &r.dk_mag,    &r.dk_o_sens_e, &r.dk_uf_sens_e, &r.dk_o_rel_e,
        &r.dk_ds_mag, &r.dk_p_sens_e, &r.dk_shift_e};
    const bool shared = qk && p.norm.shared_qk_weight;
    const int64_t nk_terms = counts.kv_len > 0 ? counts.kv_len : Nk,
                  nq_terms = counts.q_len > 0 ? counts.q_len : Nq;
    // A side the caller does not need (a sampled row's sub-case,
    // RowCounts): no per-element channels (attention_tolerances then makes
    // no table for its fields); the parameter channels stay 0.
    auto zero_side = [&](int sd, const std::array<std::vector<LD>*, kCh>& dst,
                         const std::vector<LD>& like,
                         std::array<std::vector<LD>, kCh>* dw,
                         std::array<std::vector<LD>, kCh>* db) {
      const int64_t np = param_size(p, sd) > 0           ? param_size(p, sd)
                         : p.norm.shared_qk_weight && qk ? param_size(p, 0)
                                                         : 0;
      for (int ch = 0; ch < kCh; ++ch) {
        dst[ch]->clear();
        (*dw)[ch].assign(static_cast<size_t>(np), 0);
        (*db)[ch].assign(static_cast<size_t>(np), 0);
      }
      (void)like;
    };
    if (counts.q_side)
      side(0, qm, mq, du_q, ads_q, adr_q, nk_terms, dq_dst, &r.dq_weight_ch,
           &r.dq_bias_ch, dq_out);
    else
      zero_side(0, dq_dst, q, &r.dq_weight_ch, &r.dq_bias_ch);
    if (counts.k_side)
      side(1, km, mk, du_k, ads_k, adr_k, group * nq_terms, dk_dst,
           &r.dk_weight_ch, &r.dk_bias_ch, dk_out);
    else
      zero_side(1, dk_dst, k, &r.dk_weight_ch, &r.dk_bias_ch);
    if (shared) {  // one weight: both sides' channels add
      for (int ch = 0; ch < kCh; ++ch)
        for (size_t e = 0; e < r.dq_weight_ch[ch].size(); ++e)
          r.dq_weight_ch[ch][e] += r.dk_weight_ch[ch][e];
    }
    if (param_size(p, 1) == 0)
      for (auto& x : r.dk_weight_ch) x.clear();
    if (!(qk && p.norm.bias))
      for (auto* x : {&r.dq_bias_ch, &r.dk_bias_ch})
        for (auto& y : *x) y.clear();
    if (param_size(p, 0) == 0)
      for (auto& x : r.dq_weight_ch) x.clear();
    const NormRows qr = norm_rows(p, 0), kr = norm_rows(p, 1);
    r.q_param_rows =
        qr.rows() * qr.len() / std::max<int64_t>(1, param_size(p, 0));
    r.k_param_rows =
        shared ? r.q_param_rows
               : kr.rows() * kr.len() / std::max<int64_t>(1, param_size(p, 1));
    if (shared) r.q_param_rows *= 2;
    if (whole) r.logit_flip = static_cast<double>(logit_flip(c, qm, km, s));
    r.logit_shift = static_cast<double>(logit_shift);
    for (int64_t e = 0; ks && e < Nk * D * p.batch * Hk; ++e)
      r.dv_scale = std::max(r.dv_scale, r.dv_mag[static_cast<size_t>(e)]);
    r.dq_scale = dq_out[0];
    r.dk_scale = dk_out[0];
    r.dq_o_sens = dq_out[1];
    r.dk_o_sens = dk_out[1];
    r.dq_uf_sens = dq_out[2];
    r.dk_uf_sens = dk_out[2];
  }
  return r;
}

OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c) {
  const ScaleNormProblem& p = c.problem;
  OracleScaleNorm r;
  auto x = widen(c.x), dy = widen(c.dy);
  r.y.resize(x.size());
  r.dx.resize(x.size());
  reference::scalenorm_forward<LD>(p, x.data(), r.y.data());
  reference::scalenorm_backward<LD>(p, x.data(), dy.data(), r.dx.data(), &r.dg);
  // y / g = u; sum |dy_i u_i| is the magnitude of dg's terms.
  for (int64_t r0 = 0; r0 < p.rows; ++r0) {
    const LD* xr = x.data() + r0 * p.dim;
    LD n = reference::nrm2<LD>(xr, p.dim);
    LD den = std::max(n, static_cast<LD>(p.eps));
    for (int64_t i = 0; i < p.dim; ++i)
      r.dg_scale +=
          std::fabs(dy[static_cast<size_t>(r0 * p.dim + i)] * xr[i] / den);
  }
  return r;
}

const Backend& naive_for(Precision p) { return reference::naive_backend(p); }

namespace {
// In long double: a row norm (or the product of two) near DBL_MAX overflows
// double and made A = 0 * inf = NaN (found by the fuzzer, issue 7).
long double max_row_norm(const std::vector<double>& x, int64_t D) {
  long double m = 0;
  for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
       r += static_cast<size_t>(D)) {
    long double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<LD>(x[r + static_cast<size_t>(d)]) *
           x[r + static_cast<size_t>(d)];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}
}  // namespace

double logit_amplitude(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  if (p.variant == Variant::kQKNorm && is_paper_formulation(p))
    return std::fabs(p.g);
  if (p.variant == Variant::kQKNorm) {
    // |scale| max ||q_a|| max ||k_a|| over the per-head operand rows, with
    // x_a = |x_hat| |w| + |beta| (rms: at most sqrt(D) max|w_q| max|w_k|
    // scale without bias).
    auto max_norm = [&](const std::vector<LD>& xa) {
      LD m = 0;
      const auto D = static_cast<size_t>(p.head_dim);
      for (size_t r = 0; r + D <= xa.size(); r += D) {
        LD t = 0;
        for (size_t d = 0; d < D; ++d) t += xa[r + d] * xa[r + d];
        m = std::max(m, std::sqrt(t));
      }
      return m;
    };
    const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
    return static_cast<double>(sc * max_norm(operand_mags(c, 0).xa) *
                               max_norm(operand_mags(c, 1).xa));
  }
  return static_cast<double>(max_row_norm(c.q, p.head_dim) *
                             max_row_norm(c.k, p.head_dim) /
                             std::sqrt(static_cast<LD>(p.head_dim)));
}

std::span<const double> field_values(const AttentionResult& r, Field f) {
  switch (f) {
    case Field::kO:
      return r.o;
    case Field::kLse:
      return r.lse;
    case Field::kDq:
      return r.dq;
    case Field::kDk:
      return r.dk;
    case Field::kDv:
      return r.dv;
    case Field::kDg:
      return {&r.dg, 1};
    case Field::kDqWeight:
      return r.dq_weight;
    case Field::kDkWeight:
      return r.dk_weight;
    case Field::kDqBias:
      return r.dq_bias;
    case Field::kDkBias:
      return r.dk_bias;
    default:
      return {};
  }
}

std::span<double> field_values(AttentionResult& r, Field f) {
  const std::span<const double> c = field_values(std::as_const(r), f);
  return {const_cast<double*>(c.data()), c.size()};
}

AgreementReport check_attention(const Backend& entry, const AttentionCase& c0,
                                const ExecConfig& cfg, bool forward_only,
                                bool with_naive) {
  const Precision s = entry.precision();
  const AttentionCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const AttentionResult er = forward_only ? run_attention_forward(entry, c, cfg)
                                          : run_attention(entry, c, cfg);
  AttentionResult nr;
  if (with_naive)
    nr = forward_only ? run_attention_forward(nb, c) : run_attention(nb, c);
  return judge_attention(c, s, oracle_attention(c), er,
                         with_naive ? &nr : nullptr, forward_only, entry.name(),
                         nb.name());
}

namespace {
void finish(AgreementReport* rep) {
  rep->pass = true;
  rep->margin = 0;
  for (const auto& f : rep->fields) {
    rep->pass = rep->pass && f.pass;
    if (f.margin > rep->margin || rep->worst_field.empty()) {
      rep->margin = std::max(rep->margin, f.margin);
      rep->worst_field = f.field;
    }
  }
}
}  // namespace

AgreementReport judge_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const AttentionResult& er, const AttentionResult* nr, bool forward_only,
    const std::string& entry_name, const std::string& naive_name,
    const std::vector<Field>* only, double compute_unit) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = nr != nullptr ? naive_name : "";
  rep.case_desc = c.describe();
  const double A = logit_amplitude(c);
  for (const ToleranceTable& t :
       attention_tolerances(c, s, orc, forward_only, compute_unit)) {
    if (only != nullptr &&
        std::find(only->begin(), only->end(), t.field) == only->end())
      continue;
    auto pick = [&](const AttentionResult& r) {
      const std::span<const double> x = field_values(r, t.field);
      return std::vector<double>(x.begin(), x.end());
    };
    const std::vector<double> naive =
        nr != nullptr ? pick(*nr) : std::vector<double>{};
    rep.fields.push_back(
        judge_field(t, pick(er), nr != nullptr ? &naive : nullptr));
    rep.fields.back().amplitude = A;
  }
  finish(&rep);
  return rep;
}

AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c0,
                                const ExecConfig& cfg, bool with_naive) {
  const Precision s = entry.precision();
  const ScaleNormCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const ScaleNormResult er = run_scalenorm(entry, c, cfg);
  ScaleNormResult nr;
  if (with_naive) nr = run_scalenorm(nb, c);
  return judge_scalenorm(c, s, oracle_scalenorm(c), er,
                         with_naive ? &nr : nullptr, entry.name(), nb.name());
}

AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& orc,
                                const ScaleNormResult& er,
                                const ScaleNormResult* nr,
                                const std::string& entry_name,
                                const std::string& naive_name,
                                const std::vector<Field>* only) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = nr != nullptr ? naive_name : "";
  rep.case_desc = c.describe();
  for (const ToleranceTable& t : scalenorm_tolerances(c, s, orc)) {
    if (only != nullptr &&
        std::find(only->begin(), only->end(), t.field) == only->end())
      continue;
    auto pick = [&](const ScaleNormResult& r) -> std::vector<double> {
      if (t.field == Field::kY) return r.y;
      if (t.field == Field::kDx) return r.dx;
      return {r.dg};
    };
    const std::vector<double> naive =
        nr != nullptr ? pick(*nr) : std::vector<double>{};
    rep.fields.push_back(
        judge_field(t, pick(er), nr != nullptr ? &naive : nullptr));
  }
  finish(&rep);
  return rep;
}

std::string AgreementReport::failure_message() const {
  std::string m;
  for (const auto& f : fields) {
    if (f.pass) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "  field %s: %lld of %lld elements fail; worst %s%s: "
                  "expected %.17g, actual %.17g, bound %.6e (margin %.3g; "
                  "logit amplitude A=%.6g)\n    first failure: %s\n",
                  f.field.c_str(), (long long)f.failures, (long long)f.count,
                  f.field.c_str(), f.worst_where.c_str(), f.worst_expected,
                  f.worst_actual, f.worst_bound, f.margin, f.amplitude,
                  f.diagnosis.c_str());
    m += buf;
    m += "    entry: " + describe(f.entry) + "\n";
    if (f.has_naive) {
      std::snprintf(buf, sizeof buf, "    naive margin %.3g: ", f.naive_margin);
      m += buf + describe(f.naive) + "\n";
    }
  }
  if (m.empty()) return "";
  return "entry " + entry_name + " vs oracle" +
         (naive_name.empty() ? "" : " (naive " + naive_name + ")") + " on " +
         case_desc + "\n" + m;
}

}  // namespace qknorm::validation
