#include "validation/case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
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
  if (has_window(m)) {
    if (!s.empty()) s += "+";
    char w[64];
    std::snprintf(w, sizeof w, "window:%lld,%lld", (long long)m.window_left,
                  (long long)m.window_right);
    s += w;
  }
  return s.empty() ? "none" : s;
}

// The largest decimal exponent of a row scale in format `range`, rows of
// length D: 8 sqrt(D) below max_finite leaves room for the row's norm
// (Gaussian entries), and 4x more for apply_structure's multiples 2^e x src,
// e <= 2 (generators.cc). Without the 4x, f16 rows of dim 1 with a
// parallel-row structure rounded to +-inf: invalid input, and a false alarm
// in the property soak (issue 15's findings, property-soak-d7649ef.txt:
// Determinism, Orthogonality, ZeroDO on simd f16 entries).
double max_scale_exponent(Precision range, int64_t D) {
  return std::min(30.0,
                  std::log10(max_finite(range) / (32 * std::sqrt(double(D)))));
}

// Fills `rows` rows of length D drawn from dist; `scale_rows` applies the
// per-row magnitude spread (q and k only) and zero rows.
// `v_operand` marks v (kMixedScaleV scales its rows).
void fill(Rng& rng, Distribution dist, int64_t rows, int64_t D, bool qk_operand,
          Precision range, std::vector<double>* out, bool v_operand = false) {
  out->resize(static_cast<size_t>(rows * D));
  // Exponent range of kWideMagnitude row scales, clamped to the format.
  const double hi = max_scale_exponent(range, D);
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

// kSink: row 0 of every block of `len` rows of each tensor in `ts` scaled by
// one draw of 10^U[2, 3] per block (clamped to the format), the same factor
// for the blocks' rows of every tensor (a sink token's key and value).
void sink_rows(Rng& rng, int64_t blocks, int64_t len, int64_t D,
               Precision range,
               std::initializer_list<std::vector<double>*> ts) {
  const double hi = max_scale_exponent(range, D);
  for (int64_t b = 0; b < blocks; ++b) {
    const double s =
        std::pow(10.0, std::min(rng.uniform(kSinkLog10Min, kSinkLog10Max), hi));
    for (std::vector<double>* t : ts)
      for (int64_t d = 0; d < D; ++d)
        (*t)[static_cast<size_t>(b * len * D + d)] *= s;
  }
}

// kChannels: 1 to min(4, D) distinct channels of rows of length D (drawn
// once) scaled by 100 (clamped to the format) in every row of every tensor
// of `ts`.
void massive_channels(Rng& rng, int64_t D, Precision range,
                      std::initializer_list<std::vector<double>*> ts) {
  const int64_t m = rng.uniform_int(1, std::min(kMaxMassiveChannels, D));
  std::vector<int64_t> all(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) all[static_cast<size_t>(d)] = d;
  for (int64_t i = 0; i < m; ++i)  // a partial Fisher-Yates shuffle
    std::swap(all[static_cast<size_t>(i)],
              all[static_cast<size_t>(rng.uniform_int(i, D - 1))]);
  const double s =
      std::pow(10.0, std::min(kChannelsLog10, max_scale_exponent(range, D)));
  for (std::vector<double>* t : ts)
    for (size_t r = 0; r < t->size() / static_cast<size_t>(D); ++r)
      for (int64_t i = 0; i < m; ++i)
        (*t)[r * static_cast<size_t>(D) + static_cast<size_t>(all[i])] *= s;
}

// Whether some row of length D has an extreme-range norm (InputClass; the
// norm scaled by the row's largest element, so that no square over- or
// underflows double) or is all zero.
struct RowNorms {
  bool extreme = false, zero = false;
};
void scan_rows(const std::vector<double>& t, int64_t D, RowNorms* out) {
  if (D <= 0) return;
  for (size_t r = 0; r + static_cast<size_t>(D) <= t.size();
       r += static_cast<size_t>(D)) {
    double m = 0;
    for (int64_t d = 0; d < D; ++d)
      m = std::max(m, std::fabs(t[r + static_cast<size_t>(d)]));
    if (m == 0) {
      out->zero = true;
      continue;
    }
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = t[r + static_cast<size_t>(d)] / m;
      ss += x * x;
    }
    const double n = m * std::sqrt(ss);
    if (!(n <= kExtremeNormHigh) || n < kExtremeNormLow) out->extreme = true;
  }
}

InputClass classify(Distribution dist, Structure structure, bool masked_rows,
                    const RowNorms& rows) {
  if (dist == Distribution::kWideMagnitude ||
      structure == Structure::kSubnormalEntries || rows.extreme)
    return InputClass::kExtremeRange;
  if (dist == Distribution::kZeroRows ||
      structure == Structure::kRowsBelowEps || masked_rows || rows.zero)
    return InputClass::kDegenerate;
  return InputClass::kRealistic;
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
    {Distribution::kSink, "sink"},
    {Distribution::kChannels, "channels"},
};

const char* name(Distribution d) { return name_in(kDistributionNames, d); }

bool parse_distribution(const std::string& s, Distribution* out) {
  return parse_in(kDistributionNames, s, out);
}

std::string distribution_names() { return names_in(kDistributionNames); }

constexpr NamedValue<InputClass> kInputClassNames[] = {
    {InputClass::kRealistic, "realistic"},
    {InputClass::kExtremeRange, "extreme-range"},
    {InputClass::kDegenerate, "degenerate"},
};

const char* name(InputClass c) { return name_in(kInputClassNames, c); }

bool parse_input_class(const std::string& s, InputClass* out) {
  return parse_in(kInputClassNames, s, out);
}

std::string input_class_names() { return names_in(kInputClassNames); }

bool has_fully_masked_rows(const AttentionProblem& p) {
  if (p.mask.causal && p.kv_len < p.q_len) return true;
  for (int64_t len : p.mask.key_lengths)
    if (len <= 0) return true;
  if (!has_window(p.mask)) return false;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i) {
      const KeyRange r = qknorm::visible_keys(p.mask, b, i, p.q_len, p.kv_len);
      if (r.begin >= r.end) return true;
    }
  return false;
}

InputClass input_class(const AttentionCase& c) {
  RowNorms rows;
  scan_rows(c.q, c.problem.head_dim, &rows);
  scan_rows(c.k, c.problem.head_dim, &rows);
  return classify(c.dist, c.structure, has_fully_masked_rows(c.problem), rows);
}

InputClass input_class(const ScaleNormCase& c) {
  RowNorms rows;
  scan_rows(c.x, c.problem.dim, &rows);
  return classify(c.dist, c.structure, false, rows);
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
  if (dist == Distribution::kSink)
    sink_rows(rng, BHk, problem.kv_len, D, range, {&c.k, &c.v});
  if (dist == Distribution::kChannels)
    massive_channels(rng, D, range, {&c.q, &c.k});
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
  if (dist == Distribution::kSink)
    sink_rows(rng, 1, problem.rows, problem.dim, range, {&c.x});
  if (dist == Distribution::kChannels)
    massive_channels(rng, problem.dim, range, {&c.x});
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
