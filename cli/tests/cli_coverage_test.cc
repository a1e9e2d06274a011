// `qknorm-check coverage` and the default run's covering cases (issue 33):
// the exit status and the JSON, not a regular expression on the text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/coverage.h"
#include "cli/options.h"
#include "cli/suite.h"
#include "cli/tests/test_util.h"
#include "qknorm/backend.h"

namespace qknorm::cli {
namespace {

using testing::run;

TEST(Coverage, EveryEntryOfTheDefaultRunReachesItsWholeModel) {
  const testing::CliRun r = run({"--covering", "coverage", "--json", "-"});
  ASSERT_EQ(r.code, kExitPass) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_GT(j["covering_cases"].get<int>(), 0);
  const auto& entries = j["entries"];
  ASSERT_EQ(entries.size(), all_backends().entries().size());
  for (const auto& e : entries) {
    SCOPED_TRACE(e["entry"].get<std::string>());
    EXPECT_TRUE(e["complete"].get<bool>());
    EXPECT_EQ(e["singles"]["reached"], e["singles"]["feasible"]);
    EXPECT_EQ(e["pairs"]["reached"], e["pairs"]["feasible"]);
    EXPECT_GT(e["pairs"]["feasible"].get<int>(), 1000);
    EXPECT_TRUE(e["unreached_pairs"].empty());
    EXPECT_TRUE(e["over_budget_pairs"].empty());
  }
  EXPECT_EQ(j["budget"]["covering"], "full");
  // The model: every cell with its dimension and needs.
  EXPECT_GT(j["model"]["cells"].size(), 60u);
}

TEST(Coverage, TheDefaultRunReachesEverySingleAndEveryPairInBudget) {
  const testing::CliRun r = run({"coverage", "--json", "-"});
  ASSERT_EQ(r.code, kExitPass) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["budget"]["covering"], "budget");
  EXPECT_EQ(j["budget"]["case_cap"].get<double>(),
            validation::coverage::kDefaultCaseCap);
  ASSERT_GT(j["covering_cases"].get<int>(), 0);
  for (const auto& e : j["entries"]) {
    SCOPED_TRACE(e["entry"].get<std::string>());
    EXPECT_TRUE(e["complete"].get<bool>());
    EXPECT_EQ(e["singles"]["reached"], e["singles"]["feasible"]);
    EXPECT_TRUE(e["unreached_singles"].empty());
    EXPECT_TRUE(e["unreached_pairs"].empty());
    // The pairs over the budget are listed, and are all that is unreached.
    const int over = static_cast<int>(e["over_budget_pairs"].size());
    EXPECT_GT(over, 0);
    EXPECT_EQ(e["pairs"]["reached"].get<int>() + over,
              e["pairs"]["feasible"].get<int>());
    EXPECT_GE(e["pairs"]["reached"].get<int>(),
              e["pairs"]["in_budget"].get<int>());
    EXPECT_GT(e["pairs"]["in_budget"].get<int>(), 0);
  }
  // Without the covering cases the pairs in budget are missed: exit 1.
  const testing::CliRun none = run({"--no-covering", "coverage"});
  EXPECT_EQ(none.code, kExitFail) << none.err;
  EXPECT_NE(none.out.find("INCOMPLETE"), std::string::npos) << none.out;
  // --covering and --no-covering exclude each other.
  EXPECT_EQ(run({"--covering", "--no-covering", "coverage"}).code, kExitUsage);
}

TEST(Coverage, ACustomSuiteIsReportedIncomplete) {
  // One shape: most cells unreached, exit 1, the misses listed.
  const testing::CliRun r =
      run({"--shape", "1x2x16x16", "--backend", "blas:f32", "coverage"});
  EXPECT_EQ(r.code, kExitFail) << r.err;
  EXPECT_NE(r.out.find("does not reach"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("INCOMPLETE"), std::string::npos) << r.out;
}

TEST(Coverage, CoveringCasesFollowTheDefaultSuiteAndItsSeeds) {
  SuiteOptions o;
  o.seed = 42;
  o.covering = Covering::kFull;
  const std::vector<const Backend*> entries = select_entries(all_backends(), o);
  int covering = 0;
  const Suite s = default_run_suite(o, entries, 2, &covering);
  const Suite d = default_suite(42);
  ASSERT_EQ(s.attention.size(), d.attention.size() + covering);
  for (size_t i = 0; i < d.attention.size(); ++i) {
    EXPECT_EQ(s.attention[i].seed, d.attention[i].seed);
    EXPECT_EQ(describe_case(s.attention[i]), describe_case(d.attention[i]));
  }
  ASSERT_EQ(s.scalenorm.size(), d.scalenorm.size());
  EXPECT_EQ(s.scalenorm.back().seed, d.scalenorm.back().seed);
  // Seeds continue after the ScaleNorm cases', one per covering case.
  EXPECT_EQ(s.attention[d.attention.size()].seed, d.scalenorm.back().seed + 1);
  EXPECT_EQ(s.attention.back().seed, d.scalenorm.back().seed + covering);
  // The budgeted array (the default): fewer cases, the same seeds' rule.
  const int full = covering;
  o.covering = Covering::kBudget;
  const Suite b = default_run_suite(o, entries, 2, &covering);
  EXPECT_GT(covering, 0);
  EXPECT_LT(covering, full);
  ASSERT_EQ(b.attention.size(), d.attention.size() + covering);
  EXPECT_EQ(b.attention.back().seed, d.scalenorm.back().seed + covering);
  // With --no-covering, or with a custom suite, none.
  o.covering = Covering::kNone;
  EXPECT_EQ(default_run_suite(o, entries, 2, &covering).attention.size(),
            d.attention.size());
  EXPECT_EQ(covering, 0);
  o.covering = Covering::kFull;
  o.shapes = {"1x2x16x16"};
  default_run_suite(o, entries, 2, &covering);
  EXPECT_EQ(covering, 0);
}

}  // namespace
}  // namespace qknorm::cli
