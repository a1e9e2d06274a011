// ScaleNorm sweeps of every runnable simd entry against the long-double
// oracle under the suite's tolerance rule (validation/rule.h). Every dim
// and row count of the lists occurs; g and the distribution rotate.
#include <gtest/gtest.h>

#include "simd/tests/test_util.h"
#include "validation/check.h"

namespace qknorm::simd::testing {
namespace {

using validation::Distribution;

constexpr int64_t kDims[] = {1, 3, 7, 8, 9, 16, 31, 64, 65, 128};
constexpr int64_t kRows[] = {1, 2, 3, 7, 33, 200};
constexpr double kGs[] = {0, -3, 1, 12.32, 25};
constexpr Distribution kDists[] = {
    Distribution::kGaussian, Distribution::kUniform, Distribution::kHeavyTailed,
    Distribution::kWideMagnitude, Distribution::kZeroRows};
// f16 stores at most 65504; a zero row's dx is g dy / eps, so f16 zero-row
// cases use eps = 1e-2 (dx <= ~25 |dy| / 1e-2), as in attention_test.cc.
constexpr double kF16ZeroRowEps = 1e-2;

class SimdScaleNorm : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdScaleNorm, Sweep) {
  const Backend& entry = *GetParam();
  int c = 0;
  for (int64_t dim : kDims)
    for (int64_t rows : kRows) {
      ScaleNormProblem p;
      p.dim = dim, p.rows = rows, p.g = kGs[c % 5];
      const Distribution dist = kDists[(c / 5 + c) % 5];
      if (entry.precision() == Precision::kF16 &&
          dist == Distribution::kZeroRows)
        p.eps = kF16ZeroRowEps;
      const auto sc = validation::make_scalenorm_case(
          p, dist, 500 + static_cast<uint64_t>(c), entry.precision());
      const auto rep = validation::check_scalenorm(entry, sc, ExecConfig{2});
      EXPECT_TRUE(rep.pass) << rep.failure_message();
      ++c;
    }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdScaleNorm,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
