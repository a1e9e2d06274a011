// The shape-coverage model (validation/coverage.h, issue 33): the
// classifier on hand-checked problems, feasibility, and the covering array
// reaching every feasible single and pair for every set of needs.
#include "validation/coverage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "validation/case.h"

namespace qknorm::validation::coverage {
namespace {

std::vector<std::string> labels(const Model& m, const AttentionProblem& p,
                                Dim d) {
  std::vector<std::string> out;
  for (int c : m.reached(p))
    if (m.cells()[c].dim == d) out.push_back(m.cells()[c].label);
  return out;
}

using Labels = std::vector<std::string>;

TEST(CoverageModel, Q257ReachesPlusOneOfEveryBlockUpTo256) {
  ModelOptions o;
  o.block_sizes = {6};
  const Model m(o);
  const AttentionProblem p = attention_shape(1, 1, 257, 5, 64, 1);
  EXPECT_EQ(labels(m, p, Dim::kQLen),
            (Labels{"-1 mod 6", "+1 mod 16", "+1 mod 32", "+1 mod 64",
                    "+1 mod 128", "+1 mod 256"}));
  EXPECT_EQ(labels(m, p, Dim::kHeadDim), (Labels{"64"}));
  // kv_len 5 is below every block but 6 (residues need length >= b - 1).
  EXPECT_EQ(labels(m, p, Dim::kKvLen), (Labels{"-1 mod 6"}));
  EXPECT_EQ(labels(m, p, Dim::kMask), (Labels{"none"}));
  EXPECT_EQ(labels(m, p, Dim::kHeads), (Labels{"MHA"}));
  EXPECT_EQ(labels(m, p, Dim::kBatch), (Labels{"1"}));
}

TEST(CoverageModel, CausalDecodeAgainstLongKv) {
  const Model m(ModelOptions{});
  AttentionProblem p = attention_shape(3, 8, 1, 4096, 128, 1);
  p.kv_heads = 1;
  p.mask.causal = true;
  EXPECT_EQ(labels(m, p, Dim::kQLen), (Labels{"1"}));
  EXPECT_EQ(labels(m, p, Dim::kKvLen),
            (Labels{"0 mod 16", "0 mod 32", "0 mod 64", "0 mod 128",
                    "0 mod 256", "long"}));
  // One query row sees every key: no masked run, no masked row.
  EXPECT_EQ(labels(m, p, Dim::kMask), (Labels{"causal q<kv"}));
  EXPECT_EQ(labels(m, p, Dim::kHeads), (Labels{"ratio 8", "MQA"}));
  EXPECT_EQ(labels(m, p, Dim::kBatch), (Labels{">threads"}));
  EXPECT_EQ(labels(m, p, Dim::kHeadDim), (Labels{"128"}));
}

TEST(CoverageModel, MaskStructures) {
  const Model m(ModelOptions{});
  // Causal 300 x 200: the first 100 rows see nothing (kv_len < 256: not a
  // long row); the first visible row sees 1 key of 200: a run of 199.
  AttentionProblem p = attention_shape(1, 1, 300, 200, 8, 1);
  p.mask.causal = true;
  EXPECT_EQ(labels(m, p, Dim::kMask),
            (Labels{"causal q>kv", "long masked run"}));
  // Causal 300 x 256 plus padding: long rows with fully masked rows, a
  // batch element with no key, one that pads one key.
  p = attention_shape(3, 1, 300, 256, 8, 1);
  p.mask.causal = true;
  p.mask.key_lengths = {256, 0, 255};
  EXPECT_EQ(labels(m, p, Dim::kMask),
            (Labels{"causal q>kv", "pad 0 keys", "pad 1 key", "pad all keys",
                    "masked rows in long rows", "long masked run"}));
  // Padding 127 keys of 255: one short of a long run.
  p = attention_shape(1, 1, 4, 255, 8, 1);
  p.mask.key_lengths = {128};
  EXPECT_EQ(labels(m, p, Dim::kMask), Labels{});
  p.mask.key_lengths = {127};
  EXPECT_EQ(labels(m, p, Dim::kMask), (Labels{"long masked run"}));
  p.mask = Mask{};
  p.mask.causal = true;
  p.q_len = p.kv_len;
  EXPECT_EQ(labels(m, p, Dim::kMask),
            (Labels{"causal q=kv", "long masked run"}));
}

TEST(CoverageModel, HeadDimsAndHeads) {
  const Model m(ModelOptions{});
  EXPECT_EQ(labels(m, attention_shape(1, 1, 1, 1, 1, 1), Dim::kHeadDim),
            (Labels{"1"}));
  EXPECT_EQ(labels(m, attention_shape(1, 1, 1, 1, 31, 1), Dim::kHeadDim),
            (Labels{"odd>1"}));
  EXPECT_EQ(labels(m, attention_shape(1, 1, 1, 1, 576, 1), Dim::kHeadDim),
            (Labels{"576"}));
  EXPECT_EQ(labels(m, attention_shape(1, 1, 1, 1, 48, 1), Dim::kHeadDim),
            Labels{});
  AttentionProblem p = attention_shape(1, 12, 1, 1, 8, 1);
  p.kv_heads = 2;  // ratio 6
  EXPECT_EQ(labels(m, p, Dim::kHeads), (Labels{"ratio 3..7"}));
  p.kv_heads = 3;  // ratio 4
  EXPECT_EQ(labels(m, p, Dim::kHeads), (Labels{"ratio 4"}));
  p.kv_heads = 12;
  EXPECT_EQ(labels(m, p, Dim::kHeads), (Labels{"MHA"}));
  EXPECT_EQ(needs_of(p), unsigned{kNeedNothing});
  p.kv_heads = 1;
  EXPECT_EQ(needs_of(p), unsigned{kNeedGqa});
}

TEST(CoverageModel, BatchCellFollowsThreads) {
  ModelOptions o;
  o.threads = 4;
  const Model m(o);
  EXPECT_EQ(labels(m, attention_shape(4, 1, 1, 1, 1, 1), Dim::kBatch),
            Labels{});
  EXPECT_EQ(labels(m, attention_shape(5, 1, 1, 1, 1, 1), Dim::kBatch),
            (Labels{">threads"}));
}

TEST(CoverageModel, InfeasiblePairsAreTheBuildersOnly) {
  const Model m(ModelOptions{});
  const int q1 = m.index(Dim::kQLen, "1");
  const int gt = m.index(Dim::kMask, "causal q>kv");
  const int eq = m.index(Dim::kMask, "causal q=kv");
  const int lng = m.index(Dim::kKvLen, "long");
  ASSERT_GE(q1, 0);
  ASSERT_GE(gt, 0);
  // Decode q_len 1 cannot exceed kv_len >= 1.
  EXPECT_FALSE(m.feasible(q1, gt));
  EXPECT_TRUE(m.feasible(q1, eq));  // 1 x 1
  EXPECT_TRUE(m.feasible(lng, gt));
  // Two cells of one dimension are no pair; one length reaches both.
  EXPECT_FALSE(m.feasible(m.index(Dim::kKvLen, "-1 mod 256"), lng));
  EXPECT_EQ(labels(m, attention_shape(1, 1, 1, 2047, 1, 1), Dim::kKvLen),
            (Labels{"-1 mod 16", "-1 mod 32", "-1 mod 64", "-1 mod 128",
                    "-1 mod 256"}));
  for (size_t c = 0; c < m.cells().size(); ++c)
    EXPECT_TRUE(m.feasible(static_cast<int>(c))) << full_name(m.cells()[c]);
  // Every infeasible pair is two of q_len, kv_len, mask.
  for (const auto& [a, b] : m.infeasible_pairs()) {
    for (int c : {a, b}) {
      const Dim d = m.cells()[c].dim;
      EXPECT_TRUE(d == Dim::kQLen || d == Dim::kKvLen || d == Dim::kMask)
          << full_name(m.cells()[a]) << " x " << full_name(m.cells()[b]);
    }
  }
}

// Every needs set's problems reach every item within it.
void expect_covers(const Model& m, const std::vector<AttentionProblem>& arr) {
  for (unsigned needs : {0u, 1u, 2u, 3u}) {
    Tally t(m, needs);
    for (const AttentionProblem& p : arr)
      if ((needs_of(p) & ~needs) == 0) t.add(p);
    EXPECT_TRUE(t.complete()) << "needs " << needs << ": " << t.summary();
    EXPECT_GT(t.pairs_feasible(), 0);
  }
}

TEST(CoveringArray, CoversEveryNeedsSetAndIsDeterministic) {
  ModelOptions o;
  o.block_sizes = {6, 64, 512};
  const Model m(o);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<AttentionProblem> a = covering_array(m, 12);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  double est = 0;
  for (const AttentionProblem& p : a) est += cost(p);
  std::printf(
      "cells %zu, feasible pairs %zu (n/a %zu), rows %zu, "
      "estimated %.3f s per entry, built in %.3f s\n",
      m.cells().size(), m.feasible_pairs().size(), m.infeasible_pairs().size(),
      a.size(), est, s);
  expect_covers(m, a);
  const std::vector<AttentionProblem> b = covering_array(m, 12);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(m.reached(a[i]), m.reached(b[i]));
    EXPECT_EQ(a[i].mask.key_lengths, b[i].mask.key_lengths);
  }
}

// Every needs set's problems reach every single within it, and every pair
// within it whose cheapest problem costs at most cap; no problem costs more
// than cap unless it is a single's cheapest.
void expect_covers_in_budget(const Model& m,
                             const std::vector<AttentionProblem>& arr,
                             double cap) {
  const std::vector<double> costs = pair_costs(m);
  const auto& pairs = m.feasible_pairs();
  int over = 0;
  for (unsigned needs : {0u, 1u, 2u, 3u}) {
    Tally t(m, needs);
    for (const AttentionProblem& p : arr)
      if ((needs_of(p) & ~needs) == 0) t.add(p);
    EXPECT_EQ(t.singles_reached(), t.singles_feasible()) << "needs " << needs;
    const auto missed = t.unreached_pairs();
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (std::find(missed.begin(), missed.end(), pairs[i]) == missed.end())
        continue;
      EXPECT_FALSE(
          pair_in_budget(m, pairs[i].first, pairs[i].second, costs[i], cap))
          << "needs " << needs << ": "
          << pair_name(m, pairs[i].first, pairs[i].second);
      over += needs == kAllNeeds;
    }
  }
  EXPECT_GT(over, 0);  // the budget leaves some out
  // The anchor is reached although over the cap.
  const int hd = m.index(Dim::kHeadDim, "256"), b2 = m.index(Dim::kBatch, "2");
  EXPECT_TRUE(anchor_pair(m, b2, hd));
  EXPECT_GT(cheapest_cost(m, hd, b2), cap);
  bool anchor = false;
  for (const AttentionProblem& p : arr)
    anchor |= p.head_dim == 256 && p.batch == 2;
  EXPECT_TRUE(anchor);
  double singles_max = cheapest_cost(m, hd, b2);
  for (int c = 0; c < static_cast<int>(m.cells().size()); ++c)
    singles_max = std::max(singles_max, cheapest_cost(m, c, c));
  for (const AttentionProblem& p : arr)
    EXPECT_LE(cost(p), std::max(cap, singles_max));
}

