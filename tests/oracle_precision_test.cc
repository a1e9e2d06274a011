// The oracle's precision (issue 32; validation/oracle.h, OraclePrecision):
// the double oracle that judges the f32, bf16 and f16 entries agrees with
// the long-double oracle within the rule's oracle channel (validation/rule.h:
// u_oracle times the oracle's own magnitudes), an oracle coarser than the
// unit roundoff it claims breaks that check, and an f64 entry judged
// against a double oracle gets the double oracle's channel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "qknorm/formulation.h"
#include "tests/test_support.h"
#include "validation/case.h"
#include "validation/oracle.h"
#include "validation/rule.h"

namespace qknorm::validation {
namespace {

OracleAttention oracle_as(const AttentionCase& c, OraclePrecision prec) {
  OracleOptions opt;
  opt.precision = prec;
  return oracle_attention(c, nullptr, {}, nullptr, opt);
}

// The oracle channel of every element of every table, judged as precision
// s. rule.cc adds the oracle's unit roundoff, resolution and tiny times its
// terms to each delta once, so delta is affine in their common scale
// (OracleAttention::unit_roundoff, with the other two in proportion) and
// the channel is its slope times the oracle's unit roundoff: (delta at u = 2^k
// minus delta at 0) / 2^k, for the smallest k in {20, 200, ..., 800} at which
// the channel dominates the delta (the difference then keeps its digits; an
// element whose absolute terms are far above its magnitudes needs a large k).
// NaN where no such delta is finite (an unresolved element has no channel).
std::vector<std::vector<double>> channel(const AttentionCase& c, Precision s,
                                         const OracleAttention& o) {
  OracleAttention none = o;
  none.unit_roundoff = none.resolution = none.tiny = 0;
  const auto without = attention_tolerances(c, s, none, false);
  std::vector<std::vector<double>> out(without.size());
  for (size_t t = 0; t < without.size(); ++t)
    out[t].assign(without[t].delta.size(), NAN);
  for (int k : {20, 200, 400, 600, 800}) {
    OracleAttention big = o;
    big.unit_roundoff = std::ldexp(1.0, k);
    big.resolution = std::ldexp(o.resolution / o.unit_roundoff, k);
    big.tiny = std::ldexp(o.tiny / o.unit_roundoff, k);
    const auto with = attention_tolerances(c, s, big, false);
    for (size_t t = 0; t < with.size(); ++t)
      for (size_t e = 0; e < with[t].delta.size(); ++e) {
        const double a = with[t].delta[e], b = without[t].delta[e];
        if (!std::isnan(out[t][e]) || !std::isfinite(a)) continue;
        if (a - b > b || k == 800)
          out[t][e] = std::ldexp(a - b, -k) * o.unit_roundoff;
      }
  }
  return out;
}

// Elements where |x_narrow - x_wide| exceeds both oracles' channels (the
// wide one's is its own error, 2^-64 times the same magnitudes); the worst
// ratio into *worst, and (print) the first few such elements.
int64_t violations(const AttentionCase& c, Precision s,
                   const OracleAttention& narrow, const OracleAttention& wide,
                   double* worst, std::string* where, bool print) {
  const auto tn = attention_tolerances(c, s, narrow, false);
  const auto tw = attention_tolerances(c, s, wide, false);
  const auto cn = channel(c, s, narrow), cw = channel(c, s, wide);
  EXPECT_EQ(tn.size(), tw.size());
  int64_t bad = 0;
  for (size_t t = 0; t < tn.size() && t < tw.size(); ++t) {
    EXPECT_EQ(tn[t].expected.size(), tw[t].expected.size());
    for (size_t e = 0; e < tn[t].expected.size(); ++e) {
      const long double x = tn[t].expected[e], y = tw[t].expected[e];
      const double ch = cn[t][e] + cw[t][e];
      if (!std::isfinite(ch) || !std::isfinite(y)) continue;
      const double err = static_cast<double>(std::fabs(x - y));
      const double ratio = err == 0 ? 0 : err / ch;
      if (!(ratio <= 1)) {
        if (print && bad < 5)
          std::printf("%s[%zu] %.17Lg %.17Lg ch %g %g delta %g\n",
                      name(tn[t].field), e, x, y, cn[t][e], cw[t][e],
                      tn[t].delta[e]);
        ++bad;
      }
      if (!(ratio <= *worst)) {
        *worst = ratio;
        *where = std::string(name(tn[t].field)) + "[" + std::to_string(e) +
                 "] of " + c.describe();
      }
    }
  }
  return bad;
}

// The default run's distributions, masks, GQA and formulations.
std::vector<AttentionCase> sweep(Precision storage) {
  std::vector<AttentionCase> out;
  const Distribution dists[] = {
      Distribution::kGaussian,      Distribution::kHeavyTailed,
      Distribution::kSink,          Distribution::kChannels,
      Distribution::kWideMagnitude, Distribution::kOutlierRows,
      Distribution::kZeroRows,      Distribution::kMixedScaleV};
  const char* forms[] = {"", "olmo2", "gemma3", "qwen3", "chameleon", "sdpa"};
  uint64_t seed = 3200;
  int k = 0;
  for (Distribution dist : dists)
    for (const char* f : forms) {
      AttentionProblem p;
      p.batch = 1 + k % 2, p.heads = 4, p.q_len = 19 + k % 5,
      p.kv_len = 23 - k % 7, p.head_dim = 16;
      p.g = 12;
      p.eps = 1e-12;
      if (std::string(f) == "sdpa") {
        p.variant = Variant::kSDPA;
      } else if (*f != '\0') {
        apply_preset(f, &p);
      }
      p.mask.causal = k % 3 == 1;
      if (k % 3 == 2)
        for (int64_t b = 0; b < p.batch; ++b)
          p.mask.key_lengths.push_back(p.kv_len - 3 * b - 2);
      if (k % 2 == 1 && !p.norm.shared_qk_weight &&
          p.norm.axis == NormAxis::kHead)
        p.kv_heads = 2;  // GQA
      ++k;
      out.push_back(
          round_inputs(make_attention_case(p, dist, seed++, storage), storage));
    }
  return out;
}

TEST(OraclePrecision, DoubleAgreesWithLongDoubleWithinTheChannel) {
  int64_t cases = 0, bad = 0;
  double worst = 0;
  std::string where;
  for (Precision s : {Precision::kF32, Precision::kBF16})
    for (const AttentionCase& c : sweep(s)) {
      const OracleAttention d = oracle_as(c, OraclePrecision::kDouble);
      const OracleAttention l = oracle_as(c, OraclePrecision::kLongDouble);
      ASSERT_EQ(d.unit_roundoff, 0x1p-53);
      ASSERT_EQ(l.unit_roundoff, 0x1p-64);
      bad += violations(c, s, d, l, &worst, &where, true);
      ++cases;
    }
  std::printf("%lld cases: worst |double - long double| / channel %.3g (%s)\n",
              static_cast<long long>(cases), worst, where.c_str());
  EXPECT_EQ(bad, 0) << "worst " << worst << " at " << where;
  EXPECT_GT(worst, 0);  // the oracles differ: the check measured something
}

// Teeth: the same check on a float oracle that claims double's unit
// roundoff fails (an oracle error too large for its channel is caught).
TEST(OraclePrecision, FloatOracleClaimingDoubleFails) {
  int64_t bad = 0;
  double worst = 0;
  std::string where;
  for (const AttentionCase& c : sweep(Precision::kBF16)) {
    OracleAttention f = oracle_as(c, OraclePrecision::kFloat);
    ASSERT_EQ(f.unit_roundoff, 0x1p-24);
    f.unit_roundoff = 0x1p-53;
    const OracleAttention l = oracle_as(c, OraclePrecision::kLongDouble);
    bad += violations(c, Precision::kBF16, f, l, &worst, &where, false);
  }
  EXPECT_GT(bad, 0);
  EXPECT_GT(worst, 1e3);
}

// kAuto: double for f32, bf16 and f16 storage, long double for f64 and for
// the formulations that round x_hat to 16-bit storage (oracle.h), and for
// inputs outside f32's range whatever the storage label says.
TEST(OraclePrecision, AutoPicksThePrecisionTheEntryNeeds) {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 9, p.kv_len = 11, p.head_dim = 8;
  p.g = 10;
  const AttentionCase c = make_attention_case(p, Distribution::kGaussian, 7);
  for (Precision s : {Precision::kF32, Precision::kBF16, Precision::kF16})
    EXPECT_EQ(oracle_attention(round_inputs(c, s)).unit_roundoff, 0x1p-53);
  EXPECT_EQ(oracle_attention(round_inputs(c, Precision::kF64)).unit_roundoff,
            0x1p-64);
  AttentionCase big = round_inputs(c, Precision::kF32);
  big.v[3] = 1e300;  // not an f32 value: double's range argument is void
  EXPECT_EQ(oracle_attention(big).unit_roundoff, 0x1p-64);
  AttentionProblem q = p;
  apply_preset("qwen3", &q);
  const AttentionCase cq = make_attention_case(q, Distribution::kGaussian, 8);
  EXPECT_EQ(oracle_attention(round_inputs(cq, Precision::kBF16)).unit_roundoff,
            0x1p-64);
  EXPECT_EQ(oracle_attention(round_inputs(cq, Precision::kF32)).unit_roundoff,
            0x1p-53);
}

// An f64 entry judged against a double oracle is never judged as if the
// oracle were long double: its channel grows by u_f64 / u_ld = 2^11.
TEST(OraclePrecision, F64EntryAgainstDoubleOracleWidensTheChannel) {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 13, p.kv_len = 17, p.head_dim = 16;
  p.g = 15;
  const AttentionCase c = round_inputs(
      make_attention_case(p, Distribution::kGaussian, 9), Precision::kF64);
  const OracleAttention d = oracle_as(c, OraclePrecision::kDouble);
  const OracleAttention l = oracle_as(c, OraclePrecision::kLongDouble);
  const auto cd = channel(c, Precision::kF64, d),
             cl = channel(c, Precision::kF64, l);
  int64_t checked = 0;
  for (size_t t = 0; t < cd.size(); ++t)
    for (size_t e = 0; e < cd[t].size(); ++e) {
      if (!(cl[t][e] > 0)) continue;
      EXPECT_NEAR(cd[t][e] / cl[t][e], 2048, 2048 * 1e-3) << t << " " << e;
      ++checked;
    }
  EXPECT_GT(checked, 100);
}

// A sub-case oracle reading its operands from the whole case's
// (SharedOperands: the sampled verdict's sub-cases) gives the same bits as
// one that normalizes its own, per head and across heads, in double and in
// long double.
TEST(OraclePrecision, SharedOperandsGiveTheSubCasesOwnBits) {
  for (const char* f : {"", "olmo2", "gemma3"})
    for (Precision s : {Precision::kF32, Precision::kF64}) {
      AttentionProblem p;
      p.batch = 2, p.heads = 4, p.q_len = 13, p.kv_len = 17, p.head_dim = 8;
      p.g = 9;
      if (*f != '\0') apply_preset(f, &p);
      const bool across = p.norm.axis == NormAxis::kAllHeads;
      if (!across) p.kv_heads = 2;
      const AttentionCase c =
          round_inputs(make_attention_case(p, Distribution::kGaussian, 11), s);
      const int64_t Hk = kv_heads_of(p), b = 1;
      const int64_t qh0 = across ? 0 : 2, qhn = across ? p.heads : 2;
      const int64_t kh0 = across ? 0 : 1, khn = across ? Hk : 1;
      const int64_t i0 = 5, nq = 4, j0 = 3, nk = 11;
      const AttentionCase sc =
          test_support::block_of(c, b, qh0, qhn, i0, nq, kh0, khn, j0, nk);
      const SharedOperands shared(c);
      OracleOptions opt;
      opt.sub = {&shared, b, qh0, i0, kh0, j0};
      OracleWorkspace ws;
      const RowCounts counts{p.q_len, p.kv_len, true, false};
      const OracleAttention own = oracle_attention(sc, nullptr, counts, &ws);
      const OracleAttention from =
          oracle_attention(sc, nullptr, counts, &ws, opt);
      EXPECT_EQ(own.unit_roundoff, from.unit_roundoff);
      EXPECT_EQ(own.unit_roundoff, s == Precision::kF64 ? 0x1p-64 : 0x1p-53);
      for (auto x :
           {&OracleAttention::o, &OracleAttention::lse, &OracleAttention::dq,
            &OracleAttention::dq_mag, &OracleAttention::dq_uf_sens_e,
            &OracleAttention::dq_shift_e, &OracleAttention::dq_flip_e})
        EXPECT_TRUE(own.*x == from.*x) << f << " " << name(s);
      EXPECT_FALSE(own.o.empty());
    }
}

// The attention fuzzer computes one oracle for the f32, bf16 and f16
// entries whose rounded inputs coincide (oracle_storage_equivalent, issue
// 32): judged against another equivalent storage's oracle, an entry gets
// exactly the expected values and bounds of its own. A formulation that
// rounds x_hat to 16-bit storage (qwen3) is not equivalent: its bf16 oracle
// runs in long double, its f32 oracle in double.
TEST(OraclePrecision, StorageEquivalentOraclesJudgeAlike) {
  const Precision all[] = {Precision::kF32, Precision::kBF16, Precision::kF16};
  for (const char* f : {"", "gemma3", "chameleon", "qwen3"}) {
    AttentionProblem p;
    p.batch = 1, p.heads = 4, p.q_len = 7, p.kv_len = 9, p.head_dim = 8;
    p.g = 11;
    p.mask.causal = true;
    if (*f != '\0') apply_preset(f, &p);
    const bool rounds = std::string(f) == "qwen3";
    // Values every one of the three formats holds exactly.
    const AttentionCase exact = round_inputs(
        round_inputs(make_attention_case(p, Distribution::kGaussian, 12),
                     Precision::kBF16),
        Precision::kF16);
    for (Precision a : all)
      for (Precision b : all) {
        const AttentionCase ca = round_inputs(exact, a);
        const AttentionCase cb = round_inputs(exact, b);
        ASSERT_TRUE(ca.q == cb.q && ca.k == cb.k && ca.v == cb.v &&
                    ca.d_o == cb.d_o && ca.q_weight == cb.q_weight &&
                    ca.k_weight == cb.k_weight && ca.q_bias == cb.q_bias &&
                    ca.k_bias == cb.k_bias);
        const bool same = oracle_storage_equivalent(p, a, b);
        EXPECT_EQ(same, a == b || !rounds) << f << name(a) << name(b);
        const OracleAttention oa = oracle_attention(ca);
        const OracleAttention ob = oracle_attention(cb);
        if (!same) {
          if (a == Precision::kF32) {
            EXPECT_NE(oa.unit_roundoff, ob.unit_roundoff);
          }
          continue;
        }
        const auto ta = attention_tolerances(cb, b, oa, false);
        const auto tb = attention_tolerances(cb, b, ob, false);
        ASSERT_EQ(ta.size(), tb.size());
        // The doubles bitwise (a NaN equals itself); the long double
        // expected values by value (their padding bytes are unspecified).
        auto same_bits = [](const std::vector<double>& x,
                            const std::vector<double>& y) {
          return x.size() == y.size() &&
                 (x.empty() ||
                  std::memcmp(x.data(), y.data(), x.size() * sizeof x[0]) == 0);
        };
        for (size_t t = 0; t < ta.size(); ++t)
          EXPECT_TRUE(ta[t].expected == tb[t].expected &&
                      same_bits(ta[t].delta, tb[t].delta) &&
                      same_bits(ta[t].cond, tb[t].cond))
              << f << " " << name(a) << " " << name(b) << " table " << t;
      }
  }
}

}  // namespace
}  // namespace qknorm::validation
