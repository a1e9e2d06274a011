// Every property of issue 5 on every production registry entry
// (qknorm::all_backends(): reference, and simd / blas entries when built).
// Test names: Registry/EntryProperty.<Property>/<entry>, e.g.
//   Registry/EntryProperty.NonSaturation/simd_AVX2_f32
// so --gtest_filter='*/simd_SSE4_*' picks one target and ctest shards by test.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "property_tests/mutants.h"
#include "property_tests/properties.h"
#include "property_tests/rc_gens.h"
#include "property_tests/support.h"
#include "qknorm/backend.h"
#include "validation/bounds.h"
#include "validation/harness.h"

namespace qknorm::property {
namespace {

// QKNORM_PROPERTY_WITH_MUTANTS=1 also instantiates every property on the
// mutants (mutants.h): a debugging aid that shows the full failure report
// (shrunk case, seed, RC_PARAMS="reproduce=...") of a broken entry. Those
// tests are expected to FAIL.
bool with_mutants() {
  const char* s = std::getenv("QKNORM_PROPERTY_WITH_MUTANTS");
  return s != nullptr && *s != '\0' && std::string(s) != "0";
}

std::vector<std::string> entry_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends().entries()) names.push_back(b->name());
  if (with_mutants())
    for (const Backend* b : mutant_registry().entries())
      names.push_back(b->name());
  return names;
}

const Backend* find_entry(const std::string& name) {
  const Backend* b = all_backends().find(name);
  return b != nullptr ? b : mutant_registry().find(name);
}

std::string sanitize(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

class EntryProperty : public testing::TestWithParam<std::string> {
 protected:
  const Backend& entry() const { return *find_entry(GetParam()); }

  // Runs the named property on this test's entry under rapidcheck.
  void Check(const char* property) {
    const Backend& b = entry();
    if (!b.available()) GTEST_SKIP() << b.name() << " cannot run on this CPU";
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    const std::string id =
        std::string(info->test_suite_name()) + "/" + info->name();
    const RunResult r =
        run_property(entry_property(property), b, id,
                     /*shrink=*/true, /*honour_reproduce=*/true);
    EXPECT_TRUE(r.pass) << r.message;
  }
};

TEST_P(EntryProperty, AttentionAgreement) { Check("AttentionAgreement"); }
TEST_P(EntryProperty, ScaleNormAgreement) { Check("ScaleNormAgreement"); }
TEST_P(EntryProperty, NonSaturation) { Check("NonSaturation"); }
TEST_P(EntryProperty, RowScaleInvariance) { Check("RowScaleInvariance"); }
TEST_P(EntryProperty, KeySignFlip) { Check("KeySignFlip"); }
TEST_P(EntryProperty, ScaleNormHomogeneity) { Check("ScaleNormHomogeneity"); }
TEST_P(EntryProperty, Orthogonality) { Check("Orthogonality"); }
TEST_P(EntryProperty, GradientSums) { Check("GradientSums"); }
TEST_P(EntryProperty, ZeroDO) { Check("ZeroDO"); }
TEST_P(EntryProperty, DgFiniteDifference) { Check("DgFiniteDifference"); }
TEST_P(EntryProperty, KeyValuePermutation) { Check("KeyValuePermutation"); }
TEST_P(EntryProperty, QueryPermutation) { Check("QueryPermutation"); }
TEST_P(EntryProperty, HeadBatchIndependence) { Check("HeadBatchIndependence"); }
TEST_P(EntryProperty, CausalFuture) { Check("CausalFuture"); }
TEST_P(EntryProperty, PaddingInvisible) { Check("PaddingInvisible"); }
TEST_P(EntryProperty, Determinism) { Check("Determinism"); }
TEST_P(EntryProperty, FormulationAgreement) { Check("FormulationAgreement"); }
TEST_P(EntryProperty, FormulationNonSaturation) {
  Check("FormulationNonSaturation");
}

// Every TEST_P above is in the table and vice versa.
TEST(PropertyTable, EveryPropertyHasATest) {
  const auto* suite = testing::UnitTest::GetInstance();
  for (const Property& p : entry_properties()) {
    bool found = false;
    for (int i = 0; i < suite->total_test_suite_count() && !found; ++i) {
      const testing::TestSuite* ts = suite->GetTestSuite(i);
      for (int j = 0; j < ts->total_test_count() && !found; ++j)
        found = std::string(ts->GetTestInfo(j)->name())
                    .rfind(std::string(p.name) + "/", 0) == 0;
    }
    EXPECT_TRUE(found) << "property " << p.name << " has no TEST_P";
  }
}

// The negative control of non-saturation: sdpa has no bound. With q and k
// scaled by 16 (logits x 256, exact in every format) the same checker that
// passes every qknorm entry must report a violation of the qknorm bound at
// |g| = kGMax on the sdpa probabilities, while the qknorm problem on the very
// same inputs satisfies it and unscaled sdpa (logits of a few units) does too.
// This shows the non-saturation property can fail.
TEST_P(EntryProperty, NegativeControlSdpaSaturates) {
  const Backend& b = entry();
  if (!b.available()) GTEST_SKIP() << b.name() << " cannot run on this CPU";
  constexpr double kSaturatingScale = 16.0;
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    AttentionProblem p;
    p.batch = 1, p.heads = 2, p.q_len = 8, p.kv_len = 16, p.head_dim = 8;
    p.g = kGMax;
    p.variant = Variant::kQKNorm;
    validation::AttentionCase qk = validation::round_inputs(
        validation::make_attention_case(p, validation::Distribution::kGaussian,
                                        seed, b.precision()),
        b.precision());
    // gamma of the bound at |g| = kGMax (the qknorm problem's, see
    // properties.cc).
    const double gamma = kTwoRuns * validation::reference_bounds(
                                        qk, validation::oracle_attention(qk),
                                        compute_roundoff(b.precision()))
                                        .gamma_fwd;
    auto verdict = [&](const validation::AttentionCase& c) {
      std::vector<double> probs;
      if (!hook_probabilities(b, c, &probs)) return std::string("NO HOOK");
      const auto f = validation::run_attention_forward(b, c);
      return check_nonsaturation(c.problem, probs, f.lse, kGMax, gamma);
    };
    const std::string qk_v = verdict(qk);
    ASSERT_NE(qk_v, "NO HOOK")
        << "entry " << b.name()
        << ": no inspection hook (attention_probabilities returned false)";
    EXPECT_EQ(qk_v, "") << "qknorm must satisfy the bound, seed " << seed;
    validation::AttentionCase sd = qk;
    sd.problem.variant = Variant::kSDPA;
    EXPECT_EQ(verdict(sd), "")
        << "unscaled sdpa (small logits) should satisfy it, seed " << seed;
    for (double& x : sd.q) x *= kSaturatingScale;
    for (double& x : sd.k) x *= kSaturatingScale;
    const std::string sd_v = verdict(sd);
    EXPECT_NE(sd_v, "") << "entry " << b.name()
                        << ": sdpa with q, k scaled by 16 did not saturate "
                           "(seed "
                        << seed << "): the non-saturation check cannot fail";
    if (seed == 1) std::cout << "sdpa saturates as expected: " << sd_v << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, EntryProperty,
                         testing::ValuesIn(entry_names()), sanitize);

}  // namespace
}  // namespace qknorm::property
