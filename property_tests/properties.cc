// The per-entry properties of issue 5. Each draws its case with rapidcheck,
// runs the entry through validation's harness, and fails with a message that
// names the entry, the case (shape, g, eps, mask, distribution, structure,
// seed), the field, the worst index and the tolerance.
//
// Tolerances, all derived (nothing is a bare literal):
//  - agreement: the tolerance rule of validation/rule.h, unchanged;
//  - transforms the oracle maps exactly (power-of-two scalings,
//    permutations): the sum of the rule's budgets of the two cases, each
//    run being within its budget of the same oracle values (support.h);
//  - bitwise properties: no tolerance; determinism compares every bit, the
//    mask and independence properties treat +0 and -0 as one value (an
//    exact 0 * x term of a masked key may flip an underflowed zero's sign);
//  - the non-saturation bound (probabilities, logits, entropy): its one
//    definition, validation/nonsaturation.h;
//  - the logits' sign symmetry: kTwoRuns times the a-priori relative error
//    gamma_fwd of the probabilities (bounds.h) at the entry's compute
//    roundoff: an entry may be kTwoRuns worse than the naive baseline, whose
//    error gamma_fwd bounds.
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "property_tests/rc_gens.h"
#include "property_tests/shape_coverage.h"
#include "property_tests/support.h"
#include "qknorm/formulation.h"
#include "reference/reference.h"
#include "validation/bounds.h"
#include "validation/check.h"
#include "validation/gradcheck.h"
#include "validation/nonsaturation.h"
#include "validation/rng.h"
#include "validation/sampled.h"

namespace qknorm::property {
namespace {

using LD = long double;
using validation::AttentionCase;
using validation::AttentionResult;
using validation::Field;
using validation::ScaleNormCase;
using validation::ScaleNormResult;

// Rows whose norm is within this factor of eps are treated as clamp-region
// rows by the properties that only hold outside it (orthogonality, scale
// invariance): the gradient is discontinuous at ||x|| = eps, and a norm
// computed with a relative error of even 1e-6 may pick either branch. A
// factor 4 is far above any norm's rounding error.
constexpr double kClampMargin = 4.0;

// Largest |k| of the power-of-two row factors 2^k of the scale-invariance
// properties: 2^33 ~ 8.6e9, the factor range [1e-10, 1e10]. f16's
// whole normal range spans 2^-14..2^15, and gradients scale as 2^-k, so f16
// rows are scaled by at most 2^4.
constexpr int kMaxScaleExp = 33;
constexpr int kMaxScaleExpF16 = 4;

bool is16(Precision p) { return p == Precision::kBF16 || p == Precision::kF16; }

// The index of a flat [B,heads,rows,D] element, for messages.
std::string where4(const AttentionProblem& p, int64_t heads, int64_t rows,
                   size_t i) {
  const int64_t D = p.head_dim, n = static_cast<int64_t>(i);
  char buf[80];
  std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld,%lld]",
                (long long)(n / D / rows / heads),
                (long long)(n / D / rows % heads), (long long)(n / D % rows),
                (long long)(n % D));
  return buf;
}

// First element with |a - b| > tol (or a non-finite mismatch); "" if none.
// `map` optionally maps an index of `a` to the index of `b` (permutations),
// `scale_b` multiplies b elementwise (per-row power-of-two factors).
std::string close_diff(const std::string& field, const std::vector<double>& a,
                       const std::vector<double>& b, double tol,
                       const std::vector<size_t>& map = {},
                       const std::vector<double>& scale_b = {}) {
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t j = map.empty() ? i : map[i];
    const double bj = scale_b.empty() ? b[j] : b[j] * scale_b[j];
    const bool both_finite = std::isfinite(a[i]) && std::isfinite(bj);
    if (!both_finite && !(a[i] == bj)) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "%s[%zu]: non-finite %.17g vs %.17g",
                    field.c_str(), i, a[i], bj);
      return buf;
    }
    if (both_finite && std::fabs(a[i] - bj) > tol) {
      char buf[240];
      std::snprintf(buf, sizeof buf,
                    "%s[%zu]: %.17g vs %.17g, |diff| %.3e > tolerance %.3e",
                    field.c_str(), i, a[i], bj, std::fabs(a[i] - bj), tol);
      return buf;
    }
  }
  return "";
}

// |alpha_i b_i - a_i| <= budget_a + alpha_i budget_b for every element
// (alpha_i = |per-element factor|, an exact power of two).
std::string scaled_diff(const std::string& field, const std::vector<double>& a,
                        const std::vector<double>& b,
                        const std::vector<double>& alpha, double budget_a,
                        double budget_b) {
  for (size_t i = 0; i < a.size(); ++i) {
    const double al = std::fabs(alpha[i]);
    const std::string d =
        close_diff(field, {a[i]}, {b[i] * al}, budget_a + al * budget_b);
    if (!d.empty()) return d + " at element " + std::to_string(i);
  }
  return "";
}

// Per-element budgets (support.h): a[i] against b[map[i]] within
// ta[i] + tb[map[i]] (ta indexes a's case, tb b's).
std::string close_diff(const std::string& field, const std::vector<double>& a,
                       const std::vector<double>& b,
                       const std::vector<double>& ta,
                       const std::vector<double>& tb,
                       const std::vector<size_t>& map = {}) {
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t j = map.empty() ? i : map[i];
    const std::string d = close_diff(field, {a[i]}, {b[j]}, ta[i] + tb[j]);
    if (!d.empty()) return d + " at element " + std::to_string(i);
  }
  return "";
}

// |alpha_i b_i - a_i| <= ta_i + alpha_i tb_i, per-element budgets.
std::string scaled_diff(const std::string& field, const std::vector<double>& a,
                        const std::vector<double>& b,
                        const std::vector<double>& alpha,
                        const std::vector<double>& ta,
                        const std::vector<double>& tb) {
  for (size_t i = 0; i < a.size(); ++i) {
    const double al = std::fabs(alpha[i]);
    const std::string d =
        close_diff(field, {a[i]}, {b[i] * al}, ta[i] + al * tb[i]);
    if (!d.empty()) return d + " at element " + std::to_string(i);
  }
  return "";
}

// The two runs of a metamorphic property: r1 of case c, r2 of the
// transformed case c2, with each case's per-element budgets. The oracle of c2
// is the transformed oracle of c (the transformations are exact in storage),
// so by the triangle inequality a field the transformation leaves unchanged
// (or only permutes) agrees within the sum of both cases' budgets.
struct RunPair {
  Budgets B, B2;
  AttentionResult r1, r2;
};
RunPair run_pair(const Backend& b, Precision s, const AttentionCase& c,
                 const AttentionCase& c2) {
  RunPair runs{attention_budgets(s, c), attention_budgets(s, c2), {}, {}};
  runs.r1 = validation::run_attention(b, c);
  runs.r2 = validation::run_attention(b, c2);
  return runs;
}

// One field the pair must agree on: element i of r2 against element map[i]
// of r1 (the same element if `map` is null), named "<field> (permuted)"
// where mapped.
struct AgreeingField {
  Field field;
  const std::vector<size_t>* map = nullptr;
};

// The first of `fields`, in order, on which the runs disagree; "" if none.
std::string first_disagreement(const RunPair& runs,
                               std::initializer_list<AgreeingField> fields) {
  for (const AgreeingField& f : fields) {
    const auto a = validation::field_values(runs.r2, f.field);
    const auto b = validation::field_values(runs.r1, f.field);
    const std::string d = close_diff(
        std::string(validation::name(f.field)) + (f.map ? " (permuted)" : ""),
        {a.begin(), a.end()}, {b.begin(), b.end()}, runs.B2.of(f.field),
        runs.B.of(f.field), f.map ? *f.map : std::vector<size_t>{});
    if (!d.empty()) return d;
  }
  return "";
}

double row_norm(const std::vector<double>& t, int64_t D, int64_t r) {
  std::vector<LD> x(t.begin() + r * D, t.begin() + (r + 1) * D);
  return static_cast<double>(reference::nrm2<LD>(x.data(), D));
}

