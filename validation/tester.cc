#include "validation/tester.h"

#include <memory>

#include "qknorm/formulation.h"

namespace qknorm::validation {

std::string guard_message(const std::string& entry, const std::string& desc,
                          const std::string& call,
                          const std::vector<GuardViolation>& guards) {
  std::string m = "entry " + entry + " on " + desc +
                  ": wrote outside its views during " + call + "\n";
  for (const GuardViolation& g : guards) m += "  " + g.message() + "\n";
  return m;
}

namespace {

template <class Report, class Case>
Report new_report(const Backend& entry, const Case& c) {
  Report r;
  r.entry = entry.name();
  r.test_case = c;
  return r;
}

// ws, or a fresh workspace of the entry held by `own`.
Workspace* workspace(const Backend& entry, Workspace* ws,
                     std::unique_ptr<Workspace>* own) {
  if (ws != nullptr) return ws;
  *own = entry.make_workspace();
  return own->get();
}

// Sets the report's guards (and the call) when any was written.
template <class Report, class Buffers>
bool guards_hold(const Buffers& bufs, const char* call, Report* r) {
  r->guards = bufs.guard_violations();
  if (r->guards.empty()) return true;
  r->guard_call = call;
  return false;
}

}  // namespace

AttentionTestReport run_guarded(const Backend& entry, const AttentionCase& c,
                                bool forward_only, const ExecConfig& cfg,
                                Workspace* ws, const OracleSource& oracle) {
  // run_attention checks the guards after each call (validation/run.h
  // MemoryEvidence); the report carries what it found.
  auto r = new_report<AttentionTestReport>(entry, c);
  r.result = forward_only ? run_attention_forward(entry, c, cfg, ws)
                          : run_attention_fed(entry, c, oracle, cfg, ws);
  r.guards = r.result.memory.writes;
  r.guard_call = r.result.memory.write_call;
  return r;
}

AttentionCase AttentionTester::make_case(Precision storage) const {
  AttentionCase c;
  if (case_) {
    c = *case_;
  } else {
    AttentionProblem p = problem_;
    if (!preset_.empty()) apply_preset(preset_, &p);
    c = make_attention_case(p, dist_, seed_, range_.value_or(storage));
  }
  if (row_pad_) c.row_pad = *row_pad_;
  return c;
}

AttentionTestReport AttentionTester::Run(const Backend& entry,
                                         Workspace* ws) const {
  const AttentionCase c =
      round_inputs(make_case(entry.precision()), entry.precision());
  return run_guarded(entry, c, forward_only_, cfg_, ws);
}

AttentionTestReport AttentionTester::Test(const Backend& entry,
                                          Workspace* ws) const {
  const Precision s = entry.precision();
  const AttentionCase c = round_inputs(make_case(s), s);
  LazyOracle oracle(c);
  AttentionTestReport r =
      run_guarded(entry, c, forward_only_, cfg_, ws, oracle.source());
  if (!r.guards.empty()) return r;
  const Backend& nb = naive_for(s);
  AttentionTestReport naive;
  if (with_naive_) {
    naive = run_guarded(nb, c, forward_only_, {}, nullptr, oracle.source());
    if (!naive.guards.empty()) return naive;  // the baseline itself is wrong
  }
  r.verdict = judge_attention(
      c, s, oracle.get(), r.result, with_naive_ ? &naive.result : nullptr,
      forward_only_, entry.name(), nb.name(), nullptr, entry.contract());
  r.judged = true;
  if (oracle_out_) *oracle_out_ = oracle.get();
  return r;
}

namespace {

ScaleNormTestReport run_scalenorm_guarded(const Backend& entry,
                                          const ScaleNormCase& c,
                                          int64_t row_pad,
                                          const ExecConfig& cfg,
                                          Workspace* ws) {
  auto r = new_report<ScaleNormTestReport>(entry, c);
  std::unique_ptr<Workspace> own;
  ws = workspace(entry, ws, &own);
  ScaleNormBuffers bufs(c, entry.precision(), row_pad);
  checked_scalenorm_forward(entry, c.problem, bufs.forward_args(), ws, cfg);
  if (!guards_hold(bufs, "forward", &r)) return r;
  checked_scalenorm_backward(entry, c.problem, bufs.backward_args(), ws, cfg);
  if (!guards_hold(bufs, "backward", &r)) return r;
  r.result = bufs.result(true);
  return r;
}

}  // namespace

ScaleNormTestReport ScaleNormTester::Test(const Backend& entry,
                                          Workspace* ws) const {
  const Precision s = entry.precision();
  const ScaleNormCase c = round_inputs(
      case_ ? *case_ : make_scalenorm_case(problem_, dist_, seed_, s), s);
  ScaleNormTestReport r = run_scalenorm_guarded(entry, c, row_pad_, cfg_, ws);
  if (!r.guards.empty()) return r;
  const Backend& nb = naive_for(s);
  ScaleNormTestReport naive;
  if (with_naive_) {
    naive = run_scalenorm_guarded(nb, c, row_pad_, {}, nullptr);
    if (!naive.guards.empty()) return naive;
  }
  r.verdict = judge_scalenorm(c, s, oracle_scalenorm(c), r.result,
                              with_naive_ ? &naive.result : nullptr,
                              entry.name(), nb.name());
  r.judged = true;
  return r;
}

}  // namespace qknorm::validation