TEST(CoveringArray, BudgetedArrayFitsTheNamedBudgetAtTheNamedCap) {
  // The default run's model: our entries' blocks, 2 threads.
  ModelOptions o;
  o.block_sizes = {6, 64, 128, 256, 512};
  o.threads = 2;
  const Model m(o);
  const BudgetedArray a = budgeted_covering_array(m, 12);
  EXPECT_EQ(a.case_cap, kDefaultCaseCap);
  EXPECT_LE(a.cost, kDefaultBudget);
  EXPECT_EQ(a.cost, total_cost(a.cases));
  expect_covers_in_budget(m, a.cases, a.case_cap);
  // The cap is the largest of the grid that fits: one step up does not.
  const BudgetedArray up = budgeted_covering_array(m, 12, kDefaultBudget,
                                                   kDefaultCaseCap / kCapStep);
  EXPECT_LT(up.case_cap, kDefaultCaseCap / kCapStep);
  // Deterministic.
  const BudgetedArray b = budgeted_covering_array(m, 12);
  ASSERT_EQ(a.cases.size(), b.cases.size());
  for (size_t i = 0; i < a.cases.size(); ++i)
    EXPECT_EQ(m.reached(a.cases[i]), m.reached(b.cases[i]));
  // The full array reaches more, at more cost.
  EXPECT_GT(total_cost(covering_array(m, 12)), 5 * kDefaultBudget);
}

