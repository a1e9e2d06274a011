// A user's own kernel, as qknorm's conformance suite sees it: a Backend
// subclass (qknorm/backend.h). This one is the plainest correct f64
// implementation of the paper's QKNorm attention (and the sdpa baseline it
// must also accept: Backend::supports' default), forward and backward, and
// of ScaleNorm, written from the math in qknorm/attention.h and
// qknorm/scalenorm.h. Replace its loops by your kernel's calls.
#ifndef NAIVE_BACKEND_H_
#define NAIVE_BACKEND_H_

#include "qknorm/backend.h"

namespace naive {

// Entry "naive:f64": every tensor holds doubles.
class NaiveF64 final : public qknorm::Backend {
 public:
  NaiveF64() : Backend("naive", "-", qknorm::Precision::kF64) {}

  void attention_forward(const qknorm::AttentionProblem& p,
                         const qknorm::ForwardArgs& a, qknorm::Workspace* ws,
                         const qknorm::ExecConfig& cfg) const override;
  void attention_backward(const qknorm::AttentionProblem& p,
                          const qknorm::BackwardArgs& a, qknorm::Workspace* ws,
                          const qknorm::ExecConfig& cfg) const override;
  void scalenorm_forward(const qknorm::ScaleNormProblem& p,
                         const qknorm::ScaleNormForwardArgs& a,
                         qknorm::Workspace* ws,
                         const qknorm::ExecConfig& cfg) const override;
  void scalenorm_backward(const qknorm::ScaleNormProblem& p,
                          const qknorm::ScaleNormBackwardArgs& a,
                          qknorm::Workspace* ws,
                          const qknorm::ExecConfig& cfg) const override;
  // The softmax probabilities the forward multiplies V by (the suite's
  // non-saturation property inspects them).
  bool attention_probabilities(const qknorm::AttentionProblem& p,
                               const qknorm::ForwardArgs& a, double* probs,
                               qknorm::Workspace* ws) const override;
};

}  // namespace naive

#endif  // NAIVE_BACKEND_H_
