#include "cli/mutants.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cli/app.h"
#include "cli/coverage.h"
#include "mutants/mutants.h"
#include "qknorm/error.h"
#include "validation/judge.h"

namespace qknorm::cli {
namespace {

using property::MutantKind;

// What the suite said about one mutant or control (both its attention and
// its ScaleNorm rows).
struct Outcome {
  const Backend* entry = nullptr;
  std::string kind;  // "formula", "precision", "determinism", "control"
  bool pass = true;  // every case of every row passed
  std::vector<std::string> failing_fields;
  int cases = 0, failing_cases = 0;
  // The element of largest margin err / bound over every field and case.
  double margin = 0;
  std::string worst;  // "dq[1,7,10,57] margin 10.6 (case 0: ...)"
  // A passing mutant whose outputs equal the unmutated copy's, bit for bit,
  // on every case: the suite's inputs never trigger its bug.
  bool untriggered = false;
  // property::MutantInfo::correct_when: a passing mutant in that regime is
  // right to pass.
  std::string correct_when;
  // property::MutantInfo::region: a shape mutant (issue 33), which the
  // default run's covering array must catch.
  bool shape = false;
  // The most confident diagnosis of each failing case (validation/
  // diagnose.h), once each, with the number of cases it leads.
  std::vector<std::pair<std::string, int>> causes;
};

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (!(a[i] == b[i]) || std::signbit(a[i]) != std::signbit(b[i]))
      return false;
  }
  return true;
}

bool same_bits(const validation::AttentionResult& a,
               const validation::AttentionResult& b) {
  return same_bits(a.o, b.o) && same_bits(a.lse, b.lse) &&
         same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dv, b.dv) && same_bits({a.dg}, {b.dg});
}

bool same_bits(const validation::ScaleNormResult& a,
               const validation::ScaleNormResult& b) {
  return same_bits(a.y, b.y) && same_bits(a.dx, b.dx) &&
         same_bits({a.dg}, {b.dg});
}

// True if `m` and `u` give the same outputs, bit for bit, on every spec, the
// case drawn as judge_attention / judge_scalenorm draw it (`make`), on one
// thread (`run`).
template <class Spec, class Make, class Run>
bool same_on(const Backend& m, const Backend& u, const std::vector<Spec>& specs,
             const Make& make, const Run& run) {
  const Precision s = m.precision();
  for (const Spec& spec : specs) {
    // A case whose formulation the copy does not implement triggers nothing
    // (run_suite reports it as not implemented).
    if constexpr (std::is_same_v<Spec, AttentionSpec>)
      if (!m.supports(spec.problem)) continue;
    const auto c = validation::round_inputs(
        make(spec.problem, spec.dist, spec.seed, s), s);
    if (!same_bits(run(m, c, ExecConfig{1}, nullptr),
                   run(u, c, ExecConfig{1}, nullptr)))
      return false;
  }
  return true;
}

// True if `m` and the unmutated copy of its precision give the same outputs
// on every case of `suite`. A formulation mutant's unmutated copy is the
// formulation control (the same wrapper with no bug), the others' the plain
// copy of the paper-formulation loops.
bool same_as_unmutated(const Backend& m, const Suite& suite) {
  const Backend* control = nullptr;
  for (const property::MutantInfo& i : property::mutant_list())
    if (m.target() == i.name && i.formulation != nullptr)
      control = property::control_registry().find(
          "control:formulation:" + std::string(name(m.precision())));
  const Backend& u =
      control != nullptr ? *control : property::unmutated(m.precision());
  try {
    return same_on(m, u, suite.attention, validation::make_attention_case,
                   validation::run_attention) &&
           same_on(m, u, suite.scalenorm, validation::make_scalenorm_case,
                   validation::run_scalenorm);
  } catch (const std::exception&) {
    return false;  // one of them threw: not the same
  }
}

// The first line of a message, at most `max_len` characters.
std::string first_line(const std::string& msg, size_t max_len = 110) {
  std::string line = msg.substr(0, msg.find('\n'));
  if (line.size() > max_len) line = line.substr(0, max_len - 3) + "...";
  return line;
}