TEST(CoveringArray, MoreBlocksLowerTheCapToKeepTheBudget) {
  ModelOptions o;
  // A plug-in declaring more blocks: more residue cells, more rows.
  o.block_sizes = {6, 10, 24, 40, 64, 96, 128, 256, 512};
  o.threads = 2;
  const Model m(o);
  const BudgetedArray a = budgeted_covering_array(m, 12);
  EXPECT_LT(a.case_cap, kDefaultCaseCap);
  EXPECT_LE(a.cost, kDefaultBudget);
  expect_covers_in_budget(m, a.cases, a.case_cap);
}

TEST(CoveringArray, ExtraBlockGetsItsResidues) {
  ModelOptions o;
  o.block_sizes = {48};
  const Model m(o);
  for (const char* r : {"0 mod 48", "+1 mod 48", "-1 mod 48", "24 mod 48"}) {
    EXPECT_GE(m.index(Dim::kQLen, r), 0) << r;
    EXPECT_GE(m.index(Dim::kKvLen, r), 0) << r;
  }
  const std::vector<AttentionProblem> a = covering_array(m, 12);
  expect_covers(m, a);
  // Without the block, the array need not reach 24 mod 48.
  Tally t(m, kAllNeeds);
  for (const AttentionProblem& p : covering_array(Model(ModelOptions{}), 12))
    t.add(p);
  EXPECT_FALSE(t.complete());
}

TEST(CoveringArray, RemovingACaseDropsCoverage) {
  const Model m(ModelOptions{});
  const std::vector<AttentionProblem> a = covering_array(m, 12);
  // Every row is there for some item the others miss? Not necessarily (a
  // greedy row may be overtaken later); but the first row, the costliest
  // item's, is needed unless another row reaches it: check that dropping
  // some row makes the tally fail.
  int needed = 0;
  for (size_t skip = 0; skip < a.size(); ++skip) {
    Tally t(m, kAllNeeds);
    for (size_t i = 0; i < a.size(); ++i)
      if (i != skip) t.add(a[i]);
    needed += !t.complete();
  }
  EXPECT_GT(needed, static_cast<int>(a.size()) / 2);
}

}  // namespace
}  // namespace qknorm::validation::coverage
