// The logit softcap (issue 34; attention.h: S' = cap tanh(S / cap) on the
// visible logits, before the softmax): its validation, its gradient against
// finite differences, the verdict on every reference entry (rule.h, "The
// logit softcap"), the bound it puts on the probabilities, and two entries
// with the field bugs of sglang #33915 (the cap dropped) and of the cap
// applied after the mask, which the verdict must FAIL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/error.h"
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
// 2 padding, and the cap.
AttentionProblem capped(const char* form, double cap, int mask, int64_t Nq = 5,
                        int64_t Nk = 7, int64_t D = 8) {
  AttentionProblem p = shape(1, 2, Nq, Nk, D);
  if (std::string(form) == "sdpa") {
    p.variant = Variant::kSDPA;
  } else {
    apply_preset(form, &p);
  }
  p.g = 12.3;  // the paper's g at L = 72: logits up to 12.3, capped below
  p.softcap = cap;
  p.mask.causal = mask & 1;
  if (mask & 2) p.mask.key_lengths = {Nk - 2};
  return p;
}

TEST(Softcap, InvalidCapsNameTheField) {
  for (double bad :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e-310}) {
    AttentionProblem p = capped("paper", bad, 0);
    const std::string msg = error_of([&] { validate_problem(p); });
    EXPECT_NE(msg.find("softcap"), std::string::npos) << msg;
  }
  validate_problem(capped("paper", 0, 0));  // 0: off
  validate_problem(capped("paper", 50, 0));
  // A cap outside f32's normal range is refused for the entries that compute
  // in f32 (it would become inf or 0 there), and taken by the f64 ones.
  for (double cap : {1e39, 1e-39}) {
    for (Precision prec : {Precision::kF32, Precision::kBF16}) {
      const AttentionCase c = validation::make_attention_case(
          capped("paper", cap, 1), Distribution::kGaussian, 3, prec);
      const Backend& b =
          *all_backends().find("reference:" + std::string(qknorm::name(prec)));
      const std::string msg =
          error_of([&] { validation::run_attention(b, c); });
      EXPECT_NE(msg.find("softcap"), std::string::npos) << cap << ": " << msg;
    }
    const AttentionCase c = validation::make_attention_case(
        capped("paper", cap, 1), Distribution::kGaussian, 3);
    EXPECT_TRUE(validation::check_attention(
                    *all_backends().find("reference:f64"), c, {}, false, false)
                    .pass)
        << cap;
  }
}

// Every entry of the registry (reference, simd on every target, blas)
// implements the cap; an entry that does not (Backend::supports' default,
// as a plug-in, whose C ABI has no softcap field) is refused at the checked
// front door with an error naming it, never run without its cap.
TEST(Softcap, EntriesWithoutItRefuseIt) {
  const AttentionCase c = validation::make_attention_case(
      capped("paper", 5, 1), Distribution::kGaussian, 1);
  int implemented = 0;
  for (const Backend* b : all_backends().entries()) {
    if (!b->available()) continue;
    EXPECT_TRUE(b->supports(c.problem)) << b->name();
    ++implemented;
  }
  EXPECT_GT(implemented, 0);
  const validation::ForwardingBackend plain(
      *all_backends().find("reference:f64"), "without_softcap");
  EXPECT_FALSE(plain.supports(c.problem));
  const std::string msg =
      error_of([&] { validation::run_attention(plain, c); });
  EXPECT_NE(msg.find(plain.name()), std::string::npos) << msg;
}

// The backward's slope (1 - (S' / cap)^2) against finite differences of
// the capped forward, every gradient, on both variants and the presets
// that carry weights, with and without masks, at a cap that bends the
// logits (5) and one that saturates them (1).
TEST(Softcap, EveryGradientMatchesFiniteDifferences) {
  test_support::FdTally tally;
  int n = 0;
  for (const char* form : {"paper", "sdpa", "qwen3", "olmo2"})
    for (double cap : {1.0, 5.0})
      for (int mask = 0; mask < 4; ++mask) {
        AttentionProblem p = capped(form, cap, mask, 3, 4, 3);
        if (p.variant == Variant::kSDPA) p.g = 1;
        const AttentionCase c = validation::make_attention_case(
            p, mask == 3 ? Distribution::kZeroRows : Distribution::kGaussian,
            300 + n++);
        tally.expect_pass(
            validation::check_attention_full(
                c, validation::gradients_of(validation::oracle_attention(c)),
                validation::kFdTol),
            c.describe());
      }
  tally.print("finite differences, softcap");
}

