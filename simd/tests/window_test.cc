// The sliding window (issue 34; attention.h) in the simd kernels, every
// runnable entry: each row's visible keys are an interval [begin, end), and
// a key outside every row's window is never read into any result. The same
// windowed problem is run twice, once with those keys' k and v rows replaced
// by garbage (huge k, huge and tiny v: a read would change the logits, O,
// the fixed shift's bound or its cap); every output must be bitwise the
// same, and the gradients of the unseen keys exactly 0. The verdict on
// windowed cases is tests/window_test.cc's (every entry).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/formulation.h"
#include "simd/tests/attention_sweep.h"
#include "simd/tests/test_util.h"
#include "validation/run.h"

namespace qknorm::simd::testing {
namespace {

struct WindowCase {
  const char* what;
  AttentionProblem p;
};

std::vector<WindowCase> WindowCases() {
  std::vector<WindowCase> out;
  {
    // Whole key blocks before every row's window, padding that empties the
    // last rows of batch 1, GQA, causal.
    AttentionProblem p;
    p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 70, p.kv_len = 300;
    p.head_dim = 16, p.variant = Variant::kSDPA;
    p.mask.causal = true, p.mask.window_left = 40, p.mask.window_right = 0;
    p.mask.key_lengths = {300, 250};
    out.push_back({"sdpa 70x300 window (40, 0) causal padded GQA", p});
  }
  {
    // Decode: two queries at the end of 150 keys.
    AttentionProblem p;
    p.batch = 1, p.heads = 2, p.q_len = 2, p.kv_len = 150, p.head_dim = 16;
    p.g = 12.32;
    p.mask.window_left = 31, p.mask.window_right = 0;
    out.push_back({"paper decode 2x150 window (31, 0)", p});
  }
  {
    // Both sides bounded, a formulation with weights; the first row's
    // window starts at key 0, the last ends at the last key.
    AttentionProblem p;
    p.batch = 1, p.heads = 2, p.q_len = 130, p.kv_len = 200, p.head_dim = 24;
    apply_preset("qwen3", &p);
    p.g = 12.32;
    p.mask.window_left = 66, p.mask.window_right = 3;
    out.push_back({"qwen3 130x200 window (66, 3)", p});
  }
  return out;
}

// seen[b * kv_len + j]: some query row of batch b sees key j.
std::vector<bool> SeenKeys(const AttentionProblem& p) {
  std::vector<bool> seen(static_cast<size_t>(p.batch * p.kv_len), false);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i) {
      const KeyRange kr = visible_keys(p.mask, b, i, p.q_len, p.kv_len);
      for (int64_t j = kr.begin; j < kr.end; ++j)
        seen[static_cast<size_t>(b * p.kv_len + j)] = true;
    }
  return seen;
}

// The case with every unseen key's k and v rows replaced by garbage that
// the entry's storage holds (huge k of both signs; v huge and tiny).
validation::AttentionCase WithGarbage(const validation::AttentionCase& c,
                                      const std::vector<bool>& seen,
                                      Precision prec) {
  const AttentionProblem& p = c.problem;
  const double huge = prec == Precision::kF16 ? 3e4 : 1e30;
  const double tiny = prec == Precision::kF16 ? 1e-7 : 1e-37;
  validation::AttentionCase g = c;
  const int64_t Hk = kv_heads_of(p), D = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < Hk; ++h)
      for (int64_t j = 0; j < p.kv_len; ++j) {
        if (seen[static_cast<size_t>(b * p.kv_len + j)]) continue;
        const size_t row =
            static_cast<size_t>(((b * Hk + h) * p.kv_len + j) * D);
        for (int64_t d = 0; d < D; ++d) {
          g.k[row + static_cast<size_t>(d)] = d % 2 ? -huge : huge;
          g.v[row + static_cast<size_t>(d)] = d % 3 ? tiny : -huge;
        }
      }
  return validation::round_inputs(g, prec);
}

class SimdWindow : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdWindow, KeysOutsideEveryWindowAreNeverRead) {
  const Backend& entry = *GetParam();
  uint64_t seed = 31;
  for (const WindowCase& wc : WindowCases()) {
    const validation::AttentionCase c = validation::round_inputs(
        MakeCase(entry, wc.p, Distribution::kGaussian, seed++),
        entry.precision());
    const std::vector<bool> seen = SeenKeys(c.problem);
    size_t unseen = 0;
    for (bool s : seen) unseen += !s;
    ASSERT_GT(unseen, 0u) << wc.what;
    const validation::AttentionCase bad =
        WithGarbage(c, seen, entry.precision());
    for (bool online : {false, true}) {
      const ExecConfig cfg{2, online};
      const std::string what =
          std::string(wc.what) + (online ? " (online)" : " (fixed shift)");
      validation::AttentionResult r0 = validation::run_attention(entry, c, cfg);
      validation::AttentionResult r1 =
          validation::run_attention(entry, bad, cfg);
      ASSERT_EQ(r0.backward_input, validation::BackwardInput::kEntry) << what;
      ASSERT_EQ(r1.backward_input, validation::BackwardInput::kEntry) << what;
      // The unseen keys' gradients are exactly 0 in both runs; then set
      // equal so that ExpectSame compares the rest bitwise.
      const AttentionProblem& p = c.problem;
      const int64_t Hk = kv_heads_of(p), D = p.head_dim;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t h = 0; h < Hk; ++h)
          for (int64_t j = 0; j < p.kv_len; ++j) {
            if (seen[static_cast<size_t>(b * p.kv_len + j)]) continue;
            for (int64_t d = 0; d < D; ++d) {
              const size_t e =
                  static_cast<size_t>(((b * Hk + h) * p.kv_len + j) * D + d);
              for (auto* r : {&r0, &r1}) {
                EXPECT_EQ(r->dk[e], 0.0) << what << " key " << j;
                EXPECT_EQ(r->dv[e], 0.0) << what << " key " << j;
                r->dk[e] = r->dv[e] = 0.0;
              }
            }
          }
      ExpectSame(r0, r1, entry.name() + " " + what);
    }
    // The probabilities hook: 0 outside each row's window, and the same
    // with the garbage.
    const std::vector<double> p0 = Probabilities(entry, c);
    const std::vector<double> p1 = Probabilities(entry, bad);
    EXPECT_TRUE(SameBits(p0, p1)) << wc.what << ": probabilities differ";
    const AttentionProblem& p = c.problem;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const KeyRange kr = visible_keys(p.mask, b, i, p.q_len, p.kv_len);
          double sum = 0;
          for (int64_t j = 0; j < p.kv_len; ++j) {
            const double x = p0[static_cast<size_t>(
                ((b * p.heads + h) * p.q_len + i) * p.kv_len + j)];
            if (j < kr.begin || j >= kr.end) {
              ASSERT_EQ(x, 0.0) << wc.what << " row " << i << " key " << j;
            }
            sum += x;
          }
          if (kr.begin < kr.end) {
            EXPECT_NEAR(sum, 1.0, 1e-5) << wc.what << " row " << i;
          }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdWindow,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
