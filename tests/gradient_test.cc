// Finite-difference checks (in the oracle type) of the double reference's and
// the oracle's gradients, and the structural invariants of the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "qknorm/backend.h"
#include "reference/reference.h"
#include "tests/test_support.h"
#include "validation/gradcheck.h"
#include "validation/metrics.h"
#include "validation/oracle.h"
#include "validation/run.h"

namespace qknorm {
namespace {

using test_support::FdTally;
using test_support::ref64;
using validation::Distribution;
using validation::gradients_of;
using validation::kFdTol;

// The shape with a variant, g and a mask (bit 0 causal, bit 1 the first
// batch's last key padded).
AttentionProblem problem(int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                         int64_t D, Variant var, double g, int mask) {
  AttentionProblem p = test_support::shape(B, H, Nq, Nk, D);
  p.variant = var;
  p.g = g;
  p.mask.causal = mask & 1;
  if (mask & 2)
    for (int64_t b = 0; b < B; ++b)
      p.mask.key_lengths.push_back(b == 0 ? Nk - 1 : Nk);
  return p;
}

TEST(Gradients, FullJacobianTinyProblems) {
  FdTally tally;
  int n = 0;
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA})
    for (int mask = 0; mask < 4; ++mask)
      for (double g : {0.0, -3.0, g_init(72), 25.0}) {
        const auto p = problem(2, 1, 3, 4, 3, var, g, mask);
        const auto c = validation::make_attention_case(
            p, mask == 3 ? Distribution::kZeroRows : Distribution::kGaussian,
            500 + n++);
        const auto r = validation::run_attention(ref64(), c);
        tally.expect_pass(
            validation::check_attention_full(c, gradients_of(r), kFdTol),
            c.describe());
      }
  tally.print("full-Jacobian");
}

TEST(Gradients, RandomDirectionsLargerProblems) {
  FdTally tally, oracle;
  int n = 0;
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA})
    for (int mask = 0; mask < 4; ++mask, ++n) {
      const auto p = problem(2, 2, 9, 13, 16, var, 12.32 + mask, mask);
      const auto c = validation::make_attention_case(
          p, Distribution::kHeavyTailed, 900 + n);
      const auto r = validation::run_attention(ref64(), c);
      tally.expect_pass(validation::check_attention_directions(
                            c, gradients_of(r), 8, 77 + n, kFdTol),
                        c.describe());
      // The oracle's own gradient too.
      oracle.expect_pass(validation::check_attention_directions(
                             c, gradients_of(validation::oracle_attention(c)),
                             4, 5 + n, kFdTol),
                         c.describe());
    }
  tally.print("random directions (8 each)");
  oracle.print("oracle, random directions (4 each)");
}

TEST(Gradients, ScaleNormFullAndDirectional) {
  FdTally tally;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    ScaleNormProblem p{3, static_cast<int64_t>(seed + 1),
                       2.5 * static_cast<double>(seed), kDefaultScaleNormEps};
    const auto c = validation::make_scalenorm_case(
        p, seed % 2 ? Distribution::kZeroRows : Distribution::kGaussian, seed);
    const auto r = validation::run_scalenorm(ref64(), c);
    validation::ScaleNormGradients g{{r.dx.begin(), r.dx.end()}, r.dg};
    tally.expect_pass(validation::check_scalenorm_full(c, g, kFdTol),
                      c.describe());
    tally.expect_pass(
        validation::check_scalenorm_directions(c, g, 6, seed, kFdTol),
        c.describe());
  }
  tally.print("scalenorm");
}

// The checker itself must fail on a wrong gradient (a test that cannot fail
// is a defect): perturb one element of dk and one of dg.
TEST(Gradients, CheckerCatchesWrongGradients) {
  const auto p = problem(1, 1, 3, 4, 3, Variant::kQKNorm, 12.32, 0);
  const auto c = validation::make_attention_case(p, Distribution::kGaussian, 3);
  auto g = gradients_of(validation::run_attention(ref64(), c));
  auto bad = g;
  bad.dk[5] *= 1.001;
  EXPECT_FALSE(validation::check_attention_full(c, bad, kFdTol).pass);
  EXPECT_FALSE(
      validation::check_attention_directions(c, bad, 8, 1, kFdTol).pass);
  bad = g;
  bad.dg *= 1.0001;
  EXPECT_FALSE(validation::check_attention_full(c, bad, kFdTol).pass);
}

