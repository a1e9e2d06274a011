#include "validation/case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "qknorm/formulation.h"
#include "qknorm/name_table.h"
#include "validation/rng.h"

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

}  // namespace

constexpr NamedValue<Distribution> kDistributionNames[] = {
    {Distribution::kGaussian, "gaussian"},
    {Distribution::kUniform, "uniform"},
    {Distribution::kHeavyTailed, "heavy"},
    {Distribution::kWideMagnitude, "wide"},
    {Distribution::kZeroRows, "zerorows"},
    {Distribution::kOutlierRows, "outliers"},
    {Distribution::kMixedScaleV, "mixedv"},
};

const char* name(Distribution d) { return name_in(kDistributionNames, d); }

bool parse_distribution(const std::string& s, Distribution* out) {
  return parse_in(kDistributionNames, s, out);
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

AttentionProblem attention_shape(int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                                 int64_t D, double g) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  p.g = g;
  return p;
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

}  // namespace qknorm::validation