// Relative error bound of each probability an entry of precision s computes
// on c (see the file comment).
double prob_gamma(const AttentionCase& c, Precision s) {
  const auto oracle = validation::oracle_attention(c);
  return kTwoRuns *
         validation::reference_bounds(c, oracle, compute_roundoff(s)).gamma_fwd;
}

// For a 16-bit entry: each stored output must be the round-to-nearest-even
// of its f32 result. Truncation (Highway 1.0.3's bf16 DemoteTo) moves a
// value by up to one storage ulp where rounding to nearest moves it by half
// of one; the rule's bound (validation/rule.h) is the element's compute
// error delta_e plus that half spacing, so a truncation smaller than their
// sum passes agreement unseen. This check is exact: an element is decidable
// when the whole interval
// oracle +- delta rounds to one storage value, delta = kTwoRuns times the
// a-priori f32 error bound of the field; every decidable element must then
// equal that value exactly.
std::string rounding_diff(const char* field, Precision s,
                          const std::vector<double>& entry,
                          const std::vector<LD>& oracle, double delta) {
  int64_t decidable = 0;
  for (size_t i = 0; i < entry.size(); ++i) {
    const double e = static_cast<double>(oracle[i]);
    const double lo = round_to(s, e - delta), hi = round_to(s, e + delta);
    if (lo != hi) continue;
    ++decidable;
    if (entry[i] != lo) {
      char buf[240];
      std::snprintf(buf, sizeof buf,
                    "%s[%zu] = %.9g is not the round-to-nearest-even %.9g of "
                    "oracle %.12g (f32 error bound %.3e): storage conversion "
                    "does not round to nearest even",
                    field, i, entry[i], lo, e, delta);
      return buf;
    }
  }
  (void)decidable;
  return "";
}

// ---------------------------------------------------------------------------
// 1. Agreement.

// The verdict of attention_agreement on case c of spec: every field by the
// rule; the forward only where the storage format cannot hold the backward
// (backward_fits false), the rows are saturated sdpa rows, or the naive
// same-precision baseline itself overflows a gradient; a 16-bit entry's
// O must also be the round-to-nearest-even of its f32 result.
void judge_full(const Backend& b, const AttentionSpec& spec,
                const AttentionCase& c, bool backward_fits) {
  const Precision s = b.precision();
  // A case whose gradients the storage format cannot hold (f16 zero rows with
  // eps = 1e-12: du / eps ~ 1e12) still checks the forward.
  // Saturated sdpa rows (rc_gens.h): the forward only.
  auto rep =
      validation::check_attention(b, c, {}, !backward_fits || spec.saturated());
  // The same when the naive same-precision baseline itself overflows the
  // storage format on a gradient (f16: rounding noise of an exactly-zero
  // gradient, divided by eps = 1e-12): the format cannot represent that
  // backward, so only the forward is judged.
  bool naive_overflows = false;
  for (const auto& f : rep.fields)
    naive_overflows =
        naive_overflows || (!f.pass && f.naive.nonfinite_mismatch);
  if (naive_overflows) rep = validation::check_attention(b, c, {}, true);
  if (!rep.pass) RC_FAIL(rep.failure_message() + "  (" + spec.describe() + ")");
  if (is16(s)) {
    const auto r = validation::run_attention_forward(b, c);
    const auto oracle = validation::oracle_attention(c);
    const double delta =
        kTwoRuns *
        validation::reference_bounds(c, oracle, compute_roundoff(s)).o;
    const std::string d = rounding_diff("o", s, r.o, oracle.o, delta);
    if (!d.empty()) RC_FAIL(entry_and_case(b, spec.describe()) + ": " + d);
  }
}

void attention_agreement(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.saturating_sdpa = true;
  const AttentionSpec spec = draw_attention_spec(s, o);
  bool backward_fits = true;
  const AttentionCase c = build_case(spec, s, false, &backward_fits);
  judge_full(b, spec, c, backward_fits);
}

void scalenorm_agreement(const Backend& b) {
  const Precision s = b.precision();
  const ScaleNormSpec spec = draw_scalenorm_spec(s);
  const ScaleNormCase c = build_case(spec, s);
  const auto rep = validation::check_scalenorm(b, c);
  if (!rep.pass) RC_FAIL(rep.failure_message() + "  (" + spec.describe() + ")");
  if (is16(s)) {
    const auto r = validation::run_scalenorm(b, c);
    const auto oracle = validation::oracle_scalenorm(c);
    const double delta =
        kTwoRuns *
        validation::scalenorm_bounds(c, oracle, compute_roundoff(s)).y;
    const std::string d = rounding_diff("y", s, r.y, oracle.y, delta);
    if (!d.empty()) RC_FAIL(entry_and_case(b, spec.describe()) + ": " + d);
  }
}

// The sampled verdict (validation/sampled.h) of entry b on case c: 12 query
// and 12 key rows (the first, the last, the tile boundaries of the entry's
// blocks and of 16 ... 256, masked and zero rows, random ones) by the
// componentwise rule, every other row by the O(n D) properties.
constexpr int64_t kSampledRows = 12;
void judge_sampled_case(const Backend& b, const AttentionCase& c,
                        uint64_t seed) {
  validation::SampleOptions opt;
  opt.rows = kSampledRows;
  opt.seed = seed + 1;
  opt.blocks = b.block_sizes(c.problem);
  const validation::SampledOracle so =
      validation::sampled_oracle(c, b.precision(), opt);
  const AttentionResult r = validation::run_attention(b, c);
  const auto rep = validation::judge_sampled(c, so, r, b.name());
  if (!rep.pass) RC_FAIL(rep.failure_message());
}

// The case of problem p under the sampled verdict: inputs of `dist` rounded
// to the entry's storage; noted and recorded for the coverage report.
AttentionCase long_case(const AttentionProblem& p,
                        validation::Distribution dist, uint64_t seed,
                        Precision s) {
  const AttentionCase c = validation::round_inputs(
      validation::make_attention_case(p, dist, seed, s), s);
  note_case(c.describe());
  record_problem(p);
  return c;
}

// A length in [lo, hi] at a residue cell of the entry's model (coverage.h):
// k b + r for a block b the model is built around (16 ... 256 and the
// entry's own) and r in {0, +1, -1, b/2}.
int64_t draw_residue_len(int64_t lo, int64_t hi) {
  std::vector<int64_t> blocks = {16, 32, 64, 128, 256};
  if (shape_context().model != nullptr)
    blocks = shape_context().model->blocks();
  std::vector<int64_t> fit;
  for (int64_t bl : blocks)
    if (bl <= hi) fit.push_back(bl);
  if (fit.empty()) return *rc::gen::inRange<int64_t>(lo, hi + 1);
  const int64_t bl = *rc::gen::elementOf(fit);
  const int64_t r = *rc::gen::element<int64_t>(0, 1, -1, bl / 2);
  const int64_t k =
      *rc::gen::inRange<int64_t>(std::max<int64_t>(1, lo / bl), hi / bl + 1);
  return std::clamp(k * bl + r, lo, hi);
}

