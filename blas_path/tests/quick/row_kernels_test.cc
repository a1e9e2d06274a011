// Contract tests of the row kernels (row_kernels.h) and the normalization
// (normalize.h): exp2's error bound, tails, zero padding, fully masked rows,
// and norms without overflow or underflow.
#include "blas_path/row_kernels.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "blas_path/normalize.h"

namespace qknorm::blas {
namespace {

// exp2_f32's documented error: truncation 0.2 u plus about 1 ulp of Horner
// rounding. 2 ulp is the contract; measured below (printed) about 1.
constexpr double kExp2MaxUlp = 2.0;

// |exp2_f32(x) - 2^x| / ulp(2^x), on a dense grid of [-126, 0] and the
// positive arguments the backward may see, against long double exp2.
TEST(Exp2F32, WithinTwoUlpOnItsRange) {
  double worst = 0, worst_x = 0;
  for (double xd = -126.0; xd <= 8.0; xd += 1.0 / 4099) {
    const float x = static_cast<float>(xd);
    const long double e = std::exp2(static_cast<long double>(x));
    const float got = exp2_f32(x);
    int ex = 0;
    std::frexp(static_cast<double>(e), &ex);
    const double ulp = std::ldexp(1.0, ex - 24);
    const double err = std::fabs(static_cast<double>(got - e)) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  RecordProperty("exp2_f32_max_ulp", std::to_string(worst));
  std::printf("exp2_f32 max error %.3f ulp at x = %.9g\n", worst, worst_x);
  EXPECT_LE(worst, kExp2MaxUlp) << "at x = " << worst_x;
}

TEST(Exp2F32, ExactAtIntegersAndFlushedBelowRange) {
  for (int n = -126; n <= 127; ++n)
    EXPECT_EQ(exp2_f32(static_cast<float>(n)), std::ldexp(1.0f, n)) << n;
  // Below -126.5 the result is 0 (documented), never NaN or negative.
  EXPECT_EQ(exp2_f32(-127.0f), 0.0f);
  EXPECT_EQ(exp2_f32(-1e30f), 0.0f);
  EXPECT_TRUE(std::isfinite(exp2_f32(1e30f)));
}

// Every length 1..70 crosses the 16-lane body, the 32-lane unrolled body and
// the tail; the result must equal the scalar formula element by element
// (same arithmetic per lane) and padding must be zero.
TEST(Exp2AffineRow, MatchesScalarFormulaForEveryTail) {
  for (int64_t m = 1; m <= 70; ++m) {
    const int64_t ncols = m + 5;
    std::vector<float> s(static_cast<size_t>(ncols), 7.0f);
    for (int64_t j = 0; j < m; ++j) s[j] = -0.37f * static_cast<float>(j % 23);
    const std::vector<float> in = s;
    const float sum = exp_affine_row(s.data(), m, ncols, 1.0f, 0.25f);
    double expect_sum = 0;
    for (int64_t j = 0; j < m; ++j) {
      EXPECT_EQ(s[j], exp2_f32(in[j] - 0.25f)) << "m=" << m << " j=" << j;
      expect_sum += s[j];
    }
    for (int64_t j = m; j < ncols; ++j) EXPECT_EQ(s[j], 0.0f);
    // The sum of m positive terms in f32: relative error <= m u.
    EXPECT_NEAR(sum, expect_sum, m * 0x1p-24 * expect_sum) << "m=" << m;
  }
}

TEST(RowMax, EveryLength) {
  for (int64_t m = 1; m <= 70; ++m) {
    std::vector<double> s(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) s[j] = std::sin(static_cast<double>(j));
    double expect = s[0];
    for (double x : s) expect = std::max(expect, x);
    EXPECT_EQ(row_max(s.data(), m), expect);
    std::vector<float> f(s.begin(), s.end());
    EXPECT_EQ(row_max(f.data(), m), static_cast<float>(expect));
  }
}

// A fully masked row (m = 0) yields P = dS = 0 and no dg, even with the
// lse = -inf the forward stores for it (never exp(+inf)).
TEST(SoftmaxBackwardRow, FullyMaskedRowIsZero) {
  std::vector<float> c(20, 0.5f), dp(20, 3.0f);
  const float dg = softmax_backward_row(c.data(), dp.data(), 0, 20, 1.0f);
  EXPECT_EQ(dg, 0.0f);
  for (int j = 0; j < 20; ++j) {
    EXPECT_EQ(c[j], 0.0f);
    EXPECT_EQ(dp[j], 0.0f);
  }
}

TEST(SoftmaxBackwardRow, MatchesFormula) {
  for (int64_t m = 2; m <= 40; ++m) {
    std::vector<double> c(static_cast<size_t>(m + 3)), dp(c.size());
    for (int64_t j = 0; j < m; ++j)
      c[j] = std::cos(0.3 * static_cast<double>(j)),
      dp[j] = std::sin(static_cast<double>(j));
    const std::vector<double> c0 = c, dp0 = dp;
    const double a2 = 1.7, l2 = 0;  // the shift cancels in P
    const double dg = softmax_backward_row(c.data(), dp.data(), m, m + 3, a2);
    // P is renormalized by its recomputed row sum (row_kernels.h).
    // double's base is e.
    long double sigma = 0, sd = 0;
    for (int64_t j = 0; j < m; ++j) {
      const long double e = std::exp(static_cast<long double>(c0[j]) * a2 - l2);
      sigma += e;
      sd += e * dp0[j];
    }
    const long double delta = sd / sigma;  // sum_j p_j dp_j
    long double dg_exp = 0;
    for (int64_t j = 0; j < m; ++j) {
      const long double p =
          std::exp(static_cast<long double>(c0[j]) * a2 - l2) / sigma;
      const long double ds = p * (dp0[j] - delta);
      dg_exp += ds * c0[j];
      // f64: each e_j has exp's < 1 ulp plus the argument's rounding
      // (|argument| <= 5: 5 u relative), sigma an m-term sum, then the
      // reciprocal and the product: (2 (5 + 1) + m + 2) u = (m + 14) u.
      EXPECT_NEAR(c[j], static_cast<double>(p), (m + 14) * 0x1p-53 * p);
    }
    for (int64_t j = m; j < m + 3; ++j) {
      EXPECT_EQ(c[j], 0.0);
      EXPECT_EQ(dp[j], 0.0);
    }
    // m terms |ds c| <= |dp - delta| <= 1.2, each with the relative error
    // of p plus 3 roundings, summed: (2m + 15) u * 1.2 m.
    EXPECT_NEAR(dg, static_cast<double>(dg_exp),
                (2 * m + 15) * 0x1p-53 * 1.2 * m);
  }
}

// One visible key: P = 1, dS = 0 exactly, whatever the lse (the oracle's
// gradient is exactly 0 there, so rounding noise would fail the rule).
TEST(SoftmaxBackwardRow, SingleKeyIsExact) {
  std::vector<float> c = {0.3f, 9.0f, 9.0f}, dp = {2.0f, 9.0f, 9.0f};
  EXPECT_EQ(softmax_backward_row(c.data(), dp.data(), 1, 3, 17.7f), 0.0f);
  EXPECT_EQ(c, (std::vector<float>{1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(dp, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

// Norms without overflow: f32 rows of 1e30 (f32 sum of squares overflows at
// ~1.8e19) and f64 rows of 1e300 / 1e-300 (squares over/underflow).
TEST(RowNorm, NoOverflowOrUnderflow) {
  const float big = 1e30f;
  std::vector<float> f(64, big);
  EXPECT_NEAR(row_norm(f.data(), 64), 8.0 * big, 8.0 * big * 1e-15);
  std::vector<float> tiny(9, std::numeric_limits<float>::denorm_min());
  EXPECT_NEAR(row_norm(tiny.data(), 9), 3.0 * tiny[0], 3.0 * tiny[0] * 1e-15);
  for (double mag : {1e300, 1e-300, DBL_MAX / 16, 4.9e-324}) {
    std::vector<double> d(16, mag);
    // 4 * mag exactly; the scaled sum adds a few roundings.
    EXPECT_NEAR(row_norm(d.data(), 16), 4 * mag, 4 * mag * 1e-15) << mag;
  }
  std::vector<double> z(5, 0.0);
  EXPECT_EQ(row_norm(z.data(), 5), 0.0);
}

// A zero row is divided by eps (u = 0) and its gradient is du / eps.
TEST(NormalizeRow, ZeroRowAndTinyEps) {
  std::vector<float> x(7, 0.0f), u(7, -1.0f), du(7, 2.0f), dx(7);
  const double eps = 1e-12;
  EXPECT_EQ(normalize_row(x.data(), 7, eps, 1.0, u.data()), 0.0);
  for (float v : u) EXPECT_EQ(v, 0.0f);
  normalize_backward_row(u.data(), 0.0, eps, 1.0, du.data(), 7, dx.data());
  for (float v : dx) EXPECT_EQ(v, static_cast<float>(2.0 / eps));
  // A subnormal eps: 1/eps overflows double, the division path keeps u
  // finite (0 for the zero row, +-1 for a row of one subnormal).
  std::vector<double> xd = {0.0, 0.0}, ud(2);
  normalize_row(xd.data(), 2, 1e-320, 1.0, ud.data());
  EXPECT_EQ(ud[0], 0.0);
  xd = {4.9e-324, 0.0};
  normalize_row(xd.data(), 2, 1e-320, 1.0, ud.data());
  EXPECT_TRUE(std::isfinite(ud[0]));
}

}  // namespace
}  // namespace qknorm::blas
