// "No allocation in the hot path after the workspace is sized" (issue 3):
// after one warm-up call of each kernel with a workspace, repeated calls of
// the same shape and thread count through that workspace must not call
// operator new (this binary counts every global operator new), and the
// workspace buffers (hwy::AllocateAligned, grow-only) must not move.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "simd/tests/test_util.h"
#include "simd/workspace.h"

namespace {
std::atomic<long> g_news{0};
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// noinline (new and delete): inlined into a std::allocator call site, GCC 12
// pairs one with the other side of the library and warns
// -Wmismatched-new-delete (a false positive: both are this file's).
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace qknorm::simd::testing {
namespace {

class SimdAllocation : public ::testing::TestWithParam<const Backend*> {};

// The paper (preset null) or a preset's formulation with 2 kv heads (the
// generic side path, its parameters and their gradients).
void ExpectNoAllocation(const Backend& entry, const char* preset) {
  AttentionProblem p;
  p.batch = 2, p.heads = preset ? 4 : 3, p.q_len = 77, p.kv_len = 130,
  p.head_dim = 40, p.g = 12.32;
  if (preset) p.kv_heads = 2, apply_preset(preset, &p);
  p.mask.causal = true;
  const int64_t Hk = kv_heads_of(p);
  // Small integers are exact in every format.
  validation::AttentionCase c;
  c.problem = p;
  const size_t nq =
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.head_dim);
  const size_t nk = static_cast<size_t>(p.batch * Hk * p.kv_len * p.head_dim);
  for (size_t i = 0; i < nq; ++i) {
    c.q.push_back(static_cast<double>(i % 7) - 3);
    c.d_o.push_back(static_cast<double>(i % 5) - 2);
  }
  for (size_t i = 0; i < nk; ++i) {
    c.k.push_back(static_cast<double>(i % 3) - 1);
    c.v.push_back(static_cast<double>(i % 4));
  }
  for (int side = 0; side < 2; ++side) {
    const std::vector<double> w(static_cast<size_t>(param_size(p, side)), 0.5);
    (side == 0 ? c.q_weight : c.k_weight) = w;
    if (p.norm.bias) (side == 0 ? c.q_bias : c.k_bias) = w;
  }
  validation::AttentionBuffers bufs(c, entry.precision());
  const ForwardArgs fa = bufs.forward_args();
  const BackwardArgs ba = bufs.backward_args();
  // ScaleNorm over the same buffers: q, dO as x, dy; o, dq as y, dx.
  ScaleNormProblem sp;
  sp.rows = p.batch * p.heads * p.q_len, sp.dim = p.head_dim;
  const ScaleNormForwardArgs sfa{bufs.q.cview2(), bufs.o.view2()};
  const ScaleNormBackwardArgs sba{bufs.q.cview2(), bufs.d_o.cview2(),
                                  bufs.dq.view2(), bufs.dg.doubles()};
  std::unique_ptr<Workspace> ws = entry.make_workspace();
  auto* sws = dynamic_cast<SimdWorkspace*>(ws.get());
  ASSERT_NE(sws, nullptr) << entry.name();
  const ExecConfig cfg{2};
  auto run_all = [&] {
    entry.attention_forward(p, fa, ws.get(), cfg);
    entry.attention_backward(p, ba, ws.get(), cfg);
    entry.scalenorm_forward(sp, sfa, ws.get(), cfg);
    entry.scalenorm_backward(sp, sba, ws.get(), cfg);
  };
  run_all();  // sizes the workspace, starts the pool
  const float* scratch = sws->scratch.Get(1);
  const float* qh = sws->qh.Get(1);
  const long before = g_news.load();
  for (int r = 0; r < 3; ++r) run_all();
  EXPECT_EQ(g_news.load() - before, 0)
      << entry.name() << ": operator new after warm-up";
  EXPECT_EQ(sws->scratch.Get(1), scratch)
      << entry.name() << ": scratch reallocated";
  EXPECT_EQ(sws->qh.Get(1), qh) << entry.name() << ": q_hat buffer reallocated";
  for (const validation::GuardViolation& g : bufs.guard_violations())
    ADD_FAILURE() << entry.name() << ": " << g.message();
}

TEST_P(SimdAllocation, NoneAfterWarmUp) {
  ExpectNoAllocation(*GetParam(), nullptr);
}

TEST_P(SimdAllocation, NoneAfterWarmUpWithFormulations) {
  for (const char* preset : {"qwen3", "chameleon", "olmo2"})
    ExpectNoAllocation(*GetParam(), preset);
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdAllocation,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
