// Every property of issue 5 on every production registry entry
// (qknorm::all_backends(): reference, and simd / blas entries when built).
// Test names: Registry/EntryProperty.<Property>/<entry>, e.g.
//   Registry/EntryProperty.NonSaturation/simd_AVX2_f32
// so --gtest_filter='*/simd_SSE4_*' picks one target and ctest shards by test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "mutants/mutants.h"
#include "property_tests/entry_checks.h"
#include "property_tests/support.h"
#include "qknorm/backend.h"

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
  return test_name_of(info.param);
}

class EntryProperty : public testing::TestWithParam<std::string> {
 protected:
  const Backend& entry() const { return *find_entry(GetParam()); }

  // Runs the named property on this test's entry under rapidcheck.
  void Check(const char* property) { check_entry_property(entry(), property); }
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
TEST_P(EntryProperty, LongSequence) { Check("LongSequence"); }

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

// The negative control of non-saturation (entry_checks.h): the same checker
// that passes every qknorm entry reports a violation on saturating sdpa.
TEST_P(EntryProperty, NegativeControlSdpaSaturates) {
  check_sdpa_saturates(entry());
}

INSTANTIATE_TEST_SUITE_P(Registry, EntryProperty,
                         testing::ValuesIn(entry_names()), sanitize);

}  // namespace
}  // namespace qknorm::property