// Long sequences (issues 19, 33): agreement with the sampled oracle on a
// problem of 129 to 700 keys, lengths at the residue cells of the entry's
// blocks (k b + {0, +-1, b/2}) or anywhere, head_dim 16 ... 128 (80 and 96
// included), two heads (sharing one kv head where the entry supports GQA)
// or one head in a batch of 1 or 2, causal, padding or no mask: B H <= 2
// and D <= 128 keep the mean cost that of before issue 33, and the
// largest problem (2 x 700 x 700 x 128) too. Lengths stay
// below what would make the mutation test's copies slow; qknorm-check
// --sample and the tile sweep run the production lengths (cli/README.md).
// The long anchor (head_dim 256, batch 2, q_len 64 mod 128, kv_len
// above 400 with padding) is in every fixed-seed run: ShapeCoverage.
void long_sequence(const Backend& b) {
  const Precision s = b.precision();
  const EntryLimits lim = entry_limits_of(b);
  AttentionProblem p;
  p.heads = *rc::gen::inRange<int64_t>(1, 3);
  p.batch = p.heads == 1 ? *rc::gen::inRange<int64_t>(1, 3) : 1;
  if (p.heads == 2 && (shape_context().needs & coverage::kNeedGqa) != 0 &&
      *rc::gen::arbitrary<bool>())
    p.kv_heads = 1;
  p.kv_len = *rc::gen::arbitrary<bool>() ? *rc::gen::inRange<int64_t>(129, 701)
                                         : draw_residue_len(129, 700);
  const int64_t kv = p.kv_len;
  const int q_kind = *rc::gen::inRange(0, 3);
  p.q_len = q_kind == 0   ? kv
            : q_kind == 1 ? *rc::gen::inRange<int64_t>(65, kv + 1)
                          : draw_residue_len(65, kv);
  p.head_dim = *rc::gen::element<int64_t>(16, 64, 80, 96, 128);
  p.g = *rc::gen::inRange<int>(1, 30) * 1.0;
  const int mask = *rc::gen::inRange(0, 3);
  p.mask.causal = mask == 1 && lim.causal;
  if (mask == 2 && lim.padding)
    for (int64_t bb = 0; bb < p.batch; ++bb)
      p.mask.key_lengths.push_back(*rc::gen::inRange<int64_t>(1, kv + 1));
  const auto dist = *rc::gen::element(validation::Distribution::kGaussian,
                                      validation::Distribution::kZeroRows,
                                      validation::Distribution::kOutlierRows);
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  judge_sampled_case(b, long_case(p, dist, seed, s), seed);
}

// Problems above this B H Nq Nk D are judged by the sampled verdict (the
// full long-double oracle of one costs ~0.1 s and more).
constexpr int64_t kFullVerdictMaxCost = int64_t{1} << 20;

// The shape model's walk (issue 33, shape_coverage.h) on the entry: problems
// that reach every single cell of the entry's model (coverage.h) within the
// features it supports, each at its cheapest, plus the long anchor;
// the values (distribution, seed, g) are drawn. Each problem is judged by
// the full verdict (as AttentionAgreement), or by the sampled one above
// kFullVerdictMaxCost. Every fixed-seed run thus reaches every single cell
// by construction; the property fails if the walk misses one.
void shape_coverage(const Backend& b) {
  const Precision s = b.precision();
  const ShapeContext& ctx = shape_context();
  const coverage::Model& m = ctx.model != nullptr ? *ctx.model : model_of(b);
  const double g = draw_g();
  std::vector<AttentionProblem> walk = walk_problems(m, ctx.needs, g);
  coverage::Tally tally(m, ctx.needs);
  for (const AttentionProblem& p : walk) tally.add(p);
  if (tally.singles_reached() < tally.singles_feasible()) {
    std::string cells;
    for (int i : tally.unreached_singles()) {
      cells += ' ';  // (a + b would trip GCC 12's -Wrestrict false alarm)
      cells += coverage::full_name(m.cells()[static_cast<size_t>(i)]);
    }
    RC_FAIL("entry " + b.name() + ": the walk of the shape model reaches " +
            tally.summary() + "; cells not reached:" + cells);
  }
  walk.push_back(long_anchor(ctx.needs, g));
  for (const AttentionProblem& p : walk) {
    AttentionSpec spec;
    spec.problem = p;
    spec.dist = *rc::gen::element(validation::Distribution::kGaussian,
                                  validation::Distribution::kUniform,
                                  validation::Distribution::kHeavyTailed);
    spec.seed = *rc::gen::arbitrary<uint32_t>();
    if (p.batch * p.heads * p.q_len * p.kv_len * p.head_dim >
        kFullVerdictMaxCost) {
      judge_sampled_case(b, long_case(p, spec.dist, spec.seed, s), spec.seed);
      continue;
    }
    bool backward_fits = true;
    const AttentionCase c = build_case(spec, s, false, &backward_fits);
    judge_full(b, spec, c, backward_fits);
  }
}

// ---------------------------------------------------------------------------
// 2. Softmax non-saturation, on the entry's own probabilities.

void non_saturation(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_sdpa = false;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  std::vector<double> probs;
  if (!hook_probabilities(b, c, &probs))
    RC_FAIL("entry " + b.name() +
            ": no inspection hook (attention_probabilities returned false); "
            "the non-saturation property must see the probabilities the "
            "entry computes");
  const auto fwd = validation::run_attention_forward(b, c);
  const std::string v = validation::check_nonsaturation(
      c.problem, probs, &fwd.lse,
      validation::computed_logit_amplitude(c, nullptr, s,
                                           validation::logit_amplitude(c)),
      s);
  if (!v.empty()) RC_FAIL(entry_and_case(b, spec.describe()) + ": " + v);
}

// Agreement with the oracle on every field of spec's case (the parameter
// gradients included); 16-bit cases whose gradients the format cannot hold
// judge the forward only, as attention_agreement.
void agreement_on(const Backend& b, const AttentionSpec& spec) {
  const Precision s = b.precision();
  if (!b.supports(spec.problem))
    RC_FAIL("entry " + b.name() + " does not implement " +
            describe_formulation(spec.problem));
  bool backward_fits = true;
  const AttentionCase c = build_case(spec, s, false, &backward_fits);
  const auto rep = validation::check_attention(b, c, {}, !backward_fits);
  if (!rep.pass) RC_FAIL(rep.failure_message() + "  (" + spec.describe() + ")");
}

// The formulations (issue 16): a drawn preset or free combination, GQA
// included.
void formulation_agreement(const Backend& b) {
  agreement_on(b, draw_formulation_spec(b.precision()));
}

// The logit softcap (issue 34): a drawn formulation whose logits are capped
// at a drawn cap, from one that saturates them (0.5) to Gemma 2's 50.
void formulation_softcap_agreement(const Backend& b) {
  AttentionSpec spec = draw_formulation_spec(b.precision());
  spec.problem.softcap =
      *rc::gen::elementOf(std::vector<double>{0.5, 2, 5, 20, 50});
  agreement_on(b, spec);
}

// The sliding window (issue 34): a drawn formulation under a drawn window
// (each side -1, 0, 1, 2 or 4 keys, at least one side bounded), over the
// causal mask and padding the spec drew: keys outside the window must get
// no weight at all and every key inside its share.
void window_agreement(const Backend& b) {
  AttentionSpec spec = draw_formulation_spec(b.precision());
  Mask& m = spec.problem.mask;
  const std::vector<int64_t> sides{-1, 0, 1, 2, 4};
  m.window_left = *rc::gen::elementOf(sides);
  m.window_right = *rc::gen::elementOf(sides);
  if (m.window_left < 0 && m.window_right < 0) m.window_left = 1;
  agreement_on(b, spec);
}

// RoPE (issue 34): a drawn formulation with a drawn rotation: rotary_dim 2,
// about half the head or all of it (even), either pairing, after the
// normalization or (where the formulation allows it: l2, rms, none without
// weight or bias) before it, positions from 0, 7, 1000 or 30000, and the
// rounding claims (angle_f32, cos_sin_storage) drawn too: a claim only
// widens the bound, so an entry that computes more exactly passes either
// way.
void rope_agreement(const Backend& b) {
  AttentionSpec spec = draw_formulation_spec(b.precision());
  AttentionProblem& p = spec.problem;
  const int64_t even = p.head_dim - p.head_dim % 2;
  if (even >= 2) {
    const int64_t half = std::max<int64_t>(2, (p.head_dim / 2) & ~int64_t{1});
    p.rope.rotary_dim =
        *rc::gen::elementOf(std::vector<int64_t>{2, half, even});
    p.rope.pairing = *rc::gen::arbitrary<bool>() ? RopePairing::kHalf
                                                 : RopePairing::kInterleaved;
    const Normalization& n = p.norm;
    const bool before_ok = p.variant == Variant::kQKNorm &&
                           n.kind != NormKind::kLayer &&
                           n.weight == ParamShape::kNone && !n.bias;
    if (before_ok && *rc::gen::arbitrary<bool>())
      p.rope.order = RopeOrder::kBeforeNorm;
    p.rope.position_offset =
        *rc::gen::elementOf(std::vector<int64_t>{0, 7, 1000, 30000});
    p.rope.theta = *rc::gen::elementOf(std::vector<double>{1e4, 5e5, 1e6});
    p.rope.angle_f32 = *rc::gen::arbitrary<bool>();
    p.rope.cos_sin_storage = *rc::gen::arbitrary<bool>();
  }
  agreement_on(b, spec);
}

