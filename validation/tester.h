// Fluent testers in XNNPACK's shape: one object describes a case, owns the
// entry's buffers (validation/buffers.h: NaN poison outside every input
// view, guard regions around every output view), runs the entry through the
// checked_* front doors and judges it with the rule (oracle_attention +
// judge_attention, as check_attention does):
//
//   const auto r = AttentionTester().batch(2).heads(8).kv_heads(2)
//                      .q_len(72).kv_len(72).head_dim(64).causal()
//                      .formulation("qwen3").dist(Distribution::kGaussian)
//                      .seed(42).row_pad(3).Test(entry);
//   EXPECT_TRUE(r.ok()) << r.message();
//
// Contract of Test(entry):
// - The case is make_attention_case(problem, dist, seed, range) (range: the
//   entry's precision unless range() is set), or the one given by
//   use_case(), with the tester's row_pad; its inputs are rounded to the
//   entry's storage (round_inputs), as every entry of that precision and the
//   oracle see them.
// - Forward, then (unless forward_only()) backward fed the entry's own o and
//   lse (the oracle's where the entry's are no valid backward input: a NaN
//   or inf in O; validation/run.h, BackwardInput), each through
//   checked_attention_*; after each call every buffer's guards are checked. A
//   written guard fails the test and stops it (the outputs are not judged: an
//   entry that writes out of bounds is wrong whatever it computed).
// - The decoded outputs are judged against the oracle by judge_attention
//   (with_naive(): the naive baseline is run and judged too, for its margin;
//   never for the entry's verdict).
// - qknorm::Error (invalid input, an unsupported formulation) propagates.
// message() names the entry, the case (describe(): shape, formulation,
// seed), and for each failure the tensor, the index, the expected and
// actual values and the bound (or the guard pattern and the bits found).
#ifndef QKNORM_VALIDATION_TESTER_H_
#define QKNORM_VALIDATION_TESTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/backend.h"
#include "validation/buffers.h"
#include "validation/check.h"

namespace qknorm::validation {

// "entry E on <case>: wrote outside its views during <call>:" and one
// line per written guard.
std::string guard_message(const std::string& entry, const std::string& desc,
                          const std::string& call,
                          const std::vector<GuardViolation>& guards);

// What Test() / Run() found. ok() iff no guard was written and (when judged)
// the verdict passes.
template <class Case, class Result>
struct TestReport {
  std::string entry;
  Case test_case;  // rounded to the entry's storage
  Result result;   // decoded outputs (attention forward only: o, lse)
  // The first written guard of each tensor, and the call after which it was
  // found ("forward" / "backward").
  std::vector<GuardViolation> guards;
  std::string guard_call;
  bool judged = false;      // false for Run() and after a guard violation
  AgreementReport verdict;  // meaningful when judged

  bool ok() const { return guards.empty() && (!judged || verdict.pass); }
  // "" when ok(); otherwise the guard violations or failure_message().
  std::string message() const {
    if (!guards.empty())
      return guard_message(entry, test_case.describe(), guard_call, guards);
    return judged ? verdict.failure_message() : "";
  }
};
using AttentionTestReport = TestReport<AttentionCase, AttentionResult>;
using ScaleNormTestReport = TestReport<ScaleNormCase, ScaleNormResult>;

// The setters both testers share (Tester: the derived class, returned for
// chaining; Problem, Case: the problem and case it runs).
template <typename Tester, typename Problem, typename Case>
class TesterBase {
 public:
  Tester& dist(Distribution d) {
    dist_ = d;
    return self();
  }
  Tester& seed(uint64_t s) {
    seed_ = s;
    return self();
  }
  // Test this case instead of drawing one (row_pad(), if set, overrides
  // the case's).
  Tester& use_case(const Case& c) {
    case_ = c;
    return self();
  }
  Tester& config(const ExecConfig& cfg) {
    cfg_ = cfg;
    return self();
  }
  // Also run and judge the naive baseline (see the contract above).
  Tester& with_naive(bool on = true) {
    with_naive_ = on;
    return self();
  }

 protected:
  // One field of the problem.
  template <typename T>
  Tester& set(T Problem::*field, T value) {
    problem_.*field = std::move(value);
    return self();
  }

  Problem problem_;
  Distribution dist_ = Distribution::kGaussian;
  uint64_t seed_ = 1;
  std::optional<Case> case_;
  ExecConfig cfg_;
  bool with_naive_ = false;

