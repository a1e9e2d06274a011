// The sliding window (issue 34; attention.h: FlashAttention's (left, right),
// bottom-right aligned, inclusive): its validation, the documented diagram,
// the gradient against finite differences, the verdict on every entry
// (reference, simd on every target, blas) on windowed cases of every input
// class, and the field bugs of transformers #39408 (the window off by one on
// either side) and sglang #33915 (the window ignored), which the verdict
// must FAIL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
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

// A small problem: qknorm (paper or a preset) or sdpa, the window, mask bits
// 1 causal and 2 padding (the last two keys of batch 0).
AttentionProblem windowed(const char* form, int64_t left, int64_t right,
                          int mask, int64_t Nq = 5, int64_t Nk = 7,
                          int64_t D = 8) {
  AttentionProblem p = shape(2, 2, Nq, Nk, D);
  if (std::string(form) == "sdpa") {
    p.variant = Variant::kSDPA;
  } else {
    apply_preset(form, &p);
  }
  p.g = 12.3;
  p.mask.window_left = left;
  p.mask.window_right = right;
  p.mask.causal = mask & 1;
  if (mask & 2) p.mask.key_lengths = {Nk - 2, Nk};
  return p;
}

TEST(Window, InvalidWindowsNameTheField) {
  AttentionProblem p = windowed("paper", -2, 0, 0);
  EXPECT_NE(error_of([&] { validate_problem(p); }).find("mask.window_left"),
            std::string::npos);
  p = windowed("paper", 3, -7, 0);
  EXPECT_NE(error_of([&] { validate_problem(p); }).find("mask.window_right"),
            std::string::npos);
  validate_problem(windowed("paper", -1, -1, 0));  // no window
  validate_problem(windowed("paper", 0, 0, 3));    // the diagonal only
}

// The diagram of attention.h (q_len 4, kv_len 6, window (2, 0)), and
// visible_keys() against visible() on every (mask, window, row, key) of a
// grid that includes kv_len < q_len, windows wider than the sequence and
// empty rows.
TEST(Window, VisibleKeysAreTheDocumentedInterval) {
  Mask m;
  m.window_left = 2;
  m.window_right = 0;
  const char* rows[] = {"xxx...", ".xxx..", "..xxx.", "...xxx"};
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j)
      EXPECT_EQ(visible(m, 0, i, j, 4, 6), rows[i][j] == 'x') << i << "," << j;
  int64_t empty = 0, checked = 0;
  for (int64_t Nq : {1, 3, 6})
    for (int64_t Nk : {1, 4, 6})
      for (int64_t l : {-1, 0, 1, 5})
        for (int64_t r : {-1, 0, 2})
          for (int bits = 0; bits < 4; ++bits) {
            Mask w;
            w.window_left = l;
            w.window_right = r;
            w.causal = bits & 1;
            if (bits & 2) w.key_lengths = {Nk / 2};
            for (int64_t i = 0; i < Nq; ++i) {
              const KeyRange kr = visible_keys(w, 0, i, Nq, Nk);
              ASSERT_LE(kr.begin, kr.end);
              empty += kr.begin == kr.end;
              for (int64_t j = 0; j < Nk; ++j, ++checked)
                ASSERT_EQ(visible(w, 0, i, j, Nq, Nk),
                          j >= kr.begin && j < kr.end)
                    << "Nq " << Nq << " Nk " << Nk << " window (" << l << ","
                    << r << ") bits " << bits << " row " << i << " key " << j;
            }
          }
  EXPECT_GT(empty, 0) << "the grid has no empty row";
  std::printf("%lld (row, key) pairs checked, %lld empty rows\n",
              (long long)checked, (long long)empty);
}

// An entry that does not declare windows (Backend::supports' default, as a
// plug-in, whose C ABI has no window field) is refused at the checked front
// door with an error naming it and the window; every registry entry has it.
TEST(Window, EntriesWithoutItRefuseIt) {
  const AttentionCase c = validation::make_attention_case(
      windowed("paper", 2, 0, 0), Distribution::kGaussian, 1);
  for (const Backend* b : all_backends().entries()) {
    if (b->available()) {
      EXPECT_TRUE(b->supports(c.problem)) << b->name();
    }
  }
  const validation::ForwardingBackend plain(
      *all_backends().find("reference:f64"), "without_window");
  EXPECT_FALSE(plain.supports(c.problem));
  const std::string msg =
      error_of([&] { validation::run_attention(plain, c); });
  EXPECT_NE(msg.find(plain.name()), std::string::npos) << msg;
  EXPECT_NE(msg.find("window (2, 0)"), std::string::npos) << msg;
}

