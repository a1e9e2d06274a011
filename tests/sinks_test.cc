// Attention sinks (issue 34; attention.h: one learned logit per query head
// in every row's softmax denominator, gpt-oss): their validation and text
// form, the gradient dsinks against finite differences, the verdict on
// every entry that implements them (rule.h, "Attention sinks"), the sink's
// share of each row's probabilities, the fully masked row's defined answer,
// and two entries with field bugs the verdict must FAIL: the sink dropped
// (modular #6591's generic path) and the sink indexed by the query row
// instead of the head (modular #6591 with seq_q > 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"
#include "reference/reference.h"
#include "tests/test_support.h"
#include "validation/check.h"
#include "validation/forwarding_backend.h"
#include "validation/gradcheck.h"

namespace qknorm {
namespace {

using test_support::error_of;
using test_support::shape;
using validation::AttentionCase;
using validation::Distribution;

// A small problem: qknorm (paper or a preset) or sdpa, mask bits 1 causal,
// 2 padding (the second batch's keys cut to 0: fully masked rows), and one
// sink per head: sink_h = base + h (gpt-oss's learned sinks are O(1)).
AttentionProblem sunk(const char* form, double base, int mask, int64_t Nq = 5,
                      int64_t Nk = 7, int64_t D = 8, int64_t H = 4,
                      int64_t Hk = 2) {
  AttentionProblem p = shape(2, H, Nq, Nk, D, Hk);
  if (std::string(form) == "sdpa") {
    p.variant = Variant::kSDPA;
  } else {
    apply_preset(form, &p);
  }
  p.g = 6.5;
  p.mask.causal = mask & 1;
  if (mask & 2) p.mask.key_lengths = {Nk - 2, 0};
  for (int64_t h = 0; h < H; ++h)
    p.sinks.push_back(base + static_cast<double>(h));
  return p;
}

TEST(Sinks, InvalidSinksNameTheField) {
  AttentionProblem p = sunk("paper", 0, 0);
  p.sinks.pop_back();  // one per head
  std::string msg = error_of([&] { validate_problem(p); });
  EXPECT_NE(msg.find("sinks"), std::string::npos) << msg;
  for (double bad :
       {std::nan(""), std::numeric_limits<double>::infinity(), 1e39}) {
    AttentionProblem q = sunk("paper", 0, 0);
    q.sinks[2] = bad;
    msg = error_of([&] { validate_problem(q); });
    EXPECT_NE(msg.find("sinks[2]"), std::string::npos) << msg;
  }
  validate_problem(sunk("paper", -3e38, 0));
  AttentionProblem off = sunk("paper", 0, 0);
  off.sinks.clear();
  validate_problem(off);
  EXPECT_FALSE(is_paper_formulation(sunk("paper", 0, 0)));
}

TEST(Sinks, TheTextFormRoundTrips) {
  const std::vector<double> s = {0.1, -2.5, 1e-300, 3.0000000000000004};
  EXPECT_EQ(parse_sinks(sinks_spec(s)), s);
  EXPECT_EQ(sinks_spec({}), "off");
  EXPECT_TRUE(parse_sinks("off").empty());
  EXPECT_EQ(parse_sinks("1.5"), std::vector<double>{1.5});
  const std::string msg = error_of([] { parse_sinks("1,x"); });
  EXPECT_NE(msg.find("sinks[1]"), std::string::npos) << msg;
  EXPECT_NE(describe_formulation(sunk("sdpa", 0.5, 0)).find("sinks=0.5,1.5"),
            std::string::npos);
}

// The reference in double: each row's probabilities sum to 1 minus the
// sink's share exp(sink_h - lse_i), a fully masked row is the sink alone
// (O = 0, lse = sink_h), and a sink far below every logit changes nothing
// while one far above takes the row (O -> 0).
TEST(Sinks, EachRowsProbabilitiesLeaveTheSinksShare) {
  for (int mask : {0, 1, 3}) {
    const AttentionProblem p = sunk("qwen3", -1, mask);
    const AttentionCase c =
        validation::make_attention_case(p, Distribution::kGaussian, 11 + mask);
    const int64_t rows = p.batch * p.heads * p.q_len, D = p.head_dim;
    std::vector<double> P(static_cast<size_t>(rows * p.kv_len)), o(c.q.size()),
        lse(static_cast<size_t>(rows));
    reference::NormArgs<double> w;
    w.q_weight = c.q_weight.data();
    w.k_weight = c.k_weight.data();
    reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                               P.data(), w);
    reference::attention_forward<double>(p, c.q.data(), c.k.data(), c.v.data(),
                                         o.data(), lse.data(), w);
    int masked = 0;
    double least = 1;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = (r / p.q_len) % p.heads;
      double sum = 0;
      for (int64_t j = 0; j < p.kv_len; ++j)
        sum += P[static_cast<size_t>(r * p.kv_len + j)];
      const double share = std::exp(p.sinks[static_cast<size_t>(h)] -
                                    lse[static_cast<size_t>(r)]);
      EXPECT_NEAR(sum + share, 1, 1e-14) << "row " << r;
      EXPECT_GT(share, 0);
      least = std::min(least, sum);
      if (sum == 0) {
        ++masked;
        EXPECT_EQ(lse[static_cast<size_t>(r)], p.sinks[static_cast<size_t>(h)]);
        for (int64_t d = 0; d < D; ++d)
          EXPECT_EQ(o[static_cast<size_t>(r * D + d)], 0);
      }
    }
    EXPECT_EQ(masked, mask & 2 ? 2 * p.heads * p.q_len / 2 : 0);
    EXPECT_LT(least, 1);
  }
  // Far below: no share; far above: all of it.
  for (double base : {-200.0, 200.0}) {
    AttentionProblem p = sunk("paper", base, 0);
    AttentionProblem off = p;
    off.sinks.clear();
    const AttentionCase c =
        validation::make_attention_case(p, Distribution::kGaussian, 5);
    std::vector<double> o(c.q.size()), oo(c.q.size()),
        lse(static_cast<size_t>(p.batch * p.heads * p.q_len)), l2(lse.size());
    reference::attention_forward<double>(p, c.q.data(), c.k.data(), c.v.data(),
                                         o.data(), lse.data());
    reference::attention_forward<double>(off, c.q.data(), c.k.data(),
                                         c.v.data(), oo.data(), l2.data());
    for (size_t e = 0; e < o.size(); ++e) {
      if (base < 0) EXPECT_EQ(o[e], oo[e]);
      if (base > 0) EXPECT_LT(std::fabs(o[e]), 1e-80);
    }
  }
}