// What the rows of entry b (its attention and ScaleNorm rows among `rows`)
// say about it.
Outcome outcome_of(const Backend& b, const std::vector<EntryRow>& rows,
                   const Suite& suite) {
  Outcome r;
  r.entry = &b;
  int case_base = 0;
  for (const EntryRow& row : rows) {
    if (row.name != b.name()) continue;
    const std::string prefix = row.kind == "scalenorm" ? "scalenorm." : "";
    r.pass = r.pass && row.pass;
    for (const FieldSummary& f : row.fields)
      if (!f.pass) r.failing_fields.push_back(prefix + f.key);
    for (const CaseResult& c : row.cases) {
      ++r.cases;
      r.failing_cases += c.pass ? 0 : 1;
      if (c.pass) continue;
      const std::string cause = c.diagnoses.empty()
                                    ? std::string("none")
                                    : c.diagnoses.front().phrase;
      auto it = std::find_if(r.causes.begin(), r.causes.end(),
                             [&](const auto& x) { return x.first == cause; });
      if (it == r.causes.end())
        r.causes.emplace_back(cause, 1);
      else
        ++it->second;
    }
    const WorstElement& w = row.worst;
    if (w.case_index >= 0 && (r.worst.empty() || !(w.margin <= r.margin))) {
      r.margin = w.margin;
      const int ci = case_base + w.case_index;
      const CaseResult& c = row.cases[static_cast<size_t>(w.case_index)];
      r.worst = !c.error.empty()
                    ? fmt::format("case {}: {}", ci, first_line(c.error))
                    : fmt::format(
                          "{}{}{} margin {:.3g} (case {}: expected {:.9g}, "
                          "actual {:.9g}, bound {:.3g})",
                          prefix, w.field_name(), w.where, w.margin, ci,
                          w.expected, w.actual, w.bound);
    }
    case_base += static_cast<int>(row.cases.size());
  }
  if (r.pass && b.family() == "mutant")
    r.untriggered = same_as_unmutated(b, suite);
  return r;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "-" : s;
}

}  // namespace