// The backward under a window against finite differences of the windowed
// forward, every gradient, both variants and a preset with weights, windows
// on either side, alone and with the causal and padding masks.
TEST(Window, EveryGradientMatchesFiniteDifferences) {
  test_support::FdTally tally;
  int n = 0;
  for (const char* form : {"paper", "sdpa", "qwen3"})
    for (auto [l, r] : {std::pair<int64_t, int64_t>{1, 0}, {0, 1}, {2, -1}})
      for (int mask : {0, 3}) {
        AttentionProblem p = windowed(form, l, r, mask, 3, 5, 3);
        if (p.variant == Variant::kSDPA) p.g = 1;
        const AttentionCase c = validation::make_attention_case(
            p, mask == 3 ? Distribution::kZeroRows : Distribution::kGaussian,
            400 + n++);
        tally.expect_pass(
            validation::check_attention_full(
                c, validation::gradients_of(validation::oracle_attention(c)),
                validation::kFdTol),
            c.describe());
      }
  tally.print("finite differences, window");
}

// The windowed problems every entry must pass: small rows (9 x 12) with
// windows on either side and, for the paper's formulation (the kernels'
// block walk does not depend on the formulation), decode (2 queries against
// 150 keys) and a long window case (70 x 300, window (40, 0): whole key
// blocks of the simd and blas kernels lie outside every row's window).
std::vector<AttentionProblem> verdict_problems(const char* form) {
  std::vector<AttentionProblem> out;
  for (auto [l, r] : {std::pair<int64_t, int64_t>{3, 0}, {0, 2}, {4, 1}})
    for (int mask : {0, 3})
      out.push_back(windowed(form, l, r, mask, 9, 12, 16));
  // kv_len < q_len: the right side leaves the first rows without keys.
  out.push_back(windowed(form, 2, 1, 0, 12, 8, 16));
  if (std::string(form) != "paper") return out;
  out.push_back(windowed(form, 31, 0, 1, 2, 150, 16));
  out.push_back(windowed(form, 40, 0, 2, 70, 300, 16));
  return out;
}

// Every entry passes the verdict on windowed cases of every input class the
// default run draws (spread, wide, outlier and zero rows), both variants,
// masks, a preset, a softcap: the window does not cry wolf.
TEST(Window, EveryEntryWithItPassesTheVerdict) {
  test_support::EveryEntry all;
  for (const char* form : {"paper", "sdpa", "qwen3"})
    for (const AttentionProblem& base : verdict_problems(form))
      for (Precision prec : kAllPrecisions)
        for (Distribution d :
             {Distribution::kGaussian, Distribution::kWideMagnitude,
              Distribution::kOutlierRows, Distribution::kZeroRows}) {
          // The long cases on two input classes (their cost is the
          // oracle's and the entries' O(n^2) work).
          if (base.kv_len > 100 && (d == Distribution::kWideMagnitude ||
                                    d == Distribution::kZeroRows))
            continue;
          AttentionProblem p = base;
          if (all.cases % 5 == 4) p.softcap = 5;
          all.judge(
              validation::make_attention_case(p, d, 900 + all.cases, prec),
              prec);
        }
  EXPECT_GT(all.worst.count("blas:f32"), 0u);
  EXPECT_TRUE(all.has_simd());
  all.print("window");
}

// Keys outside the window get probability exactly 0, keys inside a positive
// one (the reference's probabilities, f64, logits bounded by g = 12.3).
TEST(Window, KeysOutsideTheWindowGetZeroProbability) {
  for (int mask : {0, 1, 2, 3}) {
    const AttentionProblem p = windowed("paper", 2, 1, mask, 6, 9, 8);
    const AttentionCase c =
        validation::make_attention_case(p, Distribution::kGaussian, 60 + mask);
    std::vector<double> P(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                               P.data());
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i)
          for (int64_t j = 0; j < p.kv_len; ++j) {
            const double x = P[static_cast<size_t>(
                ((b * p.heads + h) * p.q_len + i) * p.kv_len + j)];
            if (visible(p.mask, b, i, j, p.q_len, p.kv_len))
              EXPECT_GT(x, 0);
            else
              EXPECT_EQ(x, 0) << "b " << b << " row " << i << " key " << j;
          }
  }
}

