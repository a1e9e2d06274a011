// Local timing of the formulations (issue 16; not a test, not the project
// benchmark): f32 attention forward and backward of one simd entry at the
// issue's shape (B = 1, 32 query heads, head_dim 128, n = 512 by default),
// one preset after another in the same run; presets the model ships with
// GQA get 8 kv heads, the others (the paper) 32. Reports ms and GFLOP/s
// (forward 4 n^2 d per query head, backward 10 n^2 d) and the ratio of each
// preset's time to the first preset's. The forward is timed on both softmax
// paths (issue 18, attention-inl.h "Bounded logits"), interleaved (online,
// default, online, ...) so that both see the same machine load: the
// default may take the fixed shift where the preset's data bound allows
// it; fix/onl is the ratio of the two best times. Under `valgrind
// --tool=callgrind --collect-atstart=no` the first timed pair is counted
// and dumped per call ("fwd online qwen3", "fwd default qwen3"; client
// requests, no-ops outside valgrind): instruction counts of one forward on
// each path, load-independent.
//   simd_formulation_timing [entry] [reps] [n] [threads] [preset...]
// e.g. simd_formulation_timing simd:AVX3:f32 5 512 1 paper qwen3
#include <valgrind/callgrind.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "simd/tools/timing_util.h"

namespace {

using qknorm::simd::tools::BestOf;
using qknorm::simd::tools::F32Attention;
using qknorm::simd::tools::Lcg;

}  // namespace

int main(int argc, char** argv) {
  using namespace qknorm;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 512;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  std::vector<std::string> names;
  for (int i = 5; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) names = {"paper", "qwen3"};
  const Backend* b = simd::tools::EntryArgument(argc, argv);
  if (b == nullptr) return 1;
  const int64_t H = 32, D = 128;
  std::printf("%s n=%lld H=%lld D=%lld threads=%d\n", b->name().c_str(),
              static_cast<long long>(n), static_cast<long long>(H),
              static_cast<long long>(D), threads);
  std::printf("%-10s %3s %9s %9s %9s %9s %9s %8s %8s %8s\n", "preset", "Hk",
              "fwd ms", "onl ms", "bwd ms", "fwd GF/s", "bwd GF/s", "fix/onl",
              "fwd/1st", "bwd/1st");
  double first_f = 0, first_b = 0;
  for (const std::string& preset : names) {
    const Preset* ps = find_preset(preset);
    if (ps == nullptr) {
      std::fprintf(stderr, "unknown preset %s\n", preset.c_str());
      return 1;
    }
    AttentionProblem p;
    p.batch = 1, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D;
    p.kv_heads = ps->gqa ? 8 : 0;
    apply_preset(preset, &p);
    p.g = 12.32;
    const int64_t Hk = kv_heads_of(p);
    F32Attention buf(p);
    Lcg(1).Fill(&buf.q), Lcg(2).Fill(&buf.k), Lcg(3).Fill(&buf.v),
        Lcg(4).Fill(&buf.d_o);
    // Weights near their initialization (1, or 0 for Gemma's 1 + w).
    std::vector<double> pw[4], dpw[4];
    for (int i = 0; i < 4; ++i) {
      const size_t len = static_cast<size_t>(param_size(p, i % 2));
      const bool bias = i >= 2;
      if (bias && !p.norm.bias) continue;
      std::vector<float> f(len);
      Lcg(10 + static_cast<uint32_t>(i)).Fill(&f, -0.1f, 0.2f);
      for (float x : f)
        pw[i].push_back((bias || p.norm.one_plus_weight) ? x : 1.0 + x);
      dpw[i].assign(len, 0.0);
    }
    auto ref = [&](int i) {
      return ParamRef{pw[i].data(), static_cast<int64_t>(pw[i].size())};
    };
    auto mref = [&](int i) {
      return MutParamRef{dpw[i].data(), static_cast<int64_t>(dpw[i].size())};
    };
    const NormParams prm{ref(0), ref(1), ref(2), ref(3)};
    const NormParamGrads dprm{mref(0), mref(1), mref(2), mref(3)};
    const ForwardArgs fa = buf.Forward(prm);
    const BackwardArgs ba = buf.Backward(prm, dprm);
    std::unique_ptr<Workspace> ws = b->make_workspace();
    const ExecConfig cfg{threads}, online{threads, true};
    checked_attention_forward(*b, p, fa, ws.get(), cfg);  // warm-up
    checked_attention_backward(*b, p, ba, ws.get(), cfg);
    double tf = 1e30, to = 1e30;
    for (int r = 0; r < reps; ++r)
      for (const ExecConfig* c : {&online, &cfg}) {
        const bool count = r == 0;
        if (count) CALLGRIND_TOGGLE_COLLECT;
        const double t =
            BestOf(1, [&] { b->attention_forward(p, fa, ws.get(), *c); });
        if (count) {
          CALLGRIND_TOGGLE_COLLECT;
          const std::string label = std::string("fwd ") +
                                    (c == &cfg ? "default " : "online ") +
                                    preset;
          CALLGRIND_DUMP_STATS_AT(label.c_str());
        }
        (c == &cfg ? tf : to) = std::min(c == &cfg ? tf : to, t);
      }
    const double tb =
        BestOf(reps, [&] { b->attention_backward(p, ba, ws.get(), cfg); });
    if (first_f == 0) first_f = tf, first_b = tb;
    const double ff = 4.0 * n * n * D * H, fb = 10.0 * n * n * D * H;
    std::printf("%-10s %3lld %9.2f %9.2f %9.2f %9.1f %9.1f %8.3f %8.3f %8.3f\n",
                preset.c_str(), static_cast<long long>(Hk), tf * 1e3, to * 1e3,
                tb * 1e3, ff / tf * 1e-9, fb / tb * 1e-9, tf / to, tf / first_f,
                tb / first_b);
  }
  return 0;
}