int run_mutants(const MutantsOptions& o, const SuiteOptions& so,
                std::ostream& out, std::ostream& err, bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Suite suite;
  std::vector<const Backend*> mutants, controls;
  int covering = 0;
  try {
    // The default run's suite: on the default options, its covering cases
    // (cli/coverage.h) of the registry's model, at the default run's thread
    // count (every core).
    suite = default_run_suite(so, all_backends().entries(), 0, &covering);
    // A filter may select only mutants or only controls; not nothing.
    Registry none;
    auto pick = [&](const Registry& r) {
      try {
        return select_entries(r, so);
      } catch (const Error&) {
        return std::vector<const Backend*>{};
      }
    };
    mutants = pick(property::mutant_registry());
    controls = pick(property::control_registry());
    if (mutants.empty() && controls.empty())
      select_entries(none, so);  // throws the usual "selects nothing"
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  std::vector<const Backend*> all = mutants;
  all.insert(all.end(), controls.begin(), controls.end());

  std::vector<Outcome> outcomes(all.size());
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t jobs = std::min<size_t>(
      all.size(), o.jobs > 0 ? static_cast<size_t>(o.jobs) : cores);
  // One run_suite call judges every mutant and control, case-major: each
  // (case, precision)'s oracle is computed once and dropped after its last
  // entry, so at most `jobs` cases' oracles are alive. (Keeping every
  // oracle of the default run's 566 cases for per-entry calls, as
  // SharedOracles does, took 23 GB.)
  RunOptions opt;
  opt.exec.threads = 1;
  opt.jobs = static_cast<int>(jobs);
  opt.time_forward = false;
  std::mutex progress_mu;
  if (progress)
    opt.progress = [&](const Progress& p) {
      std::lock_guard<std::mutex> lock(progress_mu);
      std::cerr << fmt::format("\r[{:>6}/{}] {:<44}", p.done, p.total,
                               p.what.substr(0, 44))
                << std::flush;
    };
  const std::vector<EntryRow> rows = run_suite(all, suite, opt);
  if (progress) std::cerr << "\r" << std::string(60, ' ') << "\r" << std::flush;
  for (size_t i = 0; i < all.size(); ++i)
    outcomes[i] = outcome_of(*all[i], rows, suite);

  for (size_t i = 0; i < mutants.size(); ++i) {
    for (const property::MutantInfo& m : property::mutant_list())
      if (all[i]->target() == m.name) {
        outcomes[i].kind = name(m.kind);
        if (m.correct_when != nullptr)
          outcomes[i].correct_when = m.correct_when;
        outcomes[i].shape = m.region != nullptr;
      }
  }
  for (size_t i = mutants.size(); i < all.size(); ++i)
    outcomes[i].kind = "control";

  const int n_cases =
      static_cast<int>(suite.attention.size() + suite.scalenorm.size());
  out << fmt::format(
      "qknorm-check mutants: {} mutants and {} controls (mutants/mutants.h) "
      "on the {} suite: {} cases ({} covering){}, seed {}; {} jobs\n",
      mutants.size(), controls.size(), custom_suite(so) ? "given" : "default",
      n_cases, covering,
      [&] {
        std::string k;
        for (validation::InputClass c : parse_classes(so.classes))
          k += (k.empty() ? " of the input classes " : ", ") +
               std::string(validation::name(c));
        return k.empty() ? k : k + " only (--classes)";
      }(),
      so.seed, jobs);
  out << "A mutant must FAIL (CAUGHT) and a control PASS. A passing mutant "
         "whose outputs equal the unmutated copy's bit for bit on every\n"
         "case is UNTRIGGERED (these cases never exercise its bug; the "
         "property suite does); one that is correct in the regime of these\n"
         "cases (mutants.h: correct_when) is CORRECT-HERE; any other passing "
         "mutant SURVIVED. Every precision mutant must be CAUGHT, and on the "
         "default suite every shape mutant (mutants.h: region).\n\n";
  out << fmt::format("{:<12} {:<39} {:<11} {:<6} {:<22} {}\n", "verdict",
                     "entry", "kind", "fail", "failing fields",
                     "worst element (largest err / bound)");
  out << std::string(120, '-') << "\n";
  int caught = 0, survived = 0, untriggered = 0, correct = 0,
      precision_caught = 0, precision_total = 0, controls_pass = 0,
      shape_caught = 0, shape_total = 0;
  for (const Outcome& r : outcomes) {
    std::string verdict;
    if (r.kind == "control") {
      verdict = r.pass ? "PASS" : "FAIL";
      controls_pass += r.pass ? 1 : 0;
    } else {
      const bool correct_here = !r.untriggered && !r.correct_when.empty();
      verdict = !r.pass         ? "CAUGHT"
                : r.untriggered ? "UNTRIGGERED"
                : correct_here  ? "CORRECT-HERE"
                                : "SURVIVED";
      caught += r.pass ? 0 : 1;
      untriggered += r.pass && r.untriggered ? 1 : 0;
      correct += r.pass && correct_here ? 1 : 0;
      survived += r.pass && !r.untriggered && !correct_here ? 1 : 0;
      if (r.kind == name(MutantKind::kPrecision)) {
        ++precision_total;
        precision_caught += r.pass ? 0 : 1;
      }
      if (r.shape) {
        ++shape_total;
        shape_caught += r.pass ? 0 : 1;
      }
    }
    std::string note = r.worst;
    if (verdict == "CORRECT-HERE") note += "; correct when " + r.correct_when;
    out << fmt::format("{:<12} {:<39} {:<11} {:<6} {:<22} {}\n", verdict,
                       r.entry->name(), r.kind,
                       fmt::format("{}/{}", r.failing_cases, r.cases),
                       join(r.failing_fields), note);
    if (!r.causes.empty()) {
      std::string causes;
      for (const auto& [cause, n] : r.causes)
        causes += fmt::format("{}{} ({} case{})", causes.empty() ? "" : "; ",
                              cause, n, n == 1 ? "" : "s");
      out << fmt::format("{:<12} likely cause: {}\n", "", causes);
    }
  }
  // The default suite's covering array reaches every shape mutant's region
  // (issue 33); a suite of the options' need not.
  const bool shapes_ok = covering == 0 || shape_caught == shape_total;
  const bool ok = survived == 0 && precision_caught == precision_total &&
                  shapes_ok &&
                  controls_pass == static_cast<int>(controls.size());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  out << fmt::format(
      "\nmutants: {} caught, {} survived, {} untriggered, {} correct here, "
      "of {} ({}/{} precision mutants, {}/{} shape mutants caught); "
      "controls: {}/{} pass\n",
      caught, survived, untriggered, correct, mutants.size(), precision_caught,
      precision_total, shape_caught, shape_total, controls_pass,
      controls.size());
  out << fmt::format("qknorm-check mutants: {} in {:.1f} s\n",
                     ok ? "PASS" : "FAIL", secs);
  return ok ? kExitPass : kExitFail;
}

}  // namespace qknorm::cli