// A window wider than the sequence on both sides is no mask: the verdict
// (the oracle, its per-element bounds and a mask-agnostic entry's outputs)
// is the same number for number. Its repeated rows (zero rows, a repeated
// token) see the same keys from every position and group as one error
// (rule.h, "Repeated rows"); grouped by position they were judged as
// independent rows, under a smaller dV bound (the review of the window).
TEST(Window, WiderThanTheSequenceIsNoMask) {
  const Backend& r32 = *all_backends().find("reference:f32");
  for (Distribution d : {Distribution::kZeroRows, Distribution::kGaussian}) {
    AttentionProblem open = windowed("paper", -1, -1, 0, 24, 24, 16);
    AttentionProblem wide = windowed("paper", 100, 100, 0, 24, 24, 16);
    const auto a = validation::check_attention(
        r32, validation::make_attention_case(open, d, 31, Precision::kF32), {},
        false, false);
    const auto b = validation::check_attention(
        r32, validation::make_attention_case(wide, d, 31, Precision::kF32), {},
        false, false);
    EXPECT_TRUE(a.pass && b.pass);
    EXPECT_EQ(a.margin, b.margin) << validation::name(d);
    ASSERT_EQ(a.fields.size(), b.fields.size());
    for (size_t f = 0; f < a.fields.size(); ++f)
      EXPECT_EQ(a.fields[f].margin, b.fields[f].margin)
          << validation::name(d) << " field " << f;
    std::printf("%s: margin %.6g without a mask and under window (100, 100)\n",
                validation::name(d), b.margin);
  }
}

// The entry computes with another window: off by one on one side
// (transformers #39408: (w, 0) for (w - 1, 0)), or none at all (sglang
// #33915: window_left ignored on one path).
class OtherWindow final : public validation::ForwardingBackend {
 public:
  OtherWindow(const Backend& inner, const char* name, int64_t dl, int64_t dr,
              bool drop)
      : ForwardingBackend(inner, name), dl_(dl), dr_(dr), drop_(drop) {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    inner().attention_forward(changed(p), a, ws, c);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    inner().attention_backward(changed(p), a, ws, c);
  }

 private:
  AttentionProblem changed(const AttentionProblem& p) const {
    AttentionProblem q = p;
    Mask& m = q.mask;
    if (drop_) {
      m.window_left = m.window_right = -1;
    } else {
      if (m.window_left >= 0)
        m.window_left = std::max<int64_t>(0, m.window_left + dl_);
      if (m.window_right >= 0)
        m.window_right = std::max<int64_t>(0, m.window_right + dr_);
    }
    return q;
  }
  int64_t dl_, dr_;
  bool drop_;
};

// Each bug FAILs on every case of a gaussian batch with a window on both
// sides (every off-by-one moves keys of interior rows in or out), in f32
// (blas) where the bugs must stand out of the rounding.
TEST(Window, FieldBugsFail) {
  const Backend& inner = *all_backends().find("blas:f32");
  const OtherWindow bugs[] = {{inner, "window_left_plus_one", 1, 0, false},
                              {inner, "window_left_minus_one", -1, 0, false},
                              {inner, "window_right_plus_one", 0, 1, false},
                              {inner, "window_right_minus_one", 0, -1, false},
                              {inner, "window_ignored", 0, 0, true}};
  for (const OtherWindow& bug : bugs) {
    double least = 1e300;
    for (int k = 0; k < 4; ++k) {
      const AttentionCase c = validation::make_attention_case(
          windowed(k % 2 ? "qwen3" : "paper", 3, 2, k / 2 ? 2 : 0, 9, 12, 16),
          Distribution::kGaussian, 1000 + k, Precision::kF32);
      const auto rep = validation::check_attention(bug, c, {}, false, false);
      EXPECT_FALSE(rep.pass) << bug.name() << " passed " << c.describe();
      least = std::min(least, rep.margin);
    }
    std::printf("%s: smallest margin %.3g over 4 cases\n", bug.name().c_str(),
                least);
  }
}

}  // namespace
}  // namespace qknorm