// Agreement with attention sinks (issue 34; attention.h): a drawn
// formulation with one sink per query head, each drawn from below the
// logits (-8) to beyond them (+8), or a shared one; the drawn masks' fully
// masked rows are then the sink alone.
void sinks_agreement(const Backend& b) {
  AttentionSpec spec = draw_formulation_spec(b.precision());
  AttentionProblem& p = spec.problem;
  const bool shared = *rc::gen::arbitrary<bool>();
  const double first =
      *rc::gen::elementOf(std::vector<double>{-8, -2, -0.5, 0, 0.75, 3, 8});
  for (int64_t h = 0; h < p.heads; ++h)
    p.sinks.push_back(shared ? first
                             : first + 0.375 * static_cast<double>(h % 5));
  agreement_on(b, spec);
}

// Non-saturation under a formulation: the bound of validation/nonsaturation.h
// at the rule's logit amplitude A (|scale| max ||q_a|| max ||k_a||), whose
// computed logits carry the formulations' error E (the operands' roundings,
// Qwen3's flips and LayerNorm's mean shift, from the oracle).
void formulation_non_saturation(const Backend& b) {
  const Precision s = b.precision();
  const AttentionSpec spec = draw_formulation_spec(s);
  const AttentionCase c = build_case(spec, s);
  std::vector<double> probs;
  if (!hook_probabilities(b, c, &probs))
    RC_FAIL("entry " + b.name() + ": no inspection hook");
  const auto fwd = validation::run_attention_forward(b, c);
  const auto oracle = validation::oracle_attention(c);
  const std::string v = validation::check_nonsaturation(
      c.problem, probs, &fwd.lse,
      validation::computed_logit_amplitude(c, &oracle, s,
                                           validation::logit_amplitude(c)),
      s);
  if (!v.empty()) RC_FAIL(entry_and_case(b, spec.describe()) + ": " + v);
}

// ---------------------------------------------------------------------------
// 3. Scale invariance.

// The exponent range [lo, hi] of factors 2^k that scale row r of t exactly
// in format s (every nonzero element stays normal, the norm and the
// gradient ~ |g| / norm stay finite with 2^8 headroom) and keep the row
// outside the clamp region; lo > hi means "do not scale this row".
std::pair<int, int> exact_exponents(const std::vector<double>& t, int64_t D,
                                    int64_t r, Precision s, double eps,
                                    double abs_g) {
  double amax = 0, amin = INFINITY;
  for (int64_t d = 0; d < D; ++d) {
    const double a = std::fabs(t[static_cast<size_t>(r * D + d)]);
    amax = std::max(amax, a);
    if (a > 0) amin = std::min(amin, a);
  }
  const double n = row_norm(t, D, r);
  if (n <= kClampMargin * eps) return {1, 0};
  const int kmax = s == Precision::kF16 ? kMaxScaleExpF16 : kMaxScaleExp;
  const double headroom = 0x1p8;
  const double big = max_finite(s) / (headroom * std::sqrt(double(D)));
  int lo = -kmax, hi = kmax;
  hi = std::min(hi, static_cast<int>(std::floor(std::log2(big / amax))));
  lo = std::max(lo,
                static_cast<int>(std::ceil(std::log2(min_normal(s) / amin))));
  lo = std::max(lo,
                static_cast<int>(std::ceil(std::log2(kClampMargin * eps / n))));
  // dq ~ |g| / norm must stay finite.
  lo = std::max(
      lo, static_cast<int>(std::ceil(std::log2(std::max(1.0, abs_g) * headroom /
                                               (max_finite(s) * n)))));
  return {lo, hi};
}

// Scales each row of t by its own 2^k (k uniform in its exact range, drawn
// from rng); returns the per-element factor.
std::vector<double> scale_rows(std::vector<double>* t, int64_t D, Precision s,
                               double eps, double abs_g, validation::Rng& rng) {
  const int64_t rows = static_cast<int64_t>(t->size()) / D;
  std::vector<double> f(t->size(), 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    const auto [lo, hi] = exact_exponents(*t, D, r, s, eps, abs_g);
    if (lo > hi) continue;
    const double a = std::ldexp(1.0, static_cast<int>(rng.uniform_int(lo, hi)));
    for (int64_t d = 0; d < D; ++d) {
      (*t)[static_cast<size_t>(r * D + d)] *= a;
      f[static_cast<size_t>(r * D + d)] = a;
    }
  }
  return f;
}

// O, lse, dv, dg are unchanged and dq_i, dk_j scale by 1/alpha (degree -1
// homogeneity) when each q and k row is multiplied by its own 2^k. Powers of
// two keep the scaled inputs exact in storage, so the oracle of the scaled
// case is exactly the scaled oracle (its normalization is exact under 2^k);
// each run is within its own budget of it, so by the triangle inequality
//   |O(c2) - O(c)| <= B_o(c) + B_o(c2)                (lse, dv, dg alike)
//   |alpha_i dq_i(c2) - dq_i(c)| <= B_dq(c) + alpha_i B_dq(c2)
// (multiplying by alpha_i is exact).
void row_scale_invariance(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_sdpa = false;
  o.smooth_only = true;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  AttentionCase c2 = c;
  validation::Rng rng(spec.seed + 1);
  const double ag = std::fabs(c.problem.g), eps = c.problem.eps;
  const int64_t D = c.problem.head_dim;
  // The gradients' size per |g| / ||x||: dS_ij = P_ij (dO_i . v_j -
  // delta_i) is at most 2 ||dO_i|| max_j ||v_j||, dq_i sums it over keys
  // with weights P_ij (sum 1), dk_j over every query row of its group. Rows
  // are scaled down only as far as those gradients stay finite (found by a
  // soak of issue 31: the sink distribution's 10^3 larger v row overflowed
  // f16's dk at 2^-k, a -inf against -4096 unscaled).
  double max_do = 0, max_v = 0;
  for (int64_t r = 0; r * D < static_cast<int64_t>(c.d_o.size()); ++r)
    max_do = std::max(max_do, row_norm(c.d_o, D, r));
  for (int64_t r = 0; r * D < static_cast<int64_t>(c.v.size()); ++r)
    max_v = std::max(max_v, row_norm(c.v, D, r));
  const double grad_q = std::max(1.0, 2 * max_do * max_v);
  const double grad_k =
      grad_q * static_cast<double>(c.problem.q_len * c.problem.heads /
                                   kv_heads_of(c.problem));
  const auto fq = scale_rows(&c2.q, D, s, eps, ag * grad_q, rng);
  const auto fk = scale_rows(&c2.k, D, s, eps, ag * grad_k, rng);
  const RunPair runs = run_pair(b, s, c, c2);
  std::string d = first_disagreement(
      runs, {{Field::kO}, {Field::kLse}, {Field::kDv}, {Field::kDg}});
  if (d.empty())
    d = scaled_diff("dq * alpha", runs.r1.dq, runs.r2.dq, fq,
                    runs.B.of(Field::kDq), runs.B2.of(Field::kDq));
  if (d.empty())
    d = scaled_diff("dk * alpha", runs.r1.dk, runs.r2.dk, fk,
                    runs.B.of(Field::kDk), runs.B2.of(Field::kDk));
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": rows of q and k scaled by powers of two in [2^-33, 2^33]: " + d);
}

