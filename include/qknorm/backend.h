// One implementation entry (backend x precision x Highway target) and the
// registry that tests, the CLI, fuzzers and benchmarks iterate.
//
// Contract of every Backend method: inputs have been validated (see
// validate.h; the checked_* wrappers below do it), buffers are sized and
// strided as the views say, outputs do not alias inputs. Methods are const and
// thread-compatible: concurrent calls need distinct Workspaces.
#ifndef QKNORM_BACKEND_H_
#define QKNORM_BACKEND_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/contract.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"

namespace qknorm {

struct ExecConfig {
  // Worker threads; 0 means the number of cores. Results must be bitwise
  // identical for every value.
  int threads = 0;
  // Forward softmax: an entry may use a fixed shift where every logit is
  // bounded (QKNorm: |S| <= |g|; simd, issue 18); true forces the online
  // running-max softmax everywhere (benchmarks compare the two paths).
  bool online_softmax = false;
};

// Scratch a backend keeps between calls so that no call allocates after
// warm-up. Each backend derives its own; callers only hold it.
class Workspace {
 public:
  virtual ~Workspace() = default;
};

class Backend {
 public:
  // family: "reference", "simd", "blas" (tests add "mutant"); target: the
  // Highway target name for simd entries, "-" otherwise. The name is
  // "family:target:precision" for simd and "family:precision" otherwise.
  Backend(std::string family, std::string target, Precision precision);
  virtual ~Backend() = default;

  const std::string& name() const { return name_; }
  const std::string& family() const { return family_; }
  const std::string& target() const { return target_; }
  Precision precision() const { return precision_; }

  // False if the entry cannot run on this CPU (e.g. AVX2 entry on SSE4 host).
  virtual bool available() const { return true; }
  // The formulations (attention.h, issue 16) this entry implements; the
  // checked_* front doors refuse the others with an Error naming the entry.
  // Default: the paper's formulation and sdpa, without GQA.
  virtual bool supports(const AttentionProblem& p) const {
    return is_paper_formulation(p);
  }

  // What the entry implements besides the attention forward (issue 35: most
  // kernels people ship are inference only, and many implement attention
  // without ScaleNorm). An entry without the attention backward is "forward
  // only": the suite judges its O and lse and the forward properties, and
  // its gradient fields are "not judged: forward only"; one without
  // ScaleNorm has no ScaleNorm rows. The checked_* front doors refuse a
  // call of what the entry does not implement (Error naming the entry).
  // Every production entry implements all three.
  virtual bool has_attention_backward() const { return true; }
  virtual bool has_scalenorm() const { return true; }
  // The CPU features the entry's code was compiled for, as its author names
  // them (a plug-in's `built_for`); "" where not said. Reports print it.
  virtual std::string built_for() const { return {}; }
  // Whether the entry's results are bitwise identical from run to run and
  // for every ExecConfig::threads, as ExecConfig asks (default: true, which
  // every production entry keeps). `qknorm-check determinism` holds a
  // deterministic entry to that across N runs at 1 and 2 threads; for one
  // that declares otherwise (atomics in a reduction: a plug-in's
  // QKNORM_FLAG_NONDETERMINISTIC) it reports the run-to-run spread beside
  // the bound, and every run must still pass the verdict.
  virtual bool deterministic() const { return true; }
  // Whether the entry's attention backward recomputes O and lse from q, k
  // and v instead of reading the ones it is given (default: false, it may
  // read them). The suite checks the declaration: such an entry's backward
  // is given o = 0 and lse = 0 (valid input, wrong values), so a backward
  // that reads them after all FAILs its gradients; and it runs even where
  // the entry's own forward output is no valid backward input
  // (validation/run.h, BackwardInput::kRecomputes).
  virtual bool backward_recomputes() const { return false; }

