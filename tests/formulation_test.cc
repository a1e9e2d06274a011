// The QK-norm formulations (issue 16): presets, validation of inconsistent
// descriptions, closed forms of each normalization, grouped-query attention
// against its repeat_kv expansion, finite differences of every gradient
// (including the learned weights and biases) and the verdict on every
// reference entry for every preset.
#include "qknorm/formulation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "qknorm/validate.h"
#include "reference/reference.h"
#include "tests/test_support.h"
#include "validation/check.h"
#include "validation/gradcheck.h"

namespace qknorm {
namespace {

using test_support::error_of;

using test_support::ref64;
using test_support::shape;
using validation::AttentionCase;
using validation::Distribution;

// The preset on a small GQA shape where the model ships GQA (4 query heads
// over 2 kv heads), else 2 heads; ngpt shares its weight, so kv = heads.
AttentionProblem preset_problem(const Preset& s, int64_t Nq, int64_t Nk,
                                int64_t D, int mask) {
  AttentionProblem p = shape(1, s.gqa ? 4 : 2, Nq, Nk, D, 2);
  apply_preset(s.name, &p);
  p.g = 3.5;
  p.mask.causal = mask & 1;
  if (mask & 2) p.mask.key_lengths = {Nk - 1};
  return p;
}

TEST(Formulation, PresetsRoundTrip) {
  for (const Preset& s : presets()) {
    AttentionProblem p = shape(1, 4, 3, 3, 64, s.gqa ? 2 : 0);
    apply_preset(s.name, &p);
    EXPECT_EQ(formulation_name(p), s.name) << describe_formulation(p);
    validate_problem(p);
  }
  AttentionProblem p;
  EXPECT_EQ(formulation_name(p), "paper");
  EXPECT_TRUE(is_paper_formulation(p));
  apply_preset("qwen3", &p);
  EXPECT_FALSE(is_paper_formulation(p));
  EXPECT_DOUBLE_EQ(p.scale, 1.0);  // 1 / sqrt(head_dim = 1)
  EXPECT_NE(error_of([&] { apply_preset("llama", &p); }).find("unknown preset"),
            std::string::npos);
}

TEST(Formulation, InconsistentDescriptionsAreRejected) {
  struct Bad {
    std::function<void(AttentionProblem*)> edit;
    const char* expect;
  };
  const Bad bad[] = {
      {[](AttentionProblem* p) { p->kv_heads = 3; }, "kv_heads"},
      {[](AttentionProblem* p) { p->norm.bias = true; }, "needs a weight"},
      {[](AttentionProblem* p) { p->norm.one_plus_weight = true; },
       "needs a weight"},
      {[](AttentionProblem* p) {
         p->norm.axis = NormAxis::kAllHeads;
         p->norm.weight = ParamShape::kDim;
       },
       "[heads, head_dim]"},
      {[](AttentionProblem* p) {
         p->norm.weight = ParamShape::kHeadDim;
         p->norm.shared_qk_weight = true;
         p->kv_heads = 2;
       },
       "kv_heads = heads"},
      {[](AttentionProblem* p) {
         p->fixed_scale = true;
         p->scale = INFINITY;
       },
       "scale"},
  };
  for (const Bad& b : bad) {
    AttentionProblem p = shape(1, 4, 2, 2, 4);
    b.edit(&p);
    const std::string msg = error_of([&] { validate_problem(p); });
    EXPECT_NE(msg.find(b.expect), std::string::npos) << msg;
  }
}

TEST(Formulation, WrongParameterLengthsNameTheTensor) {
  AttentionProblem p = shape(1, 4, 2, 3, 4, 2);
  apply_preset("chameleon", &p);  // [H_x, D] weights and biases
  AttentionCase c =
      validation::make_attention_case(p, Distribution::kGaussian, 1);
  ASSERT_EQ(c.q_weight.size(), 16u);
  ASSERT_EQ(c.k_weight.size(), 8u);
  validation::run_attention(ref64(), c);  // consistent: runs
  AttentionCase w = c;
  w.k_weight.resize(16);
  std::string msg = error_of([&] { validation::run_attention(ref64(), w); });
  EXPECT_NE(msg.find("k_weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("length must be 8"), std::string::npos) << msg;
  w = c;
  w.q_bias.clear();
  msg = error_of([&] { validation::run_attention(ref64(), w); });
  EXPECT_NE(msg.find("q_bias"), std::string::npos) << msg;
  w = c;
  w.q_weight[5] = NAN;
  msg = error_of([&] { validation::run_attention(ref64(), w); });
  EXPECT_NE(msg.find("q_weight[5]"), std::string::npos) << msg;
  // GQA: a case whose problem now says 4 kv heads still holds k and v of 2:
  // the harness names the case tensor before it copies anything.
  w = c;
  w.problem.kv_heads = 4;
  msg = error_of([&] { validation::run_attention(ref64(), w); });
  EXPECT_NE(msg.find("case k"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch*kv_heads*kv_len*head_dim = 48 (got 24)"),
            std::string::npos)
      << msg;
}

TEST(Formulation, EntriesWithoutAFormulationSayWhich) {
  AttentionProblem p = shape(1, 2, 2, 2, 4, 1);
  apply_preset("qwen3", &p);
  const AttentionCase c =
      validation::make_attention_case(p, Distribution::kGaussian, 3);
  int refused = 0;
  for (const Backend* b : all_backends().entries()) {
    if (!b->available() || b->supports(p)) continue;
    const std::string msg = error_of([&] { validation::run_attention(*b, c); });
    EXPECT_NE(msg.find("does not implement qwen3"), std::string::npos) << msg;
    EXPECT_NE(msg.find(b->name()), std::string::npos) << msg;
    ++refused;
  }
  std::printf("%d entries refuse qwen3 by name\n", refused);
}

// Closed forms of each normalization on one row of D = 2 (eps 2^-40 keeps
// them exact to ~1e-12).
TEST(Formulation, NormalizationClosedForms) {
  AttentionProblem p = shape(1, 1, 1, 1, 2);
  p.eps = 0x1p-40;
  const double x[2] = {3, 4};
  double out[2];
  auto run = [&](NormKind k, const reference::NormArgs<double>& w = {}) {
    p.norm.kind = k;
    reference::normalized_operand<double>(p, 0, x, w, out);
  };
  run(NormKind::kL2);
  EXPECT_NEAR(out[0], 0.6, 1e-15);
  EXPECT_NEAR(out[1], 0.8, 1e-15);
  run(NormKind::kRms);  // x / sqrt(12.5)
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5), 1e-12);
  EXPECT_NEAR(out[1], 4 / std::sqrt(12.5), 1e-12);
  run(NormKind::kLayer);  // mean 3.5, var 0.25: (-1, 1)
  EXPECT_NEAR(out[0], -1, 1e-11);
  EXPECT_NEAR(out[1], 1, 1e-11);
  run(NormKind::kNone);
  EXPECT_EQ(out[0], 3);
  // Weight, Gemma's 1 + w, bias.
  const double w[2] = {0.5, -2}, b[2] = {0.25, 1};
  p.norm.weight = ParamShape::kDim;
  reference::NormArgs<double> a;
  a.q_weight = w;
  run(NormKind::kL2, a);
  EXPECT_NEAR(out[0], 0.3, 1e-15);
  EXPECT_NEAR(out[1], -1.6, 1e-15);
  p.norm.one_plus_weight = true;
  run(NormKind::kL2, a);
  EXPECT_NEAR(out[0], 0.9, 1e-15);
  EXPECT_NEAR(out[1], -0.8, 1e-15);
  p.norm.one_plus_weight = false;
  p.norm.bias = true;
  a.q_bias = b;
  run(NormKind::kL2, a);
  EXPECT_NEAR(out[0], 0.55, 1e-15);
  EXPECT_NEAR(out[1], -0.6, 1e-15);
  // A zero row: rms and layer give 0 (eps > 0), l2 gives 0.
  const double z[2] = {0, 0};
  p.norm = {};
  for (NormKind k : {NormKind::kL2, NormKind::kRms, NormKind::kLayer}) {
    p.norm.kind = k;
    reference::normalized_operand<double>(p, 0, z, {}, out);
    EXPECT_EQ(out[0], 0);
    EXPECT_EQ(out[1], 0);
  }
}

// Across heads (OLMo2): the rms of the whole token row of q; per head
// would differ whenever the heads' magnitudes differ.
TEST(Formulation, AcrossHeadsNormalizesTheWholeProjection) {
  AttentionProblem p = shape(1, 2, 1, 1, 2);
  p.eps = 0x1p-40;
  p.norm.kind = NormKind::kRms;
  p.norm.axis = NormAxis::kAllHeads;
  const double x[4] = {1, 1, 3, 3};  // head 0 (1, 1), head 1 (3, 3)
  double out[4];
  reference::normalized_operand<double>(p, 0, x, {}, out);
  EXPECT_NEAR(out[0], 1 / std::sqrt(5.0), 1e-12);
  EXPECT_NEAR(out[2], 3 / std::sqrt(5.0), 1e-12);
  p.norm.axis = NormAxis::kHead;
  reference::normalized_operand<double>(p, 0, x, {}, out);
  EXPECT_NEAR(out[0], 1, 1e-12);
  EXPECT_NEAR(out[2], 1, 1e-12);
}

// GQA equals attention over k and v repeated for each query head of the
// group (repeat_kv), and dk, dv equal the group sums of the expanded
// problem's gradients (the reduction a GQA backward must not forget).
TEST(Formulation, GroupedQueryAttentionEqualsRepeatKv) {
  for (const char* name : {"paper", "qwen3", "chameleon", "olmo2"}) {
    AttentionProblem p = shape(2, 6, 3, 5, 4, 2);
    apply_preset(name, &p);
    p.g = 2.5;
    p.mask.causal = true;
    const AttentionCase c =
        validation::make_attention_case(p, Distribution::kGaussian, 7);
    const auto r = validation::run_attention(ref64(), c);
    AttentionCase e = c;
    e.problem.kv_heads = 0;
    const int64_t group = 3, D = 4, Nk = 5, H = 6;
    e.k.clear();
    e.v.clear();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const size_t off = static_cast<size_t>((b * 2 + h / group) * Nk * D);
        e.k.insert(e.k.end(), c.k.begin() + off, c.k.begin() + off + Nk * D);
        e.v.insert(e.v.end(), c.v.begin() + off, c.v.begin() + off + Nk * D);
      }
    // Per-head k weights ([H_x, D]) expand the same way.
    if (p.norm.weight == ParamShape::kHeadDim) {
      auto expand = [&](const std::vector<double>& w) {
        std::vector<double> x;
        for (int64_t h = 0; h < H; ++h)
          x.insert(x.end(), w.begin() + (h / group) * D,
                   w.begin() + (h / group + 1) * D);
        return x;
      };
      e.k_weight = expand(c.k_weight);
      if (!c.k_bias.empty()) e.k_bias = expand(c.k_bias);
    }
    // OLMo2's k row spans all kv heads: repeating them changes its rms by
    // nothing only when every head repeats equally often, which it does.
    const auto x = validation::run_attention(ref64(), e);
    for (size_t i = 0; i < r.o.size(); ++i)
      ASSERT_NEAR(r.o[i], x.o[i], 1e-13) << name << " o " << i;
    for (size_t i = 0; i < r.dq.size(); ++i)
      ASSERT_NEAR(r.dq[i], x.dq[i], 1e-12) << name << " dq " << i;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t hk = 0; hk < 2; ++hk)
        for (int64_t j = 0; j < Nk * D; ++j) {
          double sk = 0, sv = 0;
          for (int64_t m = 0; m < group; ++m) {
            const size_t o =
                static_cast<size_t>((b * H + hk * group + m) * Nk * D + j);
            sk += x.dk[o];
            sv += x.dv[o];
          }
          const size_t o = static_cast<size_t>((b * 2 + hk) * Nk * D + j);
          ASSERT_NEAR(r.dv[o], sv, 1e-12) << name << " dv " << o;
          if (p.norm.axis == NormAxis::kHead) {
            ASSERT_NEAR(r.dk[o], sk, 1e-12) << name << " dk " << o;
          }
        }
  }
}

// Every gradient, the learned weights' and biases' included, against
// central differences of the long-double forward, for every preset, with
// and without a causal mask and padding, on Gaussian and zero-row inputs.
TEST(Formulation, EveryGradientMatchesFiniteDifferences) {
  test_support::FdTally tally;
  int n = 0;
  for (const Preset& s : presets())
    for (int mask = 0; mask < 4; ++mask) {
      const AttentionProblem p = preset_problem(s, 3, 4, 3, mask);
      const AttentionCase c = validation::make_attention_case(
          p, mask == 3 ? Distribution::kZeroRows : Distribution::kGaussian,
          900 + n++);
      tally.expect_pass(
          validation::check_attention_full(
              c, validation::gradients_of(validation::oracle_attention(c)),
              validation::kFdTol),
          c.describe());
    }
  tally.print("finite differences, every preset");
}

// The reference self-check per preset: every reference entry (each
// precision) passes the componentwise verdict against the oracle.
TEST(Formulation, ReferenceEntriesPassTheVerdictOnEveryPreset) {
  int n = 0;
  double worst = 0;
  for (const Preset& s : presets())
    for (Precision prec : kAllPrecisions)
      for (Distribution d : {Distribution::kGaussian, Distribution::kZeroRows,
                             Distribution::kOutlierRows})
        for (int mask = 0; mask < 4; mask += 3) {
          const AttentionProblem p = preset_problem(s, 5, 7, 8, mask);
          const AttentionCase c =
              validation::make_attention_case(p, d, 40 + n, prec);
          const Backend& b = *all_backends().find(
              "reference:" + std::string(qknorm::name(prec)));
          const auto rep = validation::check_attention(b, c, {}, false,
                                                       /*with_naive=*/false);
          EXPECT_TRUE(rep.pass) << rep.failure_message();
          worst = std::max(worst, rep.margin);
          ++n;
        }
  std::printf("reference verdict: %d preset cases, worst margin %.3f\n", n,
              worst);
}

}  // namespace
}  // namespace qknorm
