// The quick subset of the BLAS path's attention tests: a deterministic sample
// of the issue-3 sweep for both entries, strided and head-interleaved
// layouts, extreme magnitudes, the probabilities hook, determinism across
// OpenBLAS thread counts, and the workspace's no-growth contract.
#include "blas_path/attention.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "blas_path/register.h"
#include "blas_path/tests/test_util.h"
#include "qknorm/error.h"
#include "qknorm/precision.h"
#include "tests/test_support.h"
#include "validation/buffers.h"
#include "validation/nonsaturation.h"

// Counts C++ allocations while armed (the workspace test). OpenBLAS's own
// buffers come from its C allocator and are not counted: they are allocated
// once per thread by the library, not per call.
namespace {
std::atomic<bool> g_count_allocs{false};
std::atomic<long> g_allocs{0};
}  // namespace
[[gnu::noinline]] void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// noinline (new and delete): inlined into a std::allocator call site, GCC 12
// pairs one with the other side of the library and warns
// -Wmismatched-new-delete (a false positive: both are this file's).
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}

namespace qknorm::blas::testing {
namespace {

constexpr Precision kPrecisions[] = {Precision::kF32, Precision::kF64};

// Every 7th case of the full sweep (tests/full): 1000 shapes / 7, about 140
// cases per precision, every head_dim, length and parameter value represented.
constexpr int64_t kQuickStride = 7;

// Under the sanitizer subset (test_support::sanitize_keeps) every third of
// these (every 21st of the full sweep), every head_dim still among them.
TEST(BlasAttention, QuickSweep) {
  for (Precision prec : kPrecisions) {
    int64_t index = 0;
    for (int64_t D : kHeadDims)
      for (int64_t nq : kLengths)
        for (int64_t nk : kLengths) {
          if (index++ % kQuickStride != 0) continue;
          if (!test_support::sanitize_keeps((index - 1) / kQuickStride, 3))
            continue;
          const AttentionCase c = sweep_case(index, D, nq, nk);
          SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
          expect_case(prec, c);
        }
  }
}

// Padded rows (row_stride = D + 3): the GEMMs read and write through lda.
TEST(BlasAttention, PaddedRowStrides) {
  for (Precision prec : kPrecisions)
    for (int64_t i = 0; i < 8; ++i) {
      AttentionCase c = sweep_case(i, i % 2 ? 65 : 9, 33, i % 3 ? 64 : 7);
      c.row_pad = 3;
      SCOPED_TRACE(c.describe());
      expect_case(prec, c);
    }
}

// Extreme magnitudes: qknorm is scale invariant, so rows of 1e30 (f32) and
// 1e300 / 1e-300 (f64), whose sums of squares over/underflow, must pass the
// rule like any other case.
TEST(BlasAttention, HugeAndTinyRows) {
  struct Sc {
    Precision prec;
    double scale;
  };
  for (Sc sc : {Sc{Precision::kF32, 1e30}, Sc{Precision::kF32, 1e-30},
                Sc{Precision::kF64, 1e300}, Sc{Precision::kF64, 1e-300}}) {
    AttentionCase c = sweep_case(4, 31, 9, 33);  // qknorm, causal, g = -3
    ASSERT_EQ(c.problem.variant, Variant::kQKNorm);
    for (auto& x : c.q) x *= sc.scale;
    for (auto& x : c.k) x *= sc.scale;
    SCOPED_TRACE(c.describe() + " scale=" + std::to_string(sc.scale));
    expect_case(sc.prec, c);
  }
}

// Runs entry on c in the head-interleaved layout [B, N, H, D] of a projection
// output (head_stride = D, row_stride = H D) and returns o, lse, dq, dk, dv,
// dg in the dense order; the blas path must give the same bits as on dense
// buffers (the GEMMs pack their operands, so lda does not change arithmetic).
// The buffers are guarded (validation/buffers.h): a write outside a view
// fails the test.
validation::AttentionResult run_interleaved(const Backend& b,
                                            const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, D = p.head_dim;
  auto buffer = [&](const char* name, int64_t n) {
    return validation::TensorBuffer(name, b.precision(), {B, H, n, D},
                                    Layout4{n * H * D, D, H * D}, B * n * H * D,
                                    validation::kGuardElements);
  };
  const int64_t nq = p.q_len, nk = p.kv_len;
  validation::TensorBuffer q = buffer("q", nq), k = buffer("k", nk),
                           v = buffer("v", nk), d_o = buffer("d_o", nq),
                           o = buffer("o", nq), dq = buffer("dq", nq),
                           dk = buffer("dk", nk), dv = buffer("dv", nk),
                           lse = validation::double_buffer("lse", B * H * nq),
                           dg = validation::double_buffer("dg", 1);
  q.store(c.q), k.store(c.k), v.store(c.v), d_o.store(c.d_o);
  ForwardArgs fa{q.cview(),     k.cview(),  v.cview(), o.view(),
                 lse.doubles(), lse.size(), {}};
  checked_attention_forward(b, p, fa, nullptr);
  BackwardArgs ba{q.cview(),     k.cview(),  v.cview(), o.cview(), d_o.cview(),
                  lse.doubles(), lse.size(), dq.view(), dk.view(), dv.view(),
                  dg.doubles(),  {},         {}};
  checked_attention_backward(b, p, ba, nullptr);
  for (const validation::TensorBuffer* t : {&o, &dq, &dk, &dv, &lse, &dg})
    EXPECT_TRUE(t->guards_intact()) << t->first_violation().message();
  validation::AttentionResult r;
  r.o = o.load(), r.lse = lse.load(), r.dq = dq.load(), r.dk = dk.load(),
  r.dv = dv.load(), r.dg = dg.load()[0];
  return r;
}

TEST(BlasAttention, HeadInterleavedLayoutGivesDenseBits) {
  for (int64_t i : {0, 5, 10, 13}) {
    const AttentionCase c =
        validation::round_inputs(sweep_case(i, 16, 33, 64), Precision::kF32);
    SCOPED_TRACE(c.describe());
    const auto dense = validation::run_attention(entry(Precision::kF32), c);
    expect_same_bits(dense, run_interleaved(entry(Precision::kF32), c),
                     "f32 interleaved vs dense");
    const AttentionCase c64 = validation::round_inputs(c, Precision::kF64);
    expect_same_bits(validation::run_attention(entry(Precision::kF64), c64),
                     run_interleaved(entry(Precision::kF64), c64),
                     "f64 interleaved vs dense");
  }
}

// Determinism: OpenBLAS 0.3.21 splits a GEMM over M and N between threads,
// never over K, so each element's dot product is summed in the same order
// whatever the thread count; the row kernels run on the calling thread. The
// shapes are above OpenBLAS's threading threshold (M N K >= 4 * 65536).
TEST(BlasAttention, BitwiseIdenticalAcrossThreadCountsAndReruns) {
  for (Precision prec : kPrecisions)
    for (Variant var : {Variant::kQKNorm, Variant::kSDPA}) {
      AttentionProblem p;
      p.batch = 1, p.heads = 2, p.q_len = 300, p.kv_len = 280, p.head_dim = 64;
      p.variant = var, p.g = 12.32;
      p.mask.causal = true;
      const AttentionCase c = validation::round_inputs(
          validation::make_attention_case(p, Distribution::kGaussian, 7), prec);
      SCOPED_TRACE(c.describe());
      ExecConfig one, two;
      one.threads = 1, two.threads = 2;
      const auto r1 = validation::run_attention(entry(prec), c, one);
      const auto r2 = validation::run_attention(entry(prec), c, two);
      const auto r2b = validation::run_attention(entry(prec), c, two);
      EXPECT_EQ(blas_num_threads(), 2);
      expect_same_bits(r1, r2, "threads 1 vs 2");
      expect_same_bits(r2, r2b, "rerun");
    }
}

// Workspace: after the largest shape, reusing it allocates nothing (C++
// allocations counted while armed) and bytes() does not change; the size is
// exactly workspace_bytes().
TEST(BlasWorkspace, NoGrowthAndNoAllocationAfterWarmUp) {
  for (Precision prec : kPrecisions) {
    const Backend& b = entry(prec);
    const size_t eb = element_bytes(prec);
    auto ws_owner = b.make_workspace();
    auto& ws = *ws_owner;
    auto bytes = [&] {
      return prec == Precision::kF32
                 ? dynamic_cast<BlasWorkspace<float>&>(ws).bytes()
                 : dynamic_cast<BlasWorkspace<double>&>(ws).bytes();
    };
    EXPECT_EQ(bytes(), 0u);
    AttentionProblem big;
    big.batch = 2, big.heads = 3, big.q_len = 200, big.kv_len = 127;
    big.head_dim = 65, big.g = 12.32;
    const AttentionCase cbig = validation::round_inputs(
        validation::make_attention_case(big, Distribution::kGaussian, 3), prec);
    validation::run_attention_forward(b, cbig, {}, &ws);
    EXPECT_EQ(bytes(), workspace_bytes(big, eb, false, 0));
    validation::run_attention(b, cbig, {}, &ws);
    const size_t warm = bytes();
    EXPECT_EQ(warm, workspace_bytes(big, eb, true, 0));

    // Direct calls (guarded buffers built before counting is armed).
    const AttentionProblem& p = cbig.problem;
    validation::AttentionBuffers bufs(cbig, prec);
    const ForwardArgs fa = bufs.forward_args();
    const BackwardArgs ba = bufs.backward_args();
    ExecConfig cfg;
    cfg.threads = 1;
    g_allocs = 0;
    g_count_allocs = true;
    for (int rep = 0; rep < 3; ++rep) {
      b.attention_forward(p, fa, &ws, cfg);
      b.attention_backward(p, ba, &ws, cfg);
    }
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << name(prec);
    EXPECT_EQ(bytes(), warm);

    // A smaller shape reuses the buffers.
    AttentionProblem small = big;
    small.q_len = 9, small.kv_len = 33, small.head_dim = 8;
    validation::run_attention(
        b, validation::make_attention_case(small, Distribution::kGaussian, 4),
        {}, &ws);
    EXPECT_EQ(bytes(), warm);
    for (double x : bufs.lse.load()) EXPECT_TRUE(std::isfinite(x));
    for (const validation::GuardViolation& g : bufs.guard_violations())
      ADD_FAILURE() << g.message();
  }
}

// The probabilities hook: masked entries (and fully masked rows) are 0,
// visible ones agree with reference:f64's hook to the forward's error
// bound, rows sum to 1, and qknorm's non-saturation bounds hold.
TEST(BlasProbabilities, MatchesReferenceAndNonSaturation) {
  const Backend& ref = *all_backends().find("reference:f64");
  for (Precision prec : kPrecisions)
    for (int64_t i : {0, 1, 3, 6, 7, 12, 13, 18}) {
      AttentionCase c = sweep_case(i, 31, 33, 64);
      c = validation::round_inputs(c, prec);
      const AttentionProblem& p = c.problem;
      SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
      const int64_t nq = p.q_len, nk = p.kv_len, D = p.head_dim;
      // The entry's storage and reference:f64's, guarded.
      validation::AttentionBuffers mine(c, prec), ref64(c, Precision::kF64);
      const ForwardArgs fa = mine.forward_args(), fr = ref64.forward_args();
      const size_t np = static_cast<size_t>(p.batch * p.heads * nq * nk);
      std::vector<double> pb(np, std::nan("")), pr(np);
      ASSERT_TRUE(
          entry(prec).attention_probabilities(p, fa, pb.data(), nullptr));
      ASSERT_TRUE(ref.attention_probabilities(p, fr, pr.data(), nullptr));
      EXPECT_TRUE(mine.guard_violations().empty());
      EXPECT_TRUE(ref64.guard_violations().empty());
      // Relative error of a probability (bound of test_util.h's forward
      // analysis at the entry's u): 2E + (m + 6) u, E = A (3D + 15) u.
      const double u = compute_roundoff(prec);
      // A: the rule's logit amplitude (|g|, or max||q|| max||k|| / sqrt(D)).
      const double A = validation::logit_amplitude(c);
      const double E = A * (3.0 * D + 15) * u;
      for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
        for (int64_t row = 0; row < nq; ++row) {
          const int64_t bb = bh / p.heads;
          const size_t base = static_cast<size_t>((bh * nq + row) * nk);
          int64_t m = 0;
          double sum = 0;
          for (int64_t j = 0; j < nk; ++j) {
            const double x = pb[base + j], y = pr[base + j];
            if (!visible(p.mask, bb, row, j, nq, nk)) {
              EXPECT_EQ(x, 0.0) << "masked entry " << row << "," << j;
              continue;
            }
            ++m;
            sum += x;
            const double tol = (2 * E + (nk + 6) * u) * y;
            EXPECT_NEAR(x, y, tol) << "row " << row << " key " << j;
          }
          if (m == 0) continue;
          // sum of m values each within (m + ...) u: the row sums to 1.
          EXPECT_NEAR(sum, 1.0, 2 * (2 * E + (nk + 6) * u)) << "row " << row;
        }
      // The non-saturation bound itself: validation/nonsaturation.h.
      if (p.variant == Variant::kQKNorm) {
        EXPECT_EQ(validation::check_nonsaturation(
                      p, pb, nullptr,
                      validation::computed_logit_amplitude(c, nullptr, prec, A),
                      prec),
                  "");
      }
    }
}

// Row strides beyond OpenBLAS's int (fuzz finding
// crash-blas-single-row-huge-stride): a tensor of one row never passes its
// stride to OpenBLAS, so q_len = kv_len = 1 with strides of 2^40 gives the
// dense run's bits; with two rows the stride would reach the GEMM and the
// call raises qknorm::Error naming the tensor before touching any element
// (the buffers are not dereferenced, so a 2^40-element view is safe here).
TEST(BlasAttention, RowStrideBeyondIntRange) {
  constexpr int64_t kHuge = int64_t{1} << 40;
  for (Variant var : {Variant::kQKNorm, Variant::kSDPA}) {
    AttentionProblem p;
    p.variant = var;
    p.head_dim = 5;
    const std::vector<float> q = {1, 2, 3, 4, 5}, k = {-1, 0.5f, 2, 0, 1},
                             v = {3, 1, 4, 1, 5};
    std::vector<float> o_dense(5), o_huge(5);
    double lse_dense = 0, lse_huge = 0;
    BlasWorkspace<float> ws;
    auto run = [&](int64_t rs, float* o, double* lse) {
      const Layout4 l{rs, rs, rs};
      ForwardArgs a;
      a.q = {q.data(), 5, l};
      a.k = {k.data(), 5, l};
      a.v = {v.data(), 5, l};
      a.o = {o, 5, l};
      a.lse = lse;
      a.lse_size = 1;
      attention_forward<float>(p, a, ws, ExecConfig{});
    };
    run(5, o_dense.data(), &lse_dense);
    run(kHuge, o_huge.data(), &lse_huge);
    EXPECT_EQ(o_dense, o_huge);
    EXPECT_EQ(lse_dense, lse_huge);
  }
  AttentionProblem p;
  p.variant = Variant::kSDPA;
  p.q_len = p.kv_len = 2;
  p.head_dim = 3;
  const std::vector<float> dense(6, 1.0f);
  std::vector<float> o(6);
  std::vector<double> lse(2);
  ForwardArgs a;
  const Layout4 d{6, 6, 3};
  a.q = {dense.data(), 6, d};
  a.k = {dense.data(), 6, d};
  a.v = {dense.data(), kHuge + 3, Layout4{kHuge, kHuge, kHuge}};
  a.o = {o.data(), 6, d};
  a.lse = lse.data();
  a.lse_size = 2;
  BlasWorkspace<float> ws;
  try {
    attention_forward<float>(p, a, ws, ExecConfig{});
    ADD_FAILURE() << "no qknorm::Error for a v row stride of 2^40";
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), "v") << e.what();
    EXPECT_NE(std::string(e.what()).find("row stride 1099511627776"),
              std::string::npos)
        << e.what();
  }
}

// A null or foreign workspace falls back to a temporary one.
TEST(BlasAttention, ForeignWorkspaceIsNotUsed) {
  struct Foreign : Workspace {};
  const AttentionCase c = sweep_case(0, 8, 7, 9);
  Foreign f;
  const auto a = validation::run_attention(
      entry(Precision::kF32), validation::round_inputs(c, Precision::kF32), {},
      &f);
  const auto b = validation::run_attention(
      entry(Precision::kF32), validation::round_inputs(c, Precision::kF32));
  expect_same_bits(a, b, "foreign vs own workspace");
}

TEST(BlasInfo, CorenameAndThreads) {
  ExecConfig cfg;
  cfg.threads = 1;
  set_blas_threads(cfg);
  EXPECT_EQ(blas_num_threads(), 1);
  ASSERT_NE(blas_corename(), nullptr);
  EXPECT_GT(std::strlen(blas_corename()), 0u);
  RecordProperty("openblas_corename", blas_corename());
}

}  // namespace
}  // namespace qknorm::blas::testing
