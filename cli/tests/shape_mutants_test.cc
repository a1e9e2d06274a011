// Issue 33's shape mutants (mutants/mutants.h, MutantInfo::region): each is
// wrong only in one region of the shape model (validation/coverage.h) and
// the unmutated copy bit for bit elsewhere. One test per mutant, named after
// its dimension, proves on the default run (`qknorm-check` of no options:
// the default cases and the budgeted covering array) that
//   (a) the run reaches the region and its verdict FAILs the mutant there,
//   (b) the mutant PASSes every case of the run outside the region;
// and one ...OnlyInItsRegion test per mutant runs `qknorm-check mutants` on
// explicit shapes either side of the region's edge: CAUGHT inside,
// UNTRIGGERED (outputs bit for bit the unmutated copy's) outside. The
// unmutated copy (which declares GQA, as the GQA mutant does) PASSes the
// whole default run: the mutants fail for their bugs, not their loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cli/coverage.h"
#include "cli/options.h"
#include "cli/suite.h"
#include "cli/tests/test_util.h"
#include "mutants/mutants.h"

namespace qknorm::cli {
namespace {

using Region = std::function<bool(const AttentionProblem&)>;

// The regions, from the problem alone (independent of the mutants' code).
bool large_head_dim_batched(const AttentionProblem& p) {
  return p.head_dim >= 256 && p.batch >= 2;
}
bool q_len_half_block_residue(const AttentionProblem& p) {
  return p.q_len % 128 == 64;
}
// Some row that sees a key has a run of at least 128 consecutive masked
// keys.
bool long_masked_run(const AttentionProblem& p) {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i) {
      int64_t seen = 0, run = 0, longest = 0;
      for (int64_t j = 0; j < p.kv_len; ++j) {
        if (visible(p.mask, b, i, j, p.q_len, p.kv_len)) {
          ++seen;
          run = 0;
        } else {
          longest = std::max(longest, ++run);
        }
      }
      if (seen > 0 && longest >= 128) return true;
    }
  return false;
}
bool gqa(const AttentionProblem& p) { return kv_heads_of(p) < p.heads; }
bool head_dim_1(const AttentionProblem& p) { return p.head_dim == 1; }
// Some batch element's every key is padding.
bool padding_of_every_key(const AttentionProblem& p) {
  const auto& l = p.mask.key_lengths;
  return std::find(l.begin(), l.end(), 0) != l.end();
}
bool mqa(const AttentionProblem& p) {
  return kv_heads_of(p) == 1 && p.heads > 1;
}
bool decode_long_kv(const AttentionProblem& p) {
  return p.q_len <= 16 && p.kv_len > 256;
}
// Both runs here call the entries with one thread (RunOptions::exec.threads
// = 1, as `qknorm-check mutants`).
bool batch_above_threads(const AttentionProblem& p) { return p.batch > 1; }

const Backend& mutant(const std::string& name) {
  const Backend* b = property::mutant_registry().find("mutant:" + name);
  if (b == nullptr) throw std::runtime_error("no mutant " + name);
  return *b;
}

// The default run's suite (`qknorm-check` without options: the default
// cases and the budgeted covering cases of the registry's model,
// cli/coverage.h) and the rows of the nine shape mutants and the unmutated
// copy on it, judged in one case-major run_suite call as `qknorm-check
// mutants` judges them (one thread per entry call, every core judging; at
// most one case's oracles per core alive).
// QKNORM_SHAPE_MUTANTS_COVERING=full judges the full array (--covering)
// instead: ctest -C FullArray -R cli_shape_mutants_full (cli/CMakeLists.txt;
// ~3x the CPU, out of the CI's default ctest).
Covering covering_mode() {
  const char* v = std::getenv("QKNORM_SHAPE_MUTANTS_COVERING");
  return v != nullptr && std::string(v) == "full" ? Covering::kFull
                                                  : Covering::kBudget;
}

struct DefaultRun {
  DefaultRun() {
    int covering = 0;
    SuiteOptions so;
    so.covering = covering_mode();
    suite = default_run_suite(so, all_backends().entries(), 0, &covering);
    EXPECT_GT(covering, 0);
    std::vector<const Backend*> entries = {
        &property::unmutated(Precision::kF32)};
    for (const char* m :
         {"stale_dq_head_dim_256:f32", "half_block_tail_dq:f32",
          "long_masked_run_nan:f32", "gqa_paper_no_group_sum:f32",
          "head_dim_1_signed_norm:f32", "pad_zero_means_unpadded:f32",
          "mqa_packed_rows_causal:f32", "decode_split_kv_no_rescale:f32",
          "batch_over_threads_dg:f32"})
      entries.push_back(&mutant(m));
    RunOptions opt;
    opt.exec.threads = 1;
    opt.jobs = 0;
    opt.time_forward = false;
    rows = run_suite(entries, suite, opt);
  }
  Suite suite;
  std::vector<EntryRow> rows;
};
DefaultRun& default_run() {
  static DefaultRun* run = new DefaultRun;
  return *run;
}

// The attention row of entry b on the default run.
EntryRow attention_row(const Backend& b) {
  for (const EntryRow& row : default_run().rows)
    if (row.kind == "attention" && row.name == b.name()) return row;
  ADD_FAILURE() << "no attention row for " << b.name();
  return {};
}

// Largest err / bound of a case (a NaN margin or a throw: infinity).
double case_margin(const CaseResult& c) {
  if (!c.error.empty()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (const FieldResult& f : c.fields)
    m = std::isnan(f.margin) ? std::numeric_limits<double>::infinity()
                             : std::max(m, f.margin);
  return m;
}

// (a) and (b) of the top of the file for mutant `name` and its region.
void expect_caught_only_in_region(const std::string& name,
                                  const Region& in_region) {
  const Backend& m = mutant(name);
  const Suite& suite = default_run().suite;
  // Cases in the region that the mutant implements (supports(): the
  // presets' formulations are not the paper's).
  int inside = 0;
  for (const AttentionSpec& s : suite.attention)
    inside += in_region(s.problem) && m.supports(s.problem) ? 1 : 0;
  ASSERT_GT(inside, 0) << "the default run never gives " << m.name()
                       << " a case in its region (the covering array of "
                          "validation/coverage.h must put one there)";
  const EntryRow row = attention_row(m);
  ASSERT_EQ(row.cases.size(), suite.attention.size());
  int caught = 0;
  double margin = 0;
  for (size_t i = 0; i < row.cases.size(); ++i) {
    const CaseResult& c = row.cases[i];
    if (!in_region(suite.attention[i].problem)) {
      EXPECT_TRUE(c.pass) << m.name() << " FAILs case " << i
                          << " outside its region: " << c.desc << "\n"
                          << c.failure;
      continue;
    }
    if (c.pass) continue;
    ++caught;
    margin = std::max(margin, case_margin(c));
  }
  EXPECT_GT(caught, 0) << m.name() << " PASSes every case of its region";
  EXPECT_FALSE(row.pass);
  std::printf(
      "%s: default run (%s covering array) %zu attention cases, %d in its "
      "region, %d FAIL there, worst margin %.3g; every case outside "
      "PASSes\n",
      m.name().c_str(),
      covering_mode() == Covering::kFull ? "full" : "budgeted",
      suite.attention.size(), inside, caught, margin);
}

TEST(ShapeMutants, HeadDim256Batch2IsCaughtByDefaultRun) {
  expect_caught_only_in_region("stale_dq_head_dim_256:f32",
                               large_head_dim_batched);
}

TEST(ShapeMutants, QLenResidue64Mod128IsCaughtByDefaultRun) {
  expect_caught_only_in_region("half_block_tail_dq:f32",
                               q_len_half_block_residue);
}

TEST(ShapeMutants, LongMaskedRunIsCaughtByDefaultRun) {
  expect_caught_only_in_region("long_masked_run_nan:f32", long_masked_run);
}

TEST(ShapeMutants, GqaOnPaperEntryIsCaughtByDefaultRun) {
  expect_caught_only_in_region("gqa_paper_no_group_sum:f32", gqa);
}

TEST(ShapeMutants, HeadDim1IsCaughtByDefaultRun) {
  expect_caught_only_in_region("head_dim_1_signed_norm:f32", head_dim_1);
}

TEST(ShapeMutants, PaddingOfKvLenKeysIsCaughtByDefaultRun) {
  expect_caught_only_in_region("pad_zero_means_unpadded:f32",
                               padding_of_every_key);
}

TEST(ShapeMutants, MqaIsCaughtByDefaultRun) {
  expect_caught_only_in_region("mqa_packed_rows_causal:f32", mqa);
}

TEST(ShapeMutants, DecodeAgainstLongKvIsCaughtByDefaultRun) {
  expect_caught_only_in_region("decode_split_kv_no_rescale:f32",
                               decode_long_kv);
}

TEST(ShapeMutants, BatchAboveThreadsIsCaughtByDefaultRun) {
  expect_caught_only_in_region("batch_over_threads_dg:f32",
                               batch_above_threads);
}

// The copy the mutants are made of, with GQA declared, PASSes every case of
// the default run, the regions' included.
TEST(ShapeMutants, UnmutatedCopyPassesTheDefaultRun) {
  const Backend& u = property::unmutated(Precision::kF32);
  const EntryRow row = attention_row(u);
  int gqa_judged = 0;
  for (size_t i = 0; i < row.cases.size(); ++i) {
    const CaseResult& c = row.cases[i];
    EXPECT_TRUE(c.pass) << "case " << i << ": " << c.desc << "\n" << c.failure;
    gqa_judged +=
        !c.unsupported && gqa(default_run().suite.attention[i].problem) ? 1 : 0;
  }
  EXPECT_TRUE(row.pass);
  EXPECT_GT(gqa_judged, 0) << "no GQA case judged on a GQA-declaring entry";
}

// `qknorm-check <suite options> mutants --backend mutant:<name>`: the
// verdict word of the mutant's line (CAUGHT, UNTRIGGERED, ...).
std::string verdict(std::vector<std::string> args, const std::string& name) {
  for (const char* a : {"--dist", "gaussian", "--g", "12", "mutants"})
    args.push_back(a);
  args.push_back("--backend");
  args.push_back("mutant:" + name);
  const testing::CliRun r = testing::run(args);
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.find("mutant:" + name) != std::string::npos)
      return line.substr(0, line.find(' '));
  ADD_FAILURE() << "no line for " << name << ":\n" << r.out << r.err;
  return "";
}

// Shapes just inside the region FAIL; just outside, the outputs are the
// unmutated copy's bit for bit.
struct Edge {
  std::vector<std::string> args;
  bool inside;
};

void expect_edges(const std::string& name, const std::vector<Edge>& edges) {
  for (const Edge& e : edges) {
    std::string desc;
    for (const std::string& a : e.args) desc += a + " ";
    EXPECT_EQ(verdict(e.args, name), e.inside ? "CAUGHT" : "UNTRIGGERED")
        << name << " on " << desc;
  }
}

TEST(ShapeMutants, HeadDim256Batch2OnlyInItsRegion) {
  const std::vector<std::string> m = {"--mask", "causal+pad"};
  auto with = [&](std::vector<std::string> s) {
    s.insert(s.end(), m.begin(), m.end());
    return s;
  };
  expect_edges("stale_dq_head_dim_256:f32",
               {{with({"--shape", "2x1x8x256"}), true},
                {with({"--shape", "3x1x5x7x512"}), true},
                {with({"--shape", "1x2x8x256"}), false},
                {with({"--shape", "2x2x8x255"}), false},
                {with({"--shape", "3x2x8x128"}), false}});
}

TEST(ShapeMutants, QLenResidue64Mod128OnlyInItsRegion) {
  std::vector<Edge> edges;
  for (int q : {64, 192, 320})
    edges.push_back({{"--shape", "1x1x" + std::to_string(q) + "x24x8"}, true});
  for (int q : {63, 65, 127, 128, 129, 191, 193, 256})
    edges.push_back({{"--shape", "1x1x" + std::to_string(q) + "x24x8"}, false});
  expect_edges("half_block_tail_dq:f32", edges);
}

TEST(ShapeMutants, LongMaskedRunOnlyInItsRegion) {
  expect_edges("long_masked_run_nan:f32",
               {// Masked runs of 128 and 129 keys in rows that see keys.
                {{"--shape", "1x1x4x300x8", "--mask", "pad:172"}, true},
                {{"--shape", "1x1x130x8", "--mask", "causal"}, true},
                // 127 keys; a long row with none visible; short causal rows.
                {{"--shape", "1x1x4x300x8", "--mask", "pad:173"}, false},
                {{"--shape", "1x1x4x300x8", "--mask", "pad:0"}, false},
                {{"--shape", "1x1x128x8", "--mask", "causal"}, false},
                {{"--shape", "1x1x4x300x8", "--mask", "none"}, false}});
}

TEST(ShapeMutants, GqaOnPaperEntryOnlyInItsRegion) {
  const std::vector<std::string> s = {"--shape", "2x4x12x20x8", "--mask",
                                      "causal+pad"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), s.begin(), s.end());
    return extra;
  };
  expect_edges("gqa_paper_no_group_sum:f32",
               {{with({"--kv-heads", "2"}), true},
                {with({"--kv-heads", "1"}), true},
                {with({}), false},
                {with({"--kv-heads", "4"}), false}});
}

