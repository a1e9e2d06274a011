// Non-finite classification against the finite bound (issue 31, the soak
// finding): an infinity of sign s passes exactly where the bound's interval
// [x - delta, x + delta] reaches the format's overflow threshold on that
// side, whatever the sign of x; NaN never passes. judge_element on
// hand-built tables, then the soak's own case: reference:f16 on the
// LongSequence problem where it returned +inf for dk[128,3] (oracle
// -1.94e6, delta 6.9e8), sampled as the property samples it.
#include "validation/judge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "validation/case.h"
#include "validation/metrics.h"
#include "validation/oracle.h"
#include "validation/rng.h"
#include "validation/rule.h"
#include "validation/run.h"
#include "validation/sampled.h"

namespace qknorm::validation {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One f16 dk element of oracle value x and pre-rounding bound delta.
ToleranceTable f16_element(long double x, double delta) {
  ToleranceTable t = empty_table(Field::kDk, Precision::kF16, 1, 1, 1, 1);
  t.expected = {x};
  t.delta = {delta};
  t.cond = {1};
  return t;
}

ElementClass cls(const ToleranceTable& t, double actual) {
  return judge_element(t, 0, actual).cls;
}

TEST(OverflowThreshold, IsWhereRoundToNearestGivesInf) {
  // f16: 65504 + 32 / 2; the tie rounds to inf (65504's last bit is odd).
  EXPECT_EQ(overflow_threshold(Precision::kF16), 65520.0L);
  EXPECT_EQ(round_to(Precision::kF16, 65520.0), kInf);
  EXPECT_EQ(round_to(Precision::kF16, std::nextafter(65520.0, 0.0)), 65504.0);
  for (Precision p : {Precision::kBF16, Precision::kF32}) {
    const double t = static_cast<double>(overflow_threshold(p));
    EXPECT_EQ(round_to(p, t), kInf) << name(p);
    EXPECT_EQ(round_to(p, std::nextafter(t, 0.0)), max_finite(p)) << name(p);
  }
}

// The soak's element: x = -1.94e6, delta = 6.9e8. Its interval reaches both
// thresholds, so both infinities are correct roundings of values within it
// (the reference's pre-rounding f32 value was +3114866.5).
TEST(JudgeElement, InfinityOppositeToXPassesWhereTheIntervalReachesIt) {
  const ToleranceTable t = f16_element(-1939570.3057895054L, 6.884373e8);
  EXPECT_EQ(cls(t, kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(t, -kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(t, kNaN), ElementClass::kWrongNonFinite);
  // A finite value is judged by the finite bound against x clamped.
  EXPECT_EQ(cls(t, 60000), ElementClass::kWithin);
  // Mirrored: -inf for a positive x.
  const ToleranceTable m = f16_element(1939570.3057895054L, 6.884373e8);
  EXPECT_EQ(cls(m, -kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(m, kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(m, kNaN), ElementClass::kWrongNonFinite);
}

// The threshold itself decides, on each side, for x of either sign.
TEST(JudgeElement, InfinityPassesExactlyFromTheThreshold) {
  // x + delta = 65520: +inf passes; -inf does not (x - delta = -65320).
  const ToleranceTable reaches = f16_element(100, 65420);
  EXPECT_EQ(cls(reaches, kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(reaches, -kInf), ElementClass::kWrongNonFinite);
  // One f64 ulp of delta short of it: neither.
  const ToleranceTable short_of =
      f16_element(100, std::nextafter(65420.0, 0.0));
  EXPECT_EQ(cls(short_of, kInf), ElementClass::kWrongNonFinite);
  EXPECT_EQ(cls(short_of, -kInf), ElementClass::kWrongNonFinite);
  // Mirrored: x - delta = -65520.
  const ToleranceTable below = f16_element(-100, 65420);
  EXPECT_EQ(cls(below, -kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(below, kInf), ElementClass::kWrongNonFinite);
  // A negative x whose interval reaches +65520 too: both infinities.
  const ToleranceTable both = f16_element(-100, 65620);
  EXPECT_EQ(cls(both, kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(both, -kInf), ElementClass::kNotRepresentable);
  for (const ToleranceTable* t : {&reaches, &short_of, &below, &both})
    EXPECT_EQ(cls(*t, kNaN), ElementClass::kWrongNonFinite);
}

// x beyond the range with a small bound: only its own infinity; a finite
// value is held to the clamped x (65504 is far from -65504).
TEST(JudgeElement, OverflowingXWithASmallBound) {
  const ToleranceTable t = f16_element(-1e6, 1000);
  EXPECT_EQ(cls(t, -kInf), ElementClass::kNotRepresentable);
  EXPECT_EQ(cls(t, kInf), ElementClass::kWrongNonFinite);
  EXPECT_EQ(cls(t, kNaN), ElementClass::kWrongNonFinite);
  EXPECT_EQ(cls(t, -65504), ElementClass::kWithin);
  EXPECT_EQ(cls(t, 65504), ElementClass::kOver);
}

// Even an unbounded element (delta = inf: the softmax unresolved) never
// passes NaN.
TEST(JudgeElement, NaNNeverPasses) {
  for (double delta : {0.0, 1.0, 1e9, kInf})
    for (long double x : {0.0L, -3.0L, 1e6L})
      EXPECT_EQ(cls(f16_element(x, delta), kNaN), ElementClass::kWrongNonFinite)
          << "x " << static_cast<double>(x) << " delta " << delta;
}

// The field's counts and the message of a rejected infinity: no "it is
// representable" where x rounds to inf itself.
TEST(JudgeField, CountsAndDiagnosesInfinities) {
  ToleranceTable t = f16_element(-1939570.3057895054L, 6.884373e8);
  t.expected.push_back(-1e6L);
  t.delta.push_back(1000);
  t.expected.push_back(100.0L);
  t.delta.push_back(1);
  t.cond = {1, 1, 1};
  t.cols = 3;
  const FieldVerdict ok = judge_field(t, {kInf, -kInf, 100}, nullptr);
  EXPECT_TRUE(ok.pass);
  EXPECT_EQ(ok.not_representable, 2);
  const FieldVerdict bad = judge_field(t, {kInf, kInf, 100}, nullptr);
  EXPECT_FALSE(bad.pass);
  EXPECT_EQ(bad.failures, 1);
  EXPECT_EQ(bad.worst_where, "[0,1]");
  EXPECT_NE(bad.diagnosis.find("it rounds to -inf in f16"), std::string::npos)
      << bad.diagnosis;
  EXPECT_NE(bad.diagnosis.find("overflow threshold +65520"), std::string::npos)
      << bad.diagnosis;
  EXPECT_EQ(bad.diagnosis.find("representable"), std::string::npos)
      << bad.diagnosis;
  const FieldVerdict rep = judge_field(t, {kInf, -kInf, kInf}, nullptr);
  EXPECT_NE(rep.diagnosis.find("it is representable in f16"), std::string::npos)
      << rep.diagnosis;
}

// The soak's case, as Registry/EntryProperty.LongSequence/reference_f16 drew
// and sampled it (property_tests/properties.cc, long_sequence).
TEST(SoakFinding, ReferenceF16PassesTheLongSequenceCase) {
  const Backend& b = naive_for(Precision::kF16);
  ASSERT_EQ(b.name(), "reference:f16");
  const Precision s = b.precision();
  const AttentionProblem p = attention_shape(1, 1, 221, 490, 128, 26);
  const uint64_t seed = 24161866;
  const AttentionCase c =
      round_inputs(make_attention_case(p, Distribution::kZeroRows, seed, s), s);
  SampleOptions opt;
  opt.rows = 12;
  opt.seed = seed + 1;
  opt.blocks = b.block_sizes(p);
  const SampledOracle so = sampled_oracle(c, s, opt);
  const AttentionResult r = run_attention(b, c);
  // The element the soak found: +inf where the oracle gives -1.94e6.
  ASSERT_EQ(r.dk[128 * 128 + 3], kInf);
  const AgreementReport rep = judge_sampled(c, so, r, b.name());
  EXPECT_TRUE(rep.pass) << rep.failure_message();
  bool found = false;
  for (const FieldVerdict& f : rep.fields)
    if (f.id == Field::kDk && f.property == nullptr) {
      found = true;
      EXPECT_GE(f.not_representable, 1);
    }
  EXPECT_TRUE(found) << "no sampled dk field";
}

// compare()'s order statistics come from a bucket count and a selection
// within one bucket (validation/metrics.cc), judge_field's judgements from a
// rule derived once per element for the entry and the naive: both must be
// exactly what the definitions give. Here the definitions are recomputed
// the plain way (every ulp error sorted; judge_element per element) on
// random fields with ties, zeros, infinities, NaNs and masked rows, in
// every format, at sizes from 1 to 5000.
TEST(Statistics, SameAsTheirPlainDefinitions) {
  Rng rng(5);
  for (Precision fmt : kAllPrecisions)
    // 40000: above order_statistics' bucket threshold (2^15), the rest below.
    for (size_t n : {1, 2, 3, 7, 100, 5000, 40000}) {
      ToleranceTable t =
          empty_table(Field::kO, fmt, 1, 1, 1, static_cast<int64_t>(n));
      std::vector<double> actual(n), naive(n);
      const double mf = max_finite(fmt);
      for (size_t i = 0; i < n; ++i) {
        const int64_t kind =
            rng.uniform_int(0, 399);  // specials rare: p99 finite
        long double x =
            rng.normal() *
            std::ldexp(1.0, static_cast<int>(rng.uniform_int(-20, 4)));
        if (kind == 0) x = 0;
        if (kind == 1) x = -std::numeric_limits<long double>::infinity();
        if (kind == 2) x = mf * (1 - 0x1p-12);  // its bound reaches overflow
        t.expected.push_back(x);
        t.delta.push_back(kind == 2 ? mf * 0x1p-8 : 0x1p-20 * rng.uniform());
        t.cond.push_back(1);
        // Quantized errors: many equal ulp errors (ties in a bucket).
        const double err =
            std::ldexp(static_cast<double>(rng.uniform_int(0, 8)),
                       static_cast<int>(rng.uniform_int(-30, -18)));
        actual[i] = static_cast<double>(x) + (rng.uniform() < 0.5 ? err : -err);
        naive[i] = static_cast<double>(x) - err / 2;
        if (kind == 3) actual[i] = kNaN;
        if (kind == 4) actual[i] = kInf;
        if (kind == 2 && rng.uniform() < 0.5) actual[i] = kInf;
      }
      const ErrorStats st = compare(actual, t.expected, fmt);
      std::vector<double> ulps;
      for (size_t i = 0; i < n; ++i) {
        const long double e = t.expected[i];
        if (!std::isfinite(e)) continue;
        const double err = std::isfinite(actual[i])
                               ? static_cast<double>(std::fabs(actual[i] - e))
                               : kInf;
        ulps.push_back(err / ulp(fmt, static_cast<double>(e)));
      }
      std::sort(ulps.begin(), ulps.end());
      auto at = [&](double q) {
        return ulps[static_cast<size_t>(
            q * static_cast<double>(ulps.size() - 1) + 0.5)];
      };
      if (!ulps.empty()) {
        EXPECT_EQ(st.ulp_p50, at(0.5)) << name(fmt) << " n=" << n;
        EXPECT_EQ(st.ulp_p99, at(0.99)) << name(fmt) << " n=" << n;
        EXPECT_EQ(st.ulp_max, ulps.back()) << name(fmt) << " n=" << n;
      }
      const FieldVerdict v = judge_field(t, actual, &naive);
      double margin = -1, naive_margin = 0;
      int64_t worst = -1, failures = 0, not_representable = 0;
      for (size_t i = 0; i < n; ++i) {
        const ElementJudgement j = judge_element(t, i, actual[i]);
        if (j.margin > margin) {
          margin = j.margin;
          worst = static_cast<int64_t>(i);
        }
        failures += passes(j.cls) ? 0 : 1;
        not_representable += j.cls == ElementClass::kNotRepresentable;
        naive_margin =
            std::max(naive_margin, judge_element(t, i, naive[i]).margin);
      }
      EXPECT_EQ(v.margin, std::max(margin, 0.0)) << name(fmt) << " n=" << n;
      EXPECT_EQ(v.worst_index, worst) << name(fmt) << " n=" << n;
      EXPECT_EQ(v.failures, failures) << name(fmt) << " n=" << n;
      EXPECT_EQ(v.not_representable, not_representable);
      EXPECT_EQ(v.naive_margin, naive_margin) << name(fmt) << " n=" << n;
      EXPECT_EQ(v.naive.ulp_p99, compare(naive, t.expected, fmt).ulp_p99);
    }
}

// judge_attention judges every entry of a case through one PreparedAttention
// (the suite shares it across a precision's entries): each field's verdict
// must be judge_field's on the same table, entry and naive values.
TEST(PreparedAttention, SameAsJudgeFieldPerField) {
  const Precision s = Precision::kF32;
  const AttentionProblem p = attention_shape(1, 2, 24, 24, 16, 12);
  const AttentionCase c =
      round_inputs(make_attention_case(p, Distribution::kGaussian, 7, s), s);
  const OracleAttention orc = oracle_attention(c);
  // blas:f32: in every build (simd:SCALAR is not in the Clang fuzz build,
  // whose simd targets are AVX3, AVX2 and SSE4).
  const Backend* entry = all_backends().find("blas:f32");
  ASSERT_NE(entry, nullptr);
  const AttentionResult er = run_attention(*entry, c);
  const AttentionResult nr = run_attention(naive_for(s), c);
  const PreparedAttention prep =
      prepare_attention(c, s, orc, &nr, false, "naive");
  const AgreementReport rep = judge_attention(prep, c, s, orc, er, "e");
  ASSERT_EQ(rep.fields.size(), prep.tables.size());
  auto same = [](const ErrorStats& a, const ErrorStats& b) {
    return a.count == b.count && a.max_abs == b.max_abs &&
           a.max_rel == b.max_rel && a.rel_floor == b.rel_floor &&
           a.normwise == b.normwise && a.ulp_p50 == b.ulp_p50 &&
           a.ulp_p99 == b.ulp_p99 && a.ulp_max == b.ulp_max &&
           a.worst_index == b.worst_index &&
           a.worst_expected == b.worst_expected &&
           a.worst_actual == b.worst_actual && a.scale == b.scale &&
           a.nonfinite_mismatch == b.nonfinite_mismatch;
  };
  for (size_t k = 0; k < prep.tables.size(); ++k) {
    const ToleranceTable& t = prep.tables[k];
    auto values = [&](const AttentionResult& r) {
      const std::span<const double> x = field_values(r, t.field);
      return std::vector<double>(x.begin(), x.end());
    };
    const std::vector<double> naive = values(nr);
    const FieldVerdict want = judge_field(t, values(er), &naive);
    const FieldVerdict& got = rep.fields[k];
    EXPECT_TRUE(same(got.entry, want.entry)) << name(t.field);
    EXPECT_TRUE(same(got.naive, want.naive)) << name(t.field);
    EXPECT_EQ(got.has_naive, want.has_naive);
    EXPECT_EQ(got.naive_margin, want.naive_margin) << name(t.field);
    EXPECT_EQ(got.margin, want.margin) << name(t.field);
    EXPECT_EQ(got.worst_index, want.worst_index) << name(t.field);
    EXPECT_EQ(got.worst_bound, want.worst_bound) << name(t.field);
    EXPECT_EQ(got.failures, want.failures) << name(t.field);
    EXPECT_EQ(got.ill_conditioned, want.ill_conditioned);
    EXPECT_GT(got.naive_margin, 0) << name(t.field);  // the naive was judged
  }
}

}  // namespace
}  // namespace qknorm::validation
