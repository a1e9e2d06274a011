// Compute contracts (issue 31; qknorm/contract.h, validation/rule.h
// "Compute contracts"): entries that round their intermediates where real
// kernels do (mutants/contract_entries.h) are judged under the contract
// they declare.
// - An eager 16-bit entry (every intermediate rounded to storage, as eager
//   PyTorch does) PASSes under `storage` and FAILs under f32-accumulate; one
//   worse than storage rounding (its row sum chopped in bf16) FAILs under
//   both.
// - An f32 entry with an f16 P.V accumulator (ggml's one-row kernel) FAILs
//   under f32-accumulate and PASSes declaring pv_acc=f16; one that also
//   rounds P to f16 while declaring only pv_acc=f16 FAILs (on a case built
//   so that P's f16 resolution matters: P_tail_flush below).
// - The contract's spec round-trips; f32-accumulate's tables are the rule's
//   default tables, and `storage` at f32 is f32-accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "mutants/contract_entries.h"
#include "validation/check.h"
#include "validation/rule.h"
#include "validation/sampled.h"

namespace qknorm {
namespace {

using property::ContractKernel;
using property::make_contract_entry;
using validation::AgreementReport;
using validation::AttentionCase;

ComputeContract spec(const std::string& s) {
  ComputeContract c;
  std::string why;
  EXPECT_TRUE(parse_contract(s, &c, &why)) << s << ": " << why;
  return c;
}

AttentionCase gaussian(int64_t Nq, int64_t Nk, int64_t D, double g,
                       uint64_t seed, bool causal = false) {
  AttentionProblem p = validation::attention_shape(1, 2, Nq, Nk, D, g);
  p.mask.causal = causal;
  return validation::make_attention_case(p, validation::Distribution::kGaussian,
                                         seed);
}

// A case rounded to storage s with its oracle, computed once for every
// entry and contract judged on it.
struct Judged {
  Precision s;
  AttentionCase c;
  validation::OracleAttention orc;
  Judged(Precision st, const AttentionCase& c0)
      : s(st),
        c(validation::round_inputs(c0, st)),
        orc(validation::oracle_attention(c)) {}
};

// Runs kernel k declaring `decl` on j and judges it by the entry's contract
// (as check_attention does).
AgreementReport check(ContractKernel k, const std::string& decl,
                      const Judged& j, bool forward_only = false) {
  const auto e = make_contract_entry(k, j.s, spec(decl));
  const validation::AttentionResult er =
      forward_only ? validation::run_attention_forward(*e, j.c)
                   : validation::run_attention(*e, j.c);
  const AgreementReport r =
      validation::judge_attention(j.c, j.s, j.orc, er, nullptr, forward_only,
                                  e->name(), "", nullptr, e->contract());
  std::printf(
      "%-36s declares %-22s on %s: %s, margin %.3g (%s), o's bound "
      "%.3gx f32-accumulate's\n",
      e->name().c_str(), decl.c_str(), j.c.describe().c_str(),
      r.pass ? "PASS" : "FAIL", r.margin, r.worst_field.c_str(), r.looseness);
  return r;
}

TEST(Contract, SpecRoundTripsAndRejectsUnknownKeys) {
  EXPECT_EQ(ComputeContract{}.describe(), "f32-accumulate");
  EXPECT_EQ(ComputeContract::storage().describe(), "storage");
  EXPECT_EQ(spec("f32-accumulate"), ComputeContract{});
  EXPECT_EQ(spec("storage"), ComputeContract::storage());
  const ComputeContract c = spec("q=f16,kv=bf16,logits=f32,p=f16,pv_acc=f16");
  EXPECT_EQ(c.describe(), "q=f16,kv=bf16,logits=f32,p=f16,pv_acc=f16");
  EXPECT_EQ(spec(c.describe()), c);
  EXPECT_EQ(c.format(RoundingPoint::kOut, Precision::kBF16), Precision::kF32);
  EXPECT_EQ(spec("storage,out=f32").format(RoundingPoint::kP, Precision::kF16),
            Precision::kF16);
  ComputeContract bad;
  std::string why;
  EXPECT_FALSE(parse_contract("acc=f16", &bad, &why));
  EXPECT_NE(why.find("unknown rounding point"), std::string::npos) << why;
  EXPECT_FALSE(parse_contract("p=f8", &bad, &why));
  EXPECT_FALSE(parse_contract("p=f16,storage", &bad, &why));
  EXPECT_FALSE(parse_contract("", &bad, &why));
}

// The default contract is the rule of issue 15 (the verdict-diff against
// the base proves it on the default run); at f32 `storage` declares nothing
// coarser than the compute, so its tables are bitwise f32-accumulate's.
TEST(Contract, StorageAtF32IsF32Accumulate) {
  const AttentionCase c = validation::round_inputs(
      gaussian(16, 16, 16, g_init(16), 3), Precision::kF32);
  const auto orc = validation::oracle_attention(c);
  const auto a =
      validation::attention_tolerances(c, Precision::kF32, orc, false);
  const auto b = validation::attention_tolerances(
      c, Precision::kF32, orc, false, ComputeContract::storage());
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) EXPECT_EQ(a[t].delta, b[t].delta);
}

// Eager f16 at the default run's shapes and g = g_init(N), and eager bf16
// at g = 2: at bf16 the storage bound leaves the logits unresolved (soft
// u_s > 1/8, every finite O passes) once |g| > 4, so a larger g could not
// fail the worse mutant below and would test nothing.
TEST(Contract, EagerStoragePassesUnderStorageFailsUnderF32Accumulate) {
  const Judged runs[] = {
      {Precision::kF16, gaussian(64, 64, 64, g_init(64), 1)},
      {Precision::kF16, gaussian(48, 48, 64, g_init(48), 2, true)},
      {Precision::kBF16, gaussian(64, 64, 64, 2.0, 3)},
      {Precision::kBF16, gaussian(32, 96, 32, 2.0, 4, true)},
  };
  for (const Judged& j : runs) {
    const AgreementReport st =
        check(ContractKernel::kEagerStorage, "storage", j);
    EXPECT_TRUE(st.pass) << st.failure_message();
    EXPECT_GT(st.looseness, 10);  // the storage bound's cost, reported
    EXPECT_FALSE(
        check(ContractKernel::kEagerStorage, "f32-accumulate", j).pass);
  }
}

// The row sum chopped in bf16 inside an f16 eager entry: Nk = 1024 terms of
// e^(S - m) (~0.1 each) stagnate once bf16's spacing passes them, so l and
// lse are off by far more than storage rounding allows (lse's bound
// u_16 (4 A + sum_units(Nk) + 2 |lse|) = 0.09; measured margin 4 under
// storage, 3e4 under f32-accumulate).
TEST(Contract, WorseThanStorageFailsUnderBoth) {
  const Judged j(Precision::kF16, gaussian(4, 1024, 64, g_init(64), 5));
  for (const char* decl : {"storage", "f32-accumulate"}) {
    const AgreementReport r =
        check(ContractKernel::kEagerRowSumBf16Chop, decl, j, true);
    EXPECT_FALSE(r.pass) << decl;
    if (std::string(decl) == "storage") {
      EXPECT_NE(r.failure_message().find("compute contract storage"),
                std::string::npos)
          << r.failure_message();
    }
  }
}

// ggml's one-row kernel: f32 products, an f16 running sum of P.V.
TEST(Contract, F16PvAccumulatorPassesOnlyWhenDeclared) {
  for (const AttentionCase& c :
       {gaussian(32, 256, 64, g_init(64), 6), gaussian(4, 512, 128, 12.0, 7)}) {
    const Judged j(Precision::kF32, c);
    EXPECT_FALSE(check(ContractKernel::kPvAccF16, "f32-accumulate", j).pass);
    const AgreementReport r = check(ContractKernel::kPvAccF16, "pv_acc=f16", j);
    EXPECT_TRUE(r.pass) << r.failure_message();
  }
}

// P rounded to f16 while the entry declares only its f16 accumulator. A
// relative P rounding of u_16 hides inside the accumulator's (8 sqrt(n) +
// 4) u_16 M on generic data; P's absolute resolution does not: keys whose P
// lies below half f16's smallest subnormal (5.96e-8 / 2 = 2.98e-8) round to
// 0. The case: one query row q = e_0, one dominant key k = e_0 (cosine 1,
// v = 0) and n = 100 tail keys of cosine c = 1 + ln(r) / g (g = 20, r =
// 2.7e-8) whose v is 1e4 in every component. Then P_tail = r / (1 + n r) =
// 2.7e-8 and the exact O_d = n P_tail 1e4 = 0.027; flushing P gives O_d = 0,
// an error of 0.027 = M_d. pv_acc=f16 allows (8 sqrt(101) + 4) u_16 M +
// ulp_16(0) (Nk + 2) = 0.041 * 0.027 + 6.1e-6 = 1.1e-3: margin ~24.
// Declaring p=f16 as well adds P's resolution 2.98e-8 times sum_j |v_jd| =
// 1e6, 0.0298 > 0.027, and the same entry PASSes.
TEST(Contract, RoundingPUndeclaredFailsThroughItsResolution) {
  const double g = 20, r = 2.7e-8, cos_tail = 1 + std::log(r) / g;
  const int64_t n = 100, D = 4;
  AttentionProblem p = validation::attention_shape(1, 1, 1, n + 1, D, g);
  AttentionCase c = validation::make_attention_case(
      p, validation::Distribution::kGaussian, 8);
  std::fill(c.q.begin(), c.q.end(), 0.0);
  std::fill(c.k.begin(), c.k.end(), 0.0);
  std::fill(c.v.begin(), c.v.end(), 0.0);
  c.q[0] = 1;
  c.k[0] = 1;
  for (int64_t j = 1; j <= n; ++j) {
    c.k[static_cast<size_t>(j * D)] = cos_tail;
    c.k[static_cast<size_t>(j * D + 1)] = std::sqrt(1 - cos_tail * cos_tail);
    for (int64_t d = 0; d < D; ++d) c.v[static_cast<size_t>(j * D + d)] = 1e4;
  }
  c.d_o.assign(c.q.size(), 1.0);
  const Judged j(Precision::kF32, c);
  const AgreementReport bug =
      check(ContractKernel::kPvAccF16RoundsP, "pv_acc=f16", j, true);
  EXPECT_FALSE(bug.pass);
  EXPECT_GT(bug.margin, 10);
  EXPECT_NE(bug.failure_message().find("compute contract pv_acc=f16"),
            std::string::npos)
      << bug.failure_message();
  EXPECT_TRUE(
      check(ContractKernel::kPvAccF16RoundsP, "pv_acc=f16,p=f16", j, true)
          .pass);
  EXPECT_TRUE(check(ContractKernel::kPvAccF16, "pv_acc=f16", j, true).pass);
  EXPECT_FALSE(
      check(ContractKernel::kPvAccF16RoundsP, "f32-accumulate", j, true).pass);
}

// The sampled verdict (validation/sampled.h) judges its sampled rows by the
// contract's tables and the rest by properties at the contract's units: the
// eager f16 entry PASSes under storage and FAILs under f32-accumulate there
// too, and the report names the contract (its looseness is not computed).
TEST(Contract, SampledVerdictJudgesByTheContract) {
  const Judged j(Precision::kF16, gaussian(64, 64, 32, g_init(64), 9));
  const auto e = make_contract_entry(ContractKernel::kEagerStorage, j.s,
                                     ComputeContract::storage());
  const validation::AttentionResult er = validation::run_attention(*e, j.c);
  validation::SampleOptions opt;
  opt.rows = 8;
  opt.contract = ComputeContract::storage();
  const AgreementReport st = validation::judge_sampled(
      j.c, validation::sampled_oracle(j.c, j.s, opt), er, e->name());
  EXPECT_TRUE(st.pass) << st.failure_message();
  EXPECT_EQ(st.contract, "storage");
  opt.contract = {};
  const AgreementReport f32 = validation::judge_sampled(
      j.c, validation::sampled_oracle(j.c, j.s, opt), er, e->name());
  EXPECT_FALSE(f32.pass);
  EXPECT_EQ(f32.contract, "f32-accumulate");
}

}  // namespace
}  // namespace qknorm
