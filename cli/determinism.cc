#include "cli/determinism.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/app.h"
#include "cli/suite.h"
#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "validation/case.h"
#include "validation/determinism.h"
#include "validation/oracle.h"

namespace qknorm::cli {

void add_determinism_options(CLI::App& app, DeterminismOptions& o) {
  app.add_option("--runs", o.runs, "Runs of each entry per thread count")
      ->capture_default_str()
      ->check(CLI::Range(2, 100));
  app.add_option("--thread-counts", o.thread_counts,
                 "ExecConfig::threads of the runs, in order (the first "
                 "count's first run is the one the others are compared with)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
}

namespace {

struct Row {
  std::string entry;
  bool declared = true;
  int cases = 0, runs = 0, failed = 0;
  double spread = 0;
  std::string spread_where, cause;
  bool cause_is_race = false;
  std::string skipped;  // cases the entry does not implement: "c6, c7"
  bool identical = true, pass = true, error = false;
  std::vector<std::string> failures;  // one block per failing case
};

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

}  // namespace

int run_determinism(const DeterminismOptions& o, const SuiteOptions& so,
                    const std::string& json, std::ostream& out,
                    std::ostream& err) {
  std::vector<const Backend*> entries;
  Suite suite;
  try {
    entries = select_entries(all_backends(), so);
    suite = build_suite(so);
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  validation::DeterminismPlan plan;
  plan.runs = o.runs;
  plan.thread_counts = o.thread_counts;
  std::string counts;
  for (int t : plan.thread_counts)
    counts += (counts.empty() ? "" : ", ") + std::to_string(t);
  out << fmt::format(
      "qknorm-check determinism: {} runs at each of {} threads per (entry, "
      "case), {} attention cases (seed {}); every run judged by the verdict, "
      "the runs compared bitwise (validation/determinism.h)\n",
      plan.runs, counts, suite.attention.size(), so.seed);
  // The rounded case and its oracle, per (case, storage precision), made
  // when an entry of that precision first needs them.
  std::map<std::pair<size_t, Precision>,
           std::pair<validation::AttentionCase, validation::OracleAttention>>
      shared;
  std::vector<Row> rows;
  nlohmann::json jrows = nlohmann::json::array();
  for (const Backend* e : entries) {
    Row row;
    row.entry = e->name();
    row.declared = e->deterministic();
    for (size_t ci = 0; ci < suite.attention.size(); ++ci) {
      const AttentionSpec& spec = suite.attention[ci];
      if (spec.sample_rows > 0 || !e->supports(spec.problem)) {
        row.skipped += (row.skipped.empty() ? "c" : ", c") + std::to_string(ci);
        continue;
      }
      const Precision p = e->precision();
      try {
        auto it = shared.find({ci, p});
        if (it == shared.end()) {
          validation::AttentionCase rc = validation::round_inputs(
              validation::make_attention_case(spec.problem, spec.dist,
                                              spec.seed, p),
              p);
          validation::OracleAttention orc = validation::oracle_attention(rc);
          it = shared
                   .emplace(std::pair{ci, p},
                            std::pair{std::move(rc), std::move(orc)})
                   .first;
        }
        const validation::DeterminismReport r = validation::check_determinism(
            *e, it->second.first, it->second.second, plan);
        ++row.cases;
        row.runs += r.runs_done;
        row.failed += r.runs_failed;
        if (r.spread > row.spread ||
            (!r.identical && row.spread_where.empty())) {
          row.spread = std::max(row.spread, r.spread);
          row.spread_where = fmt::format("c{} {}", ci, r.spread_where);
        }
        row.identical = row.identical && r.identical;
        // The row names the first case's cause, a data race before any
        // other (the most specific: a small case may give the racing
        // threads too little work to collide differently twice).
        if (!r.cause.empty() &&
            (row.cause.empty() ||
             (r.differs_within_threads && !row.cause_is_race))) {
          row.cause = r.cause;
          row.cause_is_race =
              r.differs_within_threads && !r.differs_within_one_thread;
        }
        if (!r.pass) {
          row.pass = false;
          std::string f =
              fmt::format("entry {} on c{} {}:\n", e->name(), ci, r.case_desc);
          if (!r.identical)
            f += "  " + r.first_difference + "\n  likely cause: " + r.cause +
                 "\n";
          if (r.runs_failed > 0)
            f += fmt::format("  {} of {} runs FAIL the verdict; {}\n",
                             r.runs_failed, r.runs_done, r.run_failure);
          row.failures.push_back(std::move(f));
        }
        jrows.push_back({{"entry", e->name()},
                         {"case", ci},
                         {"case_desc", r.case_desc},
                         {"declared_deterministic", r.declared_deterministic},
                         {"runs", r.runs_done},
                         {"identical", r.identical},
                         {"differing_fields", r.differing_fields},
                         {"first_difference", r.first_difference},
                         {"spread", r.spread},
                         {"spread_where", r.spread_where},
                         {"cause", r.cause},
                         {"runs_failed", r.runs_failed},
                         {"pass", r.pass}});
      } catch (const std::exception& ex) {
        row.pass = false;
        row.error = true;
        row.failures.push_back(fmt::format("entry {} on c{}: {}\n", e->name(),
                                           ci, first_line(ex.what())));
      }
    }
    rows.push_back(std::move(row));
  }
  size_t w = 5;
  for (const Row& r : rows) w = std::max(w, r.entry.size());
  std::string text = fmt::format(
      "\n{:<{}} | declared          | cases | runs | "
      "runs compared      | spread / bound | verdict\n",
      "entry", w);
  text += std::string(w, '-') +
          "-+-------------------+-------+------+--------------------+---------"
          "-------+--------\n";
  bool all = true;
  for (const Row& r : rows) {
    all = all && r.pass;
    std::string verdict = r.pass ? "PASS" : "FAIL";
    if (!r.pass && !r.cause.empty())
      verdict += " (likely: " + r.cause.substr(0, r.cause.find(':')) + ")";
    else if (r.failed > 0)
      verdict += fmt::format(" ({} runs FAIL the verdict)", r.failed);
    text += fmt::format(
        "{:<{}} | {:<17} | {:>5} | {:>4} | {:<18} | {:>14} | {}\n", r.entry, w,
        r.declared ? "deterministic" : "nondeterministic", r.cases, r.runs,
        r.identical ? "bitwise identical" : "differ",
        r.identical ? std::string("0") : fmt::format("{:.3g}", r.spread),
        verdict);
  }
  for (const Row& r : rows)
    if (!r.skipped.empty())
      text +=
          fmt::format("{}: not implemented, not run: {}\n", r.entry, r.skipped);
  bool header = false;
  for (const Row& r : rows)
    for (const std::string& f : r.failures) {
      if (!header) text += "\nfailures:\n";
      header = true;
      text += f;
    }
  for (const Row& r : rows)
    if (!r.identical && r.pass)
      text += fmt::format(
          "\n{} (declared nondeterministic): runs differ, largest spread "
          "{:.3g} of the bound at {}; every run passes the verdict\n",
          r.entry, r.spread, r.spread_where);
  text += fmt::format("\ndeterminism: {}\n", all ? "PASS" : "FAIL");
  try {
    if (json == "-") {
      out << nlohmann::json{{"determinism", jrows}}.dump(2) << "\n";
    } else {
      out << text;
      if (!json.empty()) {
        std::ofstream f(json);
        f << nlohmann::json{{"determinism", jrows}}.dump(2) << "\n";
        if (!f) throw Error(json, {}, "write failed");
      }
    }
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitInput;
  }
  return all ? kExitPass : kExitFail;
}

}  // namespace qknorm::cli
