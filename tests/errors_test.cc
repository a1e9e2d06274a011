// Every documented error case raises qknorm::Error naming the tensor, the
// index and the rule; the message says it all in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "qknorm/validate.h"
#include "tests/test_support.h"
#include "validation/run.h"

namespace qknorm {
namespace {

using test_support::ref64;

validation::AttentionCase base() {
  AttentionProblem p = test_support::shape(2, 2, 3, 4, 5);
  p.g = 12;
  return validation::make_attention_case(p, validation::Distribution::kGaussian,
                                         1);
}

// Runs and returns the Error; fails the test if none is thrown.
Error expect_error(const validation::AttentionCase& c,
                   const std::string& tensor, const std::string& rule_part) {
  try {
    validation::run_attention(ref64(), c);
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), tensor) << e.what();
    EXPECT_NE(e.rule().find(rule_part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(tensor), std::string::npos);
    return e;
  }
  ADD_FAILURE() << "no qknorm::Error for " << tensor << " / " << rule_part;
  return Error("", {}, "");
}

TEST(Errors, NonPositiveDimensions) {
  for (int which = 0; which < 5; ++which) {
    auto c = base();
    int64_t* dims[] = {&c.problem.batch, &c.problem.heads, &c.problem.q_len,
                       &c.problem.kv_len, &c.problem.head_dim};
    const char* names[] = {"batch", "heads", "q_len", "kv_len", "head_dim"};
    *dims[which] = which % 2 ? -3 : 0;
    EXPECT_THROW(validate_problem(c.problem), Error);
    try {
      validate_problem(c.problem);
    } catch (const Error& e) {
      EXPECT_EQ(e.tensor(), names[which]);
      EXPECT_NE(e.rule().find(">= 1"), std::string::npos);
    }
  }
}

TEST(Errors, OverflowingElementCount) {
  AttentionProblem p;
  p.batch = 1ll << 31, p.heads = 1ll << 20, p.q_len = 1 << 10, p.kv_len = 1,
  p.head_dim = 64;
  try {
    validate_problem(p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), "q");
    EXPECT_NE(e.rule().find("overflows"), std::string::npos) << e.what();
  }
  ScaleNormProblem s{1ll << 40, 1ll << 30, 1, 1e-5};
  EXPECT_THROW(validate_problem(s), Error);
}

TEST(Errors, StridesAndBufferSizes) {
  std::vector<double> buf(100);
  // Buffer too small for the dense layout of [1,1,4,5] + 1 element.
  EXPECT_THROW(validate_tensor("k", buf.data(), 19, contiguous_layout(1, 4, 5),
                               1, 1, 4, 5),
               Error);
  try {
    validate_tensor("k", buf.data(), 19, contiguous_layout(1, 4, 5), 1, 1, 4,
                    5);
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), "k");
    EXPECT_EQ(e.index(), (std::vector<int64_t>{0, 0, 3, 4}));
    EXPECT_NE(e.rule().find("outside buffer"), std::string::npos);
  }
  // Rows overlapping.
  EXPECT_THROW(
      validate_tensor("q", buf.data(), 100, Layout4{20, 20, 4}, 1, 1, 4, 5),
      Error);
  // Negative stride.
  EXPECT_THROW(
      validate_tensor("v", buf.data(), 100, Layout4{-1, 20, 5}, 1, 1, 4, 5),
      Error);
  // Offset overflow.
  EXPECT_THROW(validate_tensor("v", buf.data(), 100, Layout4{1ll << 62, 0, 5},
                               4, 1, 4, 5),
               Error);
  // Null data.
  EXPECT_THROW(validate_tensor("o", nullptr, 100, contiguous_layout(1, 4, 5), 1,
                               1, 4, 5),
               Error);
  EXPECT_NO_THROW(validate_tensor("o", buf.data(), 20,
                                  contiguous_layout(1, 4, 5), 1, 1, 4, 5));
}

