// Input classes (issue 31, validation/case.h): the classification of every
// distribution, structure and mask, the precedence of the classes, the row
// criteria, and the generated statistics of the activation distributions
// (attention sink, massive channels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "tests/test_support.h"
#include "validation/case.h"

namespace qknorm::validation {
namespace {

using test_support::shape;

constexpr Distribution kAllDists[] = {
    Distribution::kGaussian,    Distribution::kUniform,
    Distribution::kHeavyTailed, Distribution::kWideMagnitude,
    Distribution::kZeroRows,    Distribution::kOutlierRows,
    Distribution::kMixedScaleV, Distribution::kSink,
    Distribution::kChannels};

InputClass expected_class(Distribution d) {
  if (d == Distribution::kWideMagnitude) return InputClass::kExtremeRange;
  if (d == Distribution::kZeroRows) return InputClass::kDegenerate;
  return InputClass::kRealistic;
}

// The case's parameters without its tensors (what the suite classifies).
AttentionCase undrawn(const AttentionCase& c) {
  AttentionCase u;
  u.problem = c.problem;
  u.dist = c.dist;
  u.structure = c.structure;
  u.seed = c.seed;
  return u;
}

double row_norm(const std::vector<double>& t, int64_t D, int64_t r) {
  double s = 0;
  for (int64_t d = 0; d < D; ++d) {
    const double x = t[static_cast<size_t>(r * D + d)];
    s += x * x;
  }
  return std::sqrt(s);
}

TEST(InputClass, NamesRoundTrip) {
  for (InputClass k : kAllInputClasses) {
    InputClass back = InputClass::kRealistic;
    ASSERT_TRUE(parse_input_class(name(k), &back)) << name(k);
    EXPECT_EQ(back, k);
  }
  EXPECT_STREQ(name(InputClass::kRealistic), "realistic");
  EXPECT_STREQ(name(InputClass::kExtremeRange), "extreme-range");
  EXPECT_STREQ(name(InputClass::kDegenerate), "degenerate");
  InputClass k;
  EXPECT_FALSE(parse_input_class("extreme", &k));
  for (Distribution d : kAllDists) {
    Distribution back = Distribution::kGaussian;
    ASSERT_TRUE(parse_distribution(name(d), &back)) << name(d);
    EXPECT_EQ(back, d);
  }
  EXPECT_STREQ(name(Distribution::kSink), "sink");
  EXPECT_STREQ(name(Distribution::kChannels), "channels");
}

// Every distribution's class, drawn in every storage range, equals the
// class of its parameters alone: the suite's classification of a spec
// (cli::input_class) is the drawn case's.
TEST(InputClass, EveryDistributionDrawnAndUndrawn) {
  for (Distribution d : kAllDists)
    for (Precision p :
         {Precision::kF64, Precision::kF32, Precision::kBF16, Precision::kF16})
      for (uint64_t seed : {1u, 2u, 3u}) {
        const AttentionCase c = round_inputs(
            make_attention_case(shape(2, 2, 24, 24, 16), d, seed, p), p);
        EXPECT_EQ(input_class(c), expected_class(d)) << c.describe();
        EXPECT_EQ(input_class(undrawn(c)), expected_class(d)) << c.describe();
        ScaleNormProblem sp;
        sp.rows = 24;
        sp.dim = 16;
        const ScaleNormCase s =
            round_inputs(make_scalenorm_case(sp, d, seed, p), p);
        EXPECT_EQ(input_class(s), expected_class(d)) << s.describe();
      }
}

TEST(InputClass, MaskStructures) {
  auto cls = [](int64_t nq, int64_t nk, bool causal, std::vector<int64_t> pad) {
    AttentionCase c;
    c.problem = shape(static_cast<int64_t>(std::max<size_t>(pad.size(), 1)), 1,
                      nq, nk, 8);
    c.problem.mask.causal = causal;
    c.problem.mask.key_lengths = std::move(pad);
    return input_class(c);
  };
  EXPECT_EQ(cls(9, 9, false, {}), InputClass::kRealistic);
  EXPECT_EQ(cls(9, 9, true, {}), InputClass::kRealistic);
  EXPECT_EQ(cls(5, 9, true, {}), InputClass::kRealistic);  // kv_len > q_len
  EXPECT_EQ(cls(9, 5, true, {}),
            InputClass::kDegenerate);  // rows 0..3 see none
  EXPECT_EQ(cls(9, 5, false, {}), InputClass::kRealistic);
  EXPECT_EQ(cls(9, 9, false, {9, 4}), InputClass::kRealistic);  // padding
  EXPECT_EQ(cls(9, 9, false, {9, 0}), InputClass::kDegenerate);
  EXPECT_EQ(cls(9, 9, true, {1}), InputClass::kRealistic);
  EXPECT_EQ(cls(9, 9, true, {0}), InputClass::kDegenerate);
}

TEST(InputClass, StructuresAndPrecedence) {
  AttentionCase c;
  c.problem = shape(1, 1, 9, 5, 8);
  auto with = [&](Distribution d, Structure s, bool masked) {
    AttentionCase x = c;
    x.dist = d;
    x.structure = s;
    x.problem.mask.causal = masked;  // kv_len < q_len: fully masked rows
    return input_class(x);
  };
  EXPECT_EQ(with(Distribution::kGaussian, Structure::kParallelRows, false),
            InputClass::kRealistic);
  EXPECT_EQ(with(Distribution::kGaussian, Structure::kDuplicatedKeys, false),
            InputClass::kRealistic);
  EXPECT_EQ(with(Distribution::kGaussian, Structure::kRowsBelowEps, false),
            InputClass::kDegenerate);
  EXPECT_EQ(with(Distribution::kGaussian, Structure::kSubnormalEntries, false),
            InputClass::kExtremeRange);
  // extreme-range before degenerate before realistic.
  EXPECT_EQ(with(Distribution::kWideMagnitude, Structure::kNone, true),
            InputClass::kExtremeRange);
  EXPECT_EQ(with(Distribution::kZeroRows, Structure::kSubnormalEntries, false),
            InputClass::kExtremeRange);
  EXPECT_EQ(with(Distribution::kWideMagnitude, Structure::kRowsBelowEps, true),
            InputClass::kExtremeRange);
  EXPECT_EQ(with(Distribution::kSink, Structure::kNone, true),
            InputClass::kDegenerate);
  EXPECT_EQ(with(Distribution::kZeroRows, Structure::kParallelRows, true),
            InputClass::kDegenerate);
  ScaleNormCase s;
  s.structure = Structure::kSubnormalEntries;
  s.dist = Distribution::kZeroRows;
  EXPECT_EQ(input_class(s), InputClass::kExtremeRange);
  s.structure = Structure::kRowsBelowEps;
  s.dist = Distribution::kChannels;
  EXPECT_EQ(input_class(s), InputClass::kDegenerate);
}

// The row criteria: a q or k row whose norm squared leaves f32's normal
// range is extreme-range, an all-zero one degenerate; v rows do not count.
TEST(InputClass, RowCriteria) {
  const AttentionCase g =
      make_attention_case(shape(1, 2, 6, 7, 4), Distribution::kGaussian, 5);
  ASSERT_EQ(input_class(g), InputClass::kRealistic);
  auto set_row = [](std::vector<double>* t, int64_t r, double norm) {
    for (int d = 0; d < 4; ++d) (*t)[static_cast<size_t>(r * 4 + d)] = norm / 2;
  };
  struct Row {
    bool key;
    double norm;
    InputClass want;
  };
  for (const Row& row :
       {Row{false, kExtremeNormHigh * 2, InputClass::kExtremeRange},
        Row{true, kExtremeNormHigh * 2, InputClass::kExtremeRange},
        Row{true, kExtremeNormLow / 2, InputClass::kExtremeRange},
        Row{false, 0x1p-200, InputClass::kExtremeRange},
        Row{false, kExtremeNormHigh / 2, InputClass::kRealistic},
        Row{true, kExtremeNormLow * 2, InputClass::kRealistic},
        Row{true, 0, InputClass::kDegenerate},
        Row{false, 0, InputClass::kDegenerate}}) {
    AttentionCase c = g;
    set_row(row.key ? &c.k : &c.q, 3, row.norm);
    EXPECT_EQ(input_class(c), row.want)
        << (row.key ? "k" : "q") << " row of norm " << row.norm;
  }
  AttentionCase both = g;
  set_row(&both.q, 1, 0);
  set_row(&both.k, 2, kExtremeNormHigh * 4);
  EXPECT_EQ(input_class(both), InputClass::kExtremeRange);
  AttentionCase v = g;
  set_row(&v.v, 1, 0);
  set_row(&v.v, 2, kExtremeNormHigh * 4);
  EXPECT_EQ(input_class(v), InputClass::kRealistic);
  ScaleNormProblem sp;
  sp.rows = 3;
  sp.dim = 4;
  ScaleNormCase s = make_scalenorm_case(sp, Distribution::kGaussian, 5);
  EXPECT_EQ(input_class(s), InputClass::kRealistic);
  set_row(&s.x, 2, 1e30);
  EXPECT_EQ(input_class(s), InputClass::kExtremeRange);
  set_row(&s.x, 2, 0);
  EXPECT_EQ(input_class(s), InputClass::kDegenerate);
}

// kSink: the Gaussian case of the same seed with the first key row of every
// (b, kv head) and its value row scaled by one factor 10^U[2, 3]; nothing
// else changes. Its norm, ~10^3 sqrt(D), leaves an unscaled f32 sum of
// squares far below overflow.
TEST(ActivationStatistics, SinkRows) {
  AttentionProblem p = shape(2, 4, 40, 48, 64, 2);
  const int64_t D = p.head_dim, Nk = p.kv_len, blocks = p.batch * 2;
  for (uint64_t seed : {7u, 8u, 9u}) {
    const AttentionCase g =
        make_attention_case(p, Distribution::kGaussian, seed);
    const AttentionCase s = make_attention_case(p, Distribution::kSink, seed);
    EXPECT_EQ(s.q, g.q);
    EXPECT_EQ(s.d_o, g.d_o);
    std::set<double> factors;
    double worst_ratio_lo = INFINITY, worst_ratio_hi = 0, max_norm = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const double f = s.k[static_cast<size_t>(b * Nk * D)] /
                       g.k[static_cast<size_t>(b * Nk * D)];
      EXPECT_GE(std::log10(f), kSinkLog10Min - 1e-12);
      EXPECT_LE(std::log10(f), kSinkLog10Max + 1e-12);
      factors.insert(f);
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = static_cast<size_t>(b * Nk * D + d);
        EXPECT_DOUBLE_EQ(s.k[i], f * g.k[i]);
        EXPECT_DOUBLE_EQ(s.v[i], f * g.v[i]);
      }
      for (int64_t j = 1; j < Nk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const size_t i = static_cast<size_t>((b * Nk + j) * D + d);
          ASSERT_EQ(s.k[i], g.k[i]);
          ASSERT_EQ(s.v[i], g.v[i]);
        }
      // The sink's norm against the block's typical (median) key norm.
      std::vector<double> others;
      for (int64_t j = 1; j < Nk; ++j)
        others.push_back(row_norm(s.k, D, b * Nk + j));
      std::nth_element(others.begin(), others.begin() + others.size() / 2,
                       others.end());
      const double sink = row_norm(s.k, D, b * Nk);
      const double ratio = sink / others[others.size() / 2];
      worst_ratio_lo = std::min(worst_ratio_lo, ratio);
      worst_ratio_hi = std::max(worst_ratio_hi, ratio);
      max_norm = std::max(max_norm, sink);
    }
    EXPECT_EQ(factors.size(), static_cast<size_t>(blocks));  // one per block
    // 10^2..10^3 times typical, within the spread of a Gaussian row's norm
    // at D = 64 (+-25%).
    EXPECT_GE(worst_ratio_lo, 0.75 * std::pow(10.0, kSinkLog10Min));
    EXPECT_LE(worst_ratio_hi, 1.25 * std::pow(10.0, kSinkLog10Max));
    EXPECT_LT(max_norm * max_norm, 1e-25 * kExtremeNormHigh * kExtremeNormHigh);
    EXPECT_EQ(input_class(s), InputClass::kRealistic);
  }
  // ScaleNorm: x's first row.
  ScaleNormProblem sp;
  sp.rows = 30;
  sp.dim = 64;
  const ScaleNormCase g = make_scalenorm_case(sp, Distribution::kGaussian, 3);
  const ScaleNormCase s = make_scalenorm_case(sp, Distribution::kSink, 3);
  const double f = s.x[0] / g.x[0];
  EXPECT_GE(std::log10(f), kSinkLog10Min - 1e-12);
  EXPECT_LE(std::log10(f), kSinkLog10Max + 1e-12);
  EXPECT_TRUE(std::equal(s.x.begin() + 64, s.x.end(), g.x.begin() + 64));
  EXPECT_EQ(s.dy, g.dy);
}

