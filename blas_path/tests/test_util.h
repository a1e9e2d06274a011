// Shared pieces of the BLAS path's tests: the entries, the deterministic
// sweep of issue 3, and the a-priori fp64 bound of this path's algorithm.
#ifndef QKNORM_BLAS_PATH_TESTS_TEST_UTIL_H_
#define QKNORM_BLAS_PATH_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "blas_path/attention.h"
#include "qknorm/backend.h"
#include "validation/check.h"
#include "validation/tester.h"

namespace qknorm::blas::testing {

using validation::AttentionCase;
using validation::Distribution;

inline const Backend& entry(Precision p) {
  const Backend* b =
      all_backends().find(std::string("blas:") + std::string(name(p)));
  if (b == nullptr) throw std::runtime_error("blas entry missing");
  return *b;
}

// A problem of a test's list, with the name its failures print.
struct Named {
  std::string name;
  AttentionProblem p;
};

// A problem of this shape (kv_heads Hk, 0 for heads), the rest default.
inline AttentionProblem shape_problem(int64_t B, int64_t H, int64_t Hk,
                                      int64_t Nq, int64_t Nk, int64_t D) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.kv_heads = Hk;
  p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  return p;
}

// The bytes a blas entry's workspace (precision prec) holds now.
inline size_t workspace_bytes_of(Precision prec, Workspace& ws) {
  return prec == Precision::kF32
             ? dynamic_cast<BlasWorkspace<float>&>(ws).bytes()
             : dynamic_cast<BlasWorkspace<double>&>(ws).bytes();
}