// Negating key row j flips the sign of every logit S_ij: recovered from the
// entry's own probabilities and lse as S_ij = log P_ij + lse_i (the hook).
// Each recovered logit has error <= gamma (2 + |lse_i|) (log P: gamma; lse:
// gamma (1 + |lse|)); two runs: kTwoRuns of that.
void key_sign_flip(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_sdpa = false;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  AttentionCase c2 = c;
  validation::Rng rng(spec.seed + 2);
  // k is [B, kv_heads, kv_len, D]; query head h reads kv head h / group.
  const int64_t kvh = kv_heads_of(p), group = p.heads / kvh;
  const int64_t D = p.head_dim, rows = p.batch * kvh * p.kv_len;
  std::vector<bool> flipped(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    flipped[static_cast<size_t>(r)] = rng.uniform() < 0.4;
    if (flipped[static_cast<size_t>(r)])
      for (int64_t d = 0; d < D; ++d)
        c2.k[static_cast<size_t>(r * D + d)] *= -1;
  }
  std::vector<double> p1, p2;
  if (!hook_probabilities(b, c, &p1) || !hook_probabilities(b, c2, &p2))
    RC_FAIL("entry " + b.name() +
            ": no inspection hook (attention_probabilities returned false)");
  const auto f1 = validation::run_attention_forward(b, c);
  const auto f2 = validation::run_attention_forward(b, c2);
  const double gamma = prob_gamma(c, s);
  for (int64_t bb = 0; bb < p.batch; ++bb)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const size_t li = static_cast<size_t>((bb * p.heads + h) * p.q_len + i);
        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (!visible(p.mask, bb, i, j, p.q_len, p.kv_len)) continue;
          const size_t pi =
              li * static_cast<size_t>(p.kv_len) + static_cast<size_t>(j);
          if (!(p1[pi] > 0) || !(p2[pi] > 0))
            RC_FAIL(entry_and_case(b, spec.describe()) +
                    ": visible probability is not positive: " +
                    std::to_string(p1[pi]) + " / " + std::to_string(p2[pi]));
          const double s1 = std::log(p1[pi]) + f1.lse[li];
          const double s2 = std::log(p2[pi]) + f2.lse[li];
          const bool flip = flipped[static_cast<size_t>(
              (bb * kvh + h / group) * p.kv_len + j)];
          const double expect = flip ? -s1 : s1;
          const double tol =
              kTwoRuns * gamma *
              (2 + std::max(std::fabs(f1.lse[li]), std::fabs(f2.lse[li])));
          if (std::fabs(s2 - expect) > tol) {
            char buf[240];
            std::snprintf(buf, sizeof buf,
                          ": logit [%lld,%lld,%lld,%lld] %s: %.17g, expected "
                          "%.17g (unflipped %.17g), tolerance %.3e",
                          (long long)bb, (long long)h, (long long)i,
                          (long long)j, flip ? "(key negated)" : "(key kept)",
                          s2, expect, s1, tol);
            RC_FAIL(entry_and_case(b, spec.describe()) + buf);
          }
        }
      }
}

// ScaleNorm(alpha x) = sign(alpha) ScaleNorm(x), dg(alpha x) = sign(alpha)
// dg(x), and the gradient is homogeneous of degree -1: dx(alpha x) =
// dx(x) / alpha for alpha > 0 (and dx(x) / |alpha| for alpha < 0, as y is odd),
// alpha = +-2^k (exact), for rows outside the clamp region; the budgets of
// both runs as above.
void scalenorm_homogeneity(const Backend& b) {
  const Precision s = b.precision();
  ScaleNormSpec spec = draw_scalenorm_spec(s, /*smooth_only=*/true);
  // One alpha scales every row, so every row must stay outside the clamp
  // region and exactly scalable: the paper's eps (a large eps would discard
  // most cases).
  spec.problem.eps = kDefaultScaleNormEps;
  const ScaleNormCase c = build_case(spec, s);
  const ScaleNormProblem& p = c.problem;
  int lo = -kMaxScaleExp, hi = kMaxScaleExp;
  for (int64_t r = 0; r < p.rows; ++r) {
    const auto e = exact_exponents(c.x, p.dim, r, s, p.eps, std::fabs(p.g));
    RC_PRE(e.first <= e.second);  // rare: a row within 4 eps of 0
    lo = std::max(lo, e.first), hi = std::min(hi, e.second);
  }
  RC_PRE(lo <= hi);
  const int k = *rc::gen::inRange<int>(lo, hi + 1);
  const bool neg = *rc::gen::arbitrary<bool>();
  const double alpha = (neg ? -1.0 : 1.0) * std::ldexp(1.0, k);
  ScaleNormCase c2 = c;
  for (double& x : c2.x) x *= alpha;
  const Budgets B = scalenorm_budgets(s, c), B2 = scalenorm_budgets(s, c2);
  const ScaleNormResult r1 = validation::run_scalenorm(b, c);
  const ScaleNormResult r2 = validation::run_scalenorm(b, c2);
  const double sign = neg ? -1 : 1;
  std::string d;
  for (size_t i = 0; i < c.x.size() && d.empty(); ++i) {
    d = close_diff("y(alpha x) vs sign(alpha) y(x)", {r2.y[i]},
                   {sign * r1.y[i]}, B.at(Field::kY, i) + B2.at(Field::kY, i));
    if (d.empty())
      d = scaled_diff("dx(alpha x) * |alpha| vs dx(x)", {r1.dx[i]}, {r2.dx[i]},
                      {alpha}, B.at(Field::kDx, i), B2.at(Field::kDx, i));
    if (!d.empty()) d += " at element " + std::to_string(i);
  }
  if (d.empty())
    d = close_diff("dg(alpha x) vs sign(alpha) dg(x)", {r2.dg}, {sign * r1.dg},
                   B[Field::kScaleNormDg] + B2[Field::kScaleNormDg]);
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": alpha = " + std::to_string(alpha) + ": " + d);
}

// ---------------------------------------------------------------------------
// 4. Gradient structure.

// q_i . dq_i = 0, k_j . dk_j = 0 (attention) and x . dx = 0 (ScaleNorm)
// outside the clamp region. The exact gradient is orthogonal, and each
// computed element is within budget B of it, so |x . dx| <= ||x||_1 B.
std::string orthogonal_rows(const char* field, const std::vector<double>& x,
                            const std::vector<double>& dx, int64_t D,
                            double eps, const std::vector<double>& budget) {
  const int64_t rows = static_cast<int64_t>(x.size()) / D;
  for (int64_t r = 0; r < rows; ++r) {
    if (row_norm(x, D, r) <= kClampMargin * eps) continue;
    LD dot = 0, l1 = 0;
    for (int64_t d = 0; d < D; ++d) {
      const size_t i = static_cast<size_t>(r * D + d);
      dot += static_cast<LD>(x[i]) * dx[i];
      l1 += std::fabs(static_cast<LD>(x[i])) * budget[i];
    }
    const double tol = static_cast<double>(l1);
    if (!(std::fabs(static_cast<double>(dot)) <= tol)) {
      char buf[200];
      std::snprintf(
          buf, sizeof buf,
          "row %lld: x . %s = %.6e, tolerance sum_d |x_d| budget_d = %.6e",
          (long long)r, field, static_cast<double>(dot), tol);
      return buf;
    }
  }
  return "";
}

void orthogonality(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_sdpa = false;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const Budgets B = attention_budgets(s, c);
  const AttentionResult r = validation::run_attention(b, c);
  const int64_t D = c.problem.head_dim;
  std::string d =
      orthogonal_rows("dq", c.q, r.dq, D, c.problem.eps, B.of(Field::kDq));
  if (d.empty())
    d = orthogonal_rows("dk", c.k, r.dk, D, c.problem.eps, B.of(Field::kDk));
  if (!d.empty()) RC_FAIL(entry_and_case(b, spec.describe()) + ": " + d);
  const ScaleNormSpec sspec = draw_scalenorm_spec(s);
  const ScaleNormCase sc = build_case(sspec, s);
  const Budgets SB = scalenorm_budgets(s, sc);
  const ScaleNormResult sr = validation::run_scalenorm(b, sc);
  d = orthogonal_rows("dx", sc.x, sr.dx, sc.problem.dim, sc.problem.eps,
                      SB.of(Field::kDx));
  if (!d.empty()) RC_FAIL(entry_and_case(b, sspec.describe()) + ": " + d);
}

