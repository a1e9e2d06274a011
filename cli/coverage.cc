#include "cli/coverage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
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

CoveringCases covering_cases(const std::vector<const Backend*>& entries,
                             int threads, Covering mode) {
  const cov::Model m = union_model(entries, threads);
  CoveringCases out;
  if (mode == Covering::kFull) {
    out.cases = cov::covering_array(m, covering_g());
    out.case_cap = std::numeric_limits<double>::infinity();
    out.cost = cov::total_cost(out.cases);
    return out;
  }
  cov::BudgetedArray a = cov::budgeted_covering_array(m, covering_g());
  out.case_cap = a.case_cap;
  if (mode == Covering::kBudget) {
    out.cases = std::move(a.cases);
    out.cost = a.cost;
  }
  return out;
}

void append_covering(Suite* s, const std::vector<AttentionProblem>& cases,
                     uint64_t seed) {
  // After the default suite's ScaleNorm seeds (its variant cases have a
  // block of their own, kVariantSeeds).
  const Suite d = default_suite(seed);
  uint64_t next = d.scalenorm.back().seed + 1;
  for (const AttentionProblem& p : cases)
    s->attention.push_back(
        {p, validation::Distribution::kGaussian, next++,
         cov::judged_sampled(p) ? cov::kSampleRows : int64_t{0}});
}

