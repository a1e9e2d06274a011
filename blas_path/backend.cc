// Registry entries of the BLAS path. Each call runs ExecConfig::threads
// (0 = number of cores) (batch, head) items in parallel on the workspace's
// pool with OpenBLAS single-threaded (pool.h says why), on the caller's
// BlasWorkspace<T>. A null or foreign Workspace gets a temporary
// one (which allocates: callers that care keep make_workspace()'s result).
#include <cblas.h>

#include <memory>

#include "blas_path/attention.h"
#include "blas_path/register.h"

namespace qknorm::blas {
namespace {

template <class T>
class BlasBackend final : public Backend {
 public:
  explicit BlasBackend(Precision p) : Backend("blas", "-", p) {}

  // Every formulation (issue 16: normalization kind and axis, weights,
  // biases, fixed or learned scale), GQA, the logit softcap, the sliding
  // window, RoPE (issue 34; computed in double, neither angle_f32 nor
  // cos_sin_storage claimed) and attention sinks (issue 34; formed in T,
  // dsinks in BackwardArgs::d_sinks), forward and backward.
  bool supports(const AttentionProblem&) const override { return true; }
  // Query blocks of query_block() rows; rows padded to multiples of 16;
  // under a causal mask or a window, staircase (band) tiles of
  // kCausalTileRows rows in each block (attention.h, Masks).
  std::vector<int64_t> block_sizes(const AttentionProblem& p) const override {
    if (p.mask.causal || has_window(p.mask))
      return {query_block(p.kv_len, sizeof(T)), kCausalTileRows, 16};
    return {query_block(p.kv_len, sizeof(T)), 16};
  }

  std::unique_ptr<Workspace> make_workspace() const override {
    return std::make_unique<BlasWorkspace<T>>();
  }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    WsRef w(ws);
    blas::attention_forward<T>(p, a, *w, cfg);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    WsRef w(ws);
    blas::attention_backward<T>(p, a, *w, cfg);
  }
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace*,
                         const ExecConfig&) const override {
    blas::scalenorm_forward<T>(p, a);
  }
  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace* ws,
                          const ExecConfig&) const override {
    WsRef w(ws);
    blas::scalenorm_backward<T>(p, a, *w);
  }
  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace* ws) const override {
    WsRef w(ws);
    blas::attention_probabilities<T>(p, a, probs, *w);
    return true;
  }

 private:
  // The caller's workspace if it is ours, else a temporary.
  class WsRef {
   public:
    explicit WsRef(Workspace* ws) : ws_(dynamic_cast<BlasWorkspace<T>*>(ws)) {
      if (!ws_) {
        own_ = std::make_unique<BlasWorkspace<T>>();
        ws_ = own_.get();
      }
    }
    BlasWorkspace<T>& operator*() const { return *ws_; }

   private:
    BlasWorkspace<T>* ws_;
    std::unique_ptr<BlasWorkspace<T>> own_;
  };
};

}  // namespace

void register_backends(Registry& r) {
  r.add(std::make_unique<BlasBackend<float>>(Precision::kF32));
  r.add(std::make_unique<BlasBackend<double>>(Precision::kF64));
}

const char* blas_corename() { return openblas_get_corename(); }
int blas_num_threads() { return openblas_get_num_threads(); }

}  // namespace qknorm::blas
