// Local timing of the forward's two softmax paths (issue 18; not a test, not
// the project benchmark): the online running-max softmax
// (ExecConfig::online_softmax) against the fixed shift of bounded QKNorm
// logits (simd/attention-inl.h), on the same entry, inputs and workspace,
// interleaved (online, fixed, online, fixed, ...) so that both see the same
// machine load. Per shape: the median forward time of each path over `reps`
// pairs, GFLOP/s (4 n_visible d per head: causal counts the visible pairs)
// and fixed / online.
//   simd_softmax_timing [entry] [reps] [threads]
// e.g. simd_softmax_timing simd:AVX2:f32 15 1
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "simd/tools/timing_util.h"

namespace {

using qknorm::simd::tools::F32Attention;
using qknorm::simd::tools::Lcg;
using qknorm::simd::tools::Seconds;

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qknorm;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const Backend* b = simd::tools::EntryArgument(argc, argv);
  if (b == nullptr) return 1;
  const int64_t H = 8;
  std::printf(
      "%s B=1 H=%lld g=12.32 threads=%d, median of %d interleaved "
      "pairs\n",
      b->name().c_str(), static_cast<long long>(H), threads, reps);
  std::printf("%5s %4s %6s %11s %11s %10s %10s %8s\n", "n", "d", "mask",
              "online ms", "fixed ms", "online GF", "fixed GF", "fix/onl");
  for (int64_t D : {64, 128})
    for (int64_t n : {128, 512, 2048})
      for (bool causal : {false, true}) {
        AttentionProblem p;
        p.batch = 1, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D;
        p.g = 12.32;
        p.mask.causal = causal;
        F32Attention buf(p);
        Lcg(1).Fill(&buf.q), Lcg(2).Fill(&buf.k), Lcg(3).Fill(&buf.v);
        const ForwardArgs fa = buf.Forward();
        std::unique_ptr<Workspace> ws = b->make_workspace();
        ExecConfig online{threads, true}, fixed{threads, false};
        checked_attention_forward(*b, p, fa, ws.get(), online);  // warm-up
        checked_attention_forward(*b, p, fa, ws.get(), fixed);
        std::vector<double> to, tf;
        for (int r = 0; r < reps; ++r) {
          double t0 = Seconds();
          b->attention_forward(p, fa, ws.get(), online);
          to.push_back(Seconds() - t0);
          t0 = Seconds();
          b->attention_forward(p, fa, ws.get(), fixed);
          tf.push_back(Seconds() - t0);
        }
        const double mo = Median(to), mf = Median(tf);
        const double pairs = causal ? n * (n + 1) / 2.0 : double(n) * n;
        const double flops = 4.0 * pairs * D * H;
        std::printf("%5lld %4lld %6s %11.3f %11.3f %10.1f %10.1f %8.3f\n",
                    static_cast<long long>(n), static_cast<long long>(D),
                    causal ? "causal" : "none", mo * 1e3, mf * 1e3,
                    flops / mo * 1e-9, flops / mf * 1e-9, mf / mo);
      }
  return 0;
}
