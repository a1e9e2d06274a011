// The double (and float) reference against the long-double oracle, within
// the a-priori bounds of validation/bounds.h. Prints the worst measured
// error as a fraction of its bound and in units of u * scale.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>

#include "qknorm/backend.h"
#include "tests/test_support.h"
#include "validation/bounds.h"
#include "validation/metrics.h"
#include "validation/oracle.h"
#include "validation/run.h"

namespace qknorm {
namespace {

using validation::Distribution;

struct Shape {
  int64_t B, H, Nq, Nk, D;
};

std::vector<validation::AttentionCase> cases() {
  std::vector<validation::AttentionCase> out;
  const Shape shapes[] = {{1, 1, 1, 1, 1},    {1, 2, 7, 9, 3},
                          {2, 2, 17, 17, 16}, {1, 1, 33, 8, 65},
                          {2, 8, 72, 72, 64}, {1, 1, 64, 127, 31}};
  const double gs[] = {0, -3, 1, g_init(72), 20, 25};
  uint64_t seed = 1000;
  int k = 0;
  for (const Shape& s : shapes)
    for (Variant var : {Variant::kQKNorm, Variant::kSDPA})
      for (int mask = 0; mask < 4; ++mask) {
        AttentionProblem p;
        p.batch = s.B, p.heads = s.H, p.q_len = s.Nq, p.kv_len = s.Nk,
        p.head_dim = s.D;
        p.variant = var;
        p.g = gs[k++ % 6];
        p.mask.causal = mask & 1;
        if (mask & 2)
          for (int64_t b = 0; b < s.B; ++b)
            p.mask.key_lengths.push_back((s.Nk * (b + 1)) / (s.B + 1));
        const Distribution dist = (k % 3 == 0)   ? Distribution::kZeroRows
                                  : (k % 3 == 1) ? Distribution::kGaussian
                                                 : Distribution::kHeavyTailed;
        out.push_back(validation::make_attention_case(p, dist, seed++));
      }
  return out;
}

void check(const char* entry_name, double u) {
  const Backend& b = *all_backends().find(entry_name);
  double worst_frac = 0, worst_units = 0, worst_rel = 0, worst_normwise = 0;
  std::string worst_where;
  // Under the sanitizer subset (test_support::sanitize_keeps) every other
  // case: each shape, mask and distribution class still runs.
  int64_t index = 0;
  for (const auto& c0 : cases()) {
    if (!test_support::sanitize_keeps(index++, 2)) continue;
    const auto c = validation::round_inputs(c0, b.precision());
    const auto r = validation::run_attention(b, c);
    const auto o = validation::oracle_attention(c);
    const auto bd = validation::reference_bounds(c, o, u);
    struct F {
      const char* name;
      const std::vector<double>* a;
      const std::vector<long double>* e;
      double bound;
    };
    std::vector<long double> dg_e{o.dg};
    std::vector<double> dg_a{r.dg};
    const F fields[] = {
        {"o", &r.o, &o.o, bd.o},     {"lse", &r.lse, &o.lse, bd.lse},
        {"dq", &r.dq, &o.dq, bd.dq}, {"dk", &r.dk, &o.dk, bd.dk},
        {"dv", &r.dv, &o.dv, bd.dv}, {"dg", &dg_a, &dg_e, bd.dg}};
    for (const F& f : fields) {
      const auto st = validation::compare(*f.a, *f.e, b.precision());
      EXPECT_FALSE(st.nonfinite_mismatch) << f.name << " " << c.describe();
      EXPECT_LE(st.max_abs, f.bound)
          << entry_name << " field " << f.name << " on " << c.describe()
          << "\n  " << validation::describe(st);
      if (f.bound > 0 && st.max_abs / f.bound > worst_frac) {
        worst_frac = st.max_abs / f.bound;
        worst_where = std::string(f.name) + " on " + c.describe();
      }
      if (std::string(f.name) != "lse") {
        worst_rel = std::max(worst_rel, st.max_rel);
        worst_normwise = std::max(worst_normwise, st.normwise);
      }
      if (st.scale > 0)
        worst_units = std::max(worst_units, st.max_abs / (u * st.scale));
    }
  }
  std::printf(
      "%s: worst error = %.3g of its a-priori bound (%s); worst error = %.1f "
      "u * scale; max relative error (floor 2^-20 * scale) %.3e, max "
      "normwise %.3e\n",
      entry_name, worst_frac, worst_where.c_str(), worst_units, worst_rel,
      worst_normwise);
}

TEST(ReferenceVsOracle, DoubleWithinDerivedBound) {
  check("reference:f64", 0x1p-53);
}
TEST(ReferenceVsOracle, FloatWithinDerivedBound) {
  check("reference:f32", 0x1p-24);
}

TEST(ReferenceVsOracle, ScaleNormWithinDerivedBound) {
  for (const char* n : {"reference:f64", "reference:f32"}) {
    const Backend& b = *all_backends().find(n);
    const double u = compute_roundoff(b.precision());
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      ScaleNormProblem p{
          static_cast<int64_t>(seed * 3),
          static_cast<int64_t>(seed * 11 % 67 + 1),
          scalenorm_g_init(static_cast<int64_t>(seed * 11 % 67 + 1)),
          kDefaultScaleNormEps};
      auto c = validation::round_inputs(
          validation::make_scalenorm_case(
              p,
              seed % 2 ? Distribution::kZeroRows : Distribution::kWideMagnitude,
              seed, b.precision()),
          b.precision());
      auto r = validation::run_scalenorm(b, c);
      auto o = validation::oracle_scalenorm(c);
      auto bd = validation::scalenorm_bounds(c, o, u);
      EXPECT_LE(validation::compare(r.y, o.y, b.precision()).max_abs, bd.y)
          << n << c.describe();
      EXPECT_LE(validation::compare(r.dx, o.dx, b.precision()).max_abs, bd.dx)
          << n << c.describe();
      EXPECT_LE(std::fabs(r.dg - static_cast<double>(o.dg)), bd.dg)
          << n << c.describe();
    }
  }
}

// Logits that overflow the compute format (reference.cc, logits_row) are
// clamped to its largest finite value, a NaN dot (terms overflowing with
// both signs) to minus that: every output stays finite (such inputs are
// outside the representable domain, so only finiteness and the exact
// one-key answer are asserted). sdpa, D = 2: q . k_0 overflows to +inf, so
// key 0 takes all the weight (O = v_0, lse = the largest finite logit);
// q . k_1 to -inf; with the fourth key, q . k_3 = inf - inf. Fails without
// the clamp (O and lse NaN). f16 storage cannot hold the f32 values.
TEST(ReferenceEntries, OverflowingLogitsStayFinite) {
  for (const Backend* b : all_backends().match("reference:*")) {
    if (b->precision() == Precision::kF16) continue;
    const bool f64 = b->precision() == Precision::kF64;
    const double big = f64 ? 1e160 : 2e19;
    const double top = f64 ? DBL_MAX : static_cast<double>(FLT_MAX);
    for (bool with_nan_key : {false, true}) {
      const validation::AttentionCase c = validation::round_inputs(
          validation::overflowing_logits_case(big, with_nan_key),
          b->precision());
      const validation::AttentionResult r = validation::run_attention(*b, c);
      for (const auto* f : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv})
        for (double x : *f) EXPECT_TRUE(std::isfinite(x)) << b->name() << x;
      EXPECT_TRUE(std::isfinite(r.dg)) << b->name();
      if (!with_nan_key) {
        EXPECT_EQ(r.o, (std::vector<double>{1, 2})) << b->name();
        EXPECT_EQ(r.lse[0], top) << b->name();
      }
    }
  }
}

}  // namespace
}  // namespace qknorm