Suite default_run_suite(const SuiteOptions& o,
                        const std::vector<const Backend*>& entries, int threads,
                        int* covering, double* case_cap) {
  *covering = 0;
  const Covering mode = custom_suite(o) ? Covering::kNone : o.covering;
  // Building the array takes ~0.3 s: only when its cases or cap are used.
  CoveringCases cc;
  if (mode != Covering::kNone || case_cap != nullptr)
    cc = covering_cases(entries, threads, mode);
  if (case_cap != nullptr) *case_cap = cc.case_cap;
  if (mode == Covering::kNone) return build_suite(o);
  SuiteOptions all = o;
  all.classes.clear();
  Suite s = build_suite(all);
  const size_t before = s.attention.size();
  append_covering(&s, cc.cases, o.seed);
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
    const std::vector<const Backend*>& entries, const Suite& s, int threads,
    double case_cap) {
  std::vector<EntryCoverage> out;
  const int t = coverage_threads(threads);
  // Entries with the same blocks share a model and its pairs' costs.
  std::map<std::vector<int64_t>,
           std::pair<std::shared_ptr<const cov::Model>, std::vector<double>>>
      models;
  for (const Backend* b : entries) {
    if (!b->available()) continue;
    EntryCoverage e;
    e.entry = b->name();
    const std::vector<int64_t> blocks = cov::declared_blocks(*b);
    auto it = models.find(blocks);
    if (it == models.end()) {
      auto m = std::make_shared<cov::Model>(cov::model_for(*b, t));
      it = models.emplace(blocks, std::make_pair(m, cov::pair_costs(*m))).first;
    }
    e.model = it->second.first;
    e.tally = std::make_shared<cov::Tally>(*e.model, cov::supported_needs(*b));
    for (const AttentionSpec& a : s.attention)
      if (b->supports(a.problem)) {
        e.tally->add(a.problem);
        ++e.cases;
      }
    // The pairs' costs in the model's feasible_pairs() order.
    const std::vector<double>& costs = it->second.second;
    const auto& pairs = e.model->feasible_pairs();
    std::map<std::pair<int, int>, double> cost_of;
    for (size_t i = 0; i < pairs.size(); ++i) cost_of[pairs[i]] = costs[i];
    const unsigned needs = e.tally->supported_needs();
    auto in_budget = [&](const std::pair<int, int>& p, double c) {
      return cov::pair_in_budget(*e.model, p.first, p.second, c, case_cap);
    };
    for (size_t i = 0; i < pairs.size(); ++i)
      if ((e.model->needs(pairs[i].first, pairs[i].second) & ~needs) == 0 &&
          in_budget(pairs[i], costs[i]))
        ++e.in_budget;
    for (const auto& p : e.tally->unreached_pairs())
      (in_budget(p, cost_of[p]) ? e.missed : e.over_budget).push_back(p);
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

const char* covering_name(Covering mode) {
  return mode == Covering::kFull     ? "full"
         : mode == Covering::kBudget ? "budget"
                                     : "none";
}

nlohmann::json coverage_json(const cov::Model& model,
                             const std::vector<EntryCoverage>& entries,
                             int covering_cases, Covering mode,
                             double case_cap) {
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
    nlohmann::json us = nlohmann::json::array(), up = nlohmann::json::array(),
                   ob = nlohmann::json::array();
    for (int c : t.unreached_singles())
      us.push_back(cov::full_name(e.model->cells()[c]));
    for (const auto& [a, b] : e.missed)
      up.push_back(cov::pair_name(*e.model, a, b));
    for (const auto& [a, b] : e.over_budget)
      ob.push_back(cov::pair_name(*e.model, a, b));
    je.push_back({{"entry", e.entry},
                  {"needs", needs_json(t.supported_needs())},
                  {"blocks", e.model->blocks()},
                  {"cases", e.cases},
                  {"singles",
                   {{"reached", t.singles_reached()},
                    {"feasible", t.singles_feasible()}}},
                  {"pairs",
                   {{"reached", t.pairs_reached()},
                    {"feasible", t.pairs_feasible()},
                    {"in_budget", e.in_budget}}},
                  {"complete", e.complete()},
                  {"unreached_singles", us},
                  {"unreached_pairs", up},
                  {"over_budget_pairs", ob}});
  }
  // JSON has no infinity: the full array's cap is null.
  const nlohmann::json cap =
      std::isinf(case_cap) ? nlohmann::json(nullptr) : nlohmann::json(case_cap);
  return {{"covering_cases", covering_cases},
          {"budget",
           {{"covering", covering_name(mode)},
            {"budget", cov::kDefaultBudget},
            {"case_cap", cap}}},
          {"model",
           {{"blocks", model.blocks()},
            {"threads", model.options().threads},
            {"cells", cells},
            {"feasible_pairs", model.feasible_pairs().size()},
            {"infeasible_pairs", na}}},
          {"entries", je}};
}

int run_coverage(const CoverageOptions& opt, const SuiteOptions& so,
                 int threads, std::ostream& out, std::ostream& err) {
  Suite suite;
  std::vector<const Backend*> entries;
  int covering = 0;
  double case_cap = 0;
  const Covering mode = custom_suite(so) ? Covering::kNone : so.covering;
  try {
    entries = select_entries(all_backends(), so);
    suite = default_run_suite(so, entries, threads, &covering, &case_cap);
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  const cov::Model model = union_model(entries, threads);
  const std::vector<EntryCoverage> cover =
      suite_coverage(entries, suite, threads, case_cap);
  bool complete = true;
  for (const EntryCoverage& e : cover) complete &= e.complete();
  if (!opt.json.empty()) {
    const std::string text =
        coverage_json(model, cover, covering, mode, case_cap).dump(2) + "\n";
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
  // Appended piece by piece (so below): GCC 12's -O3 flagged `" " +
  // std::to_string(b)` here with a false -Wrestrict (GCC bug 105329).
  for (int64_t b : model.blocks()) {
    blocks += ' ';
    blocks += std::to_string(b);
  }
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
  // The covering cases are the suite's last.
  double covering_cost = 0;
  for (size_t i = suite.attention.size() - static_cast<size_t>(covering);
       i < suite.attention.size(); ++i)
    covering_cost += cov::cost(suite.attention[i].problem);
  out << fmt::format(
      "suite: {} attention cases ({} covering, {}); budget: the pairs whose "
      "cheapest case costs at most {} (validation::coverage::cost, one "
      "entry); per entry, its own model (its blocks) within the needs it "
      "supports:\n",
      suite.attention.size(), covering,
      mode == Covering::kFull ? "the full array, --covering"
      : mode == Covering::kBudget
          ? fmt::format("the budgeted array, cost {:.3g} "
                        "of budget {:.3g}",
                        covering_cost, cov::kDefaultBudget)
          : "none",
      std::isinf(case_cap) ? std::string("any (every pair)")
                           : fmt::format("{:.3g} s", case_cap));
  out << fmt::format("{:<22} | {:<9} | {:>5} | {:>9} | {:>11} | {:>11} | {}\n",
                     "entry", "needs", "cases", "singles", "pairs", "in budget",
                     "verdict");
  for (const EntryCoverage& e : cover) {
    const cov::Tally& t = *e.tally;
    std::string needs;
    for (const auto& n : needs_json(t.supported_needs())) {
      if (!needs.empty()) needs += '+';
      needs += n.get<std::string>();
    }
    out << fmt::format(
        "{:<22} | {:<9} | {:>5} | {:>9} | {:>11} | {:>11} | {}\n", e.entry,
        needs.empty() ? "-" : needs, e.cases,
        fmt::format("{}/{}", t.singles_reached(), t.singles_feasible()),
        fmt::format("{}/{}", t.pairs_reached(), t.pairs_feasible()),
        fmt::format("{}/{}", e.in_budget - static_cast<int>(e.missed.size()),
                    e.in_budget),
        !e.complete()  ? "INCOMPLETE"
        : t.complete() ? "100%"
                       : "100% in budget");
  }
  for (const EntryCoverage& e : cover) {
    const cov::Tally& t = *e.tally;
    if (t.complete()) continue;
    out << e.entry << " does not reach:\n";
    for (int c : t.unreached_singles())
      out << "  " << cov::full_name(e.model->cells()[c]) << "\n";
    auto list = [&](const std::vector<std::pair<int, int>>& pairs,
                    const char* why) {
      const size_t shown =
          opt.pairs ? pairs.size() : std::min<size_t>(10, pairs.size());
      for (size_t i = 0; i < shown; ++i)
        out << "  " << cov::pair_name(*e.model, pairs[i].first, pairs[i].second)
            << why << "\n";
      if (shown < pairs.size())
        out << fmt::format("  ... {} more pairs{} (--pairs lists them)\n",
                           pairs.size() - shown, why);
    };
    list(e.missed, "");
    if (!e.over_budget.empty())
      out << fmt::format(
          "  {} pairs over the default run's budget (their cheapest case "
          "costs more than the cap; qknorm-check --covering reaches them)"
          "{}\n",
          e.over_budget.size(), opt.pairs ? ":" : ", e.g.:");
    list(e.over_budget, " (over budget)");
  }
  return complete ? kExitPass : kExitFail;
}

}  // namespace qknorm::cli
