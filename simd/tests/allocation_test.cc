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

void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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
  std::vector<double> w[4], dw[4];
  for (int i = 0; i < 4; ++i)
    if (i < 2 || p.norm.bias) {
      w[i].assign(static_cast<size_t>(param_size(p, i % 2)), 0.5);
      dw[i].assign(w[i].size(), 0.0);
    }
  auto ref = [&](int i) {
    return ParamRef{w[i].data(), static_cast<int64_t>(w[i].size())};
  };
  auto mref = [&](int i) {
    return MutParamRef{dw[i].data(), static_cast<int64_t>(dw[i].size())};
  };
  const size_t es = element_bytes(entry.precision());
  const size_t nq =
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.head_dim);
  const size_t nk = static_cast<size_t>(p.batch * Hk * p.kv_len * p.head_dim);
  // Small integers are exact in every format; their bytes are all we need.
  std::vector<unsigned char> q(nq * es), k(nk * es), v(nk * es), o(nq * es),
      d_o(nq * es), dq(nq * es), dk(nk * es), dv(nk * es);
  for (size_t i = 0; i < nq; ++i) {
    encode(entry.precision(), static_cast<double>(i % 7) - 3, q.data(), i);
    encode(entry.precision(), static_cast<double>(i % 5) - 2, d_o.data(), i);
  }
  for (size_t i = 0; i < nk; ++i) {
    encode(entry.precision(), static_cast<double>(i % 3) - 1, k.data(), i);
    encode(entry.precision(), static_cast<double>(i % 4), v.data(), i);
  }
  std::vector<double> lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
  const Layout4 lq = contiguous_layout(p.heads, p.q_len, p.head_dim);
  const Layout4 lk = contiguous_layout(Hk, p.kv_len, p.head_dim);
  const int64_t sq = static_cast<int64_t>(nq), sk = static_cast<int64_t>(nk);
  const ForwardArgs fa{{q.data(), sq, lq},
                       {k.data(), sk, lk},
                       {v.data(), sk, lk},
                       {o.data(), sq, lq},
                       lse.data(),
                       static_cast<int64_t>(lse.size()),
                       {ref(0), ref(1), ref(2), ref(3)}};
  double dg = 0;
  const BackwardArgs ba{fa.q,
                        fa.k,
                        fa.v,
                        {o.data(), sq, lq},
                        {d_o.data(), sq, lq},
                        lse.data(),
                        static_cast<int64_t>(lse.size()),
                        {dq.data(), sq, lq},
                        {dk.data(), sk, lk},
                        {dv.data(), sk, lk},
                        &dg,
                        fa.params,
                        {mref(0), mref(1), mref(2), mref(3)}};
  ScaleNormProblem sp;
  sp.rows = p.batch * p.heads * p.q_len, sp.dim = p.head_dim;
  const ScaleNormForwardArgs sfa{{q.data(), sq, p.head_dim},
                                 {o.data(), sq, p.head_dim}};
  const ScaleNormBackwardArgs sba{{q.data(), sq, p.head_dim},
                                  {d_o.data(), sq, p.head_dim},
                                  {dq.data(), sq, p.head_dim},
                                  &dg};
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
