// Closed-form cases of the attention and ScaleNorm semantics, run through the
// registry's reference:f64 entry (the checked front door, strided buffers)
// and the oracle. Expected values are computed by hand from the definitions.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "tests/test_support.h"
#include "validation/run.h"

namespace qknorm {
namespace {

using test_support::ref64;
using validation::AttentionCase;
using validation::AttentionResult;

// Results of the f64 reference are compared with hand-derived expectations to
// kCloseTol: every expectation below is a handful of exp/div operations away
// from the computed value, so a few units of double roundoff (2^-53 ~ 1.1e-16)
// times O(1) magnitudes; 1e-14 leaves ~100 roundoffs of room and is 1e13x
// smaller than any semantic mistake (wrong mask, wrong scale) these cases
// catch.
constexpr double kCloseTol = 1e-14;

AttentionCase make(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D) {
  AttentionCase c =
      validation::make_attention_case(test_support::shape(B, H, Nq, Nk, D),
                                      validation::Distribution::kGaussian, 99);
  c.row_pad = 3;  // exercise strided layouts
  return c;
}

double at(const std::vector<double>& x, int64_t row, int64_t D, int64_t d) {
  return x[static_cast<size_t>(row * D + d)];
}

TEST(ClosedForm, SingleKeyOutputEqualsV) {
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA}) {
    AttentionCase c = make(2, 3, 5, 1, 7);
    c.problem.variant = var;
    c.problem.g = 17.5;
    AttentionResult r = validation::run_attention(ref64(), c);
    for (int64_t bh = 0; bh < 6; ++bh)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t d = 0; d < 7; ++d)
          EXPECT_NEAR(at(r.o, bh * 5 + i, 7, d), at(c.v, bh, 7, d), kCloseTol);
    // One visible key: P = 1 everywhere, so dS = 0 and dq = dk = 0, dg = 0,
    // dv = sum of dO rows.
    for (double x : r.dq) EXPECT_EQ(x, 0.0);
    for (double x : r.dk) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(r.dg, 0.0);
    for (int64_t d = 0; d < 7; ++d) {
      double s = 0;
      for (int64_t i = 0; i < 5; ++i) s += at(c.d_o, i, 7, d);
      EXPECT_NEAR(at(r.dv, 0, 7, d), s, kCloseTol * 10);
    }
  }
}

TEST(ClosedForm, HeadDimOneGivesSignLogits) {
  AttentionCase c = make(1, 1, 1, 2, 1);
  c.problem.g = 3;
  c.q = {-0.25};
  c.k = {4.0, -1e-3};  // signs -,+ -> logits -3, +3
  c.v = {10.0, -2.0};
  AttentionResult r = validation::run_attention(ref64(), c);
  const double p0 = 1 / (1 + std::exp(6.0));
  EXPECT_NEAR(r.o[0], p0 * 10 + (1 - p0) * -2, kCloseTol * 10);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(-3.0) + std::exp(3.0)),
              kCloseTol * 10);
}

TEST(ClosedForm, TwoKeysKnownLogits) {
  AttentionCase c = make(1, 1, 1, 2, 2);
  c.problem.g = 12.5;
  c.q = {2, 0};
  c.k = {5, 0, 0, 0.5};  // C = [1, 0], S = [g, 0]
  c.v = {1, 2, -3, 4};
  AttentionResult r = validation::run_attention(ref64(), c);
  const double p1 = 1 / (1 + std::exp(-12.5));
  EXPECT_NEAR(r.o[0], p1 * 1 + (1 - p1) * -3, kCloseTol);
  EXPECT_NEAR(r.o[1], p1 * 2 + (1 - p1) * 4, kCloseTol);
  EXPECT_NEAR(r.lse[0], 12.5 + std::log1p(std::exp(-12.5)), kCloseTol * 10);
}

// g = 0: every visible key has logit 0, so O_i is the mean of visible V rows.
void expect_uniform_average(const AttentionCase& c, const AttentionResult& r) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const int64_t bh = b * p.heads + h;
        for (int64_t d = 0; d < D; ++d) {
          double s = 0;
          int64_t m = 0;
          for (int64_t j = 0; j < p.kv_len; ++j)
            if (visible(p.mask, b, i, j, p.q_len, p.kv_len)) {
              s += at(c.v, bh * p.kv_len + j, D, d);
              ++m;
            }
          const double expect = m ? s / static_cast<double>(m) : 0.0;
          EXPECT_NEAR(at(r.o, bh * p.q_len + i, D, d), expect, kCloseTol * 10)
              << "b=" << b << " h=" << h << " i=" << i << " m=" << m;
        }
      }
}

