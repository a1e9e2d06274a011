// Shared helpers of the SIMD kernel tests: the simd entries this CPU can run,
// and GoogleTest parameter names that end in the target ("F32_AVX2"), so
// --gtest_filter='*_SSE4' selects one target.
#ifndef QKNORM_SIMD_TESTS_TEST_UTIL_H_
#define QKNORM_SIMD_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "reference/reference.h"
#include "validation/buffers.h"
#include "validation/case.h"
#include "validation/check.h"
#include "validation/run.h"
#include "validation/tester.h"

namespace qknorm::simd::testing {

// Every simd:* entry of the registry whose target this CPU supports.
inline std::vector<const Backend*> RunnableEntries() {
  std::vector<const Backend*> r;
  for (const Backend* b : all_backends().match("simd:*"))
    if (b->available()) r.push_back(b);
  return r;
}

inline std::string EntryParamName(
    const ::testing::TestParamInfo<const Backend*>& info) {
  std::string prec(name(info.param->precision()));
  for (char& c : prec)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return prec + "_" + info.param->target();
}

inline bool SameBits(const std::vector<double>& a,
                     const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Every output of two runs, bit for bit (the parameter gradients too).
inline void ExpectSame(const validation::AttentionResult& a,
                       const validation::AttentionResult& b,
                       const std::string& what) {
  EXPECT_TRUE(SameBits(a.o, b.o)) << what << ": o differs";
  EXPECT_TRUE(SameBits(a.lse, b.lse)) << what << ": lse differs";
  EXPECT_TRUE(SameBits(a.dq, b.dq)) << what << ": dq differs";
  EXPECT_TRUE(SameBits(a.dk, b.dk)) << what << ": dk differs";
  EXPECT_TRUE(SameBits(a.dv, b.dv)) << what << ": dv differs";
  EXPECT_EQ(std::memcmp(&a.dg, &b.dg, sizeof(double)), 0)
      << what << ": dg differs";
  EXPECT_TRUE(SameBits(a.dq_weight, b.dq_weight)) << what << ": dq_weight";
  EXPECT_TRUE(SameBits(a.dk_weight, b.dk_weight)) << what << ": dk_weight";
  EXPECT_TRUE(SameBits(a.dq_bias, b.dq_bias)) << what << ": dq_bias";
  EXPECT_TRUE(SameBits(a.dk_bias, b.dk_bias)) << what << ": dk_bias";
}

// The unit roundoff u_s of an entry's storage: bf16 2^-8, f16 2^-11 (8 and
// 11 significant bits), f32 2^-24.
inline double StorageUnitRoundoff(Precision p) {
  return p == Precision::kBF16  ? 0x1p-8
         : p == Precision::kF16 ? 0x1p-11
                                : 0x1p-24;
}

// The normwise tolerance of an entry's field against the reference in
// double given its f32 compute's: a 16-bit entry stores its outputs RNE,
// within u_s of each element, so of the field's largest, and rounds Qwen3's
// x_hat to storage, where a near-tie may round the other way than the
// reference's (one storage ulp of one element of a logit operand): twice
// u_s covers both.
inline double StoredTolerance(Precision p, double compute) {
  const bool half = p == Precision::kBF16 || p == Precision::kF16;
  return (half ? 2 * StorageUnitRoundoff(p) : 0.0) + compute;
}

// max |a - b| / max |b| (0 for an empty or all-zero b with a == b): the
// normwise error of a field against the reference; elements equal in both
// (-inf lse of fully masked rows too) count in the denominator only where
// finite; a NaN difference (a NaN on either side) is an infinite error.
inline double NormwiseError(const std::vector<double>& a,
                            const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (a[i] == b[i]) {
      den = std::max(den, std::isfinite(b[i]) ? std::fabs(b[i]) : 0.0);
      continue;
    }
    if (std::isnan(a[i] - b[i])) return INFINITY;
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  if (num == 0) return 0;
  return den > 0 ? num / den : INFINITY;
}

// The reference evaluated in double (reference::attention_forward<double>,
// exact RoPE) on the rounded case c: forward, and the backward fed `o`,
// `lse` (an entry's own, so that the backward is compared alone). Qwen3's
// x_hat is rounded to `storage` as the entry does. With d_sinks (a problem
// with sinks), the sinks' gradient into it (`heads` values).
inline validation::AttentionResult ReferenceInDouble(
    const validation::AttentionCase& c, Precision storage,
    const std::vector<double>& o, const std::vector<double>& lse,
    std::vector<double>* d_sinks = nullptr) {
  const AttentionProblem& p = c.problem;
  auto ptr = [](const std::vector<double>& x) {
    return x.empty() ? nullptr : x.data();
  };
  auto mptr = [](std::vector<double>& x) {
    return x.empty() ? nullptr : x.data();
  };
  reference::NormArgs<double> w;
  w.q_weight = ptr(c.q_weight), w.k_weight = ptr(c.k_weight);
  w.q_bias = ptr(c.q_bias), w.k_bias = ptr(c.k_bias);
  w.storage = storage;
  w.exact_rope = true;
  validation::AttentionResult r;
  r.o.resize(c.q.size());
  r.lse.resize(static_cast<size_t>(p.batch * p.heads * p.q_len));
  reference::attention_forward<double>(p, c.q.data(), c.k.data(), c.v.data(),
                                       r.o.data(), r.lse.data(), w);
  r.dq.resize(c.q.size()), r.dk.resize(c.k.size()), r.dv.resize(c.v.size());
  r.dq_weight.resize(c.q_weight.size()), r.dk_weight.resize(c.k_weight.size());
  r.dq_bias.resize(c.q_bias.size()), r.dk_bias.resize(c.k_bias.size());
  reference::NormGrads<double> dw;
  dw.q_weight = mptr(r.dq_weight), dw.k_weight = mptr(r.dk_weight);
  dw.q_bias = mptr(r.dq_bias), dw.k_bias = mptr(r.dk_bias);
  if (d_sinks != nullptr) {
    d_sinks->assign(p.sinks.size(), 0.0);
    dw.sinks = mptr(*d_sinks);
  }
  reference::attention_backward<double>(
      p, c.q.data(), c.k.data(), c.v.data(), o.data(), c.d_o.data(), lse.data(),
      r.dq.data(), r.dk.data(), r.dv.data(), &r.dg, nullptr, w, dw);
  return r;
}

// A Gaussian case at g = 12.32, rounded to `entry`'s storage, of the causal
// problem [B, H, Nq, Nk, D] whose batch b sees key_lengths[b] keys (0: a
// fully masked batch): the masked shape the determinism and probabilities
// tests share.
inline validation::AttentionCase CausalPaddedCase(
    const Backend& entry, int64_t B, int64_t H, int64_t Nq, int64_t Nk,
    int64_t D, std::vector<int64_t> key_lengths, uint64_t seed) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  p.g = 12.32;
  p.mask.causal = true;
  p.mask.key_lengths = std::move(key_lengths);
  return validation::round_inputs(
      validation::make_attention_case(p, validation::Distribution::kGaussian,
                                      seed, entry.precision()),
      entry.precision());
}

// check_attention's verdict on case c (the naive baseline run and judged
// too) through validation::AttentionTester: the entry's buffers are guarded
// (NaN poison outside every input view, guard regions around every output
// view, checked after each call), so an out-of-bounds read or write fails
// the case with the tensor and index named in message().
inline validation::AttentionTestReport TestCase(
    const Backend& entry, const validation::AttentionCase& c,
    const ExecConfig& cfg, bool forward_only = false) {
  return validation::AttentionTester()
      .use_case(c)
      .config(cfg)
      .forward_only(forward_only)
      .with_naive()
      .Test(entry);
}

// The probabilities `entry`'s hook reports for case c (inputs in its
// storage, in guarded buffers: validation/buffers.h; empty if the entry has
// no hook); with `ws` and `lse_out`, in that workspace and with the
// forward's lse. A hook that writes outside its views fails the test.
inline std::vector<double> Probabilities(
    const Backend& entry, const validation::AttentionCase& c,
    Workspace* ws = nullptr, std::vector<double>* lse_out = nullptr) {
  const AttentionProblem& p = c.problem;
  validation::AttentionBuffers bufs(c, entry.precision());
  std::vector<double> probs(
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len),
      std::numeric_limits<double>::quiet_NaN());
  if (!entry.attention_probabilities(p, bufs.forward_args(), probs.data(), ws))
    probs.clear();
  for (const validation::GuardViolation& g : bufs.guard_violations())
    ADD_FAILURE() << entry.name() << " probabilities hook on " << c.describe()
                  << ": " << g.message();
  if (lse_out != nullptr) *lse_out = bufs.lse.load();
  return probs;
}

}  // namespace qknorm::simd::testing

#endif  // QKNORM_SIMD_TESTS_TEST_UTIL_H_
