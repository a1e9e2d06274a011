// Local timing driver for the BLAS path (the project benchmark lives in
// bench/). For fp32, d = 64, B = 1, H = 8 and each n it times, in the same
// process and with the same thread count:
//   gemm: the bare cblas_sgemm calls of an attention forward, per head
//         S = Q K^T (n x n x d) and O = P V (n x d x n), on dense buffers;
//   fwd:  blas:f32 attention_forward (qknorm, g = 12.32, no mask);
//   bwd:  blas:f32 attention_backward;
//   sdpa: blas:f32 forward of the sdpa variant (no normalization), same shapes.
// Then the formulations' general path (issue 16) on the same shapes, without
// GQA so that the FLOPs are the paper's: qwen3 (rms per head, [D] weight),
// olmo2 (rms across heads, [H, D] weight), chameleon (LayerNorm, [H, D]
// weight and bias), each forward and backward as a time ratio to the
// paper's (form/paper < 1 means slower).
// FLOPs: forward 4 n^2 d per head, backward 10 n^2 d (issue 3). Best of
// `reps` runs after one warm-up call (workspace grown).
//   usage: blas_timing [threads=1] [reps=5] [n...]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "blas_path/attention.h"
#include "blas_path/register.h"
#include "qknorm/formulation.h"

namespace {

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Best time of each function over `reps` rounds, the functions interleaved
// within a round (so that a load change on the shared machine hits the GEMM
// baseline and the entry alike), after one warm-up round.
template <class... F>
std::vector<double> best_of(int reps, F&&... f) {
  std::vector<double> best(sizeof...(F), 1e30);
  for (int r = -1; r < reps; ++r) {
    size_t i = 0;
    auto one = [&](auto& g) {
      const double t0 = now();
      g();
      const double t = now() - t0;
      if (r >= 0) best[i] = std::min(best[i], t);
      ++i;
    };
    (one(f), ...);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qknorm;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<int64_t> ns;
  for (int i = 3; i < argc; ++i) ns.push_back(std::atoll(argv[i]));
  if (ns.empty()) ns = {128, 512, 2048};
  const int64_t B = 1, H = 8, D = 64;
  ExecConfig cfg;
  cfg.threads = threads;
  blas::set_blas_threads(cfg);
  std::printf("corename=%s threads=%d\n", blas::blas_corename(),
              blas::blas_num_threads());
  std::printf("%6s %10s %10s %10s %8s %10s %8s %9s\n", "n", "gemm_GF/s",
              "fwd_GF/s", "bwd_GF/s", "fwd/gemm", "bwd_gemm", "bwd/gemm",
              "sdpa/gemm");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (int64_t n : ns) {
    const size_t sz = static_cast<size_t>(B * H * n * D);
    std::vector<float> q(sz), k(sz), v(sz), o(sz), d_o(sz), dq(sz), dk(sz),
        dv(sz), s(static_cast<size_t>(n * n));
    for (auto* t : {&q, &k, &v, &d_o})
      for (auto& x : *t) x = nd(rng);
    std::vector<double> lse(static_cast<size_t>(B * H * n));
    const Layout4 l = contiguous_layout(H, n, D);
    AttentionProblem p;
    p.batch = B, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D;
    p.g = 12.32;
    ForwardArgs fa{{q.data(), (int64_t)sz, l},
                   {k.data(), (int64_t)sz, l},
                   {v.data(), (int64_t)sz, l},
                   {o.data(), (int64_t)sz, l},
                   lse.data(),
                   (int64_t)lse.size()};
    double dg = 0;
    BackwardArgs ba{{q.data(), (int64_t)sz, l},
                    {k.data(), (int64_t)sz, l},
                    {v.data(), (int64_t)sz, l},
                    {o.data(), (int64_t)sz, l},
                    {d_o.data(), (int64_t)sz, l},
                    lse.data(),
                    (int64_t)lse.size(),
                    {dq.data(), (int64_t)sz, l},
                    {dk.data(), (int64_t)sz, l},
                    {dv.data(), (int64_t)sz, l},
                    &dg};
    const Backend* be = nullptr;
    Registry reg;
    blas::register_backends(reg);
    be = reg.find("blas:f32");
    auto ws = be->make_workspace();
    const int ni = static_cast<int>(n), di = static_cast<int>(D);
    auto gemm_fwd = [&] {
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + h * n * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ni, ni, di, 1.0f,
                    qh, di, k.data() + h * n * D, di, 0.0f, s.data(), ni);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, di, ni, 1.0f,
                    s.data(), ni, v.data() + h * n * D, di, 0.0f,
                    o.data() + h * n * D, di);
      }
    };
    // The five GEMMs of a backward: C, dP, dV, dQ, dK (2 n^2 d each).
    auto gemm_bwd = [&] {
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + h * n * D;
        float* dqh = dq.data() + h * n * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ni, ni, di, 1.0f,
                    qh, di, k.data() + h * n * D, di, 0.0f, s.data(), ni);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ni, ni, di, 1.0f,
                    d_o.data() + h * n * D, di, v.data() + h * n * D, di, 0.0f,
                    s.data(), ni);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, di, ni, 1.0f,
                    s.data(), ni, d_o.data() + h * n * D, di, 0.0f,
                    dv.data() + h * n * D, di);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, di, ni, 1.0f,
                    s.data(), ni, k.data() + h * n * D, di, 0.0f, dqh, di);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, di, ni, 1.0f,
                    s.data(), ni, qh, di, 0.0f, dk.data() + h * n * D, di);
      }
    };
    // The bare GEMMs run with OpenBLAS threads = cfg.threads; the entry runs
    // its own pool with OpenBLAS single-threaded (pool.h).
    auto fwd = [&] { be->attention_forward(p, fa, ws.get(), cfg); };
    AttentionProblem ps = p;  // the same shapes without the normalization
    ps.variant = Variant::kSDPA;
    auto fwd_sdpa = [&] { be->attention_forward(ps, fa, ws.get(), cfg); };
    auto bwd = [&] { be->attention_backward(p, ba, ws.get(), cfg); };
    fwd();
    const std::vector<double> t =
        best_of(reps, gemm_fwd, fwd, gemm_bwd, bwd, fwd_sdpa);
    const double t_gemm = t[0], t_fwd = t[1], t_bgemm = t[2], t_bwd = t[3];
    const double f = 4.0 * n * n * D * H, fb = 10.0 * n * n * D * H;
    std::printf("%6lld %10.1f %10.1f %10.1f %8.3f %10.1f %8.3f %9.3f\n",
                static_cast<long long>(n), f / t_gemm * 1e-9, f / t_fwd * 1e-9,
                fb / t_bwd * 1e-9, t_gemm / t_fwd, fb / t_bgemm * 1e-9,
                t_bgemm / t_bwd, t_gemm / t[4]);
    for (const char* name : {"qwen3", "olmo2", "chameleon"}) {
      AttentionProblem pf = p;
      apply_preset(name, &pf);
      std::vector<double> w(static_cast<size_t>(param_size(pf, 0)), 0.9),
          dw(w.size()), dw2(w.size()), dw3(w.size()), dw4(w.size());
      const auto n_w = static_cast<int64_t>(w.size());
      const ParamRef wr{w.data(), n_w};
      const ParamRef br{pf.norm.bias ? w.data() : nullptr,
                        pf.norm.bias ? n_w : 0};
      ForwardArgs faf = fa;
      faf.params = {wr, wr, br, br};
      BackwardArgs baf = ba;
      baf.params = faf.params;
      baf.d_params = {{dw.data(), n_w},
                      {dw2.data(), n_w},
                      {pf.norm.bias ? dw3.data() : nullptr, br.size},
                      {pf.norm.bias ? dw4.data() : nullptr, br.size}};
      auto ffwd = [&] { be->attention_forward(pf, faf, ws.get(), cfg); };
      auto fbwd = [&] { be->attention_backward(pf, baf, ws.get(), cfg); };
      ffwd();
      const std::vector<double> tf = best_of(reps, fwd, ffwd, bwd, fbwd);
      std::printf(
          "%6lld   %-10s fwd %6.1f GF/s (form/paper %.3f)  bwd %6.1f "
          "GF/s (form/paper %.3f)\n",
          static_cast<long long>(n), name, f / tf[1] * 1e-9, tf[0] / tf[1],
          fb / tf[3] * 1e-9, tf[2] / tf[3]);
    }
  }
  return 0;
}
