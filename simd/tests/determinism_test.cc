// Bitwise reproducibility of every runnable simd entry: the same case run
// with 1 and 2 threads, and twice with 2 threads through one reused
// workspace (warm-up sizing, then reuse), must give identical bits in every
// output. The shape makes the backward split each head's keys into several
// groups (B*H = 3 -> 6 key groups, of 4 key blocks) and the forward use
// several query blocks, with causal + padding masks and a fully masked batch.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "simd/tests/test_util.h"
#include "validation/run.h"

namespace qknorm::simd::testing {
namespace {

class SimdDeterminism : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdDeterminism, AttentionAcrossThreadsAndReruns) {
  const Backend& entry = *GetParam();
  const auto c = CausalPaddedCase(entry, 3, 1, 150, 200, 33, {200, 0, 130}, 99);
  const auto one = validation::run_attention(entry, c, ExecConfig{1});
  std::unique_ptr<Workspace> ws = entry.make_workspace();
  const auto two = validation::run_attention(entry, c, ExecConfig{2}, ws.get());
  const auto again =
      validation::run_attention(entry, c, ExecConfig{2}, ws.get());
  const auto three =
      validation::run_attention(entry, c, ExecConfig{3}, ws.get());
  ExpectSame(one, two, entry.name() + " threads 1 vs 2");
  ExpectSame(two, again, entry.name() + " rerun with reused workspace");
  ExpectSame(one, three, entry.name() + " threads 1 vs 3");
}

// A sliding window (issue 34): the forward packs K/V per (batch, kv head)
// and chunk of query blocks, the chunks' count following the thread count
// (1 and 2 threads: 4 chunks, 5 threads: 5), into per-worker rings; the
// wide window (800, 0) packs every head up front instead. Padding empties
// batch 1's last rows, GQA shares each ring between two query heads.
TEST_P(SimdDeterminism, WindowAcrossThreads) {
  const Backend& entry = *GetParam();
  for (int64_t left : {100, 800}) {
    AttentionProblem p;
    p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 1500, p.kv_len = 1500;
    p.head_dim = 20, p.g = 12.32;
    p.mask.causal = true, p.mask.window_left = left, p.mask.window_right = 0;
    p.mask.key_lengths = {1500, 1100};
    const auto c = validation::round_inputs(
        validation::make_attention_case(p, validation::Distribution::kGaussian,
                                        7, entry.precision()),
        entry.precision());
    const std::string what = entry.name() + " window " + std::to_string(left);
    const auto one = validation::run_attention(entry, c, ExecConfig{1});
    std::unique_ptr<Workspace> ws = entry.make_workspace();
    const auto two =
        validation::run_attention(entry, c, ExecConfig{2}, ws.get());
    const auto five =
        validation::run_attention(entry, c, ExecConfig{5}, ws.get());
    ExpectSame(one, two, what + " threads 1 vs 2");
    ExpectSame(one, five, what + " threads 1 vs 5");
  }
}

TEST_P(SimdDeterminism, ScaleNormAcrossThreads) {
  const Backend& entry = *GetParam();
  ScaleNormProblem p;
  p.rows = 300, p.dim = 65, p.g = 8;
  const auto c = validation::round_inputs(
      validation::make_scalenorm_case(p, validation::Distribution::kZeroRows, 5,
                                      entry.precision()),
      entry.precision());
  const auto one = validation::run_scalenorm(entry, c, ExecConfig{1});
  const auto two = validation::run_scalenorm(entry, c, ExecConfig{2});
  EXPECT_TRUE(SameBits(one.y, two.y)) << entry.name() << ": y differs";
  EXPECT_TRUE(SameBits(one.dx, two.dx)) << entry.name() << ": dx differs";
  EXPECT_EQ(std::memcmp(&one.dg, &two.dg, sizeof(double)), 0)
      << entry.name() << ": dg differs";
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdDeterminism,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