 private:
  Tester& self() { return static_cast<Tester&>(*this); }
};

class AttentionTester
    : public TesterBase<AttentionTester, AttentionProblem, AttentionCase> {
 public:
  AttentionTester& batch(int64_t n) { return set(&AttentionProblem::batch, n); }
  AttentionTester& heads(int64_t n) { return set(&AttentionProblem::heads, n); }
  // 0 (the default) means heads.
  AttentionTester& kv_heads(int64_t n) {
    return set(&AttentionProblem::kv_heads, n);
  }
  AttentionTester& q_len(int64_t n) { return set(&AttentionProblem::q_len, n); }
  AttentionTester& kv_len(int64_t n) {
    return set(&AttentionProblem::kv_len, n);
  }
  AttentionTester& head_dim(int64_t n) {
    return set(&AttentionProblem::head_dim, n);
  }
  AttentionTester& variant(Variant v) {
    return set(&AttentionProblem::variant, v);
  }
  AttentionTester& g(double x) { return set(&AttentionProblem::g, x); }
  AttentionTester& eps(double x) { return set(&AttentionProblem::eps, x); }
  AttentionTester& causal(bool on = true) {
    problem_.mask.causal = on;
    return *this;
  }
  AttentionTester& key_lengths(std::vector<int64_t> lens) {
    problem_.mask.key_lengths = std::move(lens);
    return *this;
  }
  // A preset of qknorm/formulation.h, applied when the case is made (its
  // scale depends on head_dim); "paper" is the default formulation.
  AttentionTester& formulation(std::string preset) {
    preset_ = std::move(preset);
    return *this;
  }
  // The whole problem at once (the setters above then edit it).
  AttentionTester& problem(const AttentionProblem& p) {
    problem_ = p;
    return *this;
  }
  // The storage format kWideMagnitude's row scales stay within (default:
  // the entry's precision).
  AttentionTester& range(Precision p) {
    range_ = p;
    return *this;
  }
  // Extra elements after each row of q, k, v, dO and the outputs.
  AttentionTester& row_pad(int64_t n) {
    row_pad_ = n;
    return *this;
  }
  AttentionTester& threads(int n) {
    cfg_.threads = n;
    return *this;
  }
  AttentionTester& forward_only(bool on = true) {
    forward_only_ = on;
    return *this;
  }
  // Test() also copies the oracle it judged by into *out (when it judged),
  // so that a caller with more checks on the same case (the blas tests' f64
  // a-priori bound) does not evaluate the O(n^2 D) oracle a second time.
  AttentionTester& keep_oracle(OracleAttention* out) {
    oracle_out_ = out;
    return *this;
  }

  // The case Test() runs on, before rounding to `storage`.
  AttentionCase make_case(Precision storage) const;
  // Runs and judges (see the contract above). ws: the entry's workspace to
  // use (may be null: a fresh one).
  AttentionTestReport Test(const Backend& entry, Workspace* ws = nullptr) const;
  // Runs and checks the guards without judging (bitwise comparisons of two
  // runs, the allocation tests).
  AttentionTestReport Run(const Backend& entry, Workspace* ws = nullptr) const;

 private:
  std::string preset_;
  std::optional<Precision> range_;
  std::optional<int64_t> row_pad_;
  bool forward_only_ = false;
  OracleAttention* oracle_out_ = nullptr;
};

// Runs `entry` on the (already rounded) case in fresh guarded buffers:
// forward, then backward unless forward_only, checking the guards after each
// call. The AttentionTester's engine, for callers that hold a case.
// Where the entry's forward output is no valid backward input, the
// backward reads `oracle`'s O and lse (or does not run without one:
// BackwardInput, validation/run.h).
AttentionTestReport run_guarded(const Backend& entry, const AttentionCase& c,
                                bool forward_only, const ExecConfig& cfg = {},
                                Workspace* ws = nullptr,
                                const OracleSource& oracle = nullptr);

// The same for ScaleNorm (forward then backward, judged by
// judge_scalenorm against oracle_scalenorm).
class ScaleNormTester
    : public TesterBase<ScaleNormTester, ScaleNormProblem, ScaleNormCase> {
 public:
  ScaleNormTester& rows(int64_t n) { return set(&ScaleNormProblem::rows, n); }
  ScaleNormTester& dim(int64_t n) { return set(&ScaleNormProblem::dim, n); }
  ScaleNormTester& g(double x) { return set(&ScaleNormProblem::g, x); }
  ScaleNormTester& eps(double x) { return set(&ScaleNormProblem::eps, x); }
  ScaleNormTester& row_pad(int64_t n) {
    row_pad_ = n;
    return *this;
  }
  ScaleNormTestReport Test(const Backend& entry, Workspace* ws = nullptr) const;

 private:
  int64_t row_pad_ = 0;
};

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_TESTER_H_