// kChannels: the Gaussian case of the same seed with 1 to 4 channels, the
// same in q and k, 100x larger in every row; nothing else changes.
TEST(ActivationStatistics, MassiveChannels) {
  AttentionProblem p = shape(2, 4, 33, 40, 64, 2);
  const int64_t D = p.head_dim;
  std::set<size_t> counts;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const AttentionCase g =
        make_attention_case(p, Distribution::kGaussian, seed);
    const AttentionCase c =
        make_attention_case(p, Distribution::kChannels, seed);
    EXPECT_EQ(c.v, g.v);
    EXPECT_EQ(c.d_o, g.d_o);
    std::set<int64_t> big;
    for (int64_t d = 0; d < D; ++d)
      if (c.q[static_cast<size_t>(d)] != g.q[static_cast<size_t>(d)])
        big.insert(d);
    ASSERT_GE(big.size(), 1u);
    ASSERT_LE(big.size(), static_cast<size_t>(kMaxMassiveChannels));
    counts.insert(big.size());
    const double f = std::pow(10.0, kChannelsLog10);
    double ss_big = 0, ss_rest = 0;
    int64_t n_big = 0, n_rest = 0;
    for (const auto* pair : {&c.q, &c.k}) {
      const std::vector<double>& x = *pair;
      const std::vector<double>& x0 = pair == &c.q ? g.q : g.k;
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t d = static_cast<int64_t>(i) % D;
        if (big.count(d)) {
          ASSERT_DOUBLE_EQ(x[i], f * x0[i]);
          ss_big += x[i] * x[i];
          ++n_big;
        } else {
          ASSERT_EQ(x[i], x0[i]);
          ss_rest += x[i] * x[i];
          ++n_rest;
        }
      }
    }
    // The channels' RMS over the tensors is 100x the others' (to the
    // sampling spread of thousands of Gaussian values: a few percent).
    const double rms_ratio =
        std::sqrt(ss_big / n_big) / std::sqrt(ss_rest / n_rest);
    EXPECT_NEAR(rms_ratio, f, 0.1 * f) << "seed " << seed;
    EXPECT_EQ(input_class(c), InputClass::kRealistic);
  }
  EXPECT_GE(counts.size(), 3u);  // the count is drawn per case
  // ScaleNorm: x's channels.
  ScaleNormProblem sp;
  sp.rows = 20;
  sp.dim = 32;
  const ScaleNormCase g = make_scalenorm_case(sp, Distribution::kGaussian, 4);
  const ScaleNormCase s = make_scalenorm_case(sp, Distribution::kChannels, 4);
  int changed = 0;
  for (int64_t d = 0; d < sp.dim; ++d) {
    const bool b = s.x[static_cast<size_t>(d)] != g.x[static_cast<size_t>(d)];
    changed += b;
    for (int64_t r = 0; r < sp.rows; ++r) {
      const size_t i = static_cast<size_t>(r * sp.dim + d);
      EXPECT_DOUBLE_EQ(s.x[i], b ? 100 * g.x[i] : g.x[i]);
    }
  }
  EXPECT_GE(changed, 1);
  EXPECT_LE(changed, kMaxMassiveChannels);
}

}  // namespace
}  // namespace qknorm::validation
