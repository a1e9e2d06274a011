// A test decorator of a registered entry: it forwards the four calls of the
// Backend interface to the wrapped entry, so that a test's mutant or faulty
// entry overrides only the call it breaks. Shared by tests/tester_test.cc,
// property_tests/sampled_agreement_test.cc and cli/tests/cli_report_test.cc.
//
// Only the four pure calls are forwarded: available(), supports(),
// make_workspace(), block_sizes() and the probabilities hook keep Backend's
// defaults unless the subclass forwards them, so a decorator declares each
// optional hook it takes from the wrapped entry.
#ifndef QKNORM_TESTS_FORWARDING_BACKEND_H_
#define QKNORM_TESTS_FORWARDING_BACKEND_H_

#include <string>
#include <utility>

#include "qknorm/backend.h"

namespace qknorm::test_support {

class ForwardingBackend : public Backend {
 public:
  // The decorator's name is "mutant:target:precision" (family "mutant"),
  // at the wrapped entry's precision.
  ForwardingBackend(const Backend& inner, std::string target)
      : Backend("mutant", std::move(target), inner.precision()),
        inner_(inner) {}

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    inner_.attention_forward(p, a, ws, cfg);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    inner_.attention_backward(p, a, ws, cfg);
  }
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace* ws,
                         const ExecConfig& cfg) const override {
    inner_.scalenorm_forward(p, a, ws, cfg);
  }
  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace* ws,
                          const ExecConfig& cfg) const override {
    inner_.scalenorm_backward(p, a, ws, cfg);
  }

 protected:
  const Backend& inner() const { return inner_; }

 private:
  const Backend& inner_;
};

}  // namespace qknorm::test_support

#endif  // QKNORM_TESTS_FORWARDING_BACKEND_H_