// dsinks (and every other gradient, through the sink's share of each row)
// against finite differences of the forward with sinks: both variants, GQA,
// masks with fully masked rows, sinks small, comparable to the logits and
// dominant.
TEST(Sinks, EveryGradientMatchesFiniteDifferences) {
  test_support::FdTally tally;
  int n = 0;
  for (const char* form : {"paper", "sdpa", "qwen3", "olmo2"})
    for (double base : {-4.0, 0.5, 6.0})
      for (int mask : {0, 3}) {
        AttentionProblem p = sunk(form, base, mask, 3, 4, 3, 2, 1);
        if (p.variant == Variant::kSDPA) p.g = 1;
        const AttentionCase c = validation::make_attention_case(
            p, Distribution::kGaussian, 900 + n++);
        const auto orc = validation::oracle_attention(c);
        ASSERT_EQ(orc.d_sinks.size(), 2u);
        tally.expect_pass(
            validation::check_attention_full(c, validation::gradients_of(orc),
                                             validation::kFdTol),
            c.describe());
      }
  tally.print("finite differences, sinks");
}

// Every entry that implements sinks passes the verdict on cases of every
// input class the default run draws, both variants, presets with weights,
// GQA, masks with fully masked rows, sinks below, among and above the
// logits, with a softcap and a window too: the rule's sink terms do not
// cry wolf.
TEST(Sinks, EveryEntryWithItPassesTheVerdict) {
  test_support::EveryEntry all;
  for (const char* form : {"paper", "sdpa", "qwen3"})
    for (Precision prec : kAllPrecisions)
      for (Distribution d :
           {Distribution::kGaussian, Distribution::kWideMagnitude,
            Distribution::kOutlierRows, Distribution::kZeroRows})
        for (double base : {-3.0, 2.0, 12.0})
          for (int mask : {0, 3}) {
            AttentionProblem p = sunk(form, base, mask, 9, 12, 16);
            if (base == 2.0 && mask == 3) {
              p.softcap = 8;
              p.mask.window_left = 5;
            }
            all.judge(
                validation::make_attention_case(p, d, 1000 + all.cases, prec),
                prec);
          }
  EXPECT_GT(all.worst.count("reference:f32"), 0u);
  all.print("sinks");
}

// The sink dropped on one path (modular #6591's generic path): the entry
// computes without it, forward and backward (dsinks 0).
class DroppedSink final : public validation::ForwardingBackend {
 public:
  explicit DroppedSink(const Backend& inner)
      : ForwardingBackend(inner, "sink_dropped") {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    AttentionProblem q = p;
    q.sinks.clear();
    inner().attention_forward(q, a, ws, c);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    AttentionProblem q = p;
    q.sinks.clear();
    BackwardArgs b = a;
    b.d_sinks = nullptr;
    b.d_sinks_size = 0;
    inner().attention_backward(q, b, ws, c);
    for (int64_t h = 0; h < a.d_sinks_size; ++h) a.d_sinks[h] = 0;
  }
};

