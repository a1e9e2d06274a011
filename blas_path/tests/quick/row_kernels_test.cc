// Contract tests of the row kernels (row_kernels.h) and the normalization
// (normalize.h): exp2's error bound, tails, zero padding, fully masked rows,
// and norms without overflow or underflow.
#include "blas_path/row_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numbers>
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
  const float dg = softmax_backward_row(c.data(), dp.data(), 0, 20, 1.0f, 1.0f);
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
    const double dg =
        softmax_backward_row(c.data(), dp.data(), m, m + 3, a2, 1.0);
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
  EXPECT_EQ(softmax_backward_row(c.data(), dp.data(), 1, 3, 17.7f, 1.0f), 0.0f);
  EXPECT_EQ(c, (std::vector<float>{1.0f, 0.0f, 0.0f}));
  EXPECT_EQ(dp, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

// ---- Both vector widths of the float kernels --------------------------------
// The dispatcher picks one width per CPU; these run w32 everywhere and w64
// where the CPU has AVX-512, so a defect of either width is seen on an
// AVX-512 machine. Issue 14: in Clang builds at -O0, or with ASan/UBSan at
// -O1, the w64 kernels received garbage upper lanes from vector-valued
// lambdas (row_kernels-inl.h): P wrong by 8% for every row length whose tail
// exceeds 4 lanes, and NaN gradients for a dominant logit of 1.4e17 with
// dO = 0. Each test below fails there without the fix; the GCC Release build
// never showed it (the lambdas were inlined).
struct FloatWidth {
  const char* name;
  float (*row_max)(const float*, int64_t);
  float (*row_min)(const float*, int64_t);
  float (*exp_affine_row)(float*, int64_t, int64_t, float, float);
  float (*softmax_backward_row)(float*, float*, int64_t, int64_t, float, float,
                                float, float*);
};
std::vector<FloatWidth> float_widths() {
  std::vector<FloatWidth> w = {{"w32", detail::row_max_w32, detail::row_min_w32,
                                detail::exp_affine_row_w32,
                                detail::softmax_backward_row_w32}};
  if (detail::v4_supported())
    w.push_back({"w64", detail::row_max_w64, detail::row_min_w64,
                 detail::exp_affine_row_w64, detail::softmax_backward_row_w64});
  return w;
}

// f32 unit roundoff.
constexpr double kU32 = 0x1p-24;

// Relative error bound of one f32 probability p_j = e_j / sigma from
// softmax_backward_row, first order in u, for arguments a2 (c_j - c_r) of
// magnitude <= max_arg. Each e_j: the argument rounds twice (2 max_arg u
// absolute, so 2 max_arg ln2 u relative after exp2) and exp2_f32 adds
// kExp2MaxUlp ulp, up to 2 kExp2MaxUlp u relative (an ulp is up to 2u):
// e_rel = (2 max_arg ln2 + 2 kExp2MaxUlp) u. sigma, an m-term sum of the
// e_k, inherits e_rel and adds m u; the reciprocal and the product one u
// each. p_rel = 2 e_rel + (m + 2) u; 4 u more for the second order.
double p_rel_bound(int64_t m, double max_arg) {
  const double e_rel = 2 * max_arg * std::numbers::ln2 + 2 * kExp2MaxUlp;
  return (2 * e_rel + static_cast<double>(m) + 2 + 4) * kU32;
}
// Absolute bound of ds_j = p_j (dp_j - delta) with |dp| <= 1: p's relative
// error times |dp_j - delta| <= 2, plus p_j times the error of (dp_j - d0) -
// de: one rounding of a value <= 2 (2u), the m-term sum sd of terms e_j
// (dp_j - dp_r) <= 2 e_j (2 m u sigma, the e_j's own errors 2 p_rel sigma),
// divided by sigma (2u), one subtraction of values <= 4 (4u):
// p_j (4 p_rel + (2m + 8) u).
double ds_abs_bound(int64_t m, double max_arg, double p) {
  return (4 * p_rel_bound(m, max_arg) +
          (2 * static_cast<double>(m) + 8) * kU32) *
         p;
}

TEST(FloatWidths, RowMaxMinEveryLength) {
  for (const FloatWidth& w : float_widths())
    for (int64_t m = 1; m <= 70; ++m) {
      std::vector<float> s(static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j)
        s[j] = static_cast<float>(std::sin(1.7 * static_cast<double>(j)));
      EXPECT_EQ(w.row_max(s.data(), m), *std::max_element(s.begin(), s.end()))
          << w.name << " m=" << m;
      EXPECT_EQ(w.row_min(s.data(), m), *std::min_element(s.begin(), s.end()))
          << w.name << " m=" << m;
    }
}

// Each element is exp2_f32 of the same two roundings (bitwise), padding 0.
TEST(FloatWidths, ExpAffineRowMatchesScalarFormula) {
  const float alpha = 1.3f, shift = 0.75f;
  for (const FloatWidth& w : float_widths())
    for (int64_t m = 1; m <= 70; ++m) {
      const int64_t ncols = m + 5;
      std::vector<float> s(static_cast<size_t>(ncols), 7.0f);
      for (int64_t j = 0; j < m; ++j)
        s[j] = static_cast<float>(std::cos(0.7 * static_cast<double>(j)));
      const std::vector<float> in = s;
      w.exp_affine_row(s.data(), m, ncols, alpha, shift);
      for (int64_t j = 0; j < m; ++j) {
        const float arg = in[j] * alpha;  // two roundings, as the kernel
        EXPECT_EQ(s[j], exp2_f32(arg - shift))
            << w.name << " m=" << m << " j=" << j;
      }
      for (int64_t j = m; j < ncols; ++j) EXPECT_EQ(s[j], 0.0f);
    }
}

// The f32 backward row against the formula in long double (base 2) for
// every length 1..70 (16-lane body, tails of every size), spread rows (the
// direct form) and rows with one dominant key (the reference form).
TEST(FloatWidths, SoftmaxBackwardRowMatchesFormula) {
  const float a2 = 1.7f;
  for (const FloatWidth& w : float_widths())
    for (bool dominant : {false, true})
      for (int64_t m = 1; m <= 70; ++m) {
        const int64_t ncols = m + 3;
        std::vector<float> c(static_cast<size_t>(ncols), 9.0f), dp(c);
        for (int64_t j = 0; j < m; ++j) {
          const double x = static_cast<double>(j);
          c[j] = static_cast<float>(std::cos(0.3 * x));  // |c| <= 1
          dp[j] = static_cast<float>(std::sin(x));
        }
        // A key 12 above the rest: every other e_j <= 2^(-11 a2) < 2.5e-6,
        // so sigma < 2 for every m <= 70 and the reference form is taken.
        if (dominant) c[static_cast<size_t>(m / 2)] = 12.0f;
        const double max_arg = a2 * (dominant ? 13.0 : 2.0);
        const std::vector<float> c0 = c, dp0 = dp;
        const float dg = w.softmax_backward_row(c.data(), dp.data(), m, ncols,
                                                a2, 1.0f, 0.0f, nullptr);
        long double cmax = c0[0];
        for (int64_t j = 0; j < m; ++j)
          cmax = std::max<long double>(cmax, c0[j]);
        long double sigma = 0, sd = 0;
        for (int64_t j = 0; j < m; ++j) {
          const long double e = std::exp2((c0[j] - cmax) * a2);
          sigma += e;
          sd += e * dp0[j];
        }
        const long double delta = sd / sigma;
        long double dg_exp = 0, dg_abs = 0, dg_terms = 0;
        for (int64_t j = 0; j < m; ++j) {
          const long double p = std::exp2((c0[j] - cmax) * a2) / sigma;
          const long double ds = m == 1 ? 0 : p * (dp0[j] - delta);
          dg_exp += ds * c0[j];
          dg_terms += std::fabs(ds * c0[j]);
          dg_abs += std::fabs(c0[j]) *
                    ds_abs_bound(m, max_arg, static_cast<double>(p));
          EXPECT_NEAR(c[j], static_cast<double>(p),
                      p_rel_bound(m, max_arg) * static_cast<double>(p))
              << w.name << " m=" << m << " j=" << j;
          EXPECT_NEAR(dp[j], static_cast<double>(ds),
                      ds_abs_bound(m, max_arg, static_cast<double>(p)))
              << w.name << " m=" << m << " j=" << j;
        }
        for (int64_t j = m; j < ncols; ++j) {
          EXPECT_EQ(c[j], 0.0f);
          EXPECT_EQ(dp[j], 0.0f);
        }
        // dg = sum_j ds_j c_j: each term within |c_j| ds_abs_bound plus
        // the product's u, and the m-term sum adds m u sum |ds_j c_j|
        // (the sum cancels: its own size is no scale).
        EXPECT_NEAR(
            dg, static_cast<double>(dg_exp),
            static_cast<double>(dg_abs) + (static_cast<double>(m) + 1) * kU32 *
                                              static_cast<double>(dg_terms))
            << w.name << " m=" << m;
      }
}

// With an attention sink (a key of logit `sink`, in the kernel's base-2
// units, with dp = 0): P, dS and the row's p_sink delta against the formula
// in long double for every length 1..40 and sinks far below the row, inside
// it, just above its top (the sink is the shift and the dP reference; p_sink
// ~ 1/2) and far above it (p_sink ~ 1, delta ~ 2^-22 |dp|: formed directly,
// not as dp_r + (delta - dp_r)). Bounds as above with m + 1 keys and the
// sink's argument; the share's error relative to |delta| plus the terms
// sdr / sigma sums (sum_j p_j |dp_j - dp_ref| + p_sink |dp_ref|, dp_ref 0
// where the sink is the reference).
TEST(FloatWidths, SoftmaxBackwardRowWithSink) {
  const float a2 = 1.7f;
  for (const FloatWidth& w : float_widths())
    for (float sink : {-30.0f, 0.4f, 2.0f, 25.0f})
      for (int64_t m = 1; m <= 40; ++m) {
        const int64_t ncols = m + 3;
        std::vector<float> c(static_cast<size_t>(ncols), 9.0f), dp(c);
        for (int64_t j = 0; j < m; ++j) {
          const double x = static_cast<double>(j);
          c[j] = static_cast<float>(std::cos(0.3 * x));   // |c| <= 1
          dp[j] = static_cast<float>(std::sin(x + 0.5));  // dp_r != 0
        }
        const std::vector<float> c0 = c, dp0 = dp;
        float share = NAN;
        const float dg = w.softmax_backward_row(c.data(), dp.data(), m, ncols,
                                                a2, 1.0f, sink, &share);
        // The kernel's shift and reference key.
        int64_t r = 0;
        for (int64_t j = 1; j < m; ++j)
          if (c0[j] > c0[r]) r = j;
        const float top = a2 * c0[r];
        const bool sink_top = sink > top;
        const long double shift = sink_top ? sink : top,
                          dref = sink_top ? 0 : dp0[r];
        long double sigma = std::exp2(sink - shift), sd = 0;
        for (int64_t j = 0; j < m; ++j) {
          const long double e = std::exp2(c0[j] * a2 - shift);
          sigma += e;
          sd += e * dp0[j];
        }
        const long double delta = sd / sigma,
                          p_sink = std::exp2(sink - shift) / sigma;
        const double max_arg = std::fabs(sink) + 2 * a2;
        const double p_rel = p_rel_bound(m + 1, max_arg);
        long double dg_exp = 0, dg_abs = 0, dg_terms = 0,
                    terms = p_sink * std::fabs(dref);
        for (int64_t j = 0; j < m; ++j) {
          const long double p = std::exp2(c0[j] * a2 - shift) / sigma;
          const long double ds = p * (dp0[j] - delta);
          terms += p * std::fabs(dp0[j] - dref);
          dg_exp += ds * c0[j];
          dg_terms += std::fabs(ds * c0[j]);
          const double ds_tol = ds_abs_bound(m + 1, max_arg, (double)p);
          dg_abs += std::fabs(c0[j]) * ds_tol;
          EXPECT_NEAR(c[j], (double)p, p_rel * (double)p)
              << w.name << " sink=" << sink << " m=" << m << " j=" << j;
          EXPECT_NEAR(dp[j], (double)ds, ds_tol)
              << w.name << " sink=" << sink << " m=" << m << " j=" << j;
        }
        for (int64_t j = m; j < ncols; ++j) {
          EXPECT_EQ(c[j], 0.0f);
          EXPECT_EQ(dp[j], 0.0f);
        }
        EXPECT_NEAR(dg, (double)dg_exp,
                    (double)dg_abs + (m + 1.0) * kU32 * (double)dg_terms)
            << w.name << " sink=" << sink << " m=" << m;
        EXPECT_NEAR(share, (double)(p_sink * delta),
                    (3 * p_rel + (2.0 * m + 16) * kU32) * (double)p_sink *
                        (double)(std::fabs(delta) + terms))
            << w.name << " sink=" << sink << " m=" << m;
      }
}

// The stored dS is scale * dS (what the GEMMs multiply by the other side's
// operand, with alpha = 1), the returned dg share unscaled: for scale 0.5
// (exact) every dp is half the scale-1 one and dg and P are the same bits;
// for scale 0 every dp is 0, even where dS itself is near the largest
// float (the fuzz finding crash-blas-f64-rms-scale0-huge-do-dk-nan).
TEST(SoftmaxBackwardRow, StoresScaledDsReturnsUnscaledDg) {
  for (const FloatWidth& w : float_widths())
    for (int64_t m = 2; m <= 40; ++m) {
      SCOPED_TRACE(std::string(w.name) + " m=" + std::to_string(m));
      std::vector<float> c0(static_cast<size_t>(m + 3), 0), dp0(c0.size(), 0);
      for (int64_t j = 0; j < m; ++j)
        c0[j] = std::cos(0.3f * static_cast<float>(j)),
        dp0[j] = 1e38f * std::sin(static_cast<float>(j));
      std::vector<float> c1 = c0, dp1 = dp0, ch = c0, dph = dp0, cz = c0,
                         dpz = dp0;
      const float a2 = 1.7f;
      const float dg1 = w.softmax_backward_row(c1.data(), dp1.data(), m, m + 3,
                                               a2, 1.0f, 0.0f, nullptr);
      EXPECT_EQ(w.softmax_backward_row(ch.data(), dph.data(), m, m + 3, a2,
                                       0.5f, 0.0f, nullptr),
                dg1);
      EXPECT_EQ(w.softmax_backward_row(cz.data(), dpz.data(), m, m + 3, a2,
                                       0.0f, 0.0f, nullptr),
                dg1);
      EXPECT_EQ(ch, c1);
      EXPECT_EQ(cz, c1);
      for (size_t j = 0; j < c0.size(); ++j) {
        EXPECT_EQ(dph[j], 0.5f * dp1[j]) << j;
        EXPECT_EQ(dpz[j], 0.0f) << j;
      }
    }
}

// The issue-14 row (fuzz reproducer
// crash-blas-f32-sdpa-zero-do-nan): an sdpa row of 11 keys with logits up
// to 1.4e17 and down to -1.7e35 and dP = 0 (dO = 0). P is one-hot on the
// dominant key (every other argument is below -127: exactly 0) and dS is
// exactly 0, for the row in every position of a 16- or 8-lane tail.
TEST(FloatWidths, DominantHugeLogitWithZeroDpIsExact) {
  const float a2 = static_cast<float>(1.4426950408889634);  // log2(e), sdpa D=1
  const std::vector<float> row = {
      1, 1, 1, 1, 1, 1, -0.25f, 0, -1.66153499e35f, -0.5f, 1.43552238e17f};
  for (const FloatWidth& w : float_widths())
    for (int64_t m = 2; m <= 40; ++m) {
      std::vector<float> c(static_cast<size_t>(m + 5), 0.5f), dp(c.size(), 0);
      for (int64_t j = 0; j < m; ++j) c[j] = row[static_cast<size_t>(j) % 11];
      const int64_t r = m >= 11 ? 10 : -1;  // the 1.4e17 key, if present
      const float dg = w.softmax_backward_row(c.data(), dp.data(), m, m + 5, a2,
                                              1.0f, 0.0f, nullptr);
      EXPECT_EQ(dg, 0.0f) << w.name << " m=" << m;
      float psum = 0;
      for (int64_t j = 0; j < m + 5; ++j) {
        EXPECT_EQ(dp[j], 0.0f) << w.name << " m=" << m << " j=" << j;
        EXPECT_TRUE(std::isfinite(c[j])) << w.name << " m=" << m << " j=" << j;
        if (r >= 0 && j < m && row[static_cast<size_t>(j) % 11] != row[10]) {
          EXPECT_EQ(c[j], 0.0f) << w.name << " m=" << m << " j=" << j;
        }
        psum += c[j];
      }
      // With one dominant key (11 <= m <= 21) P is 1 / sigma with sigma = 1
      // plus exact zeros: exactly 1. From m = 22 on, 2 or 3 keys of 1.4e17
      // tie (sigma = 2 or 3), and without one (m < 11) the spread keys share
      // P, arguments down to (-0.5 - 1) a2: within the bound of each p.
      if (r < 0 || m >= 22) {
        EXPECT_NEAR(psum, 1.0f, p_rel_bound(m, 1.5 * a2))
            << w.name << " m=" << m;
        continue;
      }
      EXPECT_EQ(psum, 1.0f) << w.name << " m=" << m;
    }
}

// Norms without overflow: f32 rows of 1e30 (f32 sum of squares overflows at
// ~1.8e19) and f64 rows of 1e300 / 1e-300 (squares over/underflow).
TEST(RowNorm, NoOverflowOrUnderflow) {
  const float big = 1e30f;
  std::vector<float> f(64, big);
  EXPECT_NEAR(row_norm(f.data(), 64).value(), 8.0 * big, 8.0 * big * 1e-15);
  std::vector<float> tiny(9, std::numeric_limits<float>::denorm_min());
  EXPECT_NEAR(row_norm(tiny.data(), 9).value(), 3.0 * tiny[0],
              3.0 * tiny[0] * 1e-15);
  for (double mag : {1e300, 1e-300, DBL_MAX / 16, 4.9e-324}) {
    std::vector<double> d(16, mag);
    // 4 * mag exactly; the scaled sum adds a few roundings.
    EXPECT_NEAR(row_norm(d.data(), 16).value(), 4 * mag, 4 * mag * 1e-15)
        << mag;
  }
  std::vector<double> z(5, 0.0);
  EXPECT_EQ(row_norm(z.data(), 5).value(), 0.0);
}

// A zero row is divided by eps (u = 0) and its gradient is du / eps.
TEST(NormalizeRow, ZeroRowAndTinyEps) {
  std::vector<float> x(7, 0.0f), u(7, -1.0f), du(7, 2.0f), dx(7);
  const double eps = 1e-12;
  EXPECT_EQ(normalize_row(x.data(), 7, eps, 1.0, u.data()).value(), 0.0);
  for (float v : u) EXPECT_EQ(v, 0.0f);
  normalize_backward_row(u.data(), RowNorm{}, eps, 1.0, du.data(), 7,
                         dx.data());
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

// Rows whose norm is not a normal double (fuzz finding
// crash-blas-f64-huge-rows): at DBL_MAX the norm is 2 DBL_MAX for four
// elements, u must still be x / ||x|| = +-1/2 (exactly: power-of-two
// scaling, then a division by the mantissa 1/2 * 2 = 1), and a subnormal
// norm above a subnormal eps must not be rounded before the division.
TEST(NormalizeRow, NormBeyondDblMaxAndSubnormal) {
  std::vector<double> x = {DBL_MAX, -DBL_MAX, DBL_MAX, DBL_MAX}, u(4);
  const RowNorm n = normalize_row(x.data(), 4, 1e-12, 1.0, u.data());
  EXPECT_TRUE(std::isinf(n.value()));
  EXPECT_EQ(n.exp, 1025);  // 2 DBL_MAX = (1 - 2^-53) 2^1025
  EXPECT_EQ(u, (std::vector<double>{0.5, -0.5, 0.5, 0.5}));
  // (3, 4) * 2^-1074: norm 5 * 2^-1074, u = (0.6, 0.8) to the last bit.
  x = {3 * 0x1p-1074, 4 * 0x1p-1074};
  normalize_row(x.data(), 2, 0x1p-1074, 1.0, u.data());
  EXPECT_EQ(u[0], 0.6);
  EXPECT_EQ(u[1], 0.8);
}

// Backward factors scale / ||x|| that are not normal doubles (fuzz finding
// crash-blas-f64-subnormal-g-dx): g = 2^-1070 over ||x|| = 5 is subnormal as
// one factor (2 significant bits); applied after the product, dx keeps full
// precision. Expected values in long double (64-bit significand): the
// kernel rounds (du - u c) and the mantissa ratio once each, so 4 u_f64 is
// a bound with room.
TEST(NormalizeBackwardRow, NonNormalFactor) {
  constexpr double kTol = 4 * 0x1p-53;
  const std::vector<double> u = {0.6, 0.8}, du = {3e300, -1e300};
  std::vector<double> dx(2);
  const double g = 0x1p-1070;
  const RowNorm nrm{0.625, 3};  // 5
  normalize_backward_row(u.data(), nrm, 1e-12, g, du.data(), 2, dx.data());
  const long double c = 0.6L * 3e300L + 0.8L * -1e300L;
  for (int i = 0; i < 2; ++i) {
    const long double want =
        (du[i] - u[i] * c) * (static_cast<long double>(g) / 5);
    EXPECT_NEAR(dx[i], static_cast<double>(want),
                kTol * std::fabs(static_cast<double>(want)))
        << i;
  }
  // A huge g over a tiny norm: the factor g / ||x|| = 1e300 / (5 2^-1000)
  // overflows, dx_0 = (du_0 - u_0 c) g / ||x|| = 0.64 * 1e300 / 5 does not.
  const std::vector<double> du2 = {0x1p-1000, 0.0};
  const RowNorm tiny{0.625, -997};  // 5 * 2^-1000
  normalize_backward_row(u.data(), tiny, 0x1p-1070, 1e300, du2.data(), 2,
                         dx.data());
  const long double c2 = 0.6L * 0x1p-1000L;
  const long double want0 =
      (0x1p-1000L - 0.6L * c2) * 1e300L / (5 * 0x1p-1000L);
  EXPECT_NEAR(dx[0], static_cast<double>(want0),
              kTol * std::fabs(static_cast<double>(want0)));
}

}  // namespace
}  // namespace qknorm::blas
