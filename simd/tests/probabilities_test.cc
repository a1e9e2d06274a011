// The attention_probabilities inspection hook of every runnable simd entry:
// masked keys and fully masked rows give exactly 0, each visible row sums to
// 1, and every probability respects the QKNorm non-saturation bound
// (validation/nonsaturation.h, which states and derives it).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "qknorm/attention.h"
#include "simd/tests/test_util.h"
#include "validation/case.h"
#include "validation/metrics.h"
#include "validation/nonsaturation.h"

namespace qknorm::simd::testing {
namespace {

class SimdProbabilities : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdProbabilities, MaskedZeroRowSumsAndNonSaturation) {
  const Backend& entry = *GetParam();
  AttentionProblem p;
  p.batch = 2, p.heads = 2, p.q_len = 70, p.kv_len = 131, p.head_dim = 31,
  p.g = 12.32;
  p.mask.causal = true;
  p.mask.key_lengths = {0, 100};
  const auto c = validation::round_inputs(
      validation::make_attention_case(p, validation::Distribution::kGaussian, 3,
                                      entry.precision()),
      entry.precision());
  const std::vector<double> probs = Probabilities(entry, c);
  ASSERT_FALSE(probs.empty()) << entry.name() << ": no probabilities hook";

  // Masked keys and fully masked rows exactly 0, every visible row summing
  // to 1 and within the non-saturation bound: its one definition,
  // validation/nonsaturation.h, at |g| with the f32 logits' error.
  EXPECT_EQ(validation::check_nonsaturation(
                p, probs, nullptr,
                validation::computed_logit_amplitude(
                    c, nullptr, entry.precision(), std::fabs(p.g)),
                entry.precision()),
            "")
      << entry.name() << " " << c.describe();
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdProbabilities,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
