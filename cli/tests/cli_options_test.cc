// Option parsing of qknorm-check: every malformed option or value is a usage
// error (exit 2) with a message naming the option; valid ones build the suite
// they describe.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/options.h"
#include "cli/tests/test_util.h"
#include "qknorm/error.h"

namespace qknorm::cli {
namespace {

using testing::run;

void expect_usage_error(const std::vector<std::string>& args,
                        const std::string& needle) {
  const testing::CliRun r = run(args);
  EXPECT_EQ(r.code, kExitUsage)
      << "args: " << ::testing::PrintToString(args) << "\n"
      << r.out;
  EXPECT_NE(r.err.find(needle), std::string::npos)
      << "stderr lacks '" << needle << "':\n"
      << r.err;
}

TEST(CliOptions, UnknownOptionIsUsageError) {
  expect_usage_error({"--bogus"}, "--bogus");
}

TEST(CliOptions, MissingValueIsUsageError) {
  expect_usage_error({"--seed"}, "--seed");
}

TEST(CliOptions, NonNumericValueIsUsageError) {
  expect_usage_error({"--seed", "abc"}, "--seed");
  expect_usage_error({"--g", "twelve"}, "--g");
}

TEST(CliOptions, NegativeThreadsRejected) {
  expect_usage_error({"--threads", "-1"}, "--threads");
}

TEST(CliOptions, BadShapes) {
  expect_usage_error({"--shape", "2x8x72"}, "--shape");
  expect_usage_error({"--shape", "2x8x0x64"}, ">= 1");
  expect_usage_error({"--shape", "2x8xNx64"}, "not an integer");
  expect_usage_error({"--shape", "2x8x72x64x3x1"}, "--shape");
}

TEST(CliOptions, BadMasks) {
  expect_usage_error({"--mask", "diagonal"}, "unknown mask");
  // batch 2 needs two key lengths
  expect_usage_error({"--shape", "2x1x4x4", "--mask", "pad:3"}, "key lengths");
  // a key length beyond kv_len breaks the problem's rule
  expect_usage_error({"--shape", "1x1x4x4", "--mask", "pad:9"}, "qknorm:");
  // a window is window:LEFT,RIGHT, each side -1 or >= 0
  expect_usage_error({"--mask", "window:3"}, "window:LEFT,RIGHT");
  expect_usage_error({"--mask", "causal+window:-2,0"}, "mask.window_left");
  expect_usage_error({"--mask", "window:1,x"}, "not an integer");
}

// RoPE's spec (qknorm/formulation.h, parse_rope) and its validation
// (attention.h, Rope), each naming what is wrong.
TEST(CliOptions, BadRope) {
  expect_usage_error({"--rope", "64,sideways"}, "unknown item 'sideways'");
  expect_usage_error({"--rope", "x"}, "not an integer");
  expect_usage_error({"--shape", "1x1x4x4x8", "--rope", "7"},
                     "rope.rotary_dim");
  expect_usage_error({"--shape", "1x1x4x4x8", "--rope", "8,theta=0.5"},
                     "rope.theta");
  expect_usage_error({"--formulation", "qwen3", "--rope", "8,before"},
                     "rope.order");
  expect_usage_error({"--rope", "8", "--sample", "64"}, "--sample");
}

TEST(CliOptions, BadDistributionPrecisionVariantEps) {
  expect_usage_error({"--dist", "cauchy"}, "unknown distribution");
  expect_usage_error({"--precision", "f8"}, "unknown precision");
  expect_usage_error({"--variant", "linear"}, "--variant");
  expect_usage_error({"--eps", "0"}, "--eps");
  expect_usage_error({"--eps", "-1"}, "--eps");
}

TEST(CliOptions, FiltersThatSelectNothing) {
  expect_usage_error({"--backend", "nosuch:*"}, "select no registry entry");
  expect_usage_error({"--target", "NEON"}, "select no registry entry");
}

TEST(CliOptions, SubcommandErrors) {
  expect_usage_error({"sweep"}, "--over");
  expect_usage_error({"sweep", "--over", "temperature"}, "--over");
  expect_usage_error({"sweep", "--over", "g", "--from", "5", "--to", "1",
                      "--backend", "reference", "--no-plot"},
                     "--from");
  expect_usage_error(
      {"sweep", "--over", "magnitude", "--from", "0", "--no-plot"}, "--from");
  expect_usage_error({"sweep", "--over", "g", "--points", "1"}, "--points");
  expect_usage_error({"compare", "--inputs", "q.npy"}, "--outputs");
  expect_usage_error({"frobnicate"}, "frobnicate");
}

TEST(CliOptions, HelpExplainsOptionsWithExamples) {
  const testing::CliRun r = run({"--help"});
  EXPECT_EQ(r.code, kExitPass);
  for (const char* s : {"--shape", "--g", "--eps", "--mask", "--dist", "--seed",
                        "--precision", "--backend", "--target", "--json",
                        "--csv", "sweep", "compare", "Examples"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  const testing::CliRun s = run({"sweep", "--help"});
  EXPECT_EQ(s.code, kExitPass);
  EXPECT_NE(s.out.find("magnitude"), std::string::npos);
}

TEST(CliOptions, ShapeParsing) {
  const AttentionProblem p = parse_shape("2x8x72x64");
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads, 8);
  EXPECT_EQ(p.q_len, 72);
  EXPECT_EQ(p.kv_len, 72);
  EXPECT_EQ(p.head_dim, 64);
  const AttentionProblem r = parse_shape("1x2x33x47x31");
  EXPECT_EQ(r.q_len, 33);
  EXPECT_EQ(r.kv_len, 47);
  EXPECT_EQ(r.head_dim, 31);
  // Element counts that overflow are refused before anything is allocated.
  EXPECT_THROW(parse_shape("100000x100000x100000x100000"), Error);
}

TEST(CliOptions, MaskParsing) {
  AttentionProblem p = parse_shape("2x1x6x6");
  apply_mask("causal+pad", &p);
  EXPECT_TRUE(p.mask.causal);
  EXPECT_EQ(p.mask.key_lengths, (std::vector<int64_t>{6, 5}));
  apply_mask("pad:6,0", &p);
  EXPECT_FALSE(p.mask.causal);
  EXPECT_EQ(p.mask.key_lengths, (std::vector<int64_t>{6, 0}));
  apply_mask("none", &p);
  EXPECT_TRUE(p.mask.key_lengths.empty());
}

TEST(CliOptions, DefaultSuiteCoversTheIssue) {
  const Suite s = build_suite(SuiteOptions{});
  bool big = false, g0 = false, g20 = false, causal = false, pad = false,
       uneven = false;
  std::set<validation::Distribution> dists;
  for (const AttentionSpec& a : s.attention) {
    const AttentionProblem& p = a.problem;
    big |= p.batch == 2 && p.heads == 8 && p.q_len == 72 && p.kv_len == 72 &&
           p.head_dim == 64;
    g0 |= p.g == g_init(72);
    g20 |= p.g == 20;
    causal |= p.mask.causal;
    pad |= !p.mask.key_lengths.empty();
    uneven |= p.q_len != p.kv_len;
    dists.insert(a.dist);
  }
  EXPECT_TRUE(big && g0 && g20 && causal && pad && uneven);
  EXPECT_GE(dists.size(), 2u);
  EXPECT_FALSE(s.scalenorm.empty());
}

TEST(CliOptions, CustomSuiteIsTheProduct) {
  SuiteOptions o;
  o.shapes = {"1x1x4x4", "1x2x3x5x7"};
  o.g = {0, 25};
  o.masks = {"causal"};
  o.dists = {"uniform"};
  o.seed = 7;
  const Suite s = build_suite(o);
  ASSERT_EQ(s.attention.size(), 4u);
  EXPECT_EQ(s.attention[3].seed, 10u);  // case i uses seed + i
  EXPECT_EQ(s.attention[3].problem.g, 25);
  EXPECT_TRUE(s.attention[3].problem.mask.causal);
}

// A --shape without --g gets the paper's initialisation for its own key
// length, one g per shape; the built-in shape keeps {g_init(72), 20}.
TEST(CliOptions, CustomShapeDefaultsToThePapersGForItsLength) {
  SuiteOptions o;
  o.shapes = {"1x4x32768x128", "1x1x3x1x4"};
  o.masks = {"causal"};
  o.dists = {"gaussian"};
  const Suite s = build_suite(o);
  ASSERT_EQ(s.attention.size(), 2u);
  EXPECT_EQ(s.attention[0].problem.g, g_init(32768));
  EXPECT_NEAR(s.attention[0].problem.g, 30.0, 1e-3);
  EXPECT_EQ(s.attention[1].problem.g, g_init(2));  // Nk = 1: L = 2
  o.shapes.clear();
  o.masks = {"none"};
  std::set<double> gs;
  for (const AttentionSpec& a : build_suite(o).attention)
    gs.insert(a.problem.g);
  EXPECT_EQ(gs, (std::set<double>{g_init(72), 20}));
}

// Issue 19's decision: from kLongSeq on (q_len or kv_len), a --shape
// without --dist judges gaussian only, and the header's note says so and
// how to get the others; shorter shapes and any --dist keep every case.
TEST(CliOptions, LongShapesJudgeGaussianUnlessDistGiven) {
  SuiteOptions o;
  o.masks = {"causal"};
  auto dists = [&] {
    std::vector<validation::Distribution> d;
    for (const AttentionSpec& a : build_suite(o).attention) d.push_back(a.dist);
    return d;
  };
  using validation::Distribution;
  o.shapes = {"1x4x8191x128"};
  EXPECT_EQ(dists(), (std::vector<Distribution>{Distribution::kGaussian,
                                                Distribution::kWideMagnitude}));
  EXPECT_EQ(long_run_note(o), "");
  o.shapes = {"1x1x64x8192x64", "1x4x32768x128", "2x2x72x64"};
  EXPECT_EQ(dists(),
            (std::vector<Distribution>{
                Distribution::kGaussian, Distribution::kGaussian,
                Distribution::kGaussian, Distribution::kWideMagnitude}));
  const std::string note = long_run_note(o);
  EXPECT_NE(note.find("gaussian only for shape 1x1x64x8192x64, 1x4x32768x128"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("--dist wide"), std::string::npos) << note;
  o.dists = {"gaussian", "wide"};
  EXPECT_EQ(dists().size(), 6u);
  EXPECT_EQ(long_run_note(o), "");
}

TEST(CliOptions, FiltersSelectByGlob) {
  SuiteOptions o;
  o.backends = {"reference"};
  o.precisions = {"f16", "f64"};
  const auto e = select_entries(all_backends(), o);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]->name(), "reference:f64");
  EXPECT_EQ(e[1]->name(), "reference:f16");
  o = SuiteOptions{};
  o.backends = {"*:bf16"};
  for (const Backend* b : select_entries(all_backends(), o))
    EXPECT_EQ(b->precision(), Precision::kBF16);
}

TEST(CliOptions, SmallRunWritesParsableJsonAndCsv) {
  testing::TempDir dir;
  const testing::CliRun r = run(
      {"--shape", "1x1x4x4", "--g", "3", "--mask", "none", "--dist", "gaussian",
       "--backend", "reference", "--precision", "f64", "--scalenorm", "3x5",
       "--no-timing", "--json", "-", "--csv", dir.file("r.csv")});
  ASSERT_EQ(r.code, kExitPass) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["pass"].get<bool>());
  EXPECT_EQ(j["seed"].get<uint64_t>(), 42u);
  ASSERT_EQ(j["entries"].size(), 2u);  // attention + scalenorm rows
  EXPECT_EQ(j["entries"][0]["entry"], "reference:f64");
  EXPECT_EQ(j["entries"][0]["rule"], "componentwise");
  EXPECT_TRUE(j["entries"][0].contains("worst"));
  EXPECT_TRUE(j["machine"].contains("openblas_core"));
  // The estimate made before the run is recorded (issue 19) and printed.
  EXPECT_GT(j["estimate_seconds"].get<double>(), 0);
  EXPECT_NE(r.err.find("estimated work: 1 attention cases x 1 entries"),
            std::string::npos)
      << r.err;
  std::ifstream csv(dir.file("r.csv"));
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("kind,entry,", 0), 0u);
}

// Past the budget the run stops before it starts, with the estimate and
// what to do about it (issue 19: a 100000-long problem used to run for ten
// minutes without a word). The estimate of this shape is minutes of oracle.
TEST(CliOptions, BudgetStopsARunBeforeItStarts) {
  const testing::CliRun r =
      run({"--shape", "1x1x4096x64", "--backend", "reference", "--precision",
           "f64", "--no-timing", "--max-seconds", "1"});
  EXPECT_EQ(r.code, kExitUsage) << r.out << r.err;
  EXPECT_NE(r.err.find("estimated work: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stopped before starting"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exceeds --max-seconds 1"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(run({"--max-seconds", "0"}).code, kExitUsage);
}

}  // namespace
}  // namespace qknorm::cli
