// The registry entries of the SIMD path: one SimdBackend per compiled Highway
// target and storage precision. Each entry holds its target's kernel table
// (kernels.h) and calls it directly: the single dispatch point.
#include "qknorm/backend.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "hwy/targets.h"
#include "simd/kernels.h"
#include "simd/register.h"
#include "simd/workspace.h"

namespace qknorm::simd {
namespace {

int ResolveThreads(const ExecConfig& cfg) {
  if (cfg.threads > 0) return cfg.threads;
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// The Highway targets this CPU runs. Highway 1.0.3's hwy::SupportedTargets()
// runs cpuid on every call, and cpuid traps to the hypervisor in a VM: asked
// per available() call (every entry of every fuzz execution), it was 8.7% of
// the attention fuzzer's replay (perf, issue 32). The CPU does not change
// while the process runs, so it is asked once.
//
// QKNORM_DISABLE_TARGETS (comma-separated Highway target names, e.g.
// "AVX3_ZEN4,AVX3_DL,AVX3") makes those entries unavailable: it replays
// what a machine without them runs. The CI's fixed-seed fuzz runs explore
// differently on each CPU (coverage feedback follows the targets), and a
// finding on another machine's CPU is reproduced here this way.
int64_t SupportedTargetsOnce() {
  static const int64_t bits = [] {
    int64_t b = hwy::SupportedTargets();
    const char* off = std::getenv("QKNORM_DISABLE_TARGETS");
    if (off == nullptr) return b;
    const std::string list = std::string(",") + off + ",";
    for (int64_t t = b; t != 0; t &= t - 1) {
      const int64_t bit = t & -t;
      if (list.find(std::string(",") + hwy::TargetName(bit) + ",") !=
          std::string::npos)
        b &= ~bit;
    }
    return b;
  }();
  return bits;
}

class SimdBackend final : public Backend {
 public:
  SimdBackend(const CompiledTarget& t, Precision p)
      : Backend("simd", t.name, p), target_(t) {}

  // Every formulation of attention.h (issue 16), forward and backward:
  // the paper's and sdpa as before, the others through formulation-inl.h,
  // the logit softcap (attention-inl.h, Logits), the sliding window and
  // RoPE (issue 34; rope-inl.h, fused into the normalization pass) and
  // attention sinks (attention-inl.h, "Sinks": forward, backward with
  // BackwardArgs::d_sinks, the probabilities hook).
  bool supports(const AttentionProblem&) const override { return true; }
  // attention-inl.h: kQueryBlock = kKeyBlock = 64 rows, micro-GEMM panels of
  // kGemmRows = 6 rows; formulation-inl.h: kRowBlock = 64.
  std::vector<int64_t> block_sizes(const AttentionProblem&) const override {
    return {64, 6};
  }

  bool available() const override {
    return (SupportedTargetsOnce() & target_.bit) != 0;
  }

  std::unique_ptr<Workspace> make_workspace() const override {
    return std::make_unique<SimdWorkspace>();
  }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    WithWorkspace(ws, [&](SimdWorkspace& w) {
      w.online_softmax = cfg.online_softmax;
      target_.kernels.attention_forward(p, a, precision(), w,
                                        ResolveThreads(cfg), nullptr);
    });
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    Call(target_.kernels.attention_backward, p, a, ws, cfg);
  }
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace* ws,
                         const ExecConfig& cfg) const override {
    Call(target_.kernels.scalenorm_forward, p, a, ws, cfg);
  }
  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace* ws,
                          const ExecConfig& cfg) const override {
    Call(target_.kernels.scalenorm_backward, p, a, ws, cfg);
  }
  // Runs the forward (o and lse are written too) and reports the final
  // probabilities exp(S - m) / l the forward's online softmax ends with.
  // Threads: the interface has no ExecConfig, so as with online_softmax the
  // workspace decides: the thread count of its pool if an earlier call made
  // one (a caller that ran the entry on one thread, as the fuzzer does, gets
  // one thread here too, not a new pool), else one per core. Results are
  // bitwise the same for every thread count.
  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace* ws) const override {
    WithWorkspace(ws, [&](SimdWorkspace& w) {
      const int held = w.pool_threads();
      target_.kernels.attention_forward(
          p, a, precision(), w, held > 0 ? held : ResolveThreads({}), probs);
    });
    return true;
  }

 private:
  // A caller without a (SIMD) workspace gets a temporary one: correct, but
  // it allocates on every call.
  template <class F>
  static void WithWorkspace(Workspace* ws, const F& f) {
    if (auto* w = dynamic_cast<SimdWorkspace*>(ws)) return f(*w);
    SimdWorkspace tmp;
    f(tmp);
  }

  // A kernel of the table taking (problem, args, precision, workspace,
  // threads): every call but the forward, which also has a softmax mode and
  // the probabilities hook.
  template <class Kernel, class Problem, class Args>
  void Call(Kernel kernel, const Problem& p, const Args& a, Workspace* ws,
            const ExecConfig& cfg) const {
    WithWorkspace(ws, [&](SimdWorkspace& w) {
      kernel(p, a, precision(), w, ResolveThreads(cfg));
    });
  }

  const CompiledTarget& target_;
};

}  // namespace

void register_backends(Registry& r) {
  for (const CompiledTarget& t : compiled_targets())
    for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kF16})
      r.add(std::make_unique<SimdBackend>(t, p));
}

}  // namespace qknorm::simd