TEST(ShapeMutants, HeadDim1OnlyInItsRegion) {
  expect_edges("head_dim_1_signed_norm:f32",
               {{{"--shape", "2x2x9x1", "--mask", "causal+pad"}, true},
                {{"--shape", "2x2x9x2", "--mask", "causal+pad"}, false},
                {{"--shape", "1x1x5x7x3", "--mask", "none"}, false}});
}

TEST(ShapeMutants, PaddingOfKvLenKeysOnlyInItsRegion) {
  expect_edges("pad_zero_means_unpadded:f32",
               {{{"--shape", "2x2x9x8", "--mask", "pad:0,9"}, true},
                {{"--shape", "2x2x9x8", "--mask", "pad:5,0"}, true},
                {{"--shape", "2x2x9x8", "--mask", "pad:1,9"}, false},
                {{"--shape", "2x2x9x8", "--mask", "causal"}, false}});
}

TEST(ShapeMutants, MqaOnlyInItsRegion) {
  const std::vector<std::string> s = {"--shape", "2x4x12x20x8", "--mask",
                                      "causal"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), s.begin(), s.end());
    return extra;
  };
  expect_edges(
      "mqa_packed_rows_causal:f32",
      {{with({"--kv-heads", "1"}), true},
       {{"--shape", "1x2x5x5x8", "--mask", "causal", "--kv-heads", "1"}, true},
       {with({"--kv-heads", "2"}), false},
       {with({}), false}});
}

TEST(ShapeMutants, DecodeAgainstLongKvOnlyInItsRegion) {
  expect_edges("decode_split_kv_no_rescale:f32",
               {{{"--shape", "1x2x1x300x8", "--mask", "none"}, true},
                {{"--shape", "1x2x16x257x8", "--mask", "none"}, true},
                {{"--shape", "1x2x17x300x8", "--mask", "none"}, false},
                {{"--shape", "1x2x16x256x8", "--mask", "none"}, false}});
}

TEST(ShapeMutants, BatchAboveThreadsOnlyInItsRegion) {
  expect_edges("batch_over_threads_dg:f32",
               {{{"--shape", "2x2x9x8", "--mask", "none"}, true},
                {{"--shape", "3x1x5x7x8", "--mask", "causal"}, true},
                {{"--shape", "1x2x9x8", "--mask", "none"}, false},
                {{"--shape", "1x3x5x7x8", "--mask", "causal"}, false}});
}

}  // namespace
}  // namespace qknorm::cli