// |x_r . dx_r| <= tol * ||x_r|| ||dx_r|| for every row r.
void expect_rows_orthogonal(const char* what, const std::vector<double>& x,
                            const std::vector<double>& dx, int64_t D,
                            double tol) {
  for (size_t row = 0; row < x.size() / D; ++row) {
    double dot = 0, nx = 0, nd = 0;
    for (int64_t d = 0; d < D; ++d) {
      dot += x[row * D + d] * dx[row * D + d];
      nx += x[row * D + d] * x[row * D + d];
      nd += dx[row * D + d] * dx[row * D + d];
    }
    EXPECT_LE(std::fabs(dot), tol * std::sqrt(nx * nd) + 1e-300)
        << what << " row " << row;
  }
}

// Invariants, relative to the norms (double reference, Gaussian inputs):
// q_i . dq_i = 0 and k_j . dk_j = 0 (the normalization backward projects out
// the radial direction), x . dx = 0 (ScaleNorm), rows of dS sum to 0.
// kOrthoTol: each dot is a D-term sum of products of magnitude
// ||q|| ||dq||, so its rounding error is <= gamma_D ~ D u relative to that;
// 64 u * D with D <= 16 is 1e-13, far below a broken projection's O(1).
TEST(Gradients, Invariants) {
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA})
    for (int mask = 0; mask < 4; ++mask) {
      const auto p = problem(2, 2, 5, 7, 16, var, 17, mask);
      const auto c = validation::make_attention_case(p, Distribution::kGaussian,
                                                     40 + mask);
      const auto r = validation::run_attention(ref64(), c);
      const double kOrthoTol = 64 * 0x1p-53 * 16;
      const int64_t D = 16;
      if (var == Variant::kQKNorm) {
        expect_rows_orthogonal("q", c.q, r.dq, D, kOrthoTol);
        expect_rows_orthogonal("k", c.k, r.dk, D, kOrthoTol);
      }
      // dS row sums, from the reference's dS output.
      std::vector<double> q(c.q), k(c.k), v(c.v), d_o(c.d_o), o(r.o),
          lse(r.lse);
      std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()),
          ds(static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
      double dg = 0;
      reference::attention_backward<double>(
          p, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(),
          dq.data(), dk.data(), dv.data(), &dg, ds.data());
      // sum_j dS_ij = sum_j P_ij dP_ij - delta_i sum_j P_ij vanishes exactly;
      // computed, it is the rounding error of delta (a D-term dot of dO_i
      // and O_i), of sum P dP (N terms of |dP_ij| <= ||dO_i|| ||v_j||) and
      // of sum P = 1 (N u): <= (2D + 2N + 8) u ||dO_i|| (max_j ||v_j|| +
      // ||O_i||).
      double vmax = 0;
      for (size_t row = 0; row < v.size() / D; ++row) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += v[row * D + d] * v[row * D + d];
        vmax = std::max(vmax, std::sqrt(s));
      }
      for (size_t row = 0; row < ds.size() / p.kv_len; ++row) {
        double s = 0, ndo = 0, no = 0;
        for (int64_t j = 0; j < p.kv_len; ++j) s += ds[row * p.kv_len + j];
        for (int64_t d = 0; d < D; ++d) {
          ndo += d_o[row * D + d] * d_o[row * D + d];
          no += o[row * D + d] * o[row * D + d];
        }
        const double bound = (2 * D + 2 * p.kv_len + 8) * 0x1p-53 *
                             std::sqrt(ndo) * (vmax + std::sqrt(no));
        EXPECT_LE(std::fabs(s), bound) << "dS row " << row;
      }
    }
  // ScaleNorm x . dx = 0.
  ScaleNormProblem sp{4, 9, 3, kDefaultScaleNormEps};
  const auto sc =
      validation::make_scalenorm_case(sp, Distribution::kGaussian, 8);
  const auto sr = validation::run_scalenorm(ref64(), sc);
  expect_rows_orthogonal("x", sc.x, sr.dx, 9, 64 * 0x1p-53 * 9);
}

}  // namespace
}  // namespace qknorm