// Every entry (reference, simd on every target, blas) passes the verdict on
// capped cases of every input class the default run draws (spread, wide,
// outlier and zero rows), both variants, masks and presets: the rule's softcap
// units do not cry wolf.
TEST(Softcap, EveryEntryWithItPassesTheVerdict) {
  test_support::EveryEntry all;
  for (const char* form : {"paper", "sdpa", "qwen3", "gemma3"})
    for (Precision prec : kAllPrecisions)
      for (Distribution d :
           {Distribution::kGaussian, Distribution::kWideMagnitude,
            Distribution::kOutlierRows, Distribution::kZeroRows})
        for (double cap : {2.0, 30.0})
          for (int mask : {0, 3})
            all.judge(validation::make_attention_case(
                          capped(form, cap, mask, 9, 12, 16), d,
                          500 + all.cases, prec),
                      prec);
  EXPECT_GT(all.worst.count("blas:f32"), 0u);
  // Some simd target (the Clang fuzz tree has AVX3, AVX2 and SSE4 only).
  EXPECT_TRUE(all.has_simd());
  all.print("softcap");
}

// The log-ratio of a row's largest to smallest probability over visible
// keys: the spread of its logits.
double row_log_spread(const std::vector<double>& P, const AttentionProblem& p,
                      int64_t b, int64_t bh, int64_t i) {
  double hi = 0, lo = std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < p.kv_len; ++j) {
    if (!visible(p.mask, b, i, j, p.q_len, p.kv_len)) continue;
    const double x = P[static_cast<size_t>((bh * p.q_len + i) * p.kv_len + j)];
    hi = std::max(hi, x);
    lo = std::min(lo, x);
  }
  return std::log(hi / lo);
}

// |S'| <= cap, seen through P: in every row, log(max P / min P) over the
// visible keys is at most 2 cap, while the same case without the cap spreads
// its logits far wider (g = 40 at a cap of 3), so the property could fail.
TEST(Softcap, ProbabilitiesSpreadLessThanTwiceTheCap) {
  for (int mask : {0, 1, 2}) {
    AttentionProblem p = capped("paper", 3, mask, 6, 9, 16);
    p.g = 40;
    const AttentionCase c =
        validation::make_attention_case(p, Distribution::kGaussian, 77 + mask);
    AttentionProblem off = p;
    off.softcap = 0;
    const size_t n =
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len);
    std::vector<double> P(n), Poff(n);
    reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                               P.data());
    reference::attention_probabilities<double>(off, c.q.data(), c.k.data(),
                                               Poff.data());
    double widest = 0, widest_off = 0;
    for (int64_t bh = 0; bh < p.heads; ++bh)
      for (int64_t i = 0; i < p.q_len; ++i) {
        int64_t seen = 0;
        for (int64_t j = 0; j < p.kv_len; ++j)
          seen += visible(p.mask, 0, i, j, p.q_len, p.kv_len);
        if (seen < 2) continue;
        const double s = row_log_spread(P, p, 0, bh, i);
        // |S'| <= cap (tanh may round to 1), and the spread's own
        // roundings (a log of a ratio of two exponentials) are far below
        // 1e-9.
        EXPECT_LE(s, 2 * p.softcap + 1e-9) << "row " << i << " head " << bh;
        widest = std::max(widest, s);
        widest_off = std::max(widest_off, row_log_spread(Poff, off, 0, bh, i));
      }
    EXPECT_GT(widest_off, 2 * p.softcap) << "the uncapped case would pass too";
    std::printf(
        "mask %d: widest log-spread %.3f capped, %.3f uncapped (2 cap "
        "= %.1f)\n",
        mask, widest, widest_off, 2 * p.softcap);
  }
}

// sglang #33915: the entry computes without the cap (forward and backward).
class DroppedCap final : public validation::ForwardingBackend {
 public:
  explicit DroppedCap(const Backend& inner)
      : ForwardingBackend(inner, "softcap_dropped") {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    AttentionProblem q = p;
    q.softcap = 0;
    inner().attention_forward(q, a, ws, c);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    AttentionProblem q = p;
    q.softcap = 0;
    inner().attention_backward(q, a, ws, c);
  }
};

