// Repeated summands and the row normalization's rounding (validation/rule.h,
// "Repeated summands"; issue 33's first false alarm): the row sum's tie
// statistic (row_tie_excess), the correct entries that FAILed without the
// two terms (head_dim 1 with kv_len 2049; decode against 4096 keys at a
// small g), rows of distinct terms whose bounds stay bitwise today's, and
// every entry on long rows of repeated or near-equal summands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "tests/test_support.h"
#include "validation/case.h"
#include "validation/check.h"
#include "validation/judge.h"
#include "validation/oracle.h"
#include "validation/rule.h"
#include "validation/rule_terms.h"
#include "validation/run.h"

namespace qknorm::validation {
namespace {

constexpr double kU64 = 0x1p-53;

TEST(RowTieExcess, DistinctTermsHaveNone) {
  std::vector<double> t = {0.4, 0.1, 0.3, 0.2};
  EXPECT_EQ(row_tie_excess(&t, kU64, 4), 0.0);
  EXPECT_EQ(tie_sum_units(4, 0), sum_units(4));  // bitwise today's
}

TEST(RowTieExcess, IdenticalTermsTieInEveryPair) {
  std::vector<double> t(100, 0.01);
  EXPECT_EQ(row_tie_excess(&t, kU64, 4), 100.0 * 99);
  // min(8 sqrt(100 + 9900), 99) + kOpUnits: the deterministic n - 1.
  EXPECT_EQ(tie_sum_units(100, 100.0 * 99), 99 + kOpUnits);
}

TEST(RowTieExcess, TwoValuesAreTwoGroups) {
  // At head_dim 1 a row's terms take two values (logits +-g).
  std::vector<double> t;
  for (int i = 0; i < 60; ++i) t.push_back(1.0 / 70);
  for (int i = 0; i < 40; ++i) t.push_back(1.0 / 280);
  EXPECT_EQ(row_tie_excess(&t, kU64, 4), 60.0 * 59 + 40.0 * 39);
}

TEST(RowTieExcess, TermsBelowTheRoundoffWeighByTheirSize) {
  // A term's rounding error is at most the term: w = t / u each.
  std::vector<double> t(10, kU64 / 4);
  EXPECT_DOUBLE_EQ(row_tie_excess(&t, kU64, 4), 10.0 * 9 / 16);
}

TEST(RowTieExcess, AWiderTermErrorOnlyAddsPairs) {
  // Terms 1e-9 apart relatively: distinct at f64's own spacing, tied
  // within a kernel's term error of 1e8 units (|A| ~ 2.5e7).
  std::vector<double> t;
  for (int i = 0; i < 50; ++i) t.push_back(0.02 * (1 + 1e-9 * i));
  std::vector<double> t2 = t;
  const double narrow = row_tie_excess(&t, kU64, 4);
  const double wide = row_tie_excess(&t2, kU64, 1e8);
  EXPECT_EQ(narrow, 0.0);
  EXPECT_GT(wide, 0.0);
  EXPECT_LE(wide, 50.0 * 49);
}

// Long rows (from 256 terms row_tie_excess sorts by radix, below by
// comparison): the excess equals the pairwise definition, every ordered
// pair (a, b) of the ascending order tied where t_b - t_a <= c u (t_a + t_b)
// + 2 u, each counting w_a w_b; on rows with exact repeats, near-equal runs,
// zeros of both signs, subnormals and values that span the exponents (a
// misordered sort moves pairs in or out of the sweep's window).
TEST(RowTieExcess, LongRowsMatchThePairwiseDefinition) {
  constexpr double u = 0x1p-24, cu = 4 * u;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> uni(0, 1);
  for (int n : {256, 300, 1000, 4099}) {
    std::vector<double> t;
    for (int i = 0; i < n; ++i) {
      const double x = uni(rng);
      switch (i % 7) {
        case 0:
          t.push_back(0.25);
          break;  // repeats
        case 1:
          t.push_back(1e-3 * (1 + 1e-7 * i));
          break;  // near-equal
        case 2:
          t.push_back(i % 2 ? 0.0 : -0.0);
          break;
        case 3:
          t.push_back(4.9e-324 * (1 + i % 5));
          break;
        case 4:
          t.push_back(std::ldexp(x, -(i % 60)));
          break;
        default:
          t.push_back(x / n);
          break;
      }
    }
    std::vector<double> s = t;
    std::sort(s.begin(), s.end());
    double pairs = 0;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (s[b] * (1 - cu) <= s[a] * (1 + cu) + 2 * u)
          pairs += std::min(1.0, s[a] / u) * std::min(1.0, s[b] / u);
    std::vector<double> shuffled = t;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const double got = row_tie_excess(&shuffled, u, 4);
    EXPECT_NEAR(got, 2 * pairs, 1e-12 * 2 * pairs) << "n = " << n;
    EXPECT_TRUE(std::is_sorted(shuffled.begin(), shuffled.end()))
        << "n = " << n;
  }
}

AttentionCase paper_case(int64_t Nq, int64_t Nk, int64_t D, double g,
                         uint64_t seed) {
  AttentionProblem p = attention_shape(1, 1, Nq, Nk, D, g);
  p.mask = Mask{};
  return make_attention_case(p, Distribution::kGaussian, seed);
}

// The oracle without the two terms: no ties, no row normalization (the
// rule before them).
OracleAttention without_terms(OracleAttention o) {
  o.row_ties.clear();
  for (auto* x : {&o.dv_norm_sq_e, &o.dv_norm_lin_e, &o.dv_norm_lse_sq_e,
                  &o.dv_norm_lse_lin_e, &o.dv_norm_rep_e, &o.dk_rowmax_e,
                  &o.dk_sum_rowmax_e, &o.dk_norm_z_e, &o.dk_norm_lin_e,
                  &o.dk_norm_lse_lin_e, &o.dk_norm_rep_e})
    x->clear();
  return o;
}

AgreementReport judge(const Backend& b, const AttentionCase& c0,
                      const OracleAttention* oracle_override = nullptr) {
  const AttentionCase c = round_inputs(c0, b.precision());
  const OracleAttention orc = oracle_attention(c);
  const AttentionResult r = run_attention(b, c);
  return judge_attention(c, b.precision(),
                         oracle_override ? *oracle_override : orc, r, nullptr,
                         false, b.name(), "");
}

void expect_needs_terms(const char* entry, const AttentionCase& c0) {
  const Backend& b = *all_backends().find(entry);
  const AttentionCase c = round_inputs(c0, b.precision());
  const OracleAttention before = without_terms(oracle_attention(c));
  const AgreementReport without = judge(b, c0, &before);
  const AgreementReport with = judge(b, c0);
  std::printf("%s on %s: margin %.3f without the terms (%s), %.3f with\n",
              entry, c.describe().c_str(), without.margin,
              without.worst_field.c_str(), with.margin);
  EXPECT_FALSE(without.pass) << "the case no longer needs the terms";
  EXPECT_EQ(without.worst_field, "dv");
  EXPECT_TRUE(with.pass) << with.failure_message();
}

// Issue 33's reproducer: head_dim 1, so q_hat, k_hat = +-1, the logits
// +-g, and the row sum adds two values 2049 times (margin 1.62 before).
TEST(RepeatedSummands, HeadDim1FailedWithoutTheTerms) {
  expect_needs_terms("reference:f64",
                     paper_case(1, 2049, 1, 12.319672120946995, 475));
}

// Decode against 4096 distinct keys at g = 0.01: dV_j = P_1j dO_1 is one
// term, and P reads the stored lse, whose row sum's rounding dV's bound did
// not count (margin 1.95 before).
TEST(RepeatedSummands, DecodeFailedWithoutTheRowNormalization) {
  expect_needs_terms("reference:f64", paper_case(1, 4096, 64, 0.01, 7));
  expect_needs_terms("reference:f32", paper_case(1, 4096, 64, 1, 7));
}

// One key aligned with the query and n - 1 opposed (head_dim 1), at g
// where the opposed keys' term exp(-2 g) is 0.4 u_c of the first: added in
// key order, each is lost against the running sum 1, the same error n - 1
// times (0.4 (n - 1) u_c, 1638 u_c at n = 4096), where sum_units(n) = 516
// assumes independent errors. Only the tie term covers lse there.
AttentionCase lost_terms_case(Precision s) {
  const double u = compute_roundoff(s);
  const double g = (std::log(1 / u) - std::log(0.4)) / 2;
  AttentionCase c = paper_case(1, 4096, 1, g, 21);
  c.q[0] = 1;
  for (size_t j = 0; j < c.k.size(); ++j) c.k[j] = j == 0 ? 1 : -1;
  return c;
}

TEST(RepeatedSummands, LostTermsNeedTheTieTerm) {
  for (const char* entry : {"reference:f64", "reference:f32"}) {
    const Backend& b = *all_backends().find(entry);
    const AttentionCase c0 = lost_terms_case(b.precision());
    const AttentionCase c = round_inputs(c0, b.precision());
    OracleAttention no_ties = oracle_attention(c);
    ASSERT_GT(no_ties.row_ties.at(0), 0.0L);
    no_ties.row_ties.clear();
    const AgreementReport without = judge(b, c0, &no_ties);
    const AgreementReport with = judge(b, c0);
    std::printf(
        "%s, n - 1 lost terms: margin %.3f without ties (%s), %.3f "
        "with\n",
        entry, without.margin, without.worst_field.c_str(), with.margin);
    EXPECT_FALSE(without.pass);  // O and lse divide by the row sum
    EXPECT_TRUE(with.pass) << with.failure_message();
  }
}

// Distinct terms: no ties, and the bounds the tie term enters (o, lse, dq,
// dg) are bitwise the ones without it (dV and dK gain the row
// normalization whatever the ties). (g = 3 keeps
// every term of these rows far above u_c: at g = 12, f32 rows have terms
// near u_c that tie within a partial sum's spacing.)
TEST(RepeatedSummands, DistinctRowsKeepTheirBounds) {
  for (Precision s : {Precision::kF64, Precision::kF32}) {
    AttentionProblem p = attention_shape(2, 2, 33, 47, 16, 3);
    p.mask.causal = true;
    const AttentionCase c =
        round_inputs(make_attention_case(p, Distribution::kGaussian, 5), s);
    const OracleAttention orc = oracle_attention(c);
    ASSERT_EQ(orc.row_ties.size(), static_cast<size_t>(2 * 2 * 33));
    for (long double x : orc.row_ties) EXPECT_EQ(x, 0.0L);
    OracleAttention no_ties = orc;
    no_ties.row_ties.clear();
    const auto a = attention_tolerances(c, s, orc, false);
    const auto b = attention_tolerances(c, s, no_ties, false);
    ASSERT_EQ(a.size(), b.size());
    for (size_t f = 0; f < a.size(); ++f)
      for (size_t e = 0; e < a[f].delta.size() && a[f].field != Field::kDv &&
                         a[f].field != Field::kDk;
           ++e)
        ASSERT_EQ(a[f].delta[e], b[f].delta[e]) << name(a[f].field) << e;
  }
}

// Long rows of repeated or near-equal summands, every entry that supports
// them: head_dim 1 (two values), repeated tokens (8 distinct key and value
// rows, each 256 times), a near-uniform softmax (g = 0.01).
TEST(RepeatedSummands, EveryEntryPassesLongRepeatedRows) {
  std::vector<AttentionCase> cases;
  cases.push_back(paper_case(1, 4096, 1, 12.319672120946995, 11));
  {
    AttentionCase c = paper_case(4, 2048, 64, 20, 12);
    const size_t D = 64;
    for (size_t j = 8; j < 2048; ++j)
      for (size_t d = 0; d < D; ++d) {
        c.k[j * D + d] = c.k[(j % 8) * D + d];
        c.v[j * D + d] = c.v[(j % 8) * D + d];
      }
    cases.push_back(c);
  }
  cases.push_back(paper_case(2, 4096, 64, 0.01, 13));
  cases.push_back(lost_terms_case(Precision::kF64));
  cases.push_back(lost_terms_case(Precision::kF32));
  int judged = 0;
  // check_attention(*b, c, {}, false, false) on every entry, the entries of
  // one precision judged together on one oracle (test_support.h).
  for (const AttentionCase& c : cases)
    for (Precision prec : kAllPrecisions) {
      std::vector<const Backend*> entries;
      for (const Backend* b : all_backends().entries())
        if (b->precision() == prec && b->available() && b->supports(c.problem))
          entries.push_back(b);
      test_support::check_entries(
          entries, c, prec, [&](const Backend& b, const AgreementReport& rep) {
            EXPECT_TRUE(rep.pass) << rep.failure_message();
            std::printf("%-18s %-40.40s margin %.3f (%s)\n", b.name().c_str(),
                        c.describe().c_str(), rep.margin,
                        rep.worst_field.c_str());
            ++judged;
          });
    }
  EXPECT_GT(judged, 0);
}

}  // namespace
}  // namespace qknorm::validation
