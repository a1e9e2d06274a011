#include "cli/coverage.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <ostream>
#include <set>
#include <thread>

#include "cli/app.h"
#include "qknorm/error.h"
#include "qknorm/plugin_loader.h"

namespace qknorm::cli {
namespace cov = validation::coverage;

int coverage_threads(int threads) {
  const int t = threads > 0
                    ? threads
                    : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(t, 2);
}

cov::Model union_model(const std::vector<const Backend*>& entries,
                       int threads) {
  cov::ModelOptions o;
  o.threads = coverage_threads(threads);
  std::set<int64_t> blocks;
  for (const Backend* b : entries)
    if (b->available())
      for (int64_t k : cov::declared_blocks(*b)) blocks.insert(k);
  o.block_sizes.assign(blocks.begin(), blocks.end());
  return cov::Model(o);
}

double covering_g() { return g_init(72); }

int append_covering(Suite* s, const std::vector<const Backend*>& entries,
                    int threads, uint64_t seed) {
  const Suite d = default_suite(seed);
  uint64_t next = seed + d.attention.size() + d.scalenorm.size();
  const std::vector<AttentionProblem> rows =
      cov::covering_array(union_model(entries, threads), covering_g());
  for (const AttentionProblem& p : rows)
    s->attention.push_back(
        {p, validation::Distribution::kGaussian, next++,
         cov::judged_sampled(p) ? cov::kSampleRows : int64_t{0}});
  return static_cast<int>(rows.size());
}

Suite default_run_suite(const SuiteOptions& o,
                        const std::vector<const Backend*>& entries, int threads,
                        int* covering) {
  *covering = 0;
  if (custom_suite(o) || !o.covering) return build_suite(o);
  SuiteOptions all = o;
  all.classes.clear();
  Suite s = build_suite(all);
  const size_t before = s.attention.size();
  append_covering(&s, entries, threads, o.seed);
  const std::vector<validation::InputClass> classes = parse_classes(o.classes);
  if (!classes.empty()) {
    // Count what --classes keeps of the covering cases.
    Suite tail;
    tail.attention.assign(s.attention.begin() + static_cast<long>(before),
                          s.attention.end());
    *covering =
        static_cast<int>(select_classes(tail, classes).attention.size());
    return select_classes(s, classes);
  }
  *covering = static_cast<int>(s.attention.size() - before);
  return s;
}

std::vector<EntryCoverage> suite_coverage(
    const std::vector<const Backend*>& entries, const Suite& s, int threads) {
  std::vector<EntryCoverage> out;
  const int t = coverage_threads(threads);
  for (const Backend* b : entries) {
    if (!b->available()) continue;
    EntryCoverage e;
    e.entry = b->name();
    e.model = std::make_shared<cov::Model>(cov::model_for(*b, t));
    e.tally = std::make_shared<cov::Tally>(*e.model, cov::supported_needs(*b));
    for (const AttentionSpec& a : s.attention)
      if (b->supports(a.problem)) {
        e.tally->add(a.problem);
        ++e.cases;
      }
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

nlohmann::json needs_json(unsigned n) {
  nlohmann::json j = nlohmann::json::array();
  if (n & cov::kNeedGqa) j.push_back("gqa");
  if (n & cov::kNeedMask) j.push_back("mask");
  return j;
}

}  // namespace

nlohmann::json coverage_json(const cov::Model& model,
                             const std::vector<EntryCoverage>& entries,
                             int covering_cases) {
  nlohmann::json cells = nlohmann::json::array();
  for (const cov::Cell& c : model.cells())
    cells.push_back({{"dim", cov::name(c.dim)},
                     {"label", c.label},
                     {"needs", needs_json(c.needs)}});
  nlohmann::json na = nlohmann::json::array();
  for (const auto& [a, b] : model.infeasible_pairs())
    na.push_back(cov::pair_name(model, a, b));
  nlohmann::json je = nlohmann::json::array();
  for (const EntryCoverage& e : entries) {
    const cov::Tally& t = *e.tally;
    nlohmann::json us = nlohmann::json::array(), up = nlohmann::json::array();
    for (int c : t.unreached_singles())
      us.push_back(cov::full_name(e.model->cells()[c]));
    for (const auto& [a, b] : t.unreached_pairs())
      up.push_back(cov::pair_name(*e.model, a, b));
    je.push_back(
        {{"entry", e.entry},
         {"needs", needs_json(t.supported_needs())},
         {"blocks", e.model->blocks()},
         {"cases", e.cases},
         {"singles",
          {{"reached", t.singles_reached()},
           {"feasible", t.singles_feasible()}}},
         {"pairs",
          {{"reached", t.pairs_reached()}, {"feasible", t.pairs_feasible()}}},
         {"complete", t.complete()},
         {"unreached_singles", us},
         {"unreached_pairs", up}});
  }
  return {{"covering_cases", covering_cases},
          {"model",
           {{"blocks", model.blocks()},
            {"threads", model.options().threads},
            {"cells", cells},
            {"feasible_pairs", model.feasible_pairs().size()},
            {"infeasible_pairs", na}}},
          {"entries", je}};
}

void add_coverage_options(CLI::App& app, CoverageOptions& o) {
  app.add_flag("--pairs", o.pairs,
               "List every unreached pair (default: the first 10 per entry)");
  app.add_option("--json", o.json,
                 "Also write the coverage section as JSON to FILE ('-': "
                 "stdout, replacing the text)")
      ->type_name("FILE");
}

int run_coverage(const CoverageOptions& opt, const SuiteOptions& so,
                 int threads, std::ostream& out, std::ostream& err) {
  Suite suite;
  std::vector<const Backend*> entries;
  int covering = 0;
  try {
    entries = select_entries(all_backends(), so);
    suite = default_run_suite(so, entries, threads, &covering);
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  const cov::Model model = union_model(entries, threads);
  const std::vector<EntryCoverage> cover =
      suite_coverage(entries, suite, threads);
  bool complete = true;
  for (const EntryCoverage& e : cover) complete &= e.tally->complete();
  if (!opt.json.empty()) {
    const std::string text =
        coverage_json(model, cover, covering).dump(2) + "\n";
    if (opt.json == "-") {
      out << text;
      return complete ? kExitPass : kExitFail;
    }
    std::ofstream f(opt.json, std::ios::binary);
    if (!(f << text)) {
      err << "qknorm-check: " << opt.json << ": cannot write\n";
      return kExitInput;
    }
  }
  // The model: each dimension's cells (needs in brackets), the n/a pairs.
  std::string blocks;
  for (int64_t b : model.blocks()) blocks += " " + std::to_string(b);
  out << fmt::format(
      "coverage model (validation/coverage.h): {} cells, {} feasible pairs, "
      "{} n/a; blocks{}; threads {}\n",
      model.cells().size(), model.feasible_pairs().size(),
      model.infeasible_pairs().size(), blocks, model.options().threads);
  for (int d = 0; d < cov::kDims; ++d) {
    std::string line;
    for (const cov::Cell& c : model.cells())
      if (static_cast<int>(c.dim) == d)
        line += fmt::format("{}{}{}", line.empty() ? "" : " | ", c.label,
                            c.needs == cov::kNeedNothing ? ""
                            : c.needs == cov::kNeedGqa   ? " [gqa]"
                                                         : " [mask]");
    out << fmt::format("  {:<8} {}\n", cov::name(static_cast<cov::Dim>(d)),
                       line);
  }
  for (const auto& [a, b] : model.infeasible_pairs())
    out << "  n/a: " << cov::pair_name(model, a, b) << "\n";
  out << fmt::format(
      "suite: {} attention cases ({} covering); per entry, its own model "
      "(its blocks) within the needs it supports:\n",
      suite.attention.size(), covering);
  out << fmt::format("{:<22} | {:<9} | {:>5} | {:>9} | {:>11} | {}\n", "entry",
                     "needs", "cases", "singles", "pairs", "verdict");
  for (const EntryCoverage& e : cover) {
    const cov::Tally& t = *e.tally;
    std::string needs;
    for (const auto& n : needs_json(t.supported_needs()))
      needs += (needs.empty() ? "" : "+") + n.get<std::string>();
    out << fmt::format(
        "{:<22} | {:<9} | {:>5} | {:>9} | {:>11} | {}\n", e.entry,
        needs.empty() ? "-" : needs, e.cases,
        fmt::format("{}/{}", t.singles_reached(), t.singles_feasible()),
        fmt::format("{}/{}", t.pairs_reached(), t.pairs_feasible()),
        t.complete() ? "100%" : "INCOMPLETE");
  }
  for (const EntryCoverage& e : cover) {
    const cov::Tally& t = *e.tally;
    if (t.complete()) continue;
    out << e.entry << " does not reach:\n";
    for (int c : t.unreached_singles())
      out << "  " << cov::full_name(e.model->cells()[c]) << "\n";
    const auto pairs = t.unreached_pairs();
    const size_t shown =
        opt.pairs ? pairs.size() : std::min<size_t>(10, pairs.size());
    for (size_t i = 0; i < shown; ++i)
      out << "  " << cov::pair_name(*e.model, pairs[i].first, pairs[i].second)
          << "\n";
    if (shown < pairs.size())
      out << fmt::format("  ... {} more pairs (--pairs lists them)\n",
                         pairs.size() - shown);
  }
  return complete ? kExitPass : kExitFail;
}

}  // namespace qknorm::cli