// The cap applied after the mask: a masked logit (-inf) is capped to -cap,
// so masked keys get probability exp(-cap - m) / l instead of 0. f64
// storage, dense views, the paper's formulation; the backward is the
// correct one (the forward's O and lse are what the verdict must catch).
class CapAfterMask final : public validation::ForwardingBackend {
 public:
  explicit CapAfterMask(const Backend& inner)
      : ForwardingBackend(inner, "softcap_after_mask") {}
  bool supports(const AttentionProblem& p) const override {
    return p.softcap > 0 && p.variant == Variant::kQKNorm &&
           is_paper_formulation([&] {
             AttentionProblem q = p;
             q.softcap = 0;
             return q;
           }());
  }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig&) const override {
    const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
    auto row = [&](const ConstTensor4& t, int64_t b, int64_t h, int64_t n) {
      return static_cast<const double*>(t.data) + b * t.layout.batch_stride +
             h * t.layout.head_stride + n * t.layout.row_stride;
    };
    auto unit = [&](const double* x, std::vector<double>* u) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += x[d] * x[d];
      const double n = std::max(std::sqrt(s), p.eps);
      for (int64_t d = 0; d < D; ++d) (*u)[static_cast<size_t>(d)] = x[d] / n;
    };
    std::vector<double> qh(static_cast<size_t>(D)), kh(qh.size()),
        s(static_cast<size_t>(Nk));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = 0; i < Nq; ++i) {
          unit(row(a.q, b, h, i), &qh);
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < Nk; ++j) {
            unit(row(a.k, b, h, j), &kh);
            double c = 0;
            for (int64_t d = 0; d < D; ++d)
              c += qh[static_cast<size_t>(d)] * kh[static_cast<size_t>(d)];
            const double x = visible(p.mask, b, i, j, Nq, Nk)
                                 ? p.g * c
                                 : -std::numeric_limits<double>::infinity();
            s[static_cast<size_t>(j)] = p.softcap * std::tanh(x / p.softcap);
            m = std::max(m, s[static_cast<size_t>(j)]);
          }
          double l = 0;
          std::vector<double> o(static_cast<size_t>(D), 0);
          for (int64_t j = 0; j < Nk; ++j) {
            const double e = std::exp(s[static_cast<size_t>(j)] - m);
            l += e;
            const double* v = row(a.v, b, h, j);
            for (int64_t d = 0; d < D; ++d)
              o[static_cast<size_t>(d)] += e * v[d];
          }
          double* out = static_cast<double*>(a.o.data) +
                        b * a.o.layout.batch_stride +
                        h * a.o.layout.head_stride + i * a.o.layout.row_stride;
          for (int64_t d = 0; d < D; ++d)
            out[d] = o[static_cast<size_t>(d)] / l;
          a.lse[(b * p.heads + h) * Nq + i] = m + std::log(l);
        }
  }
};

// Each bug FAILs on the cases where it changes the answer: the dropped cap
// wherever the cap bends the logits (cap 5 at g = 12.3), the cap after the
// mask wherever a row has masked keys and the cap is small enough for
// exp(-2 cap) to show in f64 (cap 5: about 5e-5 of a masked key's share).
TEST(Softcap, FieldBugsFail) {
  const Backend& r32 = *all_backends().find("reference:f32");
  const Backend& r64 = *all_backends().find("reference:f64");
  const DroppedCap dropped(r32);
  const CapAfterMask after(r64);
  int n = 0;
  for (Distribution d : {Distribution::kGaussian, Distribution::kOutlierRows})
    for (int mask : {1, 2}) {
      const AttentionCase c32 = validation::make_attention_case(
          capped("paper", 5, mask, 9, 12, 16), d, 700 + n, Precision::kF32);
      const auto rd =
          validation::check_attention(dropped, c32, {}, false, false);
      EXPECT_FALSE(rd.pass) << "dropped cap passed " << c32.describe();
      const AttentionCase c64 = validation::make_attention_case(
          capped("paper", 5, mask, 9, 12, 16), d, 700 + n, Precision::kF64);
      const auto ra = validation::check_attention(after, c64, {}, false, false);
      EXPECT_FALSE(ra.pass) << "cap after the mask passed " << c64.describe();
      std::printf("%s: dropped margin %.3g, after-mask margin %.3g\n",
                  c64.describe().c_str(), rd.margin, ra.margin);
      ++n;
    }
  // Without masked keys the cap after the mask is the correct cap.
  const AttentionCase open = validation::make_attention_case(
      capped("paper", 5, 0, 9, 12, 16), Distribution::kGaussian, 790,
      Precision::kF64);
  const auto ok = validation::check_attention(after, open, {}, false, false);
  EXPECT_TRUE(ok.pass) << ok.failure_message();
}

}  // namespace
}  // namespace qknorm