// The sink indexed by the query row instead of the head (modular #6591:
// the wrong per-head sink index when seq_q > 1): row i of head h reads
// sinks[(h q_len + i) mod heads], right at decode (q_len 1), wrong in
// prefill. Computed exactly from the right answer: the row's sum without
// its sink, exp(lse) - exp(sink_h), plus the wrong sink's exp.
class SinkIndexFromRow final : public validation::ForwardingBackend {
 public:
  explicit SinkIndexFromRow(const Backend& inner)
      : ForwardingBackend(inner, "sink_index_from_row") {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    inner().attention_forward(p, a, ws, c);
    const int64_t Nq = p.q_len, D = p.head_dim;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = 0; i < Nq; ++i) {
          const double right = p.sinks[static_cast<size_t>(h)];
          const double wrong =
              p.sinks[static_cast<size_t>((h * Nq + i) % p.heads)];
          double& l = a.lse[(b * p.heads + h) * Nq + i];
          // In units of exp(l) (no overflow at large logits).
          const double rest = 1 - std::exp(right - l);
          const double l2 =
              l + std::log(std::max(rest, 0.0) + std::exp(wrong - l));
          double* o = static_cast<double*>(a.o.data) +
                      b * a.o.layout.batch_stride + h * a.o.layout.head_stride +
                      i * a.o.layout.row_stride;
          for (int64_t d = 0; d < D; ++d) o[d] *= std::exp(l - l2);
          l = l2;
        }
  }
};

// dsinks returned in bf16 where the entry claims f32 (a 16-bit
// accumulator or output for the sinks' gradient): 2^-9 relative, which the
// dsinks bound must see at f32.
class Bf16Dsinks final : public validation::ForwardingBackend {
 public:
  explicit Bf16Dsinks(const Backend& inner)
      : ForwardingBackend(inner, "dsinks_in_bf16") {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    inner().attention_backward(p, a, ws, c);
    for (int64_t h = 0; h < a.d_sinks_size; ++h)
      a.d_sinks[h] = round_to(Precision::kBF16, a.d_sinks[h]);
  }
};

// Each bug FAILs where it changes the answer: the dropped sink wherever the
// sink holds a share of the rows, the row-indexed sink on prefill (q_len >
// 1) and not at decode (q_len 1, where it reads the right sink).
TEST(Sinks, FieldBugsFail) {
  const Backend& r32 = *all_backends().find("reference:f32");
  const Backend& r64 = *all_backends().find("reference:f64");
  const DroppedSink dropped(r32);
  const SinkIndexFromRow by_row(r64);
  int n = 0;
  for (Distribution d : {Distribution::kGaussian, Distribution::kOutlierRows})
    for (int mask : {0, 3}) {
      const AttentionCase c32 = validation::make_attention_case(
          sunk("qwen3", 0.5, mask, 9, 12, 16), d, 1700 + n, Precision::kF32);
      const auto rd =
          validation::check_attention(dropped, c32, {}, false, false);
      EXPECT_FALSE(rd.pass) << "dropped sink passed " << c32.describe();
      EXPECT_NE(rd.failure_message().find("attention sink dropped"),
                std::string::npos)
          << rd.failure_message();
      const AttentionCase c64 = validation::make_attention_case(
          sunk("sdpa", 0.5, mask, 9, 12, 16), d, 1700 + n, Precision::kF64);
      const auto rr =
          validation::check_attention(by_row, c64, {}, false, false);
      EXPECT_FALSE(rr.pass) << "row-indexed sink passed " << c64.describe();
      EXPECT_NE(rr.failure_message().find("another head's attention sink"),
                std::string::npos)
          << rr.failure_message();
      std::printf("%s: dropped margin %.3g, row-indexed margin %.3g\n",
                  c64.describe().c_str(), rd.margin, rr.margin);
      ++n;
    }
  // dsinks alone wrong, in a 16-bit format: caught by its own table (the
  // other fields pass), at f32 and f64.
  const Bf16Dsinks coarse32(r32), coarse64(r64);
  for (Precision prec : {Precision::kF32, Precision::kF64}) {
    const AttentionCase c = validation::make_attention_case(
        sunk("qwen3", 0.5, 1, 9, 12, 16), Distribution::kGaussian, 1750, prec);
    const auto rc = validation::check_attention(
        prec == Precision::kF32 ? coarse32 : coarse64, c, {}, false, false);
    EXPECT_FALSE(rc.pass) << "bf16 dsinks passed " << c.describe();
    EXPECT_NE(rc.failure_message().find("d_sinks"), std::string::npos)
        << rc.failure_message();
    std::printf("%s: bf16 dsinks margin %.3g\n", c.describe().c_str(),
                rc.margin);
  }
  const AttentionCase decode = validation::make_attention_case(
      sunk("sdpa", 0.5, 0, 1, 40, 16), Distribution::kGaussian, 1790,
      Precision::kF64);
  const auto ok = validation::check_attention(by_row, decode, {}, false, false);
  EXPECT_TRUE(ok.pass) << ok.failure_message();
}

}  // namespace
}  // namespace qknorm
