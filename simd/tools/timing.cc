// Local timing driver (not a test, not the project benchmark): f32 QKNorm
// attention, d = 64, B = 1, H = 8, n in {128, 512, 2048}, on 1 and 2
// threads, for one simd entry (default simd:AVX2:f32), beside OpenBLAS
// cblas_sgemm on the same attention-shaped GEMMs (per head Q K^T: n x n x 64
// and P V: n x 64 x n). FLOPs as issue 3 counts them: forward 4 n^2 d per
// head, backward 10 n^2 d.
//   simd_timing [entry] [reps]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "simd/tools/timing_util.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using qknorm::simd::tools::BestOf;

}  // namespace

int main(int argc, char** argv) {
  using namespace qknorm;
  const std::string name = argc > 1 ? argv[1] : "simd:AVX2:f32";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const Backend* b = all_backends().find(name);
  if (b == nullptr || !b->available()) {
    std::fprintf(stderr, "no runnable entry %s\n", name.c_str());
    return 1;
  }
  const int64_t H = 8, D = 64;
  std::printf("%-6s %3s %10s %10s %10s %8s %8s\n", "n", "thr", "fwd GF/s",
              "bwd GF/s", "sgemm GF/s", "fwd/gemm", "bwd/gemm");
  for (int64_t n : {128, 512, 2048}) {
    AttentionProblem p;
    p.batch = 1, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D,
    p.g = 12.32;
    const size_t sz = static_cast<size_t>(H * n * D);
    std::vector<float> q(sz), k(sz), v(sz), o(sz), d_o(sz), dq(sz), dk(sz),
        dv(sz);
    uint32_t s = 1;
    for (auto* vec : {&q, &k, &v, &d_o})
      for (float& x : *vec) {
        s = s * 1664525u + 1013904223u;
        x = static_cast<float>(s >> 8) * 0x1p-24f - 0.5f;
      }
    std::vector<double> lse(static_cast<size_t>(H * n));
    const Layout4 l = contiguous_layout(H, n, D);
    const int64_t isz = static_cast<int64_t>(sz);
    ForwardArgs fa{{q.data(), isz, l},
                   {k.data(), isz, l},
                   {v.data(), isz, l},
                   {o.data(), isz, l},
                   lse.data(),
                   static_cast<int64_t>(lse.size()),
                   {}};
    double dg = 0;
    BackwardArgs ba{fa.q,
                    fa.k,
                    fa.v,
                    {o.data(), isz, l},
                    {d_o.data(), isz, l},
                    lse.data(),
                    static_cast<int64_t>(lse.size()),
                    {dq.data(), isz, l},
                    {dk.data(), isz, l},
                    {dv.data(), isz, l},
                    &dg,
                    {},
                    {}};
    std::vector<float> S(static_cast<size_t>(n * n)),
        C(static_cast<size_t>(n * D));
    const double fwd_flops = 4.0 * n * n * D * H,
                 bwd_flops = 10.0 * n * n * D * H;
    const int r = n >= 2048 ? std::max(1, reps / 2) : reps;
    for (int threads : {1, 2}) {
      std::unique_ptr<Workspace> ws = b->make_workspace();
      const ExecConfig cfg{threads};
      b->attention_forward(p, fa, ws.get(),
                           cfg);  // warm-up sizes the workspace
      b->attention_backward(p, ba, ws.get(), cfg);
      const double tf =
          BestOf(r, [&] { b->attention_forward(p, fa, ws.get(), cfg); });
      const double tb =
          BestOf(r, [&] { b->attention_backward(p, ba, ws.get(), cfg); });
      openblas_set_num_threads(threads);
      const double tg = BestOf(r, [&] {
        for (int64_t h = 0; h < H; ++h) {
          const float* qh = q.data() + h * n * D;
          const float* kh = k.data() + h * n * D;
          const float* vh = v.data() + h * n * D;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, 1.0f,
                      qh, D, kh, D, 0.0f, S.data(), n);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, n, 1.0f,
                      S.data(), n, vh, D, 0.0f, C.data(), D);
        }
      });
      const double gf = fwd_flops / tf * 1e-9, gb = bwd_flops / tb * 1e-9,
                   gg = fwd_flops / tg * 1e-9;
      std::printf("%-6lld %3d %10.1f %10.1f %10.1f %8.2f %8.2f\n",
                  static_cast<long long>(n), threads, gf, gb, gg, gf / gg,
                  gb / gg);
    }
  }
  return 0;
}
