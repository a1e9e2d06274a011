// Every property of issue 5 on every production registry entry
// (qknorm::all_backends(): reference, and simd / blas entries when built).
// Test names: Registry/EntryProperty.<Property>/<entry>, e.g.
//   Registry/EntryProperty.NonSaturation/simd_AVX2_f32
// so --gtest_filter='*/simd_SSE4_*' picks one target and ctest shards by test.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "mutants/mutants.h"
#include "property_tests/entry_checks.h"
#include "property_tests/rc_gens.h"
#include "property_tests/shape_coverage.h"
#include "property_tests/support.h"
#include "qknorm/backend.h"
#include "validation/forwarding_backend.h"

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
TEST_P(EntryProperty, FormulationSoftcapAgreement) {
  Check("FormulationSoftcapAgreement");
}
TEST_P(EntryProperty, FormulationWindowAgreement) {
  Check("FormulationWindowAgreement");
}
TEST_P(EntryProperty, FormulationRopeAgreement) {
  Check("FormulationRopeAgreement");
}
TEST_P(EntryProperty, FormulationSinksAgreement) {
  Check("FormulationSinksAgreement");
}
TEST_P(EntryProperty, LongSequence) { Check("LongSequence"); }
TEST_P(EntryProperty, ShapeCoverage) { Check("ShapeCoverage"); }

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

// reference:f32 whose forward throws (a plug-in's exception, a bug of ours).
class ThrowingEntry final : public validation::ForwardingBackend {
 public:
  explicit ThrowingEntry(const Backend& inner)
      : ForwardingBackend(inner, "throws") {}
  bool supports(const AttentionProblem& p) const override {
    return inner().supports(p);
  }
  void attention_forward(const AttentionProblem&, const ForwardArgs&,
                         Workspace*, const ExecConfig&) const override {
    throw std::runtime_error("planted: attention_forward throws");
  }
};

// The case's own description ("... dist=gaussian seed=123 ..."), not only
// the run's "seed=... max_success=..." line.
bool names_a_case(const std::string& m) {
  return std::regex_search(m,
                           std::regex("Nq=\\d+ Nk=\\d+ .*dist=\\w+ seed=\\d+"));
}

// Issue 31: an exception escaping a property (here from the entry, inside
// LongSequence and AttentionAgreement) fails it with the entry and the
// case in the message, besides rapidcheck's drawn values.
TEST(PropertyTable, AnExceptionNamesTheEntryAndTheCase) {
  const ThrowingEntry e(*all_backends().find("reference:f32"));
  for (const char* name : {"LongSequence", "AttentionAgreement"}) {
    const RunResult r = run_property(
        entry_property(name), e, std::string("PropertyTable/Throws/") + name,
        false, false, 1);
    EXPECT_FALSE(r.pass) << name;
    EXPECT_NE(r.message.find("entry mutant:throws:f32 (family mutant"),
              std::string::npos)
        << r.message;
    EXPECT_NE(r.message.find("threw: planted: attention_forward throws"),
              std::string::npos)
        << r.message;
    EXPECT_TRUE(names_a_case(r.message)) << r.message;
  }
}

// An RC_FAIL that names neither gets both.
void fails_naming_nothing(const Backend& b) {
  build_case(draw_attention_spec(b.precision()), b.precision());
  RC_FAIL("planted: a bare failure");
}

TEST(PropertyTable, ABareFailureNamesTheEntryAndTheCase) {
  const Property bare{"Bare", fails_naming_nothing, 1};
  const RunResult r = run_property(bare, *all_backends().find("reference:f32"),
                                   "PropertyTable/Bare", false, false, 1);
  EXPECT_FALSE(r.pass);
  EXPECT_NE(r.message.find("planted: a bare failure"), std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("[entry reference:f32 (family reference"),
            std::string::npos)
      << r.message;
  EXPECT_TRUE(names_a_case(r.message)) << r.message;
}

// The negative control of non-saturation (entry_checks.h): the same checker
// that passes every qknorm entry reports a violation on saturating sdpa.
TEST_P(EntryProperty, NegativeControlSdpaSaturates) {
  check_sdpa_saturates(entry());
}

// The property suite's coverage report (shape_coverage.h). ctest runs Reset
// before every property test and Report after them all (fixture
// property_coverage, ctest/coverage/); both need QKNORM_COVERAGE_OUT.
const char* coverage_out() {
  const char* d = std::getenv("QKNORM_COVERAGE_OUT");
  return d != nullptr && *d != '\0' ? d : nullptr;
}

TEST(PropertyCoverage, Reset) {
  if (coverage_out() == nullptr) GTEST_SKIP() << "QKNORM_COVERAGE_OUT unset";
  std::filesystem::remove_all(coverage_out());
}

// One summary line per entry; report.json lists the cells and pairs. Fails
// if an entry's ShapeCoverage run misses a single cell of its model.
TEST(PropertyCoverage, Report) {
  if (coverage_out() == nullptr) GTEST_SKIP() << "QKNORM_COVERAGE_OUT unset";
  std::vector<const Backend*> entries;
  for (const std::string& n : entry_names()) entries.push_back(find_entry(n));
  std::vector<std::string> missing;
  for (const std::string& line :
       write_report(coverage_out(), entries, &missing))
    std::cout << line << "\n";
  std::cout << "report: " << coverage_out() << "/report.json\n";
  for (const std::string& e : missing)
    ADD_FAILURE() << "entry " << e << ": ShapeCoverage missed a single cell";
}

INSTANTIATE_TEST_SUITE_P(Registry, EntryProperty,
                         testing::ValuesIn(entry_names()), sanitize);

}  // namespace
}  // namespace qknorm::property