// Rows of dS sum to 0, seen through every entry's outputs: for sdpa,
// dk_j = (1/sqrt(D)) sum_i dS_ij q_i, so sum_j dk_j = 0 per (b, h); and for
// both variants rows of P sum to 1, so sum_j dv_j = sum over queries with a
// visible key of dO_i. Each sum adds kv_len elements each within the budget
// of the oracle's; the oracle's own sums are exact only to its roundoff
// (a saturated row leaves dS ~ u * |dP| where the exact dS is ~0), so:
//   |sum_j dk_j| <= kv_len * budget(dk) + |sum_j oracle dk_j|, and likewise.
void gradient_sums(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.force_sdpa = *rc::gen::arbitrary<bool>();
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  const Budgets B = attention_budgets(s, c);
  const AttentionResult r = validation::run_attention(b, c);
  const auto oracle = validation::oracle_attention(c);
  // GQA: kv head h sums the gradients of its group's query heads
  // [h * group, (h + 1) * group), so its dv rows sum to their dO rows.
  const int64_t kvh = kv_heads_of(p), group = p.heads / kvh;
  for (int64_t bb = 0; bb < p.batch; ++bb)
    for (int64_t h = 0; h < kvh; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) {
        LD sdk = 0, sdv = 0, sdo = 0, odk = 0, odv = 0;
        double bdk = 0, bdv = 0;  // the summed elements' budgets
        for (int64_t j = 0; j < p.kv_len; ++j) {
          const auto x = static_cast<size_t>(
              ((bb * kvh + h) * p.kv_len + j) * p.head_dim + d);
          sdk += r.dk[x];
          sdv += r.dv[x];
          odk += oracle.dk[x];
          odv += oracle.dv[x];
          bdk += B.at(Field::kDk, x);
          bdv += B.at(Field::kDv, x);
        }
        for (int64_t i = 0; i < p.q_len; ++i) {
          bool any = false;
          for (int64_t j = 0; j < p.kv_len && !any; ++j)
            any = visible(p.mask, bb, i, j, p.q_len, p.kv_len);
          for (int64_t hq = h * group; any && hq < (h + 1) * group; ++hq)
            sdo += c.d_o[static_cast<size_t>(idx4(p, p.q_len, bb, hq, i, d))];
        }
        const double tk = bdk + static_cast<double>(std::fabs(odk));
        const double tv = bdv + static_cast<double>(std::fabs(odv - sdo));
        char buf[240];
        if (p.variant == Variant::kSDPA &&
            !(std::fabs(static_cast<double>(sdk)) <= tk)) {
          std::snprintf(buf, sizeof buf,
                        ": sdpa sum_j dk[%lld,%lld,j,%lld] = %.6e, tolerance "
                        "%.6e (rows of dS must sum to 0)",
                        (long long)bb, (long long)h, (long long)d,
                        static_cast<double>(sdk), tk);
          RC_FAIL(entry_and_case(b, spec.describe()) + buf);
        }
        if (!(std::fabs(static_cast<double>(sdv - sdo)) <= tv)) {
          std::snprintf(buf, sizeof buf,
                        ": sum_j dv[%lld,%lld,j,%lld] = %.6e but sum_i dO = "
                        "%.6e, tolerance %.6e (rows of P must sum to 1)",
                        (long long)bb, (long long)h, (long long)d,
                        static_cast<double>(sdv), static_cast<double>(sdo), tv);
          RC_FAIL(entry_and_case(b, spec.describe()) + buf);
        }
      }
}

// dO = 0 gives exactly zero gradients (dS = P (dP - delta) = 0 exactly).
void zero_do(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.saturating_sdpa = true;  // exact zeros: no budget involved
  const AttentionSpec spec = draw_attention_spec(s, o);
  AttentionCase c = build_case(spec, s);
  std::fill(c.d_o.begin(), c.d_o.end(), 0.0);
  const AttentionResult r = validation::run_attention(b, c);
  auto nonzero = [](const std::vector<double>& x) {
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != 0) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  for (const auto& [field, x] :
       {std::pair<const char*, const std::vector<double>*>{"dq", &r.dq},
        {"dk", &r.dk},
        {"dv", &r.dv}}) {
    const int64_t i = nonzero(*x);
    if (i >= 0)
      RC_FAIL(entry_and_case(b, spec.describe()) + ": dO = 0 but " + field +
              "[" + std::to_string(i) +
              "] = " + std::to_string((*x)[static_cast<size_t>(i)]));
  }
  if (r.dg != 0)
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": dO = 0 but dg = " + std::to_string(r.dg));
  const ScaleNormSpec sspec = draw_scalenorm_spec(s);
  ScaleNormCase sc = build_case(sspec, s);
  std::fill(sc.dy.begin(), sc.dy.end(), 0.0);
  const ScaleNormResult sr = validation::run_scalenorm(b, sc);
  const int64_t i = nonzero(sr.dx);
  if (i >= 0 || sr.dg != 0)
    RC_FAIL(entry_and_case(b, sspec.describe()) +
            ": dy = 0 but ScaleNorm dx/dg nonzero");
}

// The entry's dg against the central difference in g of the oracle loss
// L(g) = <dO, O(g)> (long double): an independent route to dg, with no
// backward formula involved.
void dg_finite_difference(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  // Small shapes: four long-double forwards of the whole problem per case.
  o.model_shapes = false;
  o.allow_sdpa = false;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  const Budgets B = attention_budgets(s, c);
  const AttentionResult r = validation::run_attention(b, c);
  const auto oracle = validation::oracle_attention(c);
  std::vector<LD> q(c.q.begin(), c.q.end()), k(c.k.begin(), c.k.end()),
      v(c.v.begin(), c.v.end());
  auto loss = [&](double g) {
    AttentionProblem pg = p;
    pg.g = g;
    std::vector<LD> out(q.size()),
        lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
    reference::attention_forward<LD>(pg, q.data(), k.data(), v.data(),
                                     out.data(), lse.data());
    LD L = 0;
    for (size_t i = 0; i < out.size(); ++i)
      L += static_cast<LD>(c.d_o[i]) * out[i];
    return L;
  };
  // Central differences at steps h and h/2 (g +- step rounded to double; the
  // step actually taken divides). Their difference measures the truncation
  // error (h^2 L^(3) / 6 shrinks 4x from h to h/2), and the Richardson
  // combination (4 fd(h/2) - fd(h)) / 3 cancels it to O(h^4). Tolerance: the
  // rule's dg budget + |fd(h) - fd(h/2)| (3x the truncation left in fd(h/2),
  // far above what the combination keeps) + the rounding of the loss,
  // (kv_len + D + 10) u_LD |L|_1 / (h/2), |L|_1 = sum |dO * O|.
  auto fd_at = [&](double h) {
    const double gp = p.g + h, gm = p.g - h;
    return (loss(gp) - loss(gm)) / static_cast<LD>(gp - gm);
  };
  const double h = validation::kFdStep * std::max(1.0, std::fabs(p.g));
  const LD f1 = fd_at(h), f2 = fd_at(h / 2);
  const LD fd = (4 * f2 - f1) / 3;
  LD l1 = 0;
  for (size_t i = 0; i < oracle.o.size(); ++i)
    l1 += std::fabs(static_cast<LD>(c.d_o[i]) * oracle.o[i]);
  const LD rounding = (p.kv_len + p.head_dim + 10) * 0x1p-64L * l1 / (h / 2);
  const double tol =
      B[Field::kDg] + static_cast<double>(std::fabs(f1 - f2) + rounding);
  if (!(std::fabs(r.dg - static_cast<double>(fd)) <= tol)) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  ": dg = %.17g, finite difference in g = %.17Lg, tolerance "
                  "%.3e",
                  r.dg, fd, tol);
    RC_FAIL(entry_and_case(b, spec.describe()) + buf);
  }
}

