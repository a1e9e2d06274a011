// Local timing of RoPE (issue 34; not a test, not the project benchmark):
// the f32 forward (and backward) of one simd entry with and without RoPE
// on the same inputs, interleaved (off, on, off, ...) so that both see the
// same machine load; the goal is forward on / off <= 1.10 at
// n = 512, d = 128, one thread. Shape: B = 1, H query heads (default 8, the
// bench grid's), kv heads as the preset ships (GQA: H / 4), causal or not,
// RoPE full rotary_dim, half-split, after the normalization, theta 10^4.
// Under callgrind (below) the first forward pair's instruction counts.
//   simd_rope_timing [entry] [reps] [n] [threads] [H] [causal] [preset...]
// e.g. simd_rope_timing simd:AVX3:f32 7 512 1 8 0 paper qwen3
#include <valgrind/callgrind.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "simd/tools/timing_util.h"

int main(int argc, char** argv) {
  using namespace qknorm;
  using simd::tools::BestOf;
  using simd::tools::F32Attention;
  using simd::tools::Lcg;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : 512;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  const int64_t H = argc > 5 ? std::atoll(argv[5]) : 8;
  const bool causal = argc > 6 && std::atoi(argv[6]) != 0;
  std::vector<std::string> names;
  for (int i = 7; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) names = {"paper", "qwen3"};
  const Backend* b = simd::tools::EntryArgument(argc, argv);
  if (b == nullptr) return 1;
  const int64_t D = 128;
  std::printf("%s n=%lld H=%lld D=%lld threads=%d causal=%d\n",
              b->name().c_str(), static_cast<long long>(n),
              static_cast<long long>(H), static_cast<long long>(D), threads,
              causal ? 1 : 0);
  std::printf("%-8s %9s %9s %8s %9s %9s %8s\n", "preset", "fwd off", "fwd on",
              "on/off", "bwd off", "bwd on", "on/off");
  for (const std::string& preset : names) {
    const Preset* ps = find_preset(preset);
    if (ps == nullptr) {
      std::fprintf(stderr, "unknown preset %s\n", preset.c_str());
      return 1;
    }
    AttentionProblem p;
    p.batch = 1, p.heads = H, p.q_len = n, p.kv_len = n, p.head_dim = D;
    p.kv_heads = ps->gqa ? std::max<int64_t>(1, H / 4) : 0;
    apply_preset(preset, &p);
    p.g = 12.32;
    p.mask.causal = causal;
    AttentionProblem pr = p;
    pr.rope.rotary_dim = D;
    F32Attention buf(p);
    Lcg(1).Fill(&buf.q), Lcg(2).Fill(&buf.k), Lcg(3).Fill(&buf.v),
        Lcg(4).Fill(&buf.d_o);
    std::vector<double> w[2], dw[2];
    for (int s = 0; s < 2; ++s) {
      const size_t len = static_cast<size_t>(param_size(p, s));
      std::vector<float> f(len);
      Lcg(10 + static_cast<uint32_t>(s)).Fill(&f, -0.1f, 0.2f);
      for (float x : f) w[s].push_back(p.norm.one_plus_weight ? x : 1.0 + x);
      dw[s].assign(len, 0.0);
    }
    const NormParams prm{{w[0].data(), static_cast<int64_t>(w[0].size())},
                         {w[1].data(), static_cast<int64_t>(w[1].size())},
                         {},
                         {}};
    const NormParamGrads dprm{
        {dw[0].data(), static_cast<int64_t>(dw[0].size())},
        {dw[1].data(), static_cast<int64_t>(dw[1].size())},
        {},
        {}};
    const ForwardArgs fa = buf.Forward(prm);
    const BackwardArgs ba = buf.Backward(prm, dprm);
    std::unique_ptr<Workspace> ws = b->make_workspace();
    const ExecConfig cfg{threads};
    for (const AttentionProblem* q : {&p, &pr}) {  // warm-up, validation
      checked_attention_forward(*b, *q, fa, ws.get(), cfg);
      checked_attention_backward(*b, *q, ba, ws.get(), cfg);
    }
    double f[2] = {1e30, 1e30}, g[2] = {1e30, 1e30};
    for (int r = 0; r < reps; ++r)
      for (int on = 0; on < 2; ++on) {
        // Under valgrind --tool=callgrind --collect-atstart=no the first
        // pair is counted and dumped per call ("fwd off qwen3", "fwd on
        // qwen3"): load-independent instruction counts.
        if (r == 0) CALLGRIND_TOGGLE_COLLECT;
        f[on] = std::min(f[on], BestOf(1, [&] {
                           b->attention_forward(on ? pr : p, fa, ws.get(), cfg);
                         }));
        if (r == 0) {
          CALLGRIND_TOGGLE_COLLECT;
          const std::string label =
              std::string("fwd ") + (on ? "on " : "off ") + preset;
          CALLGRIND_DUMP_STATS_AT(label.c_str());
        }
      }
    for (int r = 0; r < reps; ++r)
      for (int on = 0; on < 2; ++on) {
        // The backward reads the o and lse of its own problem.
        b->attention_forward(on ? pr : p, fa, ws.get(), cfg);
        g[on] =
            std::min(g[on], BestOf(1, [&] {
                       b->attention_backward(on ? pr : p, ba, ws.get(), cfg);
                     }));
      }
    std::printf("%-8s %9.3f %9.3f %8.3f %9.3f %9.3f %8.3f\n", preset.c_str(),
                f[0] * 1e3, f[1] * 1e3, f[1] / f[0], g[0] * 1e3, g[1] * 1e3,
                g[1] / g[0]);
  }
  return 0;
}
