// The diagnoses of validation/diagnose.h (issue 31): each provoked by a
// mutant of mutants/ whose bug is that cause, its message asserted; a
// correct entry gets none, and a mutant of another kind does not get a
// wrong one. (The example plug-ins' diagnoses are asserted by their ctest
// runs of qknorm-check: examples/plugin_c/CMakeLists.txt.)
#include <gtest/gtest.h>

#include <string>

#include "mutants/mutants.h"
#include "validation/check.h"

namespace qknorm::validation {
namespace {

const Backend& mutant(const std::string& name) {
  const Backend* b = property::mutant_registry().find(name);
  if (b == nullptr) b = property::control_registry().find(name);
  if (b == nullptr) throw std::runtime_error("no entry " + name);
  return *b;
}

// A small case: q_len = kv_len = 40 (a partial last block of 8 rows after
// two full blocks of 16), causal unless `pad`.
AttentionCase small(Distribution dist, uint64_t seed, int64_t kv_heads = 0,
                    bool causal = true) {
  AttentionProblem p = attention_shape(2, 4, 40, 40, 16, 12);
  p.kv_heads = kv_heads;
  p.mask.causal = causal;
  return make_attention_case(p, dist, seed, Precision::kF32);
}

bool has(const AgreementReport& r, DiagnosisKind k) {
  for (const Diagnosis& d : r.diagnoses)
    if (d.kind == k) return true;
  return false;
}

std::string first_message(const AgreementReport& r, DiagnosisKind k) {
  for (const Diagnosis& d : r.diagnoses)
    if (d.kind == k) return d.message;
  return "";
}

// Records the first diagnosis's message in the gtest output
// (--gtest_output=json:FILE, property "diagnosis"): the messages a release
// note quotes come from this test's own cases.
void record(const AgreementReport& r) {
  if (!r.diagnoses.empty())
    testing::Test::RecordProperty("diagnosis", r.diagnoses[0].message);
}

std::string all(const AgreementReport& r) {
  std::string s = r.failure_message();
  if (r.diagnoses.empty()) s += "(no diagnosis)";
  return s;
}

TEST(Diagnose, CorrectEntryHasNone) {
  for (const char* name : {"control:plain:f32", "control:blocked:f32"}) {
    const AgreementReport r =
        check_attention(mutant(name), small(Distribution::kWideMagnitude, 3));
    EXPECT_TRUE(r.pass) << all(r);
    EXPECT_TRUE(r.diagnoses.empty()) << all(r);
    EXPECT_EQ(r.failure_message(), "");
  }
}

TEST(Diagnose, NormRangeOnFarRows) {
  // The backward's 1/||x|| by a 12-bit estimate for rows above 2^64: the
  // failing dq, dk rows are exactly the rows whose f32 sum of squares
  // overflows.
  const AgreementReport r =
      check_attention(mutant("mutant:far_norm_rsqrt_estimate:f32"),
                      small(Distribution::kWideMagnitude, 5));
  ASSERT_FALSE(r.pass);
  ASSERT_FALSE(r.diagnoses.empty()) << all(r);
  EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kNormRange) << all(r);
  record(r);
  EXPECT_NE(r.diagnoses[0].message.find("failing rows (dq, dk) are exactly "
                                        "q/k rows with ||x|| > 1.8e+19, "
                                        "where the f32 sum of squares "
                                        "overflows"),
            std::string::npos)
      << all(r);
  EXPECT_NE(r.failure_message().find("likely cause: norm overflow"),
            std::string::npos);
}

TEST(Diagnose, NonFiniteOnFullyMaskedRows) {
  // f16 masks at -1e9 = -inf: a fully masked row's softmax is 0/0. The
  // forward alone (a NaN O is refused as the backward's input).
  AttentionProblem p = attention_shape(1, 2, 12, 5, 8, 12);
  p.mask.causal = true;  // kv_len < q_len: rows 0..6 see no key
  const AgreementReport r = check_attention(
      mutant("mutant:f16_mask_to_inf:f16"),
      make_attention_case(p, Distribution::kGaussian, 7, Precision::kF16), {},
      /*forward_only=*/true);
  ASSERT_FALSE(r.pass);
  ASSERT_FALSE(r.diagnoses.empty()) << all(r);
  EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kMaskedRowNonFinite);
  record(r);
  EXPECT_NE(r.diagnoses[0].message.find(
                "non-finite o/lse/dq failures sit on 14 fully masked query "
                "rows"),
            std::string::npos)
      << all(r);
}

