// A Backend that runs another one: the base of the deliberately wrong
// entries the tests build around a correct one (a corrupted output, a write
// past a view, a mutant of the tail rows). A subclass overrides only the
// call it corrupts, calls the inner entry's through ForwardingBackend, and
// inherits the rest. Only the four computations and what the inner entry
// implements (has_attention_backward, has_scalenorm) are forwarded:
// available(), supports(), make_workspace(), block_sizes() and the
// probabilities hook keep Backend's defaults unless the subclass forwards them.
#ifndef QKNORM_VALIDATION_FORWARDING_BACKEND_H_
#define QKNORM_VALIDATION_FORWARDING_BACKEND_H_

#include <string>
#include <utility>

#include "qknorm/backend.h"

namespace qknorm::validation {

class ForwardingBackend : public Backend {
 public:
  ForwardingBackend(std::string family, std::string target, Precision precision,
                    const Backend& inner)
      : Backend(std::move(family), std::move(target), precision),
        inner_(inner) {}
  // "mutant:<target>:<inner's precision>".
  ForwardingBackend(const Backend& inner, std::string target)
      : ForwardingBackend("mutant", std::move(target), inner.precision(),
                          inner) {}

  // What the inner entry implements (a forward-only plug-in stays forward
  // only when wrapped).
  bool has_attention_backward() const override {
    return inner_.has_attention_backward();
  }
  bool has_scalenorm() const override { return inner_.has_scalenorm(); }
  std::string built_for() const override { return inner_.built_for(); }
  bool deterministic() const override { return inner_.deterministic(); }
  bool backward_recomputes() const override {
    return inner_.backward_recomputes();
  }

  // The four computations go to the inner entry; availability, support and
  // workspaces keep Backend's defaults (none of the inner entries the tests
  // wrap has a workspace).
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    inner_.attention_forward(p, a, ws, c);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    inner_.attention_backward(p, a, ws, c);
  }
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace* ws,
                         const ExecConfig& c) const override {
    inner_.scalenorm_forward(p, a, ws, c);
  }
  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace* ws,
                          const ExecConfig& c) const override {
    inner_.scalenorm_backward(p, a, ws, c);
  }

 protected:
  const Backend& inner() const { return inner_; }

 private:
  const Backend& inner_;
};

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_FORWARDING_BACKEND_H_