  // The compute contract the entry declares (qknorm/contract.h, issue 31):
  // the formats its attention rounds its intermediates to, which the
  // verdict's bounds are derived for. Default: f32-accumulate (every
  // intermediate in the compute format), which every production entry keeps.
  virtual ComputeContract contract() const { return {}; }

  virtual std::unique_ptr<Workspace> make_workspace() const { return nullptr; }

  // The row and column blocks (tiles) the entry cuts problem p into, for
  // the sampled verdict's tile-boundary rows and the tile sweep
  // (validation/sampled.h, issue 19). Default: none declared.
  virtual std::vector<int64_t> block_sizes(const AttentionProblem&) const {
    return {};
  }

  virtual void attention_forward(const AttentionProblem& p,
                                 const ForwardArgs& a, Workspace* ws,
                                 const ExecConfig& cfg) const = 0;
  virtual void attention_backward(const AttentionProblem& p,
                                  const BackwardArgs& a, Workspace* ws,
                                  const ExecConfig& cfg) const = 0;
  virtual void scalenorm_forward(const ScaleNormProblem& p,
                                 const ScaleNormForwardArgs& a, Workspace* ws,
                                 const ExecConfig& cfg) const = 0;
  virtual void scalenorm_backward(const ScaleNormProblem& p,
                                  const ScaleNormBackwardArgs& a, Workspace* ws,
                                  const ExecConfig& cfg) const = 0;

  // Inspection hook for the softmax non-saturation property: writes the
  // probabilities this entry's forward computes, dense [B, H, q_len, kv_len]
  // doubles, 0 for masked keys (and for fully masked rows), as the kernel
  // holds them before they multiply V (in the kernel's compute precision,
  // exactly converted to double). Returns false if the entry has no hook.
  virtual bool attention_probabilities(const AttentionProblem& p,
                                       const ForwardArgs& a, double* probs,
                                       Workspace* ws) const {
    (void)p, (void)a, (void)probs, (void)ws;
    return false;
  }

 private:
  std::string family_, target_, name_;
  Precision precision_;
};

// Validating front doors: validate (throwing qknorm::Error) then call.
void checked_attention_forward(const Backend& b, const AttentionProblem& p,
                               const ForwardArgs& a, Workspace* ws,
                               const ExecConfig& cfg = {});
void checked_attention_backward(const Backend& b, const AttentionProblem& p,
                                const BackwardArgs& a, Workspace* ws,
                                const ExecConfig& cfg = {});
void checked_scalenorm_forward(const Backend& b, const ScaleNormProblem& p,
                               const ScaleNormForwardArgs& a, Workspace* ws,
                               const ExecConfig& cfg = {});
void checked_scalenorm_backward(const Backend& b, const ScaleNormProblem& p,
                                const ScaleNormBackwardArgs& a, Workspace* ws,
                                const ExecConfig& cfg = {});

class Registry {
 public:
  void add(std::unique_ptr<Backend> b);  // throws Error on a duplicate name
  // An entry the registry does not own, for one that must be the same object
  // in every registry and outside them (reference::naive_backend, the naive
  // baseline): it must outlive the registry. Throws Error on a duplicate.
  void add_unowned(const Backend& b);
  const std::vector<const Backend*>& entries() const { return view_; }
  const Backend* find(std::string_view name) const;  // nullptr if absent
  // Entries whose name matches a shell glob ('*', '?'), in registry order.
  std::vector<const Backend*> match(std::string_view glob) const;

 private:
  std::vector<std::unique_ptr<Backend>> owned_;
  std::vector<const Backend*> view_;
};

// Shell-style glob match ('*' any run, '?' one char).
bool glob_match(std::string_view glob, std::string_view s);

// Every production entry of this build (reference at every precision, then
// simd and blas entries when built). Built once, on first call. Defined in
// registry/ (library qknorm::all), not in core/: core/ knows no implementation.
const Registry& all_backends();

}  // namespace qknorm

#endif  // QKNORM_BACKEND_H_