TEST(ClosedForm, ZeroGIsUniformAverage) {
  AttentionCase c = make(2, 2, 6, 9, 5);
  c.problem.g = 0;
  expect_uniform_average(c, validation::run_attention(ref64(), c));
}

// Hand-built visibility: q_len=2, kv_len=4, causal bottom-right: row 0 sees
// keys 0..2, row 1 sees 0..3. q_len=4, kv_len=2: rows 0,1 see nothing, row 2
// sees key 0, row 3 keys 0..1.
TEST(ClosedForm, CausalMaskHandBuilt) {
  Mask m;
  m.causal = true;
  const bool vis24[2][4] = {{1, 1, 1, 0}, {1, 1, 1, 1}};
  const bool vis42[4][2] = {{0, 0}, {0, 0}, {1, 0}, {1, 1}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(visible(m, 0, i, j, 2, 4), vis24[i][j]);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(visible(m, 0, i, j, 4, 2), vis42[i][j]);
  AttentionCase c = make(1, 1, 4, 2, 3);
  c.problem.g = 0;
  c.problem.mask = m;
  AttentionResult r = validation::run_attention(ref64(), c);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(at(r.o, 0, 3, d), 0.0);
    EXPECT_EQ(at(r.o, 1, 3, d), 0.0);
    EXPECT_NEAR(at(r.o, 2, 3, d), at(c.v, 0, 3, d), kCloseTol);
    EXPECT_NEAR(at(r.o, 3, 3, d), (at(c.v, 0, 3, d) + at(c.v, 1, 3, d)) / 2,
                kCloseTol);
  }
  EXPECT_EQ(r.lse[0], -INFINITY);
  EXPECT_EQ(r.lse[1], -INFINITY);
  EXPECT_NEAR(r.lse[3], std::log(2.0), kCloseTol);
}

TEST(ClosedForm, PaddingMaskHandBuilt) {
  AttentionCase c = make(3, 2, 3, 5, 4);
  c.problem.g = 0;
  c.problem.mask.key_lengths = {2, 5, 0};  // batch 2 fully masked
  AttentionResult r = validation::run_attention(ref64(), c);
  expect_uniform_average(c, r);
  // Batch 0 row 0: mean of keys 0 and 1 only.
  EXPECT_NEAR(r.o[0], (c.v[0] + c.v[4]) / 2, kCloseTol);
  c.problem.mask.causal = true;  // combined: row i sees j <= i + 2 and j < len
  expect_uniform_average(c, validation::run_attention(ref64(), c));
}

// Fully masked rows: O = 0, lse = -inf, and no gradient flows: dq of the row
// is 0, and a batch whose keys are all padded gets dk = dv = 0.
TEST(ClosedForm, FullyMaskedRowsAreZeroNotNaN) {
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA}) {
    AttentionCase c = make(2, 2, 4, 3, 5);
    c.problem.variant = var;
    c.problem.g = 20;
    c.problem.mask.key_lengths = {0, 3};
    AttentionResult r = validation::run_attention(ref64(), c);
    const size_t half_q = r.o.size() / 2, half_k = r.dk.size() / 2;
    for (size_t i = 0; i < half_q; ++i) {
      EXPECT_EQ(r.o[i], 0.0);
      EXPECT_EQ(r.dq[i], 0.0);
    }
    for (size_t i = 0; i < half_k; ++i) {
      EXPECT_EQ(r.dk[i], 0.0);
      EXPECT_EQ(r.dv[i], 0.0);
    }
    for (size_t i = 0; i < r.lse.size() / 2; ++i)
      EXPECT_EQ(r.lse[i], -INFINITY);
    for (double x : r.o) EXPECT_TRUE(std::isfinite(x));
    for (double x : r.dq) EXPECT_TRUE(std::isfinite(x));
    EXPECT_TRUE(std::isfinite(r.dg));
  }
}

// Row `row` of O is the plain mean of V's rows (one batch and head, no mask:
// every logit of that query is equal).
void expect_mean_of_v(const AttentionCase& c, const AttentionResult& r,
                      int64_t row) {
  const int64_t D = c.problem.head_dim, Nk = c.problem.kv_len;
  for (int64_t d = 0; d < D; ++d) {
    double mean = 0;
    for (int64_t j = 0; j < Nk; ++j)
      mean += at(c.v, j, D, d) / static_cast<double>(Nk);
    EXPECT_NEAR(at(r.o, row, D, d), mean, kCloseTol) << "d=" << d;
  }
}