// Every field of two results, parameter gradients included, bit for bit.
inline void expect_same_bits(const validation::AttentionResult& a,
                             const validation::AttentionResult& b,
                             const std::string& what) {
  auto eq = [](const std::vector<double>& x, const std::vector<double>& y) {
    // An empty vector's data() may be null, which memcmp must not receive.
    return x.size() == y.size() &&
           (x.empty() ||
            std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
  };
  EXPECT_TRUE(eq(a.o, b.o)) << what << ": o";
  EXPECT_TRUE(eq(a.lse, b.lse)) << what << ": lse";
  EXPECT_TRUE(eq(a.dq, b.dq)) << what << ": dq";
  EXPECT_TRUE(eq(a.dk, b.dk)) << what << ": dk";
  EXPECT_TRUE(eq(a.dv, b.dv)) << what << ": dv";
  EXPECT_EQ(std::memcmp(&a.dg, &b.dg, sizeof(double)), 0) << what << ": dg";
  EXPECT_TRUE(eq(a.dq_weight, b.dq_weight)) << what << ": dq_weight";
  EXPECT_TRUE(eq(a.dk_weight, b.dk_weight)) << what << ": dk_weight";
  EXPECT_TRUE(eq(a.dq_bias, b.dq_bias)) << what << ": dq_bias";
  EXPECT_TRUE(eq(a.dk_bias, b.dk_bias)) << what << ": dk_bias";
}

// The sweep of issue 3.
inline constexpr int64_t kHeadDims[] = {1, 3, 7, 8, 9, 16, 31, 64, 65, 128};
inline constexpr int64_t kLengths[] = {1, 2, 3, 7, 8, 9, 33, 64, 127, 200};
inline constexpr double kGs[] = {0, -3, 1, 12.32, 25};
enum class MaskKind { kNone, kCausal, kPadding, kCausalPadding };
inline constexpr MaskKind kMasks[] = {MaskKind::kNone, MaskKind::kCausal,
                                      MaskKind::kPadding,
                                      MaskKind::kCausalPadding};
inline constexpr Distribution kDists[] = {
    Distribution::kGaussian, Distribution::kZeroRows, Distribution::kUniform,
    Distribution::kHeavyTailed, Distribution::kWideMagnitude};

// Padding for batch 2: batch 0 keeps (nk + 1) / 2 keys, batch 1 keeps
// nk / 3 keys, which is 0 (every row fully masked) for nk <= 2.
inline Mask make_mask(MaskKind kind, int64_t nk) {
  Mask m;
  m.causal = kind == MaskKind::kCausal || kind == MaskKind::kCausalPadding;
  if (kind == MaskKind::kPadding || kind == MaskKind::kCausalPadding)
    m.key_lengths = {(nk + 1) / 2, nk / 3};
  return m;
}

// Case number `index` of the sweep for shape (D, nq, nk): mask, g, variant
// and distribution rotate with co-prime periods (4, 5, 3, 5 over the index),
// so consecutive shapes see different combinations and every value of each
// parameter is hit for every head_dim. Every third case is sdpa (g unused);
// sdpa never draws kWideMagnitude, whose q.k of 1e60 is not an f32 logit.
inline AttentionCase sweep_case(int64_t index, int64_t D, int64_t nq,
                                int64_t nk) {
  AttentionProblem p;
  p.batch = 2;
  p.heads = 2;
  p.head_dim = D;
  p.q_len = nq;
  p.kv_len = nk;
  p.mask = make_mask(kMasks[index % 4], nk);
  p.g = kGs[(index / 4) % 5];
  p.variant = index % 3 == 2 ? Variant::kSDPA : Variant::kQKNorm;
  Distribution dist = kDists[(index / 3) % 5];
  if (p.variant == Variant::kSDPA && dist == Distribution::kWideMagnitude)
    dist = Distribution::kGaussian;
  return validation::make_attention_case(p, dist,
                                         static_cast<uint64_t>(1000 + index));
}

// A-priori bound on |blas:f64 - oracle|, first-order rounding analysis of
// THIS path's algorithm (attention.h) with u = 2^-53 (Higham, sec. 3.1:
// an n-term sum or dot product has error <= gamma_n sum|terms|, gamma_n ~ n u).
// A = logit amplitude (|g| for qknorm, max||q|| max||k|| / sqrt(D) for sdpa),
// N = max(q_len, kv_len):
//   q_hat, k_hat: D-term sum of squares, sqrt, the factor scale/den, one
//     product: each component <= (D + 5) u relative;
//   C = GEMM dot of D terms: |dC| <= gamma_D + 2 (D + 5) u <= (3D + 11) u;
//   exp argument C * alpha - alpha * C_max (f64: base e, alpha = g or
//     1/sqrt(D) rounded once; one FMA and the rounded shift): 4 more
//     roundings of magnitude <= 2A, so E = A (3D + 15) u bounds the argument
//     error; e_j: E + u (std::exp < 1 ulp);
//   sum_j e_j: N-term sum -> relative E + (N + 2) u;
//   O = GEMM(E V) / sum: |dO| <= (2E + (2N + 6) u) max|V|.
//   gamma_fwd = (2 A (3D + 15) + 2N + 6) u,
//   err(o) <= gamma_fwd max|V|,  err(lse) <= gamma_fwd (1 + max|lse|).
// Backward, on top of gamma_fwd (P is recomputed as the forward's e / sum):
// dP (GEMM, D terms), delta = sum P (dP - dP_r) (N terms) and dS (3
// roundings): (D + N + 4) u; dQ_hat / dK_hat / dV, N-term GEMM sums (dK_hat
// and dV accumulated over query blocks: still one N-term sum per element):
// N u; the normalization backward, a D-term dot and 4 roundings: (D + 4) u.
// In total 2D + 2N + 8, rounded up to
//   gamma_bwd = gamma_fwd + (3D + 2N + 8) u
// times max|oracle field| (random, well-conditioned inputs: the magnitude of
// the terms is that of the result up to a small factor), and times
// sum|dS| for dg (|C| <= 1). Worst case (every rounding aligned); a wrong
// formula misses it by many orders of magnitude, roundoff does not reach it
// on the sweep (both sweeps check it for every f64 case).
struct F64Bound {
  double o, lse, dq, dk, dv, dg;
};
inline F64Bound f64_bound(const AttentionCase& c,
                          const validation::OracleAttention& orc) {
  const AttentionProblem& p = c.problem;
  const double u = 0x1p-53, D = static_cast<double>(p.head_dim);
  const double N = static_cast<double>(std::max(p.q_len, p.kv_len));
  auto max_row_norm = [&](const std::vector<double>& x) {
    long double best = 0;
    for (size_t r = 0; r < x.size(); r += static_cast<size_t>(p.head_dim)) {
      long double s = 0;
      for (int64_t d = 0; d < p.head_dim; ++d)
        s += static_cast<long double>(x[r + d]) * x[r + d];
      best = std::max(best, std::sqrt(s));
    }
    return static_cast<double>(best);
  };
  const double A = p.variant == Variant::kQKNorm
                       ? std::fabs(p.g)
                       : max_row_norm(c.q) * max_row_norm(c.k) / std::sqrt(D);
  const double gf = (2 * A * (3 * D + 15) + 2 * N + 6) * u;
  const double gb = gf + (3 * D + 2 * N + 8) * u;
  auto amax = [](const auto& v) {
    double m = 0;
    for (auto x : v)
      if (std::isfinite(static_cast<double>(x)))
        m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
  };
  return {gf * amax(c.v),    gf * (1 + amax(orc.lse)),
          gb * amax(orc.dq), gb * amax(orc.dk),
          gb * amax(orc.dv), gb * static_cast<double>(orc.dg_scale)};
}

// Applies the tolerance rule (and, for f64, the a-priori bound) to one case;
// every failing field is reported, nothing aborts. The entry runs in guarded
// buffers (validation::AttentionTester; the verdict is check_attention's,
// naive included): a read or write outside a view fails the case too.
inline void expect_case(Precision prec, const AttentionCase& c,
                        const ExecConfig& cfg = {}) {
  // The a-priori bound reads the oracle the verdict was judged by (the
  // tester's copy): evaluating it again doubled the f64 cases' oracle time.
  validation::OracleAttention orc;
  const validation::AttentionTestReport r = validation::AttentionTester()
                                                .use_case(c)
                                                .config(cfg)
                                                .with_naive()
                                                .keep_oracle(&orc)
                                                .Test(entry(prec));
  EXPECT_TRUE(r.ok()) << r.message();
  if (prec != Precision::kF64 || !r.judged) return;
  const validation::AgreementReport& rep = r.verdict;
  const AttentionCase rc = validation::round_inputs(c, prec);
  const F64Bound b = f64_bound(rc, orc);
  for (const auto& f : rep.fields) {
    using validation::Field;
    const double bound = f.id == Field::kO     ? b.o
                         : f.id == Field::kLse ? b.lse
                         : f.id == Field::kDq  ? b.dq
                         : f.id == Field::kDk  ? b.dk
                         : f.id == Field::kDv  ? b.dv
                                               : b.dg;
    EXPECT_LE(f.entry.max_abs, bound)
        << "fp64 a-priori bound, field " << validation::name(f.id) << " on "
        << rep.case_desc << "\n  " << validation::describe(f.entry);
  }
}

}  // namespace qknorm::blas::testing

#endif  // QKNORM_BLAS_PATH_TESTS_TEST_UTIL_H_
