// The attention_probabilities inspection hook of every runnable simd entry:
// masked keys and fully masked rows give exactly 0, each visible row sums to
// 1 within its rounding bound (kRowSumTol), and every probability respects the
// QKNorm non-saturation bound (shared/NUMERICS.md)
//   1 / (1 + (m-1) e^{2|g|}) <= p <= 1 / (1 + (m-1) e^{-2|g|})
// up to the f32 error of the kernel's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "qknorm/attention.h"
#include "simd/tests/test_util.h"
#include "validation/case.h"

namespace qknorm::simd::testing {
namespace {

// f32 unit roundoff (the hook reports the kernel's f32 values).
constexpr double kU = 0x1p-24;

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

  // |S| <= |g| exactly; the kernel's f32 logit g (q_hat . k_hat) is off by at
  // most |g| gamma_{D+2} (dot of length D plus the normalization roundings),
  // which moves each bound by a factor exp(+-2 |g| gamma): kLogitSlack.
  const double gamma = (p.head_dim + 2) * kU / (1 - (p.head_dim + 2) * kU);
  const double kLogitSlack =
      std::exp(2 * std::fabs(p.g) * gamma) * (1 + 4 * kU);
  int bad = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const double* row =
            probs.data() + ((b * p.heads + h) * p.q_len + i) * p.kv_len;
        int64_t m = 0;
        double sum = 0;
        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (visible(p.mask, b, i, j, p.q_len, p.kv_len)) {
            ++m;
            sum += row[j];
          } else if (row[j] != 0 && bad++ < 10) {
            ADD_FAILURE() << entry.name() << " masked p[" << b << "," << h
                          << "," << i << "," << j << "] = " << row[j];
          }
        }
        if (m == 0) continue;
        // Row sum: kv f32 quotients e_j / l (0.5 ulp each) of an l summed in
        // f32 (m - 1 additions): |sum - 1| <= (m + 1) u.
        const double kRowSumTol = static_cast<double>(m + 1) * kU;
        if (std::fabs(sum - 1) > kRowSumTol && bad++ < 10)
          ADD_FAILURE() << entry.name() << " row (" << b << "," << h << "," << i
                        << ") sums to " << sum << ", tolerance " << kRowSumTol;
        const double lo =
            1 / (1 + (m - 1) * std::exp(2 * std::fabs(p.g))) / kLogitSlack;
        const double hi =
            1 / (1 + (m - 1) * std::exp(-2 * std::fabs(p.g))) * kLogitSlack;
        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (!visible(p.mask, b, i, j, p.q_len, p.kv_len)) continue;
          if ((row[j] < lo || row[j] > hi) && bad++ < 10)
            ADD_FAILURE() << entry.name() << " p[" << b << "," << h << "," << i
                          << "," << j << "] = " << row[j] << " outside [" << lo
                          << ", " << hi << "]";
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdProbabilities,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
