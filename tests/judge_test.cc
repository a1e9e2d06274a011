// Non-finite classification against the finite bound (issue 31, the soak
// finding): an infinity of sign s passes exactly where the bound's interval
// [x - delta, x + delta] reaches the format's overflow threshold on that
// side, whatever the sign of x; NaN never passes. judge_element on
// hand-built tables, then the soak's own case: reference:f16 on the
// LongSequence problem where it returned +inf for dk[128,3] (oracle
// -1.94e6, delta 6.9e8), sampled as the property samples it.
#include "validation/judge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "validation/case.h"
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

}  // namespace
}  // namespace qknorm::validation