namespace qknorm {
namespace {

// The tolerance rule's gradient scales (oracle.h) on a case where delta
// cancels exactly: sdpa, D = 1, q = 0 (so P = (1/2, 1/2)), k = (1, 1),
// v = (1, -1), dO = 1. Then dP = (1, -1), delta = 0, Del = sum_k P_k |dO||v_k|
// = 1, T_j = P_j (|dO||v_j| + Del) = 1 and the dq magnitude is
// s sum_j T_j |k_j| = 2 (s = 1/sqrt(1)); the old |dP| + |delta| model gave
// 1. The sensitivity to the stored O is s sum_j P_j |dO|_1 |k_j| = 1; dk's
// is 0 (q = 0). Every value is exact in long double.
TEST(OracleScales, DeltaCancellationAndStoredOSensitivity) {
  validation::AttentionCase c;
  c.problem.variant = Variant::kSDPA;
  c.problem.q_len = 1;
  c.problem.kv_len = 2;
  c.problem.head_dim = 1;
  c.q = {0};
  c.k = {1, 1};
  c.v = {1, -1};
  c.d_o = {1};
  const validation::OracleAttention orc = validation::oracle_attention(c);
  EXPECT_EQ(orc.dq[0], 0.0L);
  EXPECT_EQ(orc.dq_scale, 2.0L);
  EXPECT_EQ(orc.dq_o_sens, 1.0L);
  EXPECT_EQ(orc.dk_o_sens, 0.0L);
  // Subnormal compute intermediates, per ulp_c(0): dS_j counts
  // P_j (2D + 1) + 1 = 2.5, du = s sum_j 2.5 |k_j| = 5, plus (1 + s)(Nk + D
  // + 2) = 10 for du's sums and the normalization backward, which the scale
  // s may multiply, and one unscaled rounding of s dS_j per pair, sum_j
  // |k_j| = 2: 17 (no normalization for sdpa). dk: q = 0, so only
  // (1 + s)(Nq + D + 2) = 8.
  EXPECT_EQ(orc.dq_uf_sens, 17.0L);
  EXPECT_EQ(orc.dk_uf_sens, 8.0L);
  // P_j's own resolution (per smallest normal of the compute format):
  // |dP_j - delta| = 1, plus P_j p_del with p_del = sum_k |dO||v_k| = 2
  // (delta moved by every P_k's resolution), 2 per key, through s |k_j|: 4
  // for dq; O and dV: sum_j |v_j| = 2 and |dO| = 1 per key.
  EXPECT_EQ(orc.dq_p_sens_e[0], 4.0L);
  EXPECT_EQ(orc.dk_p_sens_e[0], 0.0L);
  EXPECT_EQ(orc.o_p_sens_e[0], 2.0L);
  EXPECT_EQ(orc.dv_p_sens_e[0], 1.0L);
  EXPECT_EQ(orc.dg_p_sens, 0.0L);
  // Per element (rule.h): O = 0, so sum_j P_j |v_j - O| = 1; the terms
  // the softmax's conditioning perturbs, P_j (|dP_j - delta| + E / 2) with
  // E = sum_k P_k |dP_k - delta| = 1: 0.75 each, times s |k_j|: 1.5.
  EXPECT_EQ(orc.o_dev_mag[0], 1.0L);
  EXPECT_EQ(orc.o_mag[0], 1.0L);
  EXPECT_EQ(orc.dq_mag[0], 2.0L);
  EXPECT_EQ(orc.dq_ds_mag[0], 1.5L);
}

}  // namespace
}  // namespace qknorm
