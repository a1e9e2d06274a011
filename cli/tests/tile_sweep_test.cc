// qknorm-check sweep --over tiles (issue 19, cli/tiles.h), small: the lengths
// cover every declared block's boundaries, a run up to n = 300 on two of our
// entries passes and writes its CSV and PNG, and a mutant that drops the last
// partial query block of 16 from dK FAILs exactly at the lengths it breaks,
// with a reproducer that draws the same sample. One ctest (cli_tile_sweep,
// label cli); the full sweep up to 32768 is in cli/README.md.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/tests/test_util.h"
#include "cli/tiles.h"
#include "mutants/mutants.h"

namespace qknorm::cli {
namespace {

const Backend* entry(const Registry& r, const std::string& name) {
  for (const Backend* b : r.entries())
    if (b->name() == name) return b;
  return nullptr;
}

bool has(const std::vector<int64_t>& v, int64_t n) {
  return std::find(v.begin(), v.end(), n) != v.end();
}

TEST(TileSweep, LengthsCoverEveryDeclaredBlock) {
  const Backend* simd = entry(all_backends(), "simd:AVX2:f32");
  const Backend* blas = entry(all_backends(), "blas:f32");
  ASSERT_TRUE(simd && blas);
  SuiteOptions s;
  const auto at = [&](int64_t n) { return tile_problem(s, n); };
  const TileLengths L = tile_lengths(1, 300, {simd, blas}, at);
  ASSERT_TRUE(std::is_sorted(L.n.begin(), L.n.end()));
  EXPECT_EQ(std::adjacent_find(L.n.begin(), L.n.end()), L.n.end());
  EXPECT_LE(L.n.back(), 300);
  // 2^k +- 1 from k = 4; simd's panels of 6 rows and blocks of 64; blas's
  // padding to 16; the defaults 64 and 128; each block b: b +- 1, 2b +- 1.
  for (int64_t n : {5,  6,  7,  11, 13,  15,  16,  17,  31,  32,
                    33, 63, 64, 65, 127, 128, 129, 255, 256, 257})
    EXPECT_TRUE(has(L.n, n)) << n;
  EXPECT_EQ(L.n.size(), 20u);
  EXPECT_NE(L.blocks.at(6).find("simd:AVX2:f32"), std::string::npos);
  EXPECT_NE(L.blocks.at(512).find("blas:f32"), std::string::npos);  // Nq <= 1k
  EXPECT_NE(L.why.at(129).find("2b64+1"), std::string::npos);
  // Up to 32768: blas's query block shrinks with kv_len (query_block).
  const TileLengths F = tile_lengths(1, 32768, {simd, blas}, at);
  for (int64_t n : {32767, 32768, 16385, 511, 512, 513, 1023, 1025})
    EXPECT_TRUE(has(F.n, n)) << n;
  EXPECT_FALSE(has(F.n, 32769));
  EXPECT_TRUE(F.blocks.count(32));  // blas:f32 at n = 16384, 32768
  EXPECT_EQ(tile_lengths(4097, 4097, {simd}, at).n, std::vector<int64_t>{4097});
}

// The real command line, small: exit 0, one CSV row per (length, entry),
// every one PASS, and the PNG.
TEST(TileSweep, SmallRunPassesAndWritesCsvAndPng) {
  testing::TempDir dir;
  const std::string prefix = dir.file("tiles");
  const testing::CliRun r =
      testing::run({"sweep", "--over", "tiles", "--to", "300", "--backend",
                    "simd:AVX2:f32", "--backend", "blas:f32", "--sample", "32",
                    "--threads", "2", "--out", prefix});
  if (r.code != kExitTool) {
    ASSERT_EQ(r.code, kExitPass) << r.out << r.err;
  }
  std::ifstream csv(prefix + ".csv");
  std::string line;
  ASSERT_TRUE(std::getline(csv, line));
  EXPECT_EQ(line.rfind("n,entry,precision,pass,margin,worst_field", 0), 0u);
  int rows = 0, simd_not_run = 0;
  while (std::getline(csv, line)) {
    ++rows;
    // pass is 1, or empty where simd:AVX2 is not available on this CPU.
    if (line.find(",f32,,") != std::string::npos) {
      ++simd_not_run;
      continue;
    }
    EXPECT_NE(line.find(",f32,1,"), std::string::npos) << line;
  }
  EXPECT_EQ(rows, 2 * 20);
  EXPECT_LE(simd_not_run, 20);
  EXPECT_NE(r.out.find("blas:f32"), std::string::npos) << r.out;
  if (r.code == kExitTool) GTEST_SKIP() << "gnuplot unavailable: " << r.err;
  ASSERT_TRUE(std::filesystem::exists(prefix + ".png"));
  EXPECT_GT(std::filesystem::file_size(prefix + ".png"), 1000u);
}

// The sweep estimates its work first and stops before starting past the
// budget (the top-level --max-seconds), naming what to cut; nothing is
// written. The small run above prints its estimate too.
TEST(TileSweep, EstimateFirstAndBudgetStop) {
  testing::TempDir dir;
  const std::string prefix = dir.file("tiles");
  const testing::CliRun r =
      testing::run({"--max-seconds", "1", "sweep", "--over", "tiles",
                    "--backend", "blas:f32", "--out", prefix});
  EXPECT_EQ(r.code, kExitUsage) << r.out << r.err;
  EXPECT_EQ(r.err.rfind("qknorm-check sweep: estimated work: ", 0), 0u)
      << r.err;
  EXPECT_NE(r.err.find("stopped before starting: the estimate"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exceeds --max-seconds 1."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--to"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(prefix + ".csv"));
  const testing::CliRun small =
      testing::run({"sweep", "--over", "tiles", "--from", "17", "--to", "17",
                    "--backend", "blas:f32", "--out", prefix, "--no-plot"});
  EXPECT_EQ(small.code, kExitPass) << small.out << small.err;
  EXPECT_NE(small.err.find("estimated work: 1 attention cases x 1 entries"),
            std::string::npos)
      << small.err;
}

// The sweep judges with the sampled oracle, which refuses a softcap and a
// window: a usage error up front naming the option, not a FAIL per length.
TEST(TileSweep, VariantsTheSampledOracleRefusesAreUsageErrors) {
  testing::TempDir dir;
  const std::string prefix = dir.file("tiles");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--mask", "causal+window:7,0"},
        std::vector<std::string>{"--softcap", "5"}}) {
    std::vector<std::string> args{"sweep",    "--over", "tiles", "--from",
                                  "17",       "--to",   "17",    "--backend",
                                  "blas:f32", "--out",  prefix,  "--no-plot"};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::CliRun r = testing::run(args);
    EXPECT_EQ(r.code, kExitUsage) << r.out << r.err;
    EXPECT_NE(r.err.find(extra[0]), std::string::npos) << r.err;
  }
}

// A tail-block bug is seen at the lengths it breaks (q_len > 16, q_len % 16
// != 0) and only there, and its reproducer (--from n --to n) judges the
// same inputs and sample: the same margin.
TEST(TileSweep, CatchesTheTailQueryBlockMutant) {
  const Backend* m = entry(property::mutant_registry(),
                           "mutant:dk_drops_tail_query_block:f32");
  ASSERT_NE(m, nullptr);
  SweepOptions o;
  o.over = "tiles";
  o.from = 15;
  o.to = 40;
  o.sample = 16;
  SuiteOptions s;
  const std::vector<TilePoint> pts = run_tile_points(o, s, {m}, 2, false);
  std::vector<int64_t> ns, failing;
  double margin17 = 0;
  for (const TilePoint& p : pts) {
    ns.push_back(p.n);
    ASSERT_TRUE(p.run) << p.n << " " << p.note;
    if (!p.pass) {
      failing.push_back(p.n);
      EXPECT_GT(p.margin, 1) << p.n;
      EXPECT_EQ(p.worst_field.rfind("dk", 0), 0u) << p.n << p.worst_field;
      EXPECT_NE(p.command.find(fmt::format("--from {0} --to {0}", p.n)),
                std::string::npos)
          << p.command;
    }
    if (p.n == 17) margin17 = p.margin;
  }
  EXPECT_EQ(ns, (std::vector<int64_t>{15, 16, 17, 31, 32, 33}));
  EXPECT_EQ(failing, (std::vector<int64_t>{17, 31, 33}));
  o.from = o.to = 17;
  const std::vector<TilePoint> one = run_tile_points(o, s, {m}, 2, false);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_FALSE(one[0].pass);
  EXPECT_EQ(one[0].margin, margin17);
}

}  // namespace
}  // namespace qknorm::cli
