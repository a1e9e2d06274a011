// The weight gradient's product (validation/rule.h, "The weight gradient's
// product"; the CI's Zen 3 fuzz finding of issue 32): LayerNorm's x_hat is
// off by its row's mean shift however small x_hat is, and a weight
// gradient sum x_hat dx_tilde meets dx_tilde's own error there. A q row
// whose last element is its mean (x_hat = 0 exactly) while the kernel's
// mean is not, and a k-side weight of 0 under a bias at that element
// (k_tilde the bias in every key row, so dx_tilde = s b sum_j dS_j = 0
// exactly: every first-order term of the weight's bound is 0) FAILed
// reference:f64 without the term.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "validation/case.h"
#include "validation/check.h"
#include "validation/judge.h"
#include "validation/oracle.h"
#include "validation/rule.h"
#include "validation/run.h"

namespace qknorm::validation {
namespace {

// chameleon (LayerNorm per head, [H, D] weight and bias), one query, D = 4.
// The q row (1, 2^53, 2 - 2^53, 1) has mean 1 exactly, x_hat_0 = x_hat_3 =
// 0, while a kernel's f64 sum of it loses the first 1 (1 + 2^53 rounds to
// 2^53): the computed mean is 0.75 and x_hat_3 about 4e-17.
AttentionCase mean_element_case(uint64_t seed) {
  AttentionProblem p = attention_shape(1, 1, 1, 16, 4, 1);
  apply_preset("chameleon", &p);
  AttentionCase c = make_attention_case(p, Distribution::kGaussian, seed);
  c.q = {1, 0x1p53, 2 - 0x1p53, 1};
  c.k_weight[3] = 0;
  c.k_bias[3] = 1.5;
  return c;
}

// The oracle without the term (the rule before it).
OracleAttention without_term(OracleAttention o) {
  for (auto& x : o.dq_weight_sh_ch) x.clear();
  for (auto& x : o.dk_weight_sh_ch) x.clear();
  return o;
}

AgreementReport judge(const Backend& b, const AttentionCase& c,
                      const OracleAttention& orc) {
  return judge_attention(c, b.precision(), orc, run_attention(b, c), nullptr,
                         false, b.name(), "");
}

TEST(WeightProduct, MeanElementFailedWithoutTheTerm) {
  const Backend& b = *all_backends().find("reference:f64");
  const AttentionCase c = round_inputs(mean_element_case(3), b.precision());
  const OracleAttention orc = oracle_attention(c);
  ASSERT_FALSE(orc.dq_weight_sh_ch[0].empty());
  const AgreementReport without = judge(b, c, without_term(orc));
  const AgreementReport with = judge(b, c, orc);
  std::printf("%s: margin %.3f without the term (%s), %.3g with\n",
              b.name().c_str(), without.margin, without.worst_field.c_str(),
              with.margin);
  EXPECT_FALSE(without.pass) << "the case no longer needs the term";
  EXPECT_EQ(without.worst_field, "dq_weight");
  EXPECT_TRUE(with.pass) << with.failure_message();
}

// Every entry that supports the formulation passes the case, over seeds
// (f16 storage does not hold 2^53).
TEST(WeightProduct, EveryEntryPassesMeanElements) {
  int judged = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const AttentionCase c = mean_element_case(seed);
    for (const Backend* b : all_backends().entries()) {
      if (!b->available() || !b->supports(c.problem) ||
          b->precision() == Precision::kF16)
        continue;
      const AgreementReport rep = check_attention(*b, c, {}, false, false);
      EXPECT_TRUE(rep.pass) << rep.failure_message();
      if (seed == 1)
        std::printf("%-18s margin %.3g (%s)\n", b->name().c_str(), rep.margin,
                    rep.worst_field.c_str());
      ++judged;
    }
  }
  EXPECT_GT(judged, 0);
}

// Without LayerNorm the term is absent: no shift-weighted channels, and
// the weight's bounds are the rule's without it (bitwise).
TEST(WeightProduct, OtherNormsHaveNoTerm) {
  for (const char* preset : {"qwen3", "olmo2", "ngpt"}) {
    AttentionProblem p = attention_shape(1, 2, 5, 7, 8, 1);
    apply_preset(preset, &p);
    const AttentionCase c = round_inputs(
        make_attention_case(p, Distribution::kGaussian, 4), Precision::kF64);
    const OracleAttention orc = oracle_attention(c);
    EXPECT_TRUE(orc.dq_weight_sh_ch[0].empty()) << preset;
    EXPECT_TRUE(orc.dk_weight_sh_ch[0].empty()) << preset;
  }
}

}  // namespace
}  // namespace qknorm::validation