// ---------------------------------------------------------------------------
// 5. Structure.

// A random permutation of [0, n) from rng (Fisher-Yates).
std::vector<int64_t> permutation(int64_t n, validation::Rng& rng) {
  std::vector<int64_t> pi(static_cast<size_t>(n));
  std::iota(pi.begin(), pi.end(), 0);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(pi[static_cast<size_t>(i)],
              pi[static_cast<size_t>(rng.uniform_int(0, i))]);
  return pi;
}

// Row permutation per batch: perm[b][r] = source row of row r. Applies to a
// dense [B,H,rows,D] tensor; returns the element map new index -> old index.
std::vector<size_t> row_map(const AttentionProblem& p, int64_t heads,
                            int64_t rows,
                            const std::vector<std::vector<int64_t>>& perm) {
  const int64_t D = p.head_dim;
  auto at = [&](int64_t b, int64_t h, int64_t r, int64_t d) {
    return static_cast<size_t>(((b * heads + h) * rows + r) * D + d);
  };
  std::vector<size_t> m(static_cast<size_t>(p.batch * heads * rows * D));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d)
          m[at(b, h, r, d)] =
              at(b, h, perm[static_cast<size_t>(b)][static_cast<size_t>(r)], d);
  return m;
}

std::vector<double> gather_map(const std::vector<double>& x,
                               const std::vector<size_t>& m) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[m[i]];
  return y;
}

// The lse index map of a query permutation.
std::vector<size_t> lse_map(const AttentionProblem& p,
                            const std::vector<std::vector<int64_t>>& perm) {
  std::vector<size_t> m(static_cast<size_t>(p.batch * p.heads * p.q_len));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i)
        m[static_cast<size_t>((b * p.heads + h) * p.q_len + i)] =
            static_cast<size_t>(
                (b * p.heads + h) * p.q_len +
                perm[static_cast<size_t>(b)][static_cast<size_t>(i)]);
  return m;
}

// Permuting keys and values together (within the visible prefix of each
// batch and, separately, its padded tail) leaves O, lse, dq and dg unchanged
// and permutes dk, dv. The oracle of the permuted case is the permuted
// oracle (to its own roundoff, 2^11 below f64's), so the two runs may differ
// by the sum of both cases' budgets.
void key_value_permutation(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_causal = false;  // position-dependent
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  validation::Rng rng(spec.seed + 3);
  std::vector<std::vector<int64_t>> perm;
  for (int64_t bb = 0; bb < p.batch; ++bb) {
    const int64_t len = p.mask.key_lengths.empty()
                            ? p.kv_len
                            : p.mask.key_lengths[static_cast<size_t>(bb)];
    std::vector<int64_t> pi = permutation(len, rng);
    for (int64_t t : permutation(p.kv_len - len, rng)) pi.push_back(len + t);
    perm.push_back(pi);
  }
  const auto km = row_map(p, kv_heads_of(p), p.kv_len, perm);
  AttentionCase c2 = c;
  c2.k = gather_map(c.k, km);
  c2.v = gather_map(c.v, km);
  const std::string d =
      first_disagreement(run_pair(b, s, c, c2), {{Field::kO},
                                                 {Field::kLse},
                                                 {Field::kDq},
                                                 {Field::kDg},
                                                 {Field::kDk, &km},
                                                 {Field::kDv, &km}});
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": keys/values permuted: " + d);
}

// Permuting queries permutes O, lse and dq and leaves dk, dv, dg unchanged.
void query_permutation(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_causal = false;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  validation::Rng rng(spec.seed + 4);
  std::vector<std::vector<int64_t>> perm;
  for (int64_t bb = 0; bb < p.batch; ++bb)
    perm.push_back(permutation(p.q_len, rng));
  const auto qm = row_map(p, p.heads, p.q_len, perm);
  AttentionCase c2 = c;
  c2.q = gather_map(c.q, qm);
  c2.d_o = gather_map(c.d_o, qm);
  const std::vector<size_t> lm = lse_map(p, perm);
  const std::string d =
      first_disagreement(run_pair(b, s, c, c2), {{Field::kO, &qm},
                                                 {Field::kLse, &lm},
                                                 {Field::kDq, &qm},
                                                 {Field::kDk},
                                                 {Field::kDv},
                                                 {Field::kDg}});
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) + ": queries permuted: " + d);
}

// Replaces the rows of every (b, h) of a dense [B, heads, rows, D] tensor
// (heads: p.heads for q, kv_heads_of(p) for k and v) selected by `pick`
// with fresh values (Gaussian, times 2^e, e in [-8, 8]: arbitrary
// magnitudes), rounded to s.
void refill_rows(
    std::vector<double>* t, const AttentionProblem& p, int64_t heads,
    int64_t rows, Precision s, validation::Rng& rng,
    const std::function<bool(int64_t b, int64_t h, int64_t r)>& pick) {
  const int64_t D = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r) {
        if (!pick(b, h, r)) continue;
        const double scale =
            std::ldexp(1.0, static_cast<int>(rng.uniform_int(-8, 8)));
        for (int64_t d = 0; d < D; ++d)
          (*t)[static_cast<size_t>(((b * heads + h) * rows + r) * D + d)] =
              round_to(s, rng.normal() * scale);
      }
}

// Changing the q, k, v of one (batch, head) changes nothing, bitwise, in
// the O, lse, dq, dk, dv of every other (batch, head).
void head_batch_independence(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.allow_gqa = false;       // indexes k and v by the query heads
  o.saturating_sdpa = true;  // bitwise: no budget involved
  o.min_batch_heads = 2;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  const int64_t t = *rc::gen::inRange<int64_t>(0, p.batch * p.heads);
  validation::Rng rng(spec.seed + 5);
  AttentionCase c2 = c;
  auto in_t = [&](int64_t bb, int64_t h, int64_t) {
    return bb * p.heads + h == t;
  };
  refill_rows(&c2.q, p, p.heads, p.q_len, s, rng, in_t);
  refill_rows(&c2.k, p, p.heads, p.kv_len, s, rng, in_t);
  refill_rows(&c2.v, p, p.heads, p.kv_len, s, rng, in_t);
  const AttentionResult r1 = validation::run_attention(b, c);
  const AttentionResult r2 = validation::run_attention(b, c2);
  auto others = [&](int64_t rows, int64_t width) {
    std::vector<bool> sel(
        static_cast<size_t>(p.batch * p.heads * rows * width));
    for (size_t i = 0; i < sel.size(); ++i)
      sel[i] = static_cast<int64_t>(i) / (rows * width) != t;
    return sel;
  };
  const std::string d =
      first_bitwise_diff({{"o", &r1.o, &r2.o, others(p.q_len, p.head_dim)},
                          {"lse", &r1.lse, &r2.lse, others(p.q_len, 1)},
                          {"dq", &r1.dq, &r2.dq, others(p.q_len, p.head_dim)},
                          {"dk", &r1.dk, &r2.dk, others(p.kv_len, p.head_dim)},
                          {"dv", &r1.dv, &r2.dv, others(p.kv_len, p.head_dim)}},
                         /*zero_sign=*/false);
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) + ": inputs of (b,h) slice " +
            std::to_string(t) + " changed, another slice moved: " + d);
}

