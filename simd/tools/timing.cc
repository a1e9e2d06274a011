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

using qknorm::simd::tools::BestOf;
using qknorm::simd::tools::F32Attention;
using qknorm::simd::tools::Lcg;

int main(int argc, char** argv) {
  using namespace qknorm;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const Backend* b = simd::tools::EntryArgument(argc, argv);
  if (b == nullptr) return 1;
  const int64_t H = 8, D = 64;
  std::printf("%-6s %3s %10s %10s %10s %8s %8s\n", "n", "thr", "fwd GF/s",
              "bwd GF/s", "sgemm GF/s", "fwd/gemm", "bwd/gemm");
  for (int64_t n : {128, 512, 2048}) {
    AttentionProblem p;
    p.batch = 1, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D,
    p.g = 12.32;
    F32Attention buf(p);
    Lcg rng(1);
    for (auto* vec : {&buf.q, &buf.k, &buf.v, &buf.d_o}) rng.Fill(vec);
    const ForwardArgs fa = buf.Forward();
    const BackwardArgs ba = buf.Backward();
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
          const float* qh = buf.q.data() + h * n * D;
          const float* kh = buf.k.data() + h * n * D;
          const float* vh = buf.v.data() + h * n * D;
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
