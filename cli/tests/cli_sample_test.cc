// qknorm-check --sample N (issue 19): every attention case judged by the
// sampled oracle (validation/sampled.h), the sample and its cost in the
// JSON report, no naive baseline, and the budget's stop message pointing at
// --sample. A few seconds in all.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/app.h"
#include "cli/tests/test_util.h"

namespace qknorm::cli {
namespace {

using testing::run;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// A causal case of 300 rows (tile boundaries of 16 ... 256 and the
// entries' blocks) on a sample of 16 rows: PASS, the sample (seed, rows by
// reason), the pass's cost and the estimate against the time it took are
// recorded; the text report prints the sample once per precision line.
TEST(CliSample, SampledRunRecordsTheSampleAndPasses) {
  testing::TempDir dir;
  const testing::CliRun r =
      run({"--shape",     "1x2x300x32",    "--mask",
           "causal",      "--g",           "12.3197",
           "--dist",      "gaussian",      "--sample",
           "16",          "--sample-seed", "7",
           "--backend",   "blas:*",        "--backend",
           "simd:*:bf16", "--backend",     "reference:f64",
           "--no-timing", "--json",        dir.file("r.json")});
  ASSERT_EQ(r.code, kExitPass) << r.out << r.err;
  EXPECT_NE(r.err.find("sampled oracle (--sample 16)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("sample seed 7: "), std::string::npos) << r.out;
  const nlohmann::json j = read_json(dir.file("r.json"));
  EXPECT_TRUE(j["pass"].get<bool>());
  EXPECT_EQ(j["sample"]["rows"].get<int>(), 16);
  EXPECT_EQ(j["sample"]["seed"].get<int>(), 7);
  ASSERT_EQ(j["case_costs"].size(), 1u);
  const nlohmann::json& cc = j["case_costs"][0];
  EXPECT_GT(cc["estimate_seconds"].get<double>(), 0);
  EXPECT_GT(cc["seconds"].get<double>(), 0);
  EXPECT_EQ(cc["naive_seconds"].get<double>(), 0);
  // One sampled oracle per storage precision judged: f64, f32, bf16.
  ASSERT_EQ(cc["samples"].size(), 3u);
  // Visible pairs of one head: 300 * 301 / 2; the pass does two D-term
  // dots (and at most an update of O) per pair and head.
  const double pairs = 2.0 * 300 * 301 / 2;
  for (const nlohmann::json& s : cc["samples"]) {
    EXPECT_EQ(s["seed"].get<int>(), 7);
    for (const char* side : {"query_rows", "key_rows"}) {
      EXPECT_GE(s[side]["count"].get<int>(), 16) << side;
      const nlohmann::json& why = s[side]["by_reason"];
      EXPECT_TRUE(why.contains("first")) << why;
      EXPECT_TRUE(why.contains("last")) << why;
      EXPECT_TRUE(why.contains("tile boundary")) << why;
      int sum = 0;
      for (const auto& [k, n] : why.items()) sum += n.get<int>();
      EXPECT_EQ(sum, s[side]["count"].get<int>()) << side;
    }
    EXPECT_GE(s["pass_flops"].get<double>(), 4 * 32 * pairs);
    EXPECT_LE(s["pass_flops"].get<double>(), 6 * 32 * pairs);
    EXPECT_GE(s["pass_seconds"].get<double>(), 0);
    EXPECT_NE(s["describe"].get<std::string>().find("sample seed 7"),
              std::string::npos);
  }
  EXPECT_GT(j["cost"]["estimate"]["pass"].get<double>(), 0);
  EXPECT_GT(j["cost"]["measured"]["total"].get<double>(), 0);
  for (const nlohmann::json& e : j["entries"]) {
    if (!e["available"].get<bool>()) continue;
    EXPECT_TRUE(e["pass"].get<bool>()) << e["entry"];
    if (e["kind"] != "attention") continue;  // ScaleNorm: unchanged
    const nlohmann::json& c = e["cases"][0];
    // The sampled elements and the O(n D) properties of every row.
    EXPECT_TRUE(c["fields"].contains("o")) << c["fields"];
    EXPECT_TRUE(c["fields"].contains("dk")) << c["fields"];
    bool all_rows = false;
    for (const auto& [name, f] : c["fields"].items()) {
      all_rows = all_rows || name.find("all rows") != std::string::npos;
      EXPECT_TRUE(f["naive"].is_null()) << e["entry"] << " " << name;
    }
    EXPECT_TRUE(all_rows) << c["fields"];
    EXPECT_NE(c["case"].get<std::string>().find("sample seed 7"),
              std::string::npos);
    if (e["family"] != "reference") {  // no naive baseline when sampled
      EXPECT_TRUE(e["ratio_to_naive"].is_null()) << e["entry"];
    }
  }
}

// The sample's seed is --sample-seed, else the run's --seed, else 1.
TEST(CliSample, SampleSeedDefaultsToTheRunsSeed) {
  auto seed_of = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--shape",   "1x1x40x16", "--mask",      "causal",   "--g",
        "5",         "--dist",    "gaussian",    "--sample", "4",
        "--backend", "blas:f64",  "--no-timing", "--json",   "-"};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::CliRun r = run(args);
    EXPECT_EQ(r.code, kExitPass) << r.err;
    return nlohmann::json::parse(r.out)["sample"]["seed"].get<int>();
  };
  EXPECT_EQ(seed_of({}), 1);
  EXPECT_EQ(seed_of({"--seed", "5"}), 5);
  EXPECT_EQ(seed_of({"--seed", "5", "--sample-seed", "9"}), 9);
  // Full mode records no sample.
  const testing::CliRun full =
      run({"--shape", "1x1x8x8", "--mask", "causal", "--g", "5", "--dist",
           "gaussian", "--backend", "blas:f64", "--no-timing", "--json", "-"});
  ASSERT_EQ(full.code, kExitPass) << full.err;
  const nlohmann::json jf = nlohmann::json::parse(full.out);
  EXPECT_TRUE(jf["sample"].is_null());
  // ... and judges by the full oracle, with the naive baseline beside.
  const nlohmann::json& fields = jf["entries"][0]["cases"][0]["fields"];
  for (const auto& [name, f] : fields.items()) {
    EXPECT_EQ(name.find("all rows"), std::string::npos) << name;
    EXPECT_FALSE(f["naive"].is_null()) << name;
  }
}

TEST(CliSample, BadSampleOptionsAreUsageErrors) {
  EXPECT_EQ(run({"--sample", "-1"}).code, kExitUsage);
  EXPECT_EQ(run({"--sample", "x"}).code, kExitUsage);
  const testing::CliRun r = run({"--sample", "8", "power"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("default run only"), std::string::npos) << r.err;
  // The sampled oracle has no softcap (issue 34): refused before any case
  // runs, so no entry is reported as failing.
  const testing::CliRun cap = run({"--sample", "8", "--softcap", "5", "--shape",
                                   "1x2x64x32", "--backend", "reference:f64"});
  EXPECT_EQ(cap.code, kExitUsage) << cap.out << cap.err;
  EXPECT_NE(cap.err.find("softcap"), std::string::npos) << cap.err;
  // Nor a sliding window.
  const testing::CliRun win =
      run({"--sample", "8", "--mask", "causal+window:7,0", "--shape",
           "1x2x64x32", "--backend", "reference:f64"});
  EXPECT_EQ(win.code, kExitUsage) << win.out << win.err;
  EXPECT_NE(win.err.find("sliding window"), std::string::npos) << win.err;
}

// Past the budget the stop message suggests --sample with that run's own
// estimate; a sampled run over budget names the costliest entries instead.
TEST(CliSample, BudgetStopSuggestsSample) {
  const testing::CliRun r = run({"--shape", "1x1x4096x64", "--mask", "causal",
                                 "--backend", "reference", "--precision", "f64",
                                 "--no-timing", "--max-seconds", "1"});
  EXPECT_EQ(r.code, kExitUsage) << r.out << r.err;
  EXPECT_NE(r.err.find("stopped before starting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("judge a sample of rows: --sample 256 (estimated ~"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("largest: reference:f64 ~"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  const testing::CliRun s =
      run({"--shape", "1x1x4096x64", "--mask", "causal", "--backend",
           "reference", "--precision", "f64", "--no-timing", "--sample", "16",
           "--max-seconds", "1"});
  EXPECT_EQ(s.code, kExitUsage) << s.out << s.err;
  EXPECT_NE(s.err.find("sampled oracle (--sample 16)"), std::string::npos)
      << s.err;
  EXPECT_NE(s.err.find("stopped before starting"), std::string::npos) << s.err;
  EXPECT_EQ(s.err.find("judge a sample of rows"), std::string::npos) << s.err;
}

}  // namespace
}  // namespace qknorm::cli
