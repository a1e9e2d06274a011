// The deterministic attention sweep shared by attention_test.cc (quick
// subset) and attention_full_test.cc: a sample of the cross product.
// The full cross product (10 head dims x 10 x 10 lengths x 4 masks x 5 g x
// variants x distributions) is far too slow with a long-double oracle, so
// case c of an entry takes every factor from a different stride through its
// list: every value of every factor occurs several times per entry, and the
// combinations differ between entries (salted by the entry name).
//
// No tolerance is defined here: TestCase (test_util.h: the AttentionTester,
// guarded buffers) applies the suite's rule (the per-element bound of
// validation/rule.h, against the long-double oracle) as check_attention
// does, and its failure message names entry, target,
// precision, shape, seed, worst index, expected, actual and bound, or the
// tensor and index of a written guard.
#ifndef QKNORM_SIMD_TESTS_ATTENTION_SWEEP_H_
#define QKNORM_SIMD_TESTS_ATTENTION_SWEEP_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "simd/tests/test_util.h"
#include "validation/check.h"

namespace qknorm::simd::testing {

using validation::AgreementReport;
using validation::AttentionCase;
using validation::Distribution;

constexpr int64_t kHeadDims[] = {1, 3, 7, 8, 9, 16, 31, 64, 65, 128};
constexpr int64_t kLengths[] = {1, 2, 3, 7, 8, 9, 33, 64, 127, 200};
constexpr double kGs[] = {0, -3, 1, 12.32, 25};
constexpr Distribution kDists[] = {
    Distribution::kGaussian, Distribution::kUniform, Distribution::kHeavyTailed,
    Distribution::kWideMagnitude, Distribution::kZeroRows};
enum MaskKind { kNone, kCausal, kPadding, kCausalPadding, kNumMaskKinds };

template <class T, size_t N>
inline const T& Pick(const T (&list)[N], int64_t i) {
  return list[static_cast<size_t>(i) % N];
}

// Padding lengths for batch b: include 0 (a batch with every row fully
// masked) for odd batches, otherwise a length inside (0, kv_len].
inline std::vector<int64_t> PaddingLengths(int64_t batch, int64_t kv_len,
                                           int64_t salt) {
  std::vector<int64_t> kl;
  for (int64_t b = 0; b < batch; ++b)
    kl.push_back(b % 2 == 1 ? 0 : 1 + (salt * 7 + b * 3) % kv_len);
  return kl;
}

inline AttentionProblem SampleProblem(int64_t c, int64_t salt) {
  AttentionProblem p;
  const int64_t k = c + salt;
  p.head_dim = Pick(kHeadDims, k);
  p.q_len = Pick(kLengths, 3 * k + 1);
  p.kv_len = Pick(kLengths, 7 * k + 4);
  // Keep the long-double oracle affordable: big problems get one head.
  const bool big = p.q_len * p.kv_len * p.head_dim > 64 * 64 * 32;
  p.batch = big ? 1 : 1 + k % 2;
  p.heads = big ? 1 : 1 + (k / 2) % 2;
  p.variant = k % 5 == 4 ? Variant::kSDPA : Variant::kQKNorm;
  p.g = Pick(kGs, k / 3);
  const int mask = static_cast<int>((k / 2 + c) % kNumMaskKinds);
  p.mask.causal = mask == kCausal || mask == kCausalPadding;
  if (mask == kPadding || mask == kCausalPadding)
    p.mask.key_lengths = PaddingLengths(p.batch, p.kv_len, k);
  return p;
}

// f16 stores at most 65504, and a zero row's gradient is du / eps (~1e12
// for the default eps = 1e-12): unrepresentable, for the naive baseline too.
// f16 cases with zero rows therefore use eps = 1e-2 (f32 math keeps any eps
// representable; this only keeps dq, dk ~ g |du| / eps <= ~2.5e3 finite).
constexpr double kF16ZeroRowEps = 1e-2;

// The case for `entry`: magnitudes limited to its storage format.
inline AttentionCase MakeCase(const Backend& entry, AttentionProblem p,
                              Distribution dist, uint64_t seed) {
  if (entry.precision() == Precision::kF16 && dist == Distribution::kZeroRows)
    p.eps = kF16ZeroRowEps;
  return validation::make_attention_case(p, dist, seed, entry.precision());
}

// Extra elements after each row in every third case's buffers.
inline constexpr int64_t kRowPad = 3;

// Runs cases [first, first + count) of entry's sample; EXPECTs each passes.
inline void RunAttentionSweep(const Backend& entry, int64_t first,
                              int64_t count, int64_t salt) {
  {
    for (int64_t c = first; c < first + count; ++c) {
      const AttentionProblem p = SampleProblem(c, salt);
      Distribution dist = Pick(kDists, c * 3 + salt);
      // Wide magnitudes make sdpa logits overflow by design (no norm); that
      // is the failure mode QKNorm removes, not a kernel property.
      if (p.variant == Variant::kSDPA && dist == Distribution::kWideMagnitude)
        dist = Distribution::kGaussian;
      const uint64_t seed = 1000 + static_cast<uint64_t>(c);
      AttentionCase ac = MakeCase(entry, p, dist, seed);
      // Every third case hands the entry strided rows (row_stride = D + 3).
      if (c % 3 == 1) ac.row_pad = kRowPad;
      const validation::AttentionTestReport r =
          TestCase(entry, ac, ExecConfig{2});
      EXPECT_TRUE(r.ok()) << "case " << c << ": " << r.message();
    }
  }
}

// Salt per entry name so that entries see different combinations.
inline int64_t SaltOf(const Backend& b) {
  return static_cast<int64_t>(std::hash<std::string>{}(b.name()) % 97);
}

}  // namespace qknorm::simd::testing

#endif  // QKNORM_SIMD_TESTS_ATTENTION_SWEEP_H_
