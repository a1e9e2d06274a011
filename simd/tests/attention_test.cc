// Deterministic sweeps of every runnable simd entry against the long-double
// oracle under the suite's tolerance rule (validation/harness.h):
//   err(simd) <= 2 * err(reference:<prec>) + 4 u_storage scale.
// No tolerance is defined here; check_attention applies the rule and its
// failure message names entry, target, precision, shape, seed, worst index,
// expected, actual and bound.
//
// The full cross product of the sweep (10 head dims x 10 x 10
// lengths x 4 masks x 5 g x variants x distributions) is far too slow with a
// long-double oracle, so each entry runs a deterministic sample: case c of
// entry e takes every factor from a different stride through its list, so
// every value of every factor occurs several times per entry and the
// combinations differ between entries.
#include "qknorm/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "simd/tests/test_util.h"
#include "validation/harness.h"

namespace qknorm::simd::testing {
namespace {

using validation::AgreementReport;
using validation::AttentionCase;
using validation::Distribution;

constexpr int64_t kHeadDims[] = {1, 3, 7, 8, 9, 16, 31, 64, 65, 128};
constexpr int64_t kLengths[] = {1, 2, 3, 7, 8, 9, 33, 64, 127, 200};
constexpr double kGs[] = {0, -3, 1, 12.32, 25};
constexpr Distribution kDists[] = {
    Distribution::kGaussian, Distribution::kUniform, Distribution::kHeavyTailed,
    Distribution::kWideMagnitude, Distribution::kZeroRows};
enum MaskKind { kNone, kCausal, kPadding, kCausalPadding, kNumMaskKinds };

template <class T, size_t N>
const T& Pick(const T (&list)[N], int64_t i) {
  return list[static_cast<size_t>(i) % N];
}

// Padding lengths for batch b: include 0 (a batch with every row fully
// masked) for odd batches, otherwise a length inside (0, kv_len].
std::vector<int64_t> PaddingLengths(int64_t batch, int64_t kv_len,
                                    int64_t salt) {
  std::vector<int64_t> kl;
  for (int64_t b = 0; b < batch; ++b)
    kl.push_back(b % 2 == 1 ? 0 : 1 + (salt * 7 + b * 3) % kv_len);
  return kl;
}

AttentionProblem SampleProblem(int64_t c, int64_t salt) {
  AttentionProblem p;
  const int64_t k = c + salt;
  p.head_dim = Pick(kHeadDims, k);
  p.q_len = Pick(kLengths, 3 * k + 1);
  p.kv_len = Pick(kLengths, 7 * k + 4);
  // Keep the long-double oracle affordable: big problems get one head.
  const bool big = p.q_len * p.kv_len * p.head_dim > 64 * 64 * 32;
  p.batch = big ? 1 : 1 + k % 2;
  p.heads = big ? 1 : 1 + (k / 2) % 2;
  p.variant = k % 5 == 4 ? Variant::kSDPA : Variant::kQKNorm;
  p.g = Pick(kGs, k / 3);
  const int mask = static_cast<int>((k / 2 + c) % kNumMaskKinds);
  p.mask.causal = mask == kCausal || mask == kCausalPadding;
  if (mask == kPadding || mask == kCausalPadding)
    p.mask.key_lengths = PaddingLengths(p.batch, p.kv_len, k);
  return p;
}

// f16 stores at most 65504, and a zero row's gradient is du / eps (~1e12
// for the default eps = 1e-12): unrepresentable, for the naive baseline too.
// f16 cases with zero rows therefore use eps = 1e-2 (f32 math keeps any eps
// representable; this only keeps dq, dk ~ g |du| / eps <= ~2.5e3 finite).
constexpr double kF16ZeroRowEps = 1e-2;

// The case for `entry`: magnitudes limited to its storage format.
AttentionCase MakeCase(const Backend& entry, AttentionProblem p,
                       Distribution dist, uint64_t seed) {
  if (entry.precision() == Precision::kF16 && dist == Distribution::kZeroRows)
    p.eps = kF16ZeroRowEps;
  return validation::make_attention_case(p, dist, seed, entry.precision());
}

class SimdAttentionSweep : public ::testing::TestWithParam<const Backend*> {
 protected:
  void RunSweep(int64_t first, int64_t count, int64_t salt) {
    const Backend& entry = *GetParam();
    for (int64_t c = first; c < first + count; ++c) {
      const AttentionProblem p = SampleProblem(c, salt);
      Distribution dist = Pick(kDists, c * 3 + salt);
      // Wide magnitudes make sdpa logits overflow by design (no norm); that
      // is the failure mode QKNorm removes, not a kernel property.
      if (p.variant == Variant::kSDPA && dist == Distribution::kWideMagnitude)
        dist = Distribution::kGaussian;
      const uint64_t seed = 1000 + static_cast<uint64_t>(c);
      const AttentionCase ac = MakeCase(entry, p, dist, seed);
      const AgreementReport rep =
          validation::check_attention(entry, ac, ExecConfig{2});
      EXPECT_TRUE(rep.pass) << "case " << c << ": " << rep.failure_message();
    }
  }
};

// Salt per entry name so that entries see different combinations.
int64_t SaltOf(const Backend& b) {
  return static_cast<int64_t>(std::hash<std::string>{}(b.name()) % 97);
}

TEST_P(SimdAttentionSweep, Quick) { RunSweep(0, 24, SaltOf(*GetParam())); }

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