TEST(Diagnose, SixteenBitAccumulators) {
  for (const char* name :
       {"mutant:pv_accum_bf16:bf16", "mutant:dv_accum_bf16:f32"}) {
    const Backend& e = mutant(name);
    const AgreementReport r = check_attention(
        e, make_attention_case(small(Distribution::kGaussian, 11).problem,
                               Distribution::kGaussian, 11, e.precision()));
    ASSERT_FALSE(r.pass) << name;
    ASSERT_FALSE(r.diagnoses.empty()) << all(r);
    EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kSixteenBit) << all(r);
    record(r);
    EXPECT_NE(r.diagnoses[0].message.find(
                  std::string(name).find("pv") != std::string::npos
                      ? "the softmax or P.V computed in 16 bits"
                      : "dV = P^T dO accumulated in 16 bits"),
              std::string::npos)
        << all(r);
  }
}

TEST(Diagnose, GqaGroupSumMissing) {
  const AgreementReport r =
      check_attention(mutant("mutant:gqa_no_group_sum:f32"),
                      small(Distribution::kGaussian, 13, /*kv_heads=*/1));
  ASSERT_FALSE(r.pass);
  ASSERT_FALSE(r.diagnoses.empty()) << all(r);
  EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kGqaGroupSum) << all(r);
  record(r);
  EXPECT_NE(r.diagnoses[0].message.find(
                "with 4 query heads per kv head, dk, dv fail while o, lse, "
                "dq pass"),
            std::string::npos)
      << all(r);
  EXPECT_NE(r.diagnoses[0].message.find("query head 0 of each group alone"),
            std::string::npos)
      << all(r);
  // Not a tail-block bug: every key row fails.
  EXPECT_FALSE(has(r, DiagnosisKind::kTailBlock)) << all(r);
}

TEST(Diagnose, RowsAfterTheLastFullBlock) {
  // dK's reduction over query blocks of 16 drops the partial last one.
  const AgreementReport r =
      check_attention(mutant("mutant:dk_drops_tail_query_block:f32"),
                      small(Distribution::kGaussian, 17));
  ASSERT_FALSE(r.pass);
  ASSERT_FALSE(r.diagnoses.empty()) << all(r);
  EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kTailBlock) << all(r);
  record(r);
  EXPECT_NE(r.diagnoses[0].message.find("without query rows >= 32 of q_len "
                                        "40"),
            std::string::npos)
      << all(r);
  EXPECT_FALSE(has(r, DiagnosisKind::kGqaGroupSum)) << all(r);
  // The key loop's tail drops the last key: under the causal mask only the
  // last query row sees it.
  const AgreementReport k =
      check_attention(mutant("mutant:tail_key_block_drop:f32"),
                      small(Distribution::kGaussian, 19));
  ASSERT_FALSE(k.pass);
  EXPECT_NE(first_message(k, DiagnosisKind::kTailBlock)
                .find("are all rows >= 32 of q_len 40"),
            std::string::npos)
      << all(k);
}

TEST(Diagnose, ParameterGradientAlone) {
  const Backend& e = mutant("mutant:dg_one_head:f64");
  const AgreementReport r = check_attention(
      e, make_attention_case(small(Distribution::kGaussian, 23).problem,
                             Distribution::kGaussian, 23, Precision::kF64));
  ASSERT_FALSE(r.pass);
  ASSERT_EQ(r.diagnoses.size(), 1u) << all(r);
  EXPECT_EQ(r.diagnoses[0].kind, DiagnosisKind::kParameterGradient);
  record(r);
  EXPECT_NE(r.diagnoses[0].message.find("dg fail(s)"), std::string::npos)
      << all(r);
  EXPECT_NE(r.diagnoses[0].message.find("while o, lse, dq, dk, dv pass"),
            std::string::npos)
      << all(r);
}

TEST(Diagnose, FormulaBugsGetNoWrongDiagnosis) {
  // O(1) formula errors are neither 16-bit arithmetic nor a tail block nor
  // a parameter's gradient alone.
  for (const char* name :
       {"mutant:inv_sqrt_d:f32", "mutant:causal_off_by_one:f32",
        "mutant:cheap_exp:f32", "mutant:tf32_matmul:f32"}) {
    const AgreementReport r =
        check_attention(mutant(name), small(Distribution::kGaussian, 29));
    ASSERT_FALSE(r.pass) << name;
    EXPECT_TRUE(r.diagnoses.empty()) << name << ": " << all(r);
  }
}

}  // namespace
}  // namespace qknorm::validation
