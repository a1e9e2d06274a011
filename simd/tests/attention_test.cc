// Quick attention tests of every runnable simd entry: a 24-case sample of
// the sweep (attention_sweep.h) and fixed edge cases, under the suite's
// tolerance rule.
#include "qknorm/attention.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd/tests/attention_sweep.h"
#include "simd/tests/test_util.h"
#include "validation/check.h"

namespace qknorm::simd::testing {
namespace {

class SimdAttentionSweep : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdAttentionSweep, Quick) {
  RunAttentionSweep(*GetParam(), 0, 24, SaltOf(*GetParam()));
}
// The fixed edge cases every entry must meet, independent of sampling.
TEST_P(SimdAttentionSweep, EdgeCases) {
  const Backend& entry = *GetParam();
  struct Edge {
    const char* what;
    AttentionProblem p;
    Distribution dist;
  };
  std::vector<Edge> edges;
  {
    // kv_len < q_len with causal: the first q_len - kv_len rows see no key.
    AttentionProblem p;
    p.q_len = 9, p.kv_len = 3, p.head_dim = 8, p.mask.causal = true,
    p.g = 12.32;
    edges.push_back(
        {"causal kv<q, fully masked rows", p, Distribution::kGaussian});
  }
  {
    // One batch with key length 0 (every row masked), one padded.
    AttentionProblem p;
    p.batch = 2, p.q_len = 7, p.kv_len = 65, p.head_dim = 9, p.g = 25;
    p.mask.key_lengths = {0, 33};
    edges.push_back({"padding length 0", p, Distribution::kGaussian});
  }
  {
    AttentionProblem p;
    p.q_len = 33, p.kv_len = 127, p.head_dim = 31, p.g = -3;
    p.mask.causal = true, p.mask.key_lengths = {100};
    edges.push_back(
        {"zero q/k rows, causal+padding", p, Distribution::kZeroRows});
  }
  {
    AttentionProblem p;
    p.q_len = 64, p.kv_len = 64, p.head_dim = 65, p.g = 0;
    edges.push_back({"g = 0 (uniform P)", p, Distribution::kWideMagnitude});
  }
  {
    AttentionProblem p;
    p.q_len = 1, p.kv_len = 1, p.head_dim = 1, p.g = 1;
    edges.push_back({"1x1x1", p, Distribution::kUniform});
  }
  {
    AttentionProblem p;
    p.q_len = 129, p.kv_len = 130, p.head_dim = 64, p.g = 12.32;
    p.mask.causal = true;
    edges.push_back({"three key blocks, causal", p, Distribution::kGaussian});
  }
  {
    AttentionProblem p;
    p.q_len = 65, p.kv_len = 64, p.head_dim = 16, p.variant = Variant::kSDPA;
    edges.push_back({"sdpa", p, Distribution::kHeavyTailed});
  }
  uint64_t seed = 7;
  for (const Edge& e : edges) {
    const AttentionCase ac = MakeCase(entry, e.p, e.dist, seed++);
    const validation::AttentionTestReport r =
        TestCase(entry, ac, ExecConfig{2});
    EXPECT_TRUE(r.ok()) << e.what << ": " << r.message();
  }
}

// Logits beyond the f32 range (sdpa, |q|, |k| ~ 2e19: q.k = 8e38 > FLT_MAX)
// are clamped to +-FLT_MAX (attention-inl.h, Logit; fuzz finding
// crash-simd-emu128-nan-logit). Key 0's logit overflows to +inf, key 1's to
// -inf, key 2's is 2.8e19: P = (1, 0, 0) exactly, so O = v_0 exactly and
// lse = FLT_MAX (the true 5.7e38 is not an f32 logit), and the backward is
// finite. A fourth key (2e19, -2e19) has q.k = 4e38 - 4e38: NaN without FMA
// (inf - inf), +inf with FMA, so only finiteness is required of it. f16
// storage cannot hold an f32-overflowing logit (max 65504): skipped.
TEST_P(SimdAttentionSweep, OverflowingLogitsStayFinite) {
  const Backend& entry = *GetParam();
  if (entry.precision() == Precision::kF16) GTEST_SKIP() << "f16 range";
  constexpr double kBig = 2e19;
  for (bool with_nan_key : {false, true}) {
    const AttentionCase c =
        validation::overflowing_logits_case(kBig, with_nan_key);
    const validation::AttentionResult r = validation::run_attention(entry, c);
    for (const auto* f : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
      for (double x : *f) EXPECT_TRUE(std::isfinite(x)) << x;
    EXPECT_TRUE(std::isfinite(r.dg));
    if (!with_nan_key) {
      EXPECT_EQ(r.o, (std::vector<double>{1, 2}));
      EXPECT_EQ(r.lse[0], static_cast<double>(FLT_MAX));
    }
  }
}

// The forward's two softmax paths (issue 18; attention-inl.h): the fixed
// shift of bounded QKNorm logits (|g| <= 43, the default) and the online
// running max (ExecConfig::online_softmax). Both pass the verdict; both keep
// the exactness of a row with one visible key (causal row 0: O = v_0, dq =
// 0, and the same lse = S_00); the fixed path is really taken (some output
// differs in its last bits) at g = 12.32 and 20 (gaussian v: no value
// below the fixed path's floor, attention-inl.h) and not above |g| = 43.
TEST_P(SimdAttentionSweep, SoftmaxPathsKeepExactness) {
  const Backend& entry = *GetParam();
  for (double g : {12.32, 20.0, 50.0}) {
    AttentionProblem p;
    p.batch = 1, p.heads = 2, p.q_len = 70, p.kv_len = 70, p.head_dim = 32;
    p.g = g;
    p.mask.causal = true;
    const AttentionCase ac = validation::round_inputs(
        MakeCase(entry, p, Distribution::kGaussian, 3), entry.precision());
    ExecConfig online{2, true}, fixed{2, false};
    const auto rf = validation::run_attention(entry, ac, fixed);
    const auto ro = validation::run_attention(entry, ac, online);
    for (const ExecConfig& cfg : {online, fixed}) {
      const validation::AttentionTestReport r = TestCase(entry, ac, cfg);
      EXPECT_TRUE(r.ok()) << "g " << g << " online " << cfg.online_softmax
                          << ": " << r.message();
    }
    for (const auto* r : {&rf, &ro})
      for (int64_t h = 0; h < p.heads; ++h) {
        const size_t row = static_cast<size_t>(h * p.q_len) * 32;
        for (size_t d = 0; d < 32; ++d) {
          EXPECT_EQ(r->o[row + d], ac.v[row + d]) << "g " << g << " h " << h;
          EXPECT_EQ(r->dq[row + d], 0.0) << "g " << g << " h " << h;
        }
      }
    EXPECT_EQ(rf.lse[0], ro.lse[0]);
    EXPECT_EQ(rf.lse[static_cast<size_t>(p.q_len)],
              ro.lse[static_cast<size_t>(p.q_len)]);
    if (g > 43)
      EXPECT_EQ(rf.o, ro.o) << "g " << g << ": above 43 both are online";
    else
      EXPECT_NE(rf.lse, ro.lse)
          << "g " << g << ": the fixed path was not taken";
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdAttentionSweep,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