// Causal mask: changing keys/values j >= t changes nothing, bitwise, in the
// O, lse and dq of the queries that cannot see them (i + kv_len - q_len < t).
void causal_future(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.saturating_sdpa = true;  // bitwise: no budget involved
  o.force_causal = true;
  o.min_q_len = 2;
  o.min_kv_len = 2;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  const int64_t shift = p.kv_len - p.q_len;
  const int64_t t =
      *rc::gen::inRange<int64_t>(std::max<int64_t>(1, shift + 1), p.kv_len);
  validation::Rng rng(spec.seed + 6);
  AttentionCase c2 = c;
  auto future = [t](int64_t, int64_t, int64_t j) { return j >= t; };
  refill_rows(&c2.k, p, kv_heads_of(p), p.kv_len, s, rng, future);
  refill_rows(&c2.v, p, kv_heads_of(p), p.kv_len, s, rng, future);
  const AttentionResult r1 = validation::run_attention(b, c);
  const AttentionResult r2 = validation::run_attention(b, c2);
  auto past_rows = [&](int64_t width) {
    std::vector<bool> sel(
        static_cast<size_t>(p.batch * p.heads * p.q_len * width));
    for (size_t x = 0; x < sel.size(); ++x) {
      const int64_t i = static_cast<int64_t>(x) / width % p.q_len;
      sel[x] = i + shift < t;
    }
    return sel;
  };
  const std::string d =
      first_bitwise_diff({{"o", &r1.o, &r2.o, past_rows(p.head_dim)},
                          {"lse", &r1.lse, &r2.lse, past_rows(1)},
                          {"dq", &r1.dq, &r2.dq, past_rows(p.head_dim)}},
                         /*zero_sign=*/false);
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": causal: keys/values j >= " + std::to_string(t) +
            " changed, a query that cannot see them moved: " + d);
}

// Padding: changing padded keys/values (j >= key_lengths[b]) changes
// nothing, bitwise: O, lse, dq, dg, and dk, dv of the visible keys; padded
// keys get exactly zero dk and dv.
void padding_invisible(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.saturating_sdpa = true;  // bitwise: no budget involved
  o.force_padding = true;
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  const AttentionProblem& p = c.problem;
  validation::Rng rng(spec.seed + 7);
  AttentionCase c2 = c;
  const auto& len = p.mask.key_lengths;
  auto padded = [&](int64_t bb, int64_t, int64_t j) {
    return j >= len[static_cast<size_t>(bb)];
  };
  refill_rows(&c2.k, p, kv_heads_of(p), p.kv_len, s, rng, padded);
  refill_rows(&c2.v, p, kv_heads_of(p), p.kv_len, s, rng, padded);
  const AttentionResult r1 = validation::run_attention(b, c);
  const AttentionResult r2 = validation::run_attention(b, c2);
  std::vector<bool> vis(c.k.size());
  for (size_t x = 0; x < vis.size(); ++x) {
    const int64_t j = static_cast<int64_t>(x) / p.head_dim % p.kv_len;
    const int64_t bb =
        static_cast<int64_t>(x) / (p.head_dim * p.kv_len * kv_heads_of(p));
    vis[x] = j < len[static_cast<size_t>(bb)];
  }
  const std::vector<double> g1{r1.dg}, g2{r2.dg};
  std::string d =
      first_bitwise_diff({{"o", &r1.o, &r2.o},
                          {"lse", &r1.lse, &r2.lse},
                          {"dq", &r1.dq, &r2.dq},
                          {"dg", &g1, &g2},
                          {"dk (visible keys)", &r1.dk, &r2.dk, vis},
                          {"dv (visible keys)", &r1.dv, &r2.dv, vis}},
                         /*zero_sign=*/false);
  for (size_t x = 0; x < vis.size() && d.empty(); ++x) {
    if (vis[x]) continue;
    for (const AttentionResult* r : {&r1, &r2})
      if (r->dk[x] != 0 || r->dv[x] != 0) {
        d = "dk/dv of the padded key " +
            where4(p, kv_heads_of(p), p.kv_len, x) + " = " +
            std::to_string(r->dk[x]) + " / " + std::to_string(r->dv[x]) +
            ", must be exactly 0";
        break;
      }
  }
  if (!d.empty())
    RC_FAIL(entry_and_case(b, spec.describe()) +
            ": padded keys/values changed: " + d);
}

// ---------------------------------------------------------------------------
// 6. Determinism: two runs (one reusing the workspace) and thread counts 1
// and 2 give bitwise-identical results.
void determinism(const Backend& b) {
  const Precision s = b.precision();
  SpecOptions o;
  o.saturating_sdpa = true;  // bitwise: no budget involved
  const AttentionSpec spec = draw_attention_spec(s, o);
  const AttentionCase c = build_case(spec, s);
  auto ws = b.make_workspace();
  const AttentionResult r1 = validation::run_attention(b, c, {1}, ws.get());
  const AttentionResult r2 = validation::run_attention(b, c, {1}, ws.get());
  const AttentionResult r3 = validation::run_attention(b, c, {2});
  for (const auto& [what, r] : {std::pair<const char*, const AttentionResult*>{
                                    "rerun (threads=1)", &r2},
                                {"threads=2", &r3}}) {
    const std::vector<double> g1{r1.dg}, g2{r->dg};
    const std::string d = first_bitwise_diff({{"o", &r1.o, &r->o},
                                              {"lse", &r1.lse, &r->lse},
                                              {"dq", &r1.dq, &r->dq},
                                              {"dk", &r1.dk, &r->dk},
                                              {"dv", &r1.dv, &r->dv},
                                              {"dg", &g1, &g2}});
    if (!d.empty())
      RC_FAIL(entry_and_case(b, spec.describe()) + ": " + what +
              " differs from the first run (threads=1): " + d);
  }
  const ScaleNormSpec sspec = draw_scalenorm_spec(s);
  const ScaleNormCase sc = build_case(sspec, s);
  const ScaleNormResult s1 = validation::run_scalenorm(b, sc, {1});
  const ScaleNormResult s2 = validation::run_scalenorm(b, sc, {2});
  std::string d = bitwise_diff(s1.y, s2.y);
  if (d.empty()) d = bitwise_diff(s1.dx, s2.dx);
  if (d.empty()) d = bitwise_diff({s1.dg}, {s2.dg});
  if (!d.empty())
    RC_FAIL(entry_and_case(b, sspec.describe()) +
            ": ScaleNorm threads=1 vs threads=2: " + d);
}

}  // namespace

const std::vector<Property>& entry_properties() {
  // Case counts of a default run, per entry: sized so that the whole suite
  // over the ~21 entries of a full build (reference x 4, simd 5 targets x 3,
  // blas x 2) stays within a few minutes on 2 cores (README has timings).
  // {name, property, cases, reads_gradients, runs_scalenorm} (support.h).
  static const std::vector<Property> table = {
      {"AttentionAgreement", attention_agreement, 480},
      {"ScaleNormAgreement", scalenorm_agreement, 480, false, true},
      {"NonSaturation", non_saturation, 320},
      {"RowScaleInvariance", row_scale_invariance, 240, true, false},
      {"KeySignFlip", key_sign_flip, 240},
      {"ScaleNormHomogeneity", scalenorm_homogeneity, 320, false, true},
      {"Orthogonality", orthogonality, 240, true, true},
      {"GradientSums", gradient_sums, 240, true, false},
      {"ZeroDO", zero_do, 200, true, true},
      {"DgFiniteDifference", dg_finite_difference, 200, true, false},
      {"KeyValuePermutation", key_value_permutation, 200, true, false},
      {"QueryPermutation", query_permutation, 200, true, false},
      {"HeadBatchIndependence", head_batch_independence, 200, true, false},
      {"CausalFuture", causal_future, 240, true, false},
      {"PaddingInvisible", padding_invisible, 240, true, false},
      {"Determinism", determinism, 160, true, false},
      {"FormulationAgreement", formulation_agreement, 160},
      {"FormulationNonSaturation", formulation_non_saturation, 80},
      {"FormulationSoftcapAgreement", formulation_softcap_agreement, 60},
      {"FormulationWindowAgreement", window_agreement, 60},
      {"FormulationRopeAgreement", rope_agreement, 60},
      {"FormulationSinksAgreement", sinks_agreement, 60},
      {"LongSequence", long_sequence, 2},
      {"ShapeCoverage", shape_coverage, 1},
  };
  return table;
}

}  // namespace qknorm::property
