// Quick attention tests of every runnable simd entry: a 24-case sample of
// the sweep (attention_sweep.h) and fixed edge cases, under the suite's
// tolerance rule.
#include "qknorm/attention.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "simd/tests/attention_sweep.h"
#include "simd/tests/test_util.h"
#include "validation/harness.h"

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
    const AgreementReport rep =
        validation::check_attention(entry, ac, ExecConfig{2});
    EXPECT_TRUE(rep.pass) << e.what << ": " << rep.failure_message();
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdAttentionSweep,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