void expect_finite(const AttentionResult& r) {
  for (auto* v : {&r.o, &r.dq, &r.dk, &r.dv})
    for (double x : *v) EXPECT_TRUE(std::isfinite(x));
}

// Zero rows: q_hat = 0 (clamped norm), so every logit of that query is 0 and
// its output is the plain mean of V; its gradient is du / eps: finite.
TEST(ClosedForm, ZeroRowsAreFinite) {
  AttentionCase c = make(1, 1, 3, 4, 6);
  c.problem.g = 15;
  for (int d = 0; d < 6; ++d) c.q[static_cast<size_t>(6 + d)] = 0;  // row 1
  for (int d = 0; d < 6; ++d) c.k[static_cast<size_t>(d)] = 0;      // key 0
  AttentionResult r = validation::run_attention(ref64(), c);
  expect_mean_of_v(c, r, 1);
  expect_finite(r);
  // Non-zero gradient of the zero row: du / eps, magnitude ~ g/eps scale.
  double mx = 0;
  for (int d = 0; d < 6; ++d) mx = std::max(mx, std::fabs(at(r.dq, 1, 6, d)));
  EXPECT_GT(mx, 1e9);
}

// Scale invariance at the extremes: rows of magnitude ~1e307 and subnormal
// rows normalize exactly like their unit-scale copies (no overflow in the
// norm).
TEST(ClosedForm, HugeAndSubnormalRows) {
  AttentionCase c = make(1, 1, 3, 5, 8);
  c.problem.g = 10;
  AttentionResult base = validation::run_attention(ref64(), c);
  AttentionCase big = c;
  for (double& x : big.q) x *= 1e307;
  for (double& x : big.k) x *= 0x1p1020;
  AttentionResult rb = validation::run_attention(ref64(), big);
  for (size_t i = 0; i < base.o.size(); ++i)
    EXPECT_NEAR(rb.o[i], base.o[i], kCloseTol * 10);
  for (double x : rb.dq) EXPECT_TRUE(std::isfinite(x));
  // Subnormal q rows: ||q|| ~ 1e-310 < eps, so q_hat = q / eps ~ 1e-298 and
  // all its logits are ~0: uniform average, finite gradients.
  AttentionCase sub = c;
  for (double& x : sub.q) x *= 1e-310;
  AttentionResult rs = validation::run_attention(ref64(), sub);
  expect_mean_of_v(c, rs, 0);
  expect_finite(rs);
}

TEST(ClosedForm, GInitMatchesPaper) {
  EXPECT_NEAR(g_init(72), 12.3197, 5e-5);  // values quoted from the paper
  EXPECT_NEAR(g_init(75), 12.4383, 5e-5);
  EXPECT_NEAR(g_init(79), 12.5892, 5e-5);
  EXPECT_THROW(g_init(1), Error);
  EXPECT_NEAR(scalenorm_g_init(64), 8.0, 0);
}

TEST(ClosedForm, ScaleNorm) {
  validation::ScaleNormCase c;
  c.problem = {3, 2, 2.0, kDefaultScaleNormEps};
  c.x = {3, 4, 0, 0, 3e300, -4e300};
  c.dy = {1, 0, 1, 1, 0, 1};
  validation::ScaleNormResult r = validation::run_scalenorm(ref64(), c);
  EXPECT_NEAR(r.y[0], 1.2, kCloseTol);
  EXPECT_NEAR(r.y[1], 1.6, kCloseTol);
  EXPECT_EQ(r.y[2], 0.0);
  EXPECT_EQ(r.y[3], 0.0);
  EXPECT_NEAR(r.y[4], 1.2, kCloseTol);
  EXPECT_NEAR(r.y[5], -1.6, kCloseTol);
  // Row 0: u = (.6,.8), dy = (1,0): dx = (g/5)(dy - u*0.6) = 0.4*(0.64,-0.48).
  EXPECT_NEAR(r.dx[0], 0.4 * 0.64, kCloseTol);
  EXPECT_NEAR(r.dx[1], -0.4 * 0.48, kCloseTol);
  // Zero row: dx = g dy / eps.
  EXPECT_NEAR(r.dx[2], 2.0 / kDefaultScaleNormEps, 1e-9);
  // dg = sum dy . u = 0.6 + 0 + (-0.8).
  EXPECT_NEAR(r.dg, 0.6 - 0.8, kCloseTol);
}

}  // namespace
}  // namespace qknorm