TEST(Errors, LseSizeMismatch) {
  auto c = base();
  std::vector<double> q(c.q), k(c.k), v(c.v), o(c.q.size()), lse(11);
  ForwardArgs a{{q.data(), (int64_t)q.size(), contiguous_layout(2, 3, 5)},
                {k.data(), (int64_t)k.size(), contiguous_layout(2, 4, 5)},
                {v.data(), (int64_t)v.size(), contiguous_layout(2, 4, 5)},
                {o.data(), (int64_t)o.size(), contiguous_layout(2, 3, 5)},
                lse.data(),
                11,
                {}};
  EXPECT_THROW(checked_attention_forward(ref64(), c.problem, a, nullptr),
               Error);
}

TEST(Errors, BadEps) {
  for (double eps :
       {0.0, -1e-12, std::numeric_limits<double>::infinity(), double(NAN)}) {
    auto c = base();
    c.problem.eps = eps;
    expect_error(c, "eps", "finite and > 0");
  }
  ScaleNormProblem s{2, 3, 1, 0};
  EXPECT_THROW(validate_problem(s), Error);
}

TEST(Errors, NonFiniteG) {
  for (double g : {double(NAN), double(INFINITY), -double(INFINITY)}) {
    auto c = base();
    c.problem.g = g;
    expect_error(c, "g", "finite");
  }
}

TEST(Errors, BadPadding) {
  auto c = base();
  c.problem.mask.key_lengths = {4, 5};  // kv_len = 4
  Error e = expect_error(c, "mask.key_lengths", "padding length");
  EXPECT_EQ(e.index(), std::vector<int64_t>{1});
  c.problem.mask.key_lengths = {-1, 2};
  expect_error(c, "mask.key_lengths", "padding length");
  c.problem.mask.key_lengths = {3};  // wrong count
  expect_error(c, "mask.key_lengths", "one length per batch");
}

TEST(Errors, NonFiniteInputNamesFirstBadElement) {
  auto c = base();
  // Element (b=1, h=0, n=2, d=3) of k, and a later one.
  c.k[static_cast<size_t>(((1 * 2 + 0) * 4 + 2) * 5 + 3)] = NAN;
  c.k.back() = INFINITY;
  Error e = expect_error(c, "k", "NaN");
  EXPECT_EQ(e.index(), (std::vector<int64_t>{1, 0, 2, 3}));
  auto c2 = base();
  c2.v[0] = -INFINITY;
  c2.row_pad = 2;  // strided layout: index is still logical
  Error e2 = expect_error(c2, "v", "-Inf");
  EXPECT_EQ(e2.index(), (std::vector<int64_t>{0, 0, 0, 0}));
  // Values that overflow the storage format are Inf there: an f16 entry
  // rejects q = 1e5 (f16 max is 65504) as +Inf at its index.
  auto c3 = base();
  c3.q[7] = 1e5;
  try {
    validation::run_attention(*all_backends().find("reference:f16"), c3);
    ADD_FAILURE();
  } catch (const Error& er) {
    EXPECT_EQ(er.tensor(), "q");
    EXPECT_EQ(er.index(), (std::vector<int64_t>{0, 0, 1, 2}));
    EXPECT_NE(er.rule().find("+Inf"), std::string::npos);
  }
  // dO is validated by the backward front door.
  auto c4 = base();
  c4.d_o[3] = NAN;
  expect_error(c4, "d_o", "NaN");
}

TEST(Errors, ScaleNormNonFinite) {
  validation::ScaleNormCase c;
  c.problem = {2, 3, 1.5, 1e-5};
  c.x = {1, 2, 3, 4, NAN, 6};
  c.dy = {1, 1, 1, 1, 1, 1};
  try {
    validation::run_scalenorm(ref64(), c);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), "x");
    EXPECT_EQ(e.index(), (std::vector<int64_t>{0, 0, 1, 1}));
  }
}

TEST(Errors, MessageFormat) {
  Error e("k", {1, 0, 2, 3}, "element is NaN (finite input required)");
  EXPECT_STREQ(e.what(),
               "qknorm: k[1,0,2,3]: element is NaN (finite input required)");
}

}  // namespace
}  // namespace qknorm
