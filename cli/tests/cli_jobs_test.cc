// qknorm-check --jobs (issue 32): the default suite judged on a pool of
// workers gives the same verdicts and margins as the serial order, and every
// result lands in its own (entry, case) slot. A few of the registry's
// entries on every case of the default suite: the mechanism of the full run.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/report.h"
#include "cli/suite.h"
#include "cli/tests/test_util.h"
#include "qknorm/backend.h"

namespace qknorm::cli {
namespace {

using testing::run;

// Reference, simd and blas entries of two storage precisions (each (case,
// precision) oracle is shared by several entries; the naive baseline runs
// beside the non-reference ones). Entries this CPU lacks are reported
// unavailable, the same way at any job count.
std::vector<const Backend*> some_entries() {
  SuiteOptions so;
  so.backends = {"reference:*", "simd:AVX2:*", "blas:*"};
  so.precisions = {"f32", "bf16"};
  return select_entries(all_backends(), so);
}

// The report's verdicts: everything but the run's timing and configuration
// (seconds, estimates, costs, jobs, the machine).
nlohmann::json verdicts(const std::vector<EntryRow>& rows) {
  Report rep;
  rep.rows = rows;
  finalize(&rep);
  const nlohmann::json j = nlohmann::json::parse(to_json(rep));
  return {{"pass", j.at("pass")}, {"entries", j.at("entries")}};
}

// A case's description without its storage precision (a judged case names
// the entry's; describe_case, f64).
std::string without_storage(const std::string& desc) {
  return desc.substr(0, desc.find(" storage="));
}

// The default suite's kinds of cases at --jobs 1 and 3: the same report, and
// each result in its own (entry, case) slot: the case it names, and the entry
// judged alone on that case (nothing shared, judge_attention), for one case per
// entry.
TEST(Jobs, SameVerdictsAtAnyJobCountAndInTheirSlots) {
  // Five of the default suite's cases, one per kind (padding and wide
  // magnitudes; odd sizes with causal + padding; fully masked rows; two
  // formulations, GQA, which some entries do not implement): the test's
  // cost is their oracles.
  Suite suite = default_suite(42);
  suite.attention = {suite.attention[1], suite.attention[4], suite.attention[5],
                     suite.attention[7], suite.attention[8]};
  const std::vector<const Backend*> entries = some_entries();
  ASSERT_GE(entries.size(), 4u);
  RunOptions opt;
  opt.time_forward = false;
  opt.jobs = 1;
  const std::vector<EntryRow> serial = run_suite(entries, suite, opt);
  opt.jobs = 3;
  const std::vector<EntryRow> pooled = run_suite(entries, suite, opt);
  const nlohmann::json a = verdicts(serial), b = verdicts(pooled);
  ASSERT_EQ(a.at("entries").size(), b.at("entries").size());
  // Row by row, so that a difference names its entry.
  for (size_t i = 0; i < a.at("entries").size(); ++i)
    EXPECT_EQ(a["entries"][i], b["entries"][i])
        << a["entries"][i].at("entry") << " (" << a["entries"][i].at("kind")
        << ") differs between --jobs 1 and 3";
  EXPECT_EQ(a, b);

  ASSERT_EQ(pooled.size(), 2 * entries.size());
  size_t checked = 0;
  for (size_t ei = 0; ei < entries.size(); ++ei) {
    const EntryRow& row = pooled[2 * ei];  // attention, then ScaleNorm
    ASSERT_EQ(row.name, entries[ei]->name());
    ASSERT_EQ(row.kind, "attention");
    if (!row.available) continue;
    ASSERT_EQ(row.cases.size(), suite.attention.size());
    for (size_t ci = 0; ci < suite.attention.size(); ++ci)
      EXPECT_EQ(without_storage(row.cases[ci].desc),
                without_storage(describe_case(suite.attention[ci])))
          << row.name << " case " << ci;
    const size_t ci = (3 * ei + 1) % suite.attention.size();
    const CaseResult alone =
        judge_attention(*entries[ei], suite.attention[ci], ExecConfig{1});
    const CaseResult& got = row.cases[ci];
    EXPECT_EQ(got.pass, alone.pass) << row.name << " case " << ci;
    EXPECT_EQ(got.error, alone.error) << row.name << " case " << ci;
    ASSERT_EQ(got.fields.size(), alone.fields.size()) << row.name;
    for (size_t f = 0; f < alone.fields.size(); ++f) {
      EXPECT_EQ(got.fields[f].key, alone.fields[f].key);
      // Bitwise: the same functions on the same inputs.
      EXPECT_EQ(got.fields[f].margin, alone.fields[f].margin)
          << row.name << " case " << ci << " " << alone.fields[f].key;
      EXPECT_EQ(got.fields[f].where, alone.fields[f].where);
    }
    ++checked;
  }
  EXPECT_GE(checked, 4u);
}

// The command line takes --jobs and reports it (a small custom suite).
TEST(Jobs, CommandLineReportsJobs) {
  const testing::CliRun r =
      run({"--jobs", "3", "--no-timing", "--json", "-", "--shape", "1x2x9x8",
           "--backend", "reference:*", "--precision", "f32"});
  EXPECT_EQ(r.code, kExitPass) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("jobs"), 3);
  EXPECT_EQ(j.at("pass"), true);
}

// --jobs and --threads both above 1 would race on OpenBLAS's process-wide
// thread count: a usage error.
TEST(Jobs, JobsWithThreadsIsAUsageError) {
  const testing::CliRun r = run({"--jobs", "2", "--threads", "2"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("--jobs > 1 with --threads > 1"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace qknorm::cli
