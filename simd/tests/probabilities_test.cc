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
  const auto c = CausalPaddedCase(entry, 2, 2, 70, 131, 31, {0, 100}, 3);
  const AttentionProblem& p = c.problem;
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
