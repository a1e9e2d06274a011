#include "validation/determinism.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "validation/judge.h"
#include "validation/rule.h"
#include "validation/run.h"

namespace qknorm::validation {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, 8) == 0; }

std::string threads_text(int t) {
  return std::to_string(t) + (t == 1 ? " thread" : " threads");
}

// One run against the first: the differing elements of each field, the
// first of them, and the spread (|x - x_first| / bound_e, inf where either
// is not finite or the bound is 0).
struct Comparison {
  int64_t differing = 0;
  std::string first;  // "dk 37 of 4608 elements differ ...; first dk[...]"
  std::vector<std::string> fields;  // those that differ: "dk", "dv"
  double spread = 0;
  std::string spread_where;
};

Comparison compare_runs(const std::vector<ToleranceTable>& tables,
                        const AttentionResult& first,
                        const AttentionResult& run) {
  Comparison c;
  for (const ToleranceTable& t : tables) {
    const std::span<const double> a = field_values(first, t.field),
                                  b = field_values(run, t.field);
    int64_t n = 0, first_i = -1;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (same_bits(a[i], b[i])) continue;
      if (n++ == 0) first_i = static_cast<int64_t>(i);
      const double bound = element_bound(t, i);
      const double d = std::fabs(b[i] - a[i]);
      const double s = std::isfinite(d) && bound > 0
                           ? d / bound
                           : std::numeric_limits<double>::infinity();
      if (s > c.spread || c.spread_where.empty()) {
        c.spread = std::max(c.spread, s);
        c.spread_where =
            std::string(name(t.field)) + t.index_text(static_cast<int64_t>(i));
      }
    }
    if (n == 0) continue;
    c.differing += n;
    c.fields.push_back(name(t.field));
    if (c.first.empty()) {
      char buf[320];
      const size_t i = static_cast<size_t>(first_i);
      std::snprintf(buf, sizeof buf,
                    "%s %lld of %zu elements differ; first %s%s: %.17g vs "
                    "%.17g",
                    name(t.field), (long long)n, a.size(), name(t.field),
                    t.index_text(first_i).c_str(), a[i], b[i]);
      c.first = buf;
    }
  }
  return c;
}

}  // namespace

DeterminismReport check_determinism(const Backend& entry,
                                    const AttentionCase& c,
                                    const OracleAttention& oracle,
                                    const DeterminismPlan& plan) {
  DeterminismReport rep;
  rep.entry = entry.name();
  rep.case_desc = c.describe();
  rep.declared_deterministic = entry.deterministic();
  const Precision s = entry.precision();
  const bool forward_only = !entry.has_attention_backward();
  const std::vector<ToleranceTable> tables =
      attention_tolerances(c, s, oracle, forward_only, entry.contract());
  const OracleSource source = [&oracle] {
    return ExactForward{oracle.o, oracle.lse};
  };
  // One workspace for every run, as a caller keeps one: state it carries
  // from call to call shows as runs at one thread count that differ.
  std::unique_ptr<Workspace> ws = entry.make_workspace();
  AttentionResult first;
  std::string first_label;
  std::vector<std::string> fields;  // that differ in some run
  // Per thread count, that count's first run (within-count comparisons).
  for (size_t k = 0; k < plan.thread_counts.size(); ++k) {
    const int threads = plan.thread_counts[k];
    const ExecConfig cfg{threads};
    AttentionResult count_first;
    for (int r = 1; r <= plan.runs; ++r) {
      AttentionResult res = run_attention_fed(entry, c, source, cfg, ws.get());
      ++rep.runs_done;
      const std::string label =
          "run " + std::to_string(r) + " at " + threads_text(threads);
      const AgreementReport v =
          judge_attention(c, s, oracle, res, nullptr, forward_only,
                          entry.name(), "", nullptr, entry.contract());
      if (!v.pass && rep.runs_failed++ == 0)
        rep.run_failure = label + ": " + v.failure_message();
      if (k == 0 && r == 1) {
        first = res;
        first_label = label;
        count_first = std::move(res);
        continue;
      }
      const Comparison vs_first = compare_runs(tables, first, res);
      if (vs_first.differing > 0) {
        if (rep.identical)
          rep.first_difference = label + ": " + vs_first.first + " (" +
                                 first_label + " vs this run)";
        rep.identical = false;
        for (const std::string& f : vs_first.fields)
          if (std::find(fields.begin(), fields.end(), f) == fields.end())
            fields.push_back(f);
        if (vs_first.spread > rep.spread || rep.spread_where.empty()) {
          rep.spread = std::max(rep.spread, vs_first.spread);
          rep.spread_where = vs_first.spread_where + " (" + label + ")";
        }
      }
      if (r == 1) {
        count_first = std::move(res);
        if (vs_first.differing > 0) rep.differs_across_counts = true;
        continue;
      }
      if (compare_runs(tables, count_first, res).differing > 0) {
        if (threads == 1)
          rep.differs_within_one_thread = true;
        else
          rep.differs_within_threads = true;
      }
    }
  }
  for (const std::string& f : fields)
    rep.differing_fields += (rep.differing_fields.empty() ? "" : ", ") + f;
  if (!rep.identical) {
    if (rep.differs_within_one_thread)
      rep.cause =
          "state carried between calls (a stale workspace or uninitialized "
          "memory): runs at 1 thread differ from each other in " +
          rep.differing_fields;
    else if (rep.differs_within_threads)
      rep.cause =
          "a data race between the entry's threads: runs at one thread "
          "count differ from each other in " +
          rep.differing_fields + "; runs at 1 thread agree";
    else
      rep.cause =
          "the reduction order follows the thread count: each thread count "
          "repeats itself, two counts differ in " +
          rep.differing_fields;
  }
  rep.pass =
      rep.runs_failed == 0 && (rep.identical || !rep.declared_deterministic);
  return rep;
}

}  // namespace qknorm::validation
