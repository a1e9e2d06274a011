#include "cli/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "validation/metrics.h"
#include "validation/rule_terms.h"

namespace qknorm::cli {
namespace {

const FieldSummary* find_field(const EntryRow& r, validation::Field f) {
  for (const FieldSummary& s : r.fields)
    if (s.field == f && s.key == validation::name(f)) return &s;
  return nullptr;
}

// "PASS (2 of 9 cases n/i)": cases whose formulation the entry does not
// implement are not judged and are named in the verdict.
std::string verdict(const EntryRow& r) {
  if (!r.available) return "n/a";
  std::string v = r.pass ? "PASS" : "FAIL";
  if (r.forward_only) v += " (forward only: o and lse judged)";
  if (r.unsupported > 0)
    v += fmt::format(" ({} of {} cases not implemented)", r.unsupported,
                     r.cases.size());
  if (r.contract != "f32-accumulate")  // the contract and its bound's cost
    v += r.looseness > 0
             ? fmt::format(" under {} (o's bound {:.3g}x f32-accumulate's)",
                           r.contract, r.looseness)
             : " under " + r.contract;
  // The likely causes (validation/diagnose.h): each case's most confident
  // one, once each.
  std::vector<std::string> causes;
  for (const CaseResult& c : r.cases)
    if (!c.pass && !c.diagnoses.empty() &&
        std::find(causes.begin(), causes.end(), c.diagnoses[0].phrase) ==
            causes.end())
      causes.push_back(c.diagnoses[0].phrase);
  for (size_t i = 0; i < causes.size(); ++i)
    v += (i == 0 ? " (likely: " : "; ") + causes[i] +
         (i + 1 == causes.size() ? ")" : "");
  return v;
}

std::string ratio_text(const EntryRow& r) {
  if (r.family == "reference") return "self";
  if (!r.has_naive) return "-";  // not run (sampled mode)
  if (!std::isfinite(r.ratio)) return "inf";
  // A naive baseline almost exact where the entry is not (an out-of-range
  // case judged against its clamp) gives ratios of 1e53: keep the column.
  if (r.ratio >= 1e4) return fmt::format("{:.3g}", r.ratio);
  return fmt::format("{:.2f}", r.ratio);
}

std::string margin_text(double m) {
  if (!std::isfinite(m)) return "inf";
  return fmt::format("{:.3f}", m);
}

// A class segment's margin: "0.28", "0.999", "5.5e7", "inf".
std::string class_margin(double m);

// "dQ c3[1,4,17,5] 0.1234 vs 0.1235 +- 2.1e-7": the worst element of a row.
std::string worst_text(const WorstElement& w) {
  if (w.case_index < 0) return "-";
  if (w.threw) return fmt::format("c{} threw", w.case_index);
  if (!w.wrote.empty())
    return fmt::format("c{} wrote outside: {}", w.case_index, w.wrote);
  return fmt::format("{} c{}{} exp {:.6g} got {:.6g} bound {}", w.field_name(),
                     w.case_index, w.where, w.expected, w.actual, sci(w.bound));
}

// "abs rel p50/p99/max"; scalar fields (dg) print one ULP figure.
std::string cell(const FieldSummary* f, bool scalar) {
  if (f == nullptr) return "-";
  const validation::ErrorStats& s = f->worst;
  if (s.nonfinite_mismatch) return "NONFINITE";
  if (scalar)
    return fmt::format("{} {} {}", sci(s.max_abs), sci(s.max_rel),
                       ulps(s.ulp_max));
  return fmt::format("{} {} {}/{}/{}", sci(s.max_abs), sci(s.max_rel),
                     ulps(s.ulp_p50), ulps(s.ulp_p99), ulps(s.ulp_max));
}

struct Column {
  std::string title;
  std::vector<std::string> cells;
  bool left = false;
};

void print_columns(std::ostream& out, const std::vector<Column>& cols) {
  std::vector<size_t> w;
  for (const Column& c : cols) {
    size_t m = c.title.size();
    for (const auto& s : c.cells) m = std::max(m, s.size());
    w.push_back(m);
  }
  auto line = [&](auto get) {
    std::string s;
    for (size_t i = 0; i < cols.size(); ++i) {
      const std::string t = get(i);
      s += i ? " | " : "";
      s += cols[i].left ? fmt::format("{:<{}}", t, w[i])
                        : fmt::format("{:>{}}", t, w[i]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out << s << "\n";
  };
  line([&](size_t i) { return cols[i].title; });
  std::string rule;
  for (size_t i = 0; i < cols.size(); ++i)
    rule += (i ? "-+-" : "") + std::string(w[i], '-');
  out << rule << "\n";
  for (size_t r = 0; r < cols.front().cells.size(); ++r)
    line([&](size_t i) { return cols[i].cells[r]; });
}

void print_kind(std::ostream& out, const Report& rep, const std::string& kind,
                const std::vector<validation::Field>& fields, bool gflops) {
  std::vector<const EntryRow*> rows;
  for (const EntryRow& r : rep.rows)
    if (r.kind == kind) rows.push_back(&r);
  if (rows.empty()) return;
  std::vector<Column> cols;
  Column name{"entry", {}, true};
  for (const EntryRow* r : rows) name.cells.push_back(r->name);
  cols.push_back(name);
  for (const validation::Field f : fields) {
    const bool scalar =
        f == validation::Field::kDg || f == validation::Field::kScaleNormDg;
    const std::string label = tensor_name(f);
    Column c{
        label + (scalar ? " abs rel ulp" : " abs rel ulp50/99/max"), {}, false};
    for (const EntryRow* r : rows)
      c.cells.push_back(r->available ? cell(find_field(*r, f), scalar) : "-");
    cols.push_back(c);
  }
  Column ratio{"x naive", {}, false}, head{"margin", {}, false},
      worst{
          "worst element (field case[index] expected actual bound)", {}, true},
      gf{"fwd GF/s", {}, false}, v{"verdict", {}, true};
  for (const EntryRow* r : rows) {
    ratio.cells.push_back(r->available ? ratio_text(*r) : "-");
    head.cells.push_back(!r->available ? "-" : margin_text(r->worst.margin));
    worst.cells.push_back(r->available ? worst_text(r->worst) : "-");
    gf.cells.push_back(
        r->available && r->gflops > 0 ? fmt::format("{:.2f}", r->gflops) : "-");
    v.cells.push_back(verdict(*r));
  }
  cols.push_back(ratio);
  cols.push_back(head);
  cols.push_back(worst);
  // Timed runs only (not compare, not --no-timing).
  const bool timed =
      std::any_of(rows.begin(), rows.end(),
                  [](const EntryRow* r) { return r->gflops > 0; });
  if (gflops && timed) cols.push_back(gf);
  cols.push_back(v);
  print_columns(out, cols);
}

// The verdict per input class, one line per (entry, kind).
void print_classes(std::ostream& out, const Report& rep) {
  if (rep.rows.empty()) return;
  size_t w = 0;
  for (const EntryRow& r : rep.rows) w = std::max(w, r.name.size());
  out << "\nverdict per input class (validation/case.h; the worst margin, "
         "and the worst element where a class FAILs):\n";
  for (const char* kind : {"attention", "scalenorm"})
    for (const EntryRow& r : rep.rows)
      if (r.kind == kind)
        out << fmt::format("  {:<{}} {:<9} {}\n", r.name, w, r.kind,
                           class_line(r));
  // Which cases each entry does not implement (not judged): "c6-c11, c40".
  bool any = false;
  for (const EntryRow& r : rep.rows) {
    std::string list;
    for (size_t i = 0; i < r.cases.size(); ++i) {
      if (!r.cases[i].unsupported) continue;
      size_t j = i;
      while (j + 1 < r.cases.size() && r.cases[j + 1].unsupported) ++j;
      list += (list.empty() ? "" : ", ") +
              (j == i ? fmt::format("c{}", i) : fmt::format("c{}-c{}", i, j));
      i = j;
    }
    if (list.empty()) continue;
    if (!any)
      out << "not implemented (the entry does not declare the formulation, "
             "variant or feature; not judged):\n";
    any = true;
    out << fmt::format("  {:<{}} {:<9} {}\n", r.name, w, r.kind, list);
  }
}

nlohmann::json stats_json(const validation::ErrorStats& s) {
  auto num = [](double x) -> nlohmann::json {
    if (std::isfinite(x)) return x;
    return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  };
  return {{"count", s.count},
          {"max_abs", num(s.max_abs)},
          {"max_rel", num(s.max_rel)},
          {"rel_floor", num(s.rel_floor)},
          {"normwise", num(s.normwise)},
          {"ulp_p50", num(s.ulp_p50)},
          {"ulp_p99", num(s.ulp_p99)},
          {"ulp_max", num(s.ulp_max)},
          {"worst_index", s.worst_index},
          {"worst_expected", num(s.worst_expected)},
          {"worst_actual", num(s.worst_actual)},
          {"scale", num(s.scale)},
          {"nonfinite_mismatch", s.nonfinite_mismatch}};
}

nlohmann::json finite_or_string(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

nlohmann::json worst_json(const WorstElement& w) {
  nlohmann::json j = {{"margin", finite_or_string(w.margin)},
                      {"case", w.case_index},
                      {"field", w.field_name()},
                      {"index", w.where},
                      {"expected", finite_or_string(w.expected)},
                      {"actual", finite_or_string(w.actual)},
                      {"bound", finite_or_string(w.bound)}};
  if (!w.wrote.empty()) j["wrote_outside"] = w.wrote;
  return j;
}

// True if two sampled oracles drew the same rows.
bool same_rows(const validation::SampledOracle& a,
               const validation::SampledOracle& b) {
  auto eq = [](const std::vector<validation::SampledRow>& x,
               const std::vector<validation::SampledRow>& y) {
    return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(),
                                              [](const auto& u, const auto& v) {
                                                return u.b == v.b &&
                                                       u.h == v.h && u.n == v.n;
                                              });
  };
  return eq(a.query_rows, b.query_rows) && eq(a.key_rows, b.key_rows);
}

// "first 4, tile boundary 124, random 128" as {"first": 4, ...}.
nlohmann::json reasons_json(const std::vector<validation::SampledRow>& rows) {
  nlohmann::json j = nlohmann::json::object();
  for (const validation::SampledRow& r : rows) {
    const std::string why = r.why;
    j[why] = j.contains(why) ? j[why].get<int>() + 1 : 1;
  }
  return j;
}

}  // namespace

namespace {
// "3.4e+07" -> "3.4e7", "2.4e-02" -> "2.4e-2": the table is wide enough.
std::string short_exponent(std::string s) {
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  const bool neg = !exp.empty() && exp[0] == '-';
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) exp.erase(0, 1);
  exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
  return mant + "e" + (neg ? "-" : "") + exp;
}
}  // namespace

std::string sci(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  return short_exponent(fmt::format("{:.1e}", v));
}

std::string ulps(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : "inf";
  if (v < 10) return fmt::format("{:.2g}", v);
  if (v < 1000) return fmt::format("{:.0f}", v);
  return short_exponent(fmt::format("{:.0e}", v));
}

namespace {
std::string class_margin(double m) {
  if (!std::isfinite(m)) return std::isnan(m) ? "nan" : "inf";
  return short_exponent(fmt::format("{:.3g}", m));
}

std::string classes_text(const std::vector<validation::InputClass>& ks) {
  std::string s;
  for (validation::InputClass k : ks)
    s += (s.empty() ? "" : ", ") + std::string(validation::name(k));
  return s;
}

// The worst margin over a case's fields (inf if it threw).
double case_margin(const CaseResult& c) {
  if (!c.error.empty() && !c.unsupported)
    return std::numeric_limits<double>::infinity();
  double m = 0;
  for (const FieldResult& f : c.fields)
    if (!(f.margin <= m)) m = f.margin;
  return m;
}
}  // namespace

std::string class_line(const EntryRow& row) {
  if (!row.available) return "n/a (entry not available on this CPU)";
  std::string s;
  for (const ClassSummary& c : row.classes) {
    s += s.empty() ? "" : " · ";
    const char* k = validation::name(c.input_class);
    if (c.cases == 0) {
      s += fmt::format("n/i {} ({} cases not implemented)", k, c.unsupported);
      continue;
    }
    // Padded to the longest class name and a 6-character margin, so that
    // the segments of consecutive entries line up.
    s += fmt::format("{} {:<13} {:<6}", c.pass ? "PASS" : "FAIL", k,
                     class_margin(c.worst.margin));
    if (!c.pass && c.worst.case_index >= 0)
      s += c.worst.threw ? fmt::format(" (case c{} threw)", c.worst.case_index)
           : !c.worst.wrote.empty()
               ? fmt::format(" (case c{} wrote outside a view)",
                             c.worst.case_index)
               : fmt::format(" ({}{} in case c{})", c.worst.field_name(),
                             c.worst.where, c.worst.case_index);
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.empty() ? "-" : s;
}

void finalize(Report* report) {
  report->pass = true;
  for (const EntryRow& r : report->rows)
    if (r.available && !r.pass) report->pass = false;
}

void print_table(std::ostream& out, const Report& rep) {
  const MachineInfo& m = rep.machine;
  std::string targets;
  for (const auto& t : m.hwy_targets)
    targets += (targets.empty() ? "" : " ") + t;
  if (targets.empty()) targets = "none (no simd entries in this build)";
  out << fmt::format(
      "{}: {} entries, {} cases{}, {}{}\n", rep.title,
      [&] {
        std::vector<std::string> names;
        for (const auto& r : rep.rows)
          if (std::find(names.begin(), names.end(), r.name) == names.end())
            names.push_back(r.name);
        return names.size();
      }(),
      rep.cases.size(),
      rep.covering_cases > 0
          ? fmt::format(" ({} of them covering the shape model: "
                        "qknorm-check coverage)",
                        rep.covering_cases)
          : std::string(),
      rep.seeded ? "seed " + std::to_string(rep.seed)
                 : std::string("inputs from files"),
      rep.classes.empty()
          ? std::string()
          : fmt::format("; input classes {} only (--classes: the other "
                        "classes' cases are not run and do not count)",
                        classes_text(rep.classes)));
  if (!rep.note.empty()) out << rep.note << "\n";
  out << fmt::format(
      "machine: {} ({} cores); Highway targets: {}; OpenBLAS core {} ({}), "
      "{} threads; entry threads: {}; jobs: {}\n",
      m.cpu, m.cores, targets, m.openblas_core,
      m.openblas_coretype.empty()
          ? std::string("picked for this CPU")
          : "forced: OPENBLAS_CORETYPE=" + m.openblas_coretype,
      m.openblas_threads,
      rep.threads == 0
          ? std::string(rep.jobs > 1 ? "1 (jobs > 1)" : "all cores")
          : std::to_string(rep.threads),
      rep.jobs);
  // What each entry that says so was built for (plug-ins, ABI version 2),
  // beside this machine's line: once per entry.
  for (size_t i = 0; i < rep.rows.size(); ++i) {
    const EntryRow& r = rep.rows[i];
    if (r.built_for.empty()) continue;
    if (i > 0 && rep.rows[i - 1].name == r.name) continue;
    out << fmt::format("entry {} built for: {}\n", r.name, r.built_for);
  }
  out << "cases:\n";
  for (size_t i = 0; i < rep.cases.size(); ++i) {
    out << fmt::format("  [{}] {:<13} {}\n", i,
                       i < rep.case_classes.size()
                           ? validation::name(rep.case_classes[i])
                           : "",
                       rep.cases[i]);
    if (i >= rep.case_costs.size()) continue;
    // Sampled mode: the sample once per case (the same rows in every
    // precision; each precision's own pass and rows timings).
    const std::vector<validation::SampledOracle>& ss =
        rep.case_costs[i].samples;
    for (size_t k = 0; k < ss.size(); ++k) {
      const std::string prec(name(ss[k].storage));
      if (k > 0 && same_rows(ss[k], ss[0]))
        out << fmt::format(
            "      {}: same rows, pass {:.3g} flops in {:.1f} s, rows in "
            "{:.1f} s\n",
            prec, ss[k].pass_flops, ss[k].pass_seconds, ss[k].rows_seconds);
      else
        out << fmt::format("      {}: {}\n", prec, ss[k].describe());
    }
  }
  out << fmt::format(
      "rule (validation/rule.h), per element: |x - oracle| <= "
      "u_c (sum_units(n) + 2 dot |A|) M + ulp_fmt(|oracle|)/2 (+ stored-O and "
      "subnormal terms), dot = {:g} (+ the cosine units of rows with dominant "
      "channels), M = the element's magnitude before cancellation, "
      "sum_units(n) = {:g} sqrt(n) + {:g};\n"
      "      margin = the worst element's |error| / its bound (> 1 fails), "
      "over every field and case; the element is shown as field "
      "c<case>[b,h,n,d].\n"
      "      \"x naive\" = max err / naive max err (statistics only). "
      "ULP figures and everything else: --json.\n\n",
      validation::kDotUnits, validation::kSumLambda, validation::kOpUnits);
  print_kind(out, rep, "attention", {}, true);
  out << "\n";
  print_kind(out, rep, "scalenorm", {}, false);
  print_classes(out, rep);
  int shown = 0;
  constexpr int kMaxFailuresShown = 20;  // the JSON report has all of them
  for (const EntryRow& r : rep.rows)
    for (const CaseResult& c : r.cases) {
      if (c.pass) continue;
      if (shown == 0) out << "\nfailures:\n";
      if (shown++ < kMaxFailuresShown)
        out << "[" << validation::name(c.input_class) << "] " << c.failure
            << "\n";
    }
  if (shown > kMaxFailuresShown)
    out << fmt::format("... and {} more failing cases (see --json)\n",
                       shown - kMaxFailuresShown);
  out << fmt::format("\n{}: {} in {:.1f} s{}\n", rep.title,
                     rep.pass ? "PASS" : "FAIL", rep.seconds,
                     rep.estimate.empty() ? std::string()
                                          : fmt::format(" (estimated {:.1f} s)",
                                                        rep.estimate_s));
}

std::string to_json(const Report& rep) {
  nlohmann::json j;
  j["tool"] = rep.title;
  if (!rep.note.empty()) j["note"] = rep.note;
  j["seed"] = rep.seed;
  j["threads"] = rep.threads;
  j["jobs"] = rep.jobs;
  j["seconds"] = rep.seconds;
  if (!rep.estimate.empty()) {
    j["estimate_seconds"] = rep.estimate_s;
    j["estimate"] = rep.estimate;
    // The estimate per phase beside what each took (measured sums over the
    // attention cases, added over the --jobs workers, so above the wall
    // time when jobs > 1; "other": timing, ScaleNorm and the calibration,
    // the wall time beyond the cases' share of it, their sum / jobs).
    double oracle = 0, pass = 0, rows = 0, naive = 0, entries = 0, cases = 0;
    for (const CaseCost& c : rep.case_costs) {
      oracle += c.oracle_seconds;
      naive += c.naive_seconds;
      entries += c.entries_seconds;
      cases += c.seconds;
      for (const validation::SampledOracle& so : c.samples) {
        pass += so.pass_seconds;
        rows += so.rows_seconds;
      }
    }
    j["cost"] = {
        {"calibration_seconds", rep.calibration_s},
        {"estimate",
         {{"oracle", rep.est_oracle_s},
          {"pass", rep.est_pass_s},
          {"rows", rep.est_rows_s},
          {"naive", rep.est_naive_s},
          {"entries", rep.est_entries_s},
          {"timing", rep.est_timing_s},
          {"total", rep.estimate_s}}},
        {"measured",
         {{"oracle", oracle},
          {"pass", pass},
          {"rows", rows},
          {"naive", naive},
          {"entries", entries},
          {"other", std::max(0.0, rep.seconds - cases / std::max(1, rep.jobs))},
          {"total", rep.seconds}}}};
  }
  if (rep.sample_rows > 0)
    j["sample"] = {{"rows", rep.sample_rows}, {"seed", rep.sample_seed}};
  else
    j["sample"] = nullptr;
  if (!rep.case_costs.empty()) {
    nlohmann::json cc = nlohmann::json::array();
    for (size_t i = 0; i < rep.case_costs.size(); ++i) {
      const CaseCost& c = rep.case_costs[i];
      nlohmann::json jc = {
          {"case", i},
          {"estimate_seconds",
           i < rep.case_estimates.size() ? rep.case_estimates[i] : 0.0},
          {"seconds", c.seconds},
          {"oracle_seconds", c.oracle_seconds},
          {"naive_seconds", c.naive_seconds},
          {"entries_seconds", c.entries_seconds}};
      nlohmann::json samples = nlohmann::json::array();
      for (const validation::SampledOracle& so : c.samples)
        samples.push_back({{"precision", std::string(name(so.storage))},
                           {"seed", so.options.seed},
                           {"rows_requested", so.options.rows},
                           {"blocks", so.options.blocks},
                           {"query_rows",
                            {{"count", so.query_rows.size()},
                             {"by_reason", reasons_json(so.query_rows)}}},
                           {"key_rows",
                            {{"count", so.key_rows.size()},
                             {"by_reason", reasons_json(so.key_rows)}}},
                           {"pass_seconds", so.pass_seconds},
                           {"pass_flops", so.pass_flops},
                           {"rows_seconds", so.rows_seconds},
                           {"given_units", so.given_units},
                           {"describe", so.describe()}});
      jc["samples"] = samples;
      cc.push_back(jc);
    }
    j["case_costs"] = cc;
  }
  j["pass"] = rep.pass;
  if (!rep.coverage.is_null()) j["coverage"] = rep.coverage;
  j["machine"] = {{"cpu", rep.machine.cpu},
                  {"cores", rep.machine.cores},
                  {"hwy_targets", rep.machine.hwy_targets},
                  {"openblas_core", rep.machine.openblas_core},
                  {"openblas_coretype_env", rep.machine.openblas_coretype},
                  {"openblas_threads", rep.machine.openblas_threads}};
  j["rule"] = {
      {"sum_lambda", validation::kSumLambda},
      {"op_units", validation::kOpUnits},
      {"dot_units", validation::kDotUnits},
      {"dominant_ratio", validation::kDominantRatio},
      {"ill_conditioned", validation::kIllConditioned},
      {"text",
       "componentwise (validation/rule.h): |x_e - oracle_e| <= delta_e "
       "+ ulp_fmt(|oracle_e| + delta_e) / 2, delta_e = u_c (sum_lambda "
       "sqrt(n_e) + op_units + 2 dot |A|) M_e + u_s R_e + ulp_s(0) "
       "So_e + ulp_c(0) Sc_e; dot = dot_units, plus the cosine units of "
       "rows with dominant channels (a share >= dominant_ratio x the rest's "
       "mean square)"}};
  j["cases"] = rep.cases;
  {
    nlohmann::json cc = nlohmann::json::array();
    for (validation::InputClass k : rep.case_classes)
      cc.push_back(validation::name(k));
    j["case_classes"] = cc;
    nlohmann::json sel = nlohmann::json::array();
    for (validation::InputClass k : rep.classes)
      sel.push_back(validation::name(k));
    j["classes_selected"] = rep.classes.empty() ? nlohmann::json() : sel;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const EntryRow& r : rep.rows) {
    nlohmann::json jr = {
        {"kind", r.kind},
        {"entry", r.name},
        {"family", r.family},
        {"target", r.target},
        {"precision", r.precision},
        {"rule", r.rule},
        {"contract", r.contract},
        {"available", r.available},
        {"pass", r.pass},
        {"ratio_to_naive", r.has_naive || r.family == "reference"
                               ? finite_or_string(r.ratio)
                               : nlohmann::json()},
        {"margin", finite_or_string(r.worst.margin)},
        {"worst", worst_json(r.worst)},
        {"forward_gflops", r.gflops},
        {"cases_not_implemented", r.unsupported}};
    if (r.forward_only) jr["forward_only"] = true;
    if (!r.built_for.empty()) jr["built_for"] = r.built_for;
    for (const FieldSummary& f : r.fields)
      jr["fields"][f.key] = {
          {"worst", stats_json(f.worst)},
          {"ratio_to_naive", finite_or_string(f.ratio)},
          {"margin", finite_or_string(f.worst_element.margin)},
          {"worst_element", worst_json(f.worst_element)},
          {"failures", f.failures},
          {"not_representable", f.not_representable},
          {"pass", f.pass}};
    nlohmann::json classes = nlohmann::json::array();
    for (const ClassSummary& c : r.classes)
      classes.push_back({{"class", validation::name(c.input_class)},
                         {"pass", c.pass},
                         {"cases", c.cases},
                         {"cases_not_implemented", c.unsupported},
                         {"margin", finite_or_string(c.worst.margin)},
                         {"worst", worst_json(c.worst)}});
    jr["classes"] = classes;
    nlohmann::json cases = nlohmann::json::array();
    for (const CaseResult& c : r.cases) {
      nlohmann::json jc = {{"case", c.desc},
                           {"class", validation::name(c.input_class)},
                           {"pass", c.pass}};
      if (c.unsupported) jc["not_implemented"] = true;
      if (!c.error.empty()) jc["error"] = c.error;
      if (!c.out_of_bounds.empty()) jc["out_of_bounds"] = c.out_of_bounds;
      if (!c.pass) {
        nlohmann::json dj = nlohmann::json::array();
        for (const validation::Diagnosis& d : c.diagnoses)
          dj.push_back({{"kind", validation::name(d.kind)},
                        {"phrase", d.phrase},
                        {"message", d.message},
                        {"confidence", d.confidence}});
        jc["diagnoses"] = dj;
      }
      for (const FieldResult& f : c.fields)
        jc["fields"][f.key] = {
            {"entry", stats_json(f.entry)},
            {"naive", f.has_naive ? stats_json(f.naive) : nlohmann::json()},
            {"margin", finite_or_string(f.margin)},
            {"naive_margin",
             f.has_naive ? finite_or_string(f.naive_margin) : nlohmann::json()},
            {"worst",
             {{"index", f.where},
              {"expected", finite_or_string(f.expected)},
              {"actual", finite_or_string(f.actual)},
              {"bound", finite_or_string(f.bound)}}},
            {"elements", f.count},
            {"failures", f.failures},
            {"not_representable", f.not_representable},
            {"ill_conditioned", f.ill_conditioned},
            {"diagnosis", f.diagnosis},
            {"pass", f.pass}};
      cases.push_back(jc);
    }
    jr["cases"] = cases;
    rows.push_back(jr);
  }
  j["entries"] = rows;
  return j.dump(2);
}

void write_csv(std::ostream& out, const Report& rep) {
  out << "kind,entry,family,target,precision,rule,field,max_abs,max_rel,ulp_"
         "p50,"
         "ulp_p99,ulp_max,ratio_to_naive,margin,pass,forward_gflops,seed,"
         "class,case\n";
  for (const EntryRow& r : rep.rows) {
    if (!r.available) continue;
    for (const FieldSummary& f : r.fields) {
      const validation::ErrorStats& s = f.worst;
      out << fmt::format(
          "{},{},{},{},{},{},{},{:.6e},{:.6e},{:.4g},{:.4g},{:.4g},{:.6g},{:."
          "6g},{},{:.4g},{},all,all\n",
          r.kind, r.name, r.family, r.target, r.precision, r.rule, f.key,
          s.max_abs, s.max_rel, s.ulp_p50, s.ulp_p99, s.ulp_max, f.ratio,
          f.worst_element.margin, f.pass ? "PASS" : "FAIL", r.gflops, rep.seed);
    }
    // The class and case rows: field "all", no statistics.
    auto line = [&](double margin, const char* verdict, const char* cls,
                    const std::string& case_id) {
      out << fmt::format(
          "{},{},{},{},{},{},all,,,,,,,{:.6g},{},{:.4g},{},{},{}\n", r.kind,
          r.name, r.family, r.target, r.precision, r.rule, margin, verdict,
          r.gflops, rep.seed, cls, case_id);
    };
    for (const ClassSummary& c : r.classes)
      line(c.worst.margin, c.cases == 0 ? "n/i" : (c.pass ? "PASS" : "FAIL"),
           validation::name(c.input_class), "all");
    for (size_t i = 0; i < r.cases.size(); ++i) {
      const CaseResult& c = r.cases[i];
      line(case_margin(c), c.unsupported ? "n/i" : (c.pass ? "PASS" : "FAIL"),
           validation::name(c.input_class), fmt::format("c{}", i));
    }
  }
}

}  // namespace qknorm::cli
