// The oracle's own gradient properties (issue 5, property 4): the long double
// backward against central finite differences (full Jacobian on tiny
// problems, random directions on larger ones), and rows of dS summing to 0 in
// every reference instantiation. Entries are compared with this oracle by the
// agreement properties (property_test.cc).
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "property_tests/rc_gens.h"
#include "property_tests/support.h"
#include "reference/reference.h"
#include "validation/bounds.h"
#include "validation/gradcheck.h"

namespace qknorm::property {
namespace {

using validation::AttentionCase;

// Relative tolerance of the finite-difference checks (gradcheck.h: central
// differences in long double with kFdStep = 2^-20 have truncation and
// rounding errors ~1e-12 relative); the foundation tests measured worst cases
// near 1e-10, so 1e-8 keeps a 100x margin and sits far below the O(1) error
// of a wrong formula.
constexpr double kFdTol = 1e-8;
constexpr int kFdDirections = 6;

std::string test_id() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "/" + info->name();
}

void expect_property(const char* name, void (*body)(), int cases) {
  const RunResult r = run_body(name, body, cases, test_id(), true, true);
  EXPECT_TRUE(r.pass) << r.message;
}

validation::AttentionGradients grads_of(const validation::OracleAttention& o) {
  return {o.dq,        o.dk,        o.dv,      o.dg,
          o.dq_weight, o.dk_weight, o.dq_bias, o.dk_bias};
}

// True iff every gradient group (dq, dk, dv, dg) is large enough for a long
// double central difference to resolve it at kFdTol. The difference of
// element e with step h_e carries a rounding error of about
//   noise_e = (kv_len + D + 10) u_LD |L|_1 / h_e,
// |L|_1 = sum |dO * O| (the terms of the loss; kv_len + D + 10 roundings per
// term), so a group whose largest gradient is below noise / (kFdTol / 10) is
// unresolvable: e.g. g = 30 with one-hot rows makes dS ~ e^-60. Such cases
// are discarded (they say nothing about the backward's formula).
bool fd_resolvable(const AttentionCase& c,
                   const validation::OracleAttention& o) {
  const AttentionProblem& p = c.problem;
  const long double u = 0x1p-64L;
  long double l1 = 0;
  for (size_t i = 0; i < o.o.size(); ++i) l1 += std::fabs(c.d_o[i] * o.o[i]);
  const long double k = (p.kv_len + p.head_dim + 10) * u * l1;
  const bool qk = p.variant == Variant::kQKNorm;
  const long double gdiv = qk ? std::max(1.0, std::fabs(p.g)) : 1.0;
  auto min_step = [&](const std::vector<double>& t, bool clamp) {
    long double h = INFINITY;
    for (size_t r = 0; r * p.head_dim < t.size(); ++r) {
      std::vector<long double> row(t.begin() + r * p.head_dim,
                                   t.begin() + (r + 1) * p.head_dim);
      const long double n =
          reference::nrm2<long double>(row.data(), p.head_dim);
      const long double e = clamp && qk ? p.eps : 0.0;
      h = std::min(h, n > e ? validation::kFdStep * n / (clamp ? gdiv : 1)
                            : validation::kFdStep * (e > 0 ? e : 1.0L));
    }
    return h;
  };
  auto max_abs = [](const std::vector<long double>& g) {
    long double m = 0;
    for (long double x : g) m = std::max(m, std::fabs(x));
    return m;
  };
  const long double need = 10 / kFdTol;
  auto ok = [&](long double gmax, long double h) {
    return gmax == 0 || gmax >= need * k / h;
  };
  return ok(max_abs(o.dq), min_step(c.q, true)) &&
         ok(max_abs(o.dk), min_step(c.k, true)) &&
         ok(max_abs(o.dv), min_step(c.v, false)) &&
         ok(std::fabs(o.dg), validation::kFdStep * gdiv);
}

// The checker's step does not adapt to sdpa's logit amplitude (it scales by
// the row norm only), so sdpa cases keep unit-scale rows: with q, k scaled by
// 8 the logits reach hundreds and the truncation error h^2 L''' / 6 of a
// relative step 2^-20 exceeds kFdTol.
AttentionSpec fd_spec() {
  AttentionSpec spec = draw_attention_spec(Precision::kF64);
  spec.sdpa_scale = 1.0;
  return spec;
}

// Tiny problems: every input element is perturbed (full Jacobian).
void full_jacobian_tiny() {
  AttentionSpec spec = fd_spec();
  AttentionProblem& p = spec.problem;
  p.batch = *rc::gen::inRange<int64_t>(1, 3);
  p.heads = *rc::gen::inRange<int64_t>(1, 3);
  p.q_len = *rc::gen::inRange<int64_t>(1, 5);
  p.kv_len = *rc::gen::inRange<int64_t>(1, 5);
  p.head_dim = *rc::gen::inRange<int64_t>(1, 5);
  p.mask.key_lengths.clear();
  if (*rc::gen::arbitrary<bool>())
    for (int64_t b = 0; b < p.batch; ++b)
      p.mask.key_lengths.push_back(*rc::gen::inRange<int64_t>(0, p.kv_len + 1));
  const AttentionCase c = build_case(spec, Precision::kF64);
  const auto o = validation::oracle_attention(c);
  RC_PRE(fd_resolvable(c, o));
  const auto rep = validation::check_attention_full(c, grads_of(o), kFdTol);
  if (!rep.pass) RC_FAIL(rep.message() + " on " + spec.describe());
}

// Larger problems: random directions through (q, k, v).
void random_directions() {
  const AttentionSpec spec = fd_spec();
  const AttentionCase c = build_case(spec, Precision::kF64);
  const auto o = validation::oracle_attention(c);
  RC_PRE(fd_resolvable(c, o));
  const auto rep = validation::check_attention_directions(
      c, grads_of(o), kFdDirections, spec.seed + 11, kFdTol);
  if (!rep.pass) RC_FAIL(rep.message() + " on " + spec.describe());
}

void scalenorm_fd() {
  const ScaleNormSpec spec = draw_scalenorm_spec(Precision::kF64);
  const auto c = build_case(spec, Precision::kF64);
  const auto o = validation::oracle_scalenorm(c);
  const validation::ScaleNormGradients g{o.dx, o.dg};
  const bool tiny = c.x.size() <= 48;
  const auto rep = tiny ? validation::check_scalenorm_full(c, g, kFdTol)
                        : validation::check_scalenorm_directions(
                              c, g, kFdDirections, spec.seed + 12, kFdTol);
  if (!rep.pass) RC_FAIL(rep.message() + " on " + spec.describe());
}

// Rows of dS sum to 0 in reference<T>, T = float, double, long double.
// sum_j dS_ij = sum_j P_ij dP_ij - delta_i sum_j P_ij, exactly 0; computed,
// it carries the error of P (relative gamma_fwd, bounds.h) and of the sums of
// dP, delta and dS (2 (kv_len + D) + 10 roundings), each on terms bounded by
// scale_i = 2 ||dO_i||_1 max|v| (>= sum_j P_ij |dP_ij| + |delta_i|).
template <class T>
void ds_rows_sum_to_zero_in() {
  const Precision prec =
      sizeof(T) == sizeof(float) ? Precision::kF32 : Precision::kF64;
  const double u = sizeof(T) == sizeof(float)    ? 0x1p-24
                   : sizeof(T) == sizeof(double) ? 0x1p-53
                                                 : 0x1p-64;
  const AttentionSpec spec = draw_attention_spec(prec);
  const AttentionCase c = build_case(spec, prec);
  const AttentionProblem& p = c.problem;
  std::vector<T> q(c.q.begin(), c.q.end()), k(c.k.begin(), c.k.end()),
      v(c.v.begin(), c.v.end()), d_o(c.d_o.begin(), c.d_o.end());
  std::vector<T> o(q.size()),
      lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
  reference::attention_forward<T>(p, q.data(), k.data(), v.data(), o.data(),
                                  lse.data());
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size()),
      ds(static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
  T dg = 0;
  reference::attention_backward<T>(p, q.data(), k.data(), v.data(), o.data(),
                                   d_o.data(), lse.data(), dq.data(), dk.data(),
                                   dv.data(), &dg, ds.data());
  const auto oracle = validation::oracle_attention(c);
  const double gamma = validation::reference_bounds(c, oracle, u).gamma_fwd +
                       (2.0 * (p.kv_len + p.head_dim) + 10) * u;
  double vmax = 0;
  for (double x : c.v) vmax = std::max(vmax, std::fabs(x));
  for (int64_t r = 0; r < p.batch * p.heads * p.q_len; ++r) {
    long double sum = 0, l1 = 0;
    for (int64_t j = 0; j < p.kv_len; ++j)
      sum +=
          static_cast<long double>(ds[static_cast<size_t>(r * p.kv_len + j)]);
    for (int64_t d = 0; d < p.head_dim; ++d)
      l1 += std::fabs(static_cast<long double>(
          c.d_o[static_cast<size_t>(r * p.head_dim + d)]));
    const double tol = gamma * 2 * static_cast<double>(l1) * vmax;
    if (!(std::fabs(static_cast<double>(sum)) <= tol))
      RC_FAIL("reference<" + std::to_string(sizeof(T)) + "-byte type>: row " +
              std::to_string(r) + " of dS sums to " +
              std::to_string(static_cast<double>(sum)) + " (tolerance " +
              std::to_string(tol) + ") on " + spec.describe());
  }
}

void ds_rows_sum_to_zero() {
  ds_rows_sum_to_zero_in<float>();
  ds_rows_sum_to_zero_in<double>();
  ds_rows_sum_to_zero_in<long double>();
}

TEST(OracleGradients, FullJacobianTinyProblems) {
  expect_property("oracle full Jacobian", full_jacobian_tiny, 600);
}
TEST(OracleGradients, RandomDirections) {
  expect_property("oracle random directions", random_directions, 400);
}
TEST(OracleGradients, ScaleNormFiniteDifferences) {
  expect_property("oracle ScaleNorm finite differences", scalenorm_fd, 600);
}
TEST(OracleGradients, DsRowsSumToZero) {
  expect_property("dS rows sum to 0", ds_rows_sum_to_zero, 600);
}

// The finite-difference check itself can fail: a gradient with one wrong
// element is rejected.
TEST(OracleGradients, CheckerRejectsAWrongGradient) {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 3, p.kv_len = 4, p.head_dim = 3;
  p.g = 12.32;
  const AttentionCase c = validation::make_attention_case(
      p, validation::Distribution::kGaussian, 7);
  auto g = grads_of(validation::oracle_attention(c));
  g.dk[5] *= 1.001L;
  EXPECT_FALSE(validation::check_attention_full(c, g, kFdTol).pass);
}

}  // namespace
}  // namespace qknorm::property
