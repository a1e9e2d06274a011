#include "cli/power.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "cli/app.h"
#include "cli/pool.h"
#include "cli/sweep.h"
#include "qknorm/error.h"
#include "qknorm/name_table.h"
#include "validation/judge.h"
#include "validation/npy.h"
#include "validation/rng.h"
#include "validation/tensor_io.h"

namespace qknorm::cli {
namespace {

using validation::AttentionCase;
using validation::AttentionResult;
using validation::Distribution;
using validation::Field;
using validation::ToleranceTable;

constexpr double kInf = std::numeric_limits<double>::infinity();
// "Never caught" (not even at the top of the grid) is drawn at this value.
constexpr double kPlotCeiling = 10;

// The defaults of power mode (options not given).
constexpr const char* kShape = "2x4x64x64";
constexpr double kG = 20;
const std::vector<std::string> kMasks = {"none", "causal"};
// The activation statistics of trained models (issue 31) come last, so that
// the earlier rows keep their seeds.
const std::vector<std::string> kDists = {
    "gaussian", "zerorows", "outliers", "mixedv", "heavy", "sink", "channels"};
const std::vector<std::string> kPrecisions = {"f32", "bf16", "f16"};
constexpr Field kFields[] = {Field::kO, Field::kDq, Field::kDk, Field::kDv};
const std::vector<std::string> kGranularities = {"element", "row", "head",
                                                 "field"};
// --quick: one distribution (padding tokens), one precision, one case.
const std::vector<std::string> kQuickDists = {"zerorows"};
const std::vector<std::string> kQuickPrecisions = {"f32"};
const std::vector<std::string> kQuickMasks = {"causal"};
constexpr int kQuickTrials = 3;

using validation::field_values;

// The attention fields: --field's values, and the fields both verdicts
// judge on uncorrupted outputs (false alarms).
constexpr Field kAllFields[] = {Field::kO,  Field::kLse, Field::kDq,
                                Field::kDk, Field::kDv,  Field::kDg};

Field parse_field(const std::string& s) {
  std::string known;
  for (Field f : kAllFields) {
    if (s == validation::name(f)) return f;
    known += (known.empty() ? "" : ", ") + std::string(validation::name(f));
  }
  throw Error("--field", {}, "unknown field '" + s + "' (" + known + ")");
}

constexpr NamedValue<Granularity> kGranularityNames[] = {
    {Granularity::kElement, "element"},
    {Granularity::kRow, "row"},
    {Granularity::kHead, "head"},
    {Granularity::kField, "field"},
};

Granularity parse_granularity(const std::string& s) {
  Granularity g;
  if (parse_in(kGranularityNames, s, &g)) return g;
  throw Error(
      "--granularity", {},
      "unknown granularity '" + s + "' (" + names_in(kGranularityNames) + ")");
}

// torch's dtype names, for the dump torch replays.
constexpr NamedValue<Precision> kTorchDtypes[] = {
    {Precision::kF64, "float64"},
    {Precision::kF32, "float32"},
    {Precision::kBF16, "bfloat16"},
    {Precision::kF16, "float16"},
};

const char* torch_dtype(Precision p) { return name_in(kTorchDtypes, p); }

// One case of one (precision, distribution): the inputs as the entries see
// them, the oracle and the verdict's tables.
struct CaseData {
  AttentionCase rc;
  validation::OracleAttention orc;
  std::vector<ToleranceTable> tables;
  const ToleranceTable& table(Field f) const {
    for (const ToleranceTable& t : tables)
      if (t.field == f) return t;
    throw Error("power", {}, "no tolerance table for a field");
  }
};

// One (entry, case) run: the correct outputs and both verdicts on them.
struct RunData {
  const Backend* entry = nullptr;
  size_t case_index = 0;
  AttentionResult res;
  std::string error;  // the entry threw
  bool qk_pass = false, ac_pass = false;
  std::map<Field, bool> qk_field, ac_field;
  std::string qk_message, ac_message;
};

// assert_close on one field of an entry of precision p (torch's tolerances
// of the model's dtype, also for lse and dg, which this project returns in
// the compute format): mismatching elements and the first one.
int64_t assert_close_field(const ToleranceTable& t, std::span<const double> a,
                           Precision p, std::string* first) {
  const AssertCloseTol tol = assert_close_defaults(p);
  int64_t bad = 0;
  for (size_t i = 0; i < t.expected.size(); ++i) {
    const double e = static_cast<double>(t.expected[i]);
    if (assert_close_element(a[i], e, tol)) continue;
    if (bad++ == 0 && first != nullptr)
      *first = fmt::format(
          "{}{} = {:.9g}, expected {:.9g}: |diff| {:.3g} > atol + rtol|e| = "
          "{:.3g}",
          validation::name(t.field), t.index_text(static_cast<int64_t>(i)),
          a[i], e, std::fabs(a[i] - e), tol.atol + std::fabs(tol.rtol * e));
  }
  return bad;
}

double inject(Precision fmt, double x, double sign, double r) {
  return round_to(fmt, x * (1 + sign * r));
}

bool usable(double x) { return std::isfinite(x) && x != 0; }

struct Trial {
  bool valid = false;
  bool ac_valid = false;  // some injected element passes assert_close before
  size_t qk = 0, ac = 0;  // grid index of the threshold; grid.size(): never
  double qk_eff = 0, ac_eff = 0;
  int64_t injected = 0, ill = 0;
  // min over the injected elements of bound_e / |x_e|: the relative error
  // at which the verdict starts to see the target (the entry's own error
  // aside).
  double rel_bound = kInf;
  int checks = 0;
  std::vector<std::string> mismatches;
};

// Elements [first, first + size) of a granularity's unit u.
struct Units {
  size_t size = 1, count = 1;
};
Units units_of(const ToleranceTable& t, Granularity g) {
  const size_t n = t.expected.size();
  const size_t cols = static_cast<size_t>(t.cols);
  const size_t head = static_cast<size_t>(t.rows * t.cols);
  switch (g) {
    case Granularity::kElement:
      return {1, n};
    case Granularity::kRow:
      return {cols, n / cols};
    case Granularity::kHead:
      return {head, n / head};
    case Granularity::kField:
      return {n, 1};
  }
  return {n, 1};
}

// Smallest grid index k with caught(grid[j]) for every j >= k.
template <class Caught>
size_t scan(const std::vector<double>& grid, Caught caught) {
  size_t k = grid.size();
  while (k > 0 && caught(grid[k - 1])) --k;
  return k;
}

class TrialRunner {
 public:
  TrialRunner(const std::vector<double>& grid, Precision prec, bool random_sign)
      : grid_(grid), prec_(prec), random_sign_(random_sign) {}

  Trial run(const CaseData& cd, const RunData& run, Field f, Granularity g,
            validation::Rng& rng) const {
    Trial tr;
    const ToleranceTable& t = cd.table(f);
    const std::span<const double> x = field_values(run.res, f);
    const Units u = units_of(t, g);
    std::vector<size_t> cand;
    for (size_t k = 0; k < u.count; ++k) {
      bool ok = false;
      for (size_t i = k * u.size; i < (k + 1) * u.size && !ok; ++i)
        ok = usable(x[i]) && (g != Granularity::kElement ||
                              t.cond[i] <= validation::kIllConditioned);
      if (ok) cand.push_back(k);
    }
    if (cand.empty()) return tr;
    const size_t unit = cand[static_cast<size_t>(
        rng.uniform_int(0, static_cast<int64_t>(cand.size()) - 1))];
    std::vector<size_t> idx;
    std::vector<double> sign;
    for (size_t i = unit * u.size; i < (unit + 1) * u.size; ++i) {
      idx.push_back(i);
      sign.push_back(random_sign_ && rng.uniform() < 0.5 ? -1.0 : 1.0);
      tr.ill += t.cond[i] > validation::kIllConditioned;
      if (usable(x[i]))
        tr.rel_bound = std::min(
            tr.rel_bound, validation::element_bound(t, i) / std::fabs(x[i]));
    }
    tr.valid = true;
    tr.injected = static_cast<int64_t>(idx.size());
    const AssertCloseTol tol = assert_close_defaults(prec_);
    auto qk_ok = [&](size_t i, double v) {
      return validation::passes(validation::judge_element(t, i, v).cls);
    };
    auto ac_ok = [&](size_t i, double v) {
      return assert_close_element(v, static_cast<double>(t.expected[i]), tol);
    };
    // Caught: an injected element that passes uncorrupted fails corrupted
    // (an element that already fails is a false alarm, counted apart).
    std::vector<char> qk_base(idx.size()), ac_base(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) {
      qk_base[j] = qk_ok(idx[j], x[idx[j]]);
      ac_base[j] = ac_ok(idx[j], x[idx[j]]);
      tr.ac_valid = tr.ac_valid || ac_base[j];
    }
    auto caught = [&](bool qk, double r) {
      for (size_t j = 0; j < idx.size(); ++j) {
        if (!(qk ? qk_base[j] : ac_base[j])) continue;
        const double v = inject(t.fmt, x[idx[j]], sign[j], r);
        if (!(qk ? qk_ok(idx[j], v) : ac_ok(idx[j], v))) return true;
      }
      return false;
    };
    auto effective = [&](size_t k) {
      if (k >= grid_.size()) return kInf;
      double e = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        const double xi = x[idx[j]];
        if (usable(xi))
          e = std::max(e, std::fabs(inject(t.fmt, xi, sign[j], grid_[k]) - xi) /
                              std::fabs(xi));
      }
      return e;
    };
    tr.qk = scan(grid_, [&](double r) { return caught(true, r); });
    tr.ac = scan(grid_, [&](double r) { return caught(false, r); });
    tr.qk_eff = effective(tr.qk);
    tr.ac_eff = effective(tr.ac);
    // The full verdict on the whole corrupted field must agree: FAIL at the
    // threshold, PASS one grid step below it (or at the top if never caught).
    if (run.qk_field.at(f)) {
      auto fails = [&](size_t k) {
        AttentionResult cr = run.res;
        std::span<double> v = field_values(cr, f);
        for (size_t j = 0; j < idx.size(); ++j)
          v[idx[j]] = inject(t.fmt, x[idx[j]], sign[j], grid_[k]);
        const std::vector<Field> only{f};
        return !validation::judge_attention(cd.rc, prec_, cd.orc, cr, nullptr,
                                            false, run.entry->name(), "", &only)
                    .pass;
      };
      auto check = [&](size_t k, bool expect_fail) {
        ++tr.checks;
        if (fails(k) != expect_fail)
          tr.mismatches.push_back(fmt::format(
              "{} {} {} {}[unit {}] r = {:.3g}: judge_attention says {}, the "
              "element scan says {}",
              run.entry->name(), cd.rc.describe(), tensor_name(f), name(g),
              unit, grid_[k], expect_fail ? "PASS" : "FAIL",
              expect_fail ? "caught" : "not caught"));
      };
      if (tr.qk < grid_.size()) check(tr.qk, true);
      if (tr.qk > 0) check(tr.qk - 1, false);
    }
    return tr;
  }

 private:
  const std::vector<double>& grid_;
  Precision prec_;
  bool random_sign_;
};

struct PowerRow {
  Precision prec = Precision::kF32;
  Distribution dist = Distribution::kGaussian;
  // The input class of the distribution's cases (validation/case.h; the
  // most extreme of them if they differ).
  validation::InputClass input_class = validation::InputClass::kRealistic;
  Field field = Field::kO;
  Granularity gran = Granularity::kElement;
  int trials = 0, ac_trials = 0, runs = 0;
  double qk_all = NAN, qk_all_eff = NAN, qk_med = NAN, qk_med_eff = NAN;
  double ac_all = NAN, ac_all_eff = NAN, ac_med = NAN, ac_med_eff = NAN;
  double target = NAN;
  double rel_bound = NAN;         // the largest trial's Trial::rel_bound
  int64_t ill = 0, elements = 0;  // the field's, over the cases
  int64_t injected = 0, injected_ill = 0;
  int qk_false = 0, ac_false = 0;
  int checks = 0, mismatches = 0;
  bool has_target() const { return !std::isnan(target); }
  bool met() const { return !has_target() || qk_all <= target; }
};

// The row's thresholds from its trials: every trial caught (largest trial
// threshold) and the median trial (the (T/2 + 1)-th smallest); each with the
// effective relative error of the trial that sets it.
void aggregate(const std::vector<Trial>& trials,
               const std::vector<double>& grid, bool qk, double* all,
               double* all_eff, double* med, double* med_eff) {
  std::vector<std::pair<size_t, double>> v;
  for (const Trial& t : trials)
    if (t.valid && (qk || t.ac_valid))
      v.emplace_back(qk ? t.qk : t.ac, qk ? t.qk_eff : t.ac_eff);
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto value = [&](size_t k) { return k < grid.size() ? grid[k] : kInf; };
  *all = value(v.back().first);
  *all_eff = v.back().second;
  *med = value(v[v.size() / 2].first);
  *med_eff = v[v.size() / 2].second;
}

// A threshold; `floor` (the grid's smallest value) is shown as "<=floor":
// caught everywhere on the grid.
std::string thr(double v, double floor = 0) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return "never";
  if (v <= floor) return fmt::format("<={:.0e}", v);
  return fmt::format("{:.1e}", v);
}

std::string csv_num(double v) {
  if (std::isnan(v)) return "";
  if (std::isinf(v)) return "inf";
  return fmt::format("{:.6e}", v);
}

std::string plot_num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return fmt::format("{:g}", kPlotCeiling);
  return fmt::format("{:.6e}", v);
}

std::string target_text(const PowerRow& r) {
  if (!r.has_target()) return "-";
  if (std::isnan(r.qk_all)) return fmt::format("{:.0e} n/a", r.target);
  if (r.met()) return fmt::format("{:.0e} met", r.target);
  return fmt::format("{:.0e} MISS x{:.3g}", r.target, r.qk_all / r.target);
}

std::string ill_text(const PowerRow& r) {
  if (r.gran == Granularity::kElement)
    return fmt::format("{} ({:.2f}%) excl", r.ill,
                       r.elements ? 100.0 * r.ill / r.elements : 0.0);
  return fmt::format("{:.2f}% of inj",
                     r.injected ? 100.0 * r.injected_ill / r.injected : 0.0);
}

// The entries a precision's trials use: --backend/--target filters if given,
// otherwise reference:<p>, the best available simd entry of p and blas:<p>.
std::vector<const Backend*> entries_for(Precision p, const SuiteOptions& s,
                                        std::vector<std::string>* skipped) {
  std::vector<const Backend*> out;
  const Registry& r = all_backends();
  if (!s.backends.empty() || !s.targets.empty()) {
    SuiteOptions f = s;
    f.precisions = {std::string(name(p))};
    try {
      for (const Backend* b : select_entries(r, f)) {
        if (!b->available())
          skipped->push_back(b->name() + " (not available on this CPU)");
        else if (!b->has_attention_backward())
          skipped->push_back(b->name() +
                             " (forward only: power's trials inject into "
                             "the gradients too)");
        else
          out.push_back(b);
      }
    } catch (const Error&) {
      // No entry of this precision matches: the precision is left out.
    }
    return out;
  }
  if (const Backend* b = r.find("reference:" + std::string(name(p))))
    out.push_back(b);
  for (const Backend* b : r.entries())
    if (b->family() == "simd" && b->precision() == p && b->available()) {
      out.push_back(b);
      break;
    }
  if (const Backend* b = r.find("blas:" + std::string(name(p))))
    out.push_back(b);
  return out;
}

// --torch-dump: arrays (actual as stored, expected = the oracle, both f64
// .npy) with this code's assert_close verdict, for
// scripts/power_assert_close_check.py to confirm with torch.
class TorchDump {
 public:
  explicit TorchDump(std::string dir) : dir_(std::move(dir)) {
    if (!dir_.empty()) std::filesystem::create_directories(dir_);
  }
  bool enabled() const { return !dir_.empty(); }
  void add(const std::string& tag, const ToleranceTable& t,
           std::span<const double> actual) {
    const std::string stem = fmt::format("{:03d}_{}", entries_.size(), tag);
    validation::HostTensor a, e;
    a.dtype = e.dtype = Precision::kF64;
    a.shape = e.shape = {t.B, t.H, t.rows, t.cols};
    a.values.assign(actual.begin(), actual.end());
    for (long double x : t.expected) e.values.push_back(static_cast<double>(x));
    validation::write_npy_file(dir_ + "/" + stem + "_actual.npy", a);
    validation::write_npy_file(dir_ + "/" + stem + "_expected.npy", e);
    const int64_t bad = assert_close_field(t, actual, t.fmt, nullptr);
    entries_.push_back({{"name", stem},
                        {"actual", stem + "_actual.npy"},
                        {"expected", stem + "_expected.npy"},
                        {"dtype", torch_dtype(t.fmt)},
                        {"cpp_close", bad == 0},
                        {"cpp_mismatches", bad},
                        {"numel", t.expected.size()}});
  }
  void finish() const {
    if (!enabled()) return;
    validation::write_file_bytes(dir_ + "/manifest.json",
                                 nlohmann::json(entries_).dump(1) + "\n");
  }

 private:
  std::string dir_;
  nlohmann::json::array_t entries_;
};

// The torch dump's arrays of one run: uncorrupted, one well-conditioned
// element at r = 1e-4 and 1e-2, one row at 3e-3.
void dump_for_torch(TorchDump& dump, const CaseData& cd, const RunData& run,
                    Field f, Precision p, Distribution d,
                    validation::Rng& rng) {
  const ToleranceTable& t = cd.table(f);
  const std::span<const double> x = field_values(run.res, f);
  const std::string base =
      fmt::format("{}_{}_{}", name(p), validation::name(d), name(t.field));
  dump.add(base + "_clean", t, x);
  std::vector<size_t> good;
  for (size_t i = 0; i < x.size(); ++i)
    if (usable(x[i]) && t.cond[i] <= validation::kIllConditioned)
      good.push_back(i);
  if (good.empty()) return;
  const size_t e = good[static_cast<size_t>(
      rng.uniform_int(0, static_cast<int64_t>(good.size()) - 1))];
  for (double r : {1e-4, 1e-2}) {
    std::vector<double> y(x.begin(), x.end());
    y[e] = inject(t.fmt, x[e], 1, r);
    dump.add(fmt::format("{}_elem{:.0e}", base, r), t, y);
  }
  std::vector<double> y(x.begin(), x.end());
  const size_t row = e / static_cast<size_t>(t.cols) * t.cols;
  for (size_t i = row; i < row + static_cast<size_t>(t.cols); ++i)
    y[i] = inject(t.fmt, x[i], 1, 3e-3);
  dump.add(base + "_row3e-03", t, y);
}

struct PowerRun {
  std::vector<PowerRow> rows;
  std::vector<std::string> qk_false, ac_false, mismatches, skipped;
  int runs = 0;
  int checks = 0;
};

}  // namespace

const char* name(Granularity g) { return name_in(kGranularityNames, g); }

AssertCloseTol assert_close_defaults(Precision p) {
  // torch.testing._comparison._DTYPE_PRECISIONS.
  switch (p) {
    case Precision::kF64:
      return {1e-7, 1e-7};
    case Precision::kF32:
      return {1.3e-6, 1e-5};
    case Precision::kBF16:
      return {0.016, 1e-5};
    case Precision::kF16:
      return {0.001, 1e-5};
  }
  return {};
}

bool assert_close_element(double actual, double expected, AssertCloseTol t) {
  if (actual == expected) return true;  // equal infinities included
  const double diff = std::fabs(actual - expected);
  return std::isfinite(diff) && diff <= t.atol + std::fabs(t.rtol * expected);
}

std::vector<double> power_grid(double r_min, double r_max, int per_decade) {
  if (!(r_min > 0) || !(r_max > r_min) || !std::isfinite(r_max))
    throw Error("--r-min/--r-max", {}, "need 0 < --r-min < --r-max (finite)");
  if (per_decade < 1 || per_decade > 100)
    throw Error("--per-decade", {}, "must be in [1, 100]");
  const double lo = std::log10(r_min), hi = std::log10(r_max);
  std::vector<double> g;
  const long k0 = std::lround(std::ceil(lo * per_decade - 1e-9));
  const long k1 = std::lround(std::floor(hi * per_decade + 1e-9));
  for (long k = k0; k <= k1; ++k)
    g.push_back(k % per_decade == 0
                    ? std::pow(10.0, static_cast<double>(k / per_decade))
                    : std::pow(10.0, static_cast<double>(k) / per_decade));
  for (double t : {1e-5, 1e-4, 3e-3, 1e-2, 3e-2})
    if (t >= r_min && t <= r_max) g.push_back(t);
  std::sort(g.begin(), g.end());
  std::vector<double> out;
  for (double v : g)
    if (out.empty() || v > out.back() * (1 + 1e-9)) out.push_back(v);
  return out;
}

double power_target(Precision p, Granularity g, Field f) {
  if (f != Field::kO && f != Field::kDq && f != Field::kDk && f != Field::kDv)
    return NAN;
  switch (g) {
    case Granularity::kElement:
      return p == Precision::kF32    ? 1e-4
             : p == Precision::kF16  ? 1e-2
             : p == Precision::kBF16 ? 3e-2
                                     : NAN;
    case Granularity::kRow:
    case Granularity::kHead:
      return p == Precision::kF32 ? 1e-5 : p == Precision::kF64 ? NAN : 3e-3;
    case Granularity::kField:
      return NAN;
  }
  return NAN;
}

int run_power(const PowerOptions& o, const SuiteOptions& s, int threads,
              std::ostream& out, std::ostream& err, bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> grid;
  std::vector<Precision> precs;
  std::vector<Distribution> dists;
  std::vector<Field> fields;
  std::vector<Granularity> grans;
  std::vector<AttentionProblem> problems;
  const int trials = o.quick && o.trials == 8 ? kQuickTrials : o.trials;
  try {
    grid = power_grid(o.r_min, o.r_max, o.per_decade);
    for (const auto& p : !s.precisions.empty() ? s.precisions
                         : o.quick             ? kQuickPrecisions
                                               : kPrecisions)
      precs.push_back(parse_prec(p));
    for (const auto& d : !s.dists.empty() ? s.dists
                         : o.quick        ? kQuickDists
                                          : kDists)
      dists.push_back(parse_dist(d));
    // --classes: the distributions whose cases are of those classes.
    const std::vector<validation::InputClass> classes =
        parse_classes(s.classes);
    if (!classes.empty())
      std::erase_if(dists, [&](Distribution d) {
        AttentionCase c;  // parameters only: the default masks leave no
        c.dist = d;       // query row fully masked
        return std::find(classes.begin(), classes.end(),
                         validation::input_class(c)) == classes.end();
      });
    if (dists.empty())
      throw Error("--classes", {}, "selects none of the distributions");
    if (o.fields.empty()) fields.assign(std::begin(kFields), std::end(kFields));
    for (const auto& f : o.fields) fields.push_back(parse_field(f));
    for (const auto& g :
         o.granularities.empty() ? kGranularities : o.granularities)
      grans.push_back(parse_granularity(g));
    if (s.variant != "qknorm" && s.variant != "sdpa")
      throw Error("--variant", {}, "must be qknorm or sdpa");
    if (!std::isfinite(s.eps) || s.eps <= 0)
      throw Error("--eps", {}, "must be finite and > 0");
    const std::vector<std::string> shapes =
        s.shapes.empty() ? std::vector<std::string>{kShape} : s.shapes;
    const std::vector<double> gs = s.g.empty() ? std::vector<double>{kG} : s.g;
    const std::vector<std::string>& masks = !s.masks.empty() ? s.masks
                                            : o.quick        ? kQuickMasks
                                                             : kMasks;
    for (const auto& sh : shapes)
      for (double g : gs)
        for (const auto& m : masks) {
          if (!std::isfinite(g)) throw Error("--g", {}, "must be finite");
          AttentionProblem p = parse_shape(sh);
          p.g = g;
          p.eps = s.eps;
          p.variant = s.variant == "sdpa" ? Variant::kSDPA : Variant::kQKNorm;
          apply_mask(m, &p);
          problems.push_back(p);
        }
  } catch (const Error& e) {
    err << "qknorm-check power: " << e.what() << "\n";
    return kExitUsage;
  }
  // Entries run on the pool (o.jobs), one thread each unless --threads.
  const ExecConfig exec = pooled_exec(ExecConfig{threads}, o.jobs);
  TorchDump dump(o.torch_dump);
  PowerRun pr;
  for (size_t pi = 0; pi < precs.size(); ++pi) {
    const Precision p = precs[pi];
    const std::vector<const Backend*> entries = entries_for(p, s, &pr.skipped);
    if (entries.empty()) {
      pr.skipped.push_back(std::string(name(p)) +
                           ": no entry selected, precision left out");
      continue;
    }
    const TrialRunner runner(grid, p, o.sign == "random");
    for (size_t di = 0; di < dists.size(); ++di) {
      const Distribution d = dists[di];
      if (progress)
        std::cerr << fmt::format("\r[{}/{}] {} {:<10}",
                                 pi * dists.size() + di + 1,
                                 precs.size() * dists.size(), name(p),
                                 validation::name(d))
                  << std::flush;
      // The cases (oracle and tables), then every (case, entry) run, each on
      // the pool into its own slot; the messages are gathered in the
      // serial order after.
      std::vector<CaseData> cases(problems.size());
      parallel_for(problems.size(), o.jobs, [&](size_t ci) {
        CaseData& cd = cases[ci];
        cd.rc = validation::round_inputs(
            validation::make_attention_case(
                problems[ci], d, s.seed + di * problems.size() + ci, p),
            p);
        cd.orc = validation::oracle_attention(cd.rc);
        cd.tables = validation::attention_tolerances(cd.rc, p, cd.orc, false);
      });
      validation::InputClass cls = validation::InputClass::kRealistic;
      for (const CaseData& cd : cases) {
        // Precedence (case.h): extreme-range, then degenerate.
        const validation::InputClass k = validation::input_class(cd.rc);
        if (k == validation::InputClass::kExtremeRange ||
            cls == validation::InputClass::kRealistic)
          cls = k;
      }
      std::vector<RunData> runs(cases.size() * entries.size());
      parallel_for(runs.size(), o.jobs, [&](size_t ri) {
        const Backend* b = entries[ri % entries.size()];
        RunData& run = runs[ri];
        run.entry = b;
        run.case_index = ri / entries.size();
        const CaseData& cd = cases[run.case_index];
        const std::string where =
            fmt::format("{} on {} class={}", b->name(), cd.rc.describe(),
                        validation::name(validation::input_class(cd.rc)));
        try {
          run.res = validation::run_attention(*b, cd.rc, exec);
        } catch (const std::exception& e) {
          run.error = e.what();
        }
        if (!run.error.empty()) {
          run.qk_message = where + ": the entry threw: " + run.error;
          run.ac_message = where + ": the entry threw";
          for (Field f : kAllFields) run.qk_field[f] = run.ac_field[f] = false;
          return;
        }
        const validation::AgreementReport rep = validation::judge_attention(
            cd.rc, p, cd.orc, run.res, nullptr, false, b->name(), "");
        run.qk_pass = rep.pass;
        for (const auto& fv : rep.fields) run.qk_field[fv.id] = fv.pass;
        if (!rep.pass) run.qk_message = rep.failure_message();
        run.ac_pass = true;
        std::string msgs;
        for (Field f : kAllFields) {
          std::string first;
          const int64_t bad = assert_close_field(
              cd.table(f), field_values(run.res, f), p, &first);
          run.ac_field[f] = bad == 0;
          if (bad) {
            run.ac_pass = false;
            msgs += fmt::format(
                "\n    {}: {} of {} elements not close; "
                "first: {}",
                tensor_name(f), bad, cd.table(f).expected.size(), first);
          }
        }
        if (!run.ac_pass) run.ac_message = where + ":" + msgs;
      });
      for (const RunData& run : runs) {
        ++pr.runs;
        if (!run.qk_message.empty()) pr.qk_false.push_back(run.qk_message);
        if (!run.ac_message.empty()) pr.ac_false.push_back(run.ac_message);
      }
      std::vector<const RunData*> good;
      for (const RunData& r : runs)
        if (r.error.empty()) good.push_back(&r);
      // Per field, the statistics and the torch dump (it writes files),
      // serially; then each (field, granularity) row's trials on the pool,
      // each with its own seed, gathered in the serial order.
      struct FieldStats {
        int64_t ill = 0, elements = 0;
        int qk_false = 0, ac_false = 0;
      };
      std::vector<FieldStats> stats(fields.size());
      for (size_t fi = 0; fi < fields.size(); ++fi) {
        const Field f = fields[fi];
        FieldStats& st = stats[fi];
        for (const CaseData& cd : cases) {
          const ToleranceTable& t = cd.table(f);
          st.elements += static_cast<int64_t>(t.cond.size());
          for (double k : t.cond) st.ill += k > validation::kIllConditioned;
        }
        for (const RunData& r : runs) {
          st.qk_false += !r.qk_field.at(f);
          st.ac_false += !r.ac_field.at(f);
        }
        if (dump.enabled() && !good.empty() && fi < 2 &&
            cases.front().table(f).fmt == p) {
          validation::Rng rng(s.seed + 977 * (pi * 31 + di * 7 + fi));
          dump_for_torch(dump, cases[good.front()->case_index], *good.front(),
                         f, p, d, rng);
        }
      }
      const size_t n_rows = fields.size() * grans.size();
      std::vector<PowerRow> rows(n_rows);
      std::vector<std::vector<std::string>> row_mismatches(n_rows);
      parallel_for(n_rows, o.jobs, [&](size_t ri) {
        const size_t fi = ri / grans.size(), gi = ri % grans.size();
        const Field f = fields[fi];
        const FieldStats& st = stats[fi];
        const Granularity g = grans[gi];
        PowerRow& row = rows[ri];
        row.prec = p;
        row.dist = d;
        row.input_class = cls;
        row.field = f;
        row.gran = g;
        row.runs = static_cast<int>(runs.size());
        row.ill = st.ill;
        row.elements = st.elements;
        row.qk_false = st.qk_false;
        row.ac_false = st.ac_false;
        row.target = power_target(p, g, f);
        validation::Rng rng(s.seed * 1000003 + pi * 100003 + di * 1009 +
                            fi * 101 + gi);
        std::vector<Trial> ts;
        for (int k = 0; k < trials && !good.empty(); ++k) {
          const RunData& run = *good[static_cast<size_t>(k) % good.size()];
          Trial t = runner.run(cases[run.case_index], run, f, g, rng);
          if (!t.valid) continue;
          ++row.trials;
          row.ac_trials += t.ac_valid;
          row.injected += t.injected;
          row.injected_ill += t.ill;
          row.checks += t.checks;
          if (!(t.rel_bound <= row.rel_bound)) row.rel_bound = t.rel_bound;
          row.mismatches += static_cast<int>(t.mismatches.size());
          for (auto& m : t.mismatches)
            row_mismatches[ri].push_back(std::move(m));
          ts.push_back(std::move(t));
        }
        aggregate(ts, grid, true, &row.qk_all, &row.qk_all_eff, &row.qk_med,
                  &row.qk_med_eff);
        aggregate(ts, grid, false, &row.ac_all, &row.ac_all_eff, &row.ac_med,
                  &row.ac_med_eff);
      });
      for (size_t ri = 0; ri < n_rows; ++ri) {
        pr.checks += rows[ri].checks;
        pr.rows.push_back(rows[ri]);
        for (auto& m : row_mismatches[ri])
          pr.mismatches.push_back(std::move(m));
      }
    }
  }
  if (progress) std::cerr << "\r" << std::string(40, ' ') << "\r" << std::flush;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();

  // The table.
  std::string problems_text;
  for (const AttentionProblem& p : problems) {
    AttentionCase c;
    c.problem = p;
    std::string desc = c.describe();
    desc = desc.substr(0, desc.find(" dist="));
    problems_text += "\n  case: " + desc;
  }
  out << fmt::format(
      "qknorm-check power: the smallest injected relative error r caught\n"
      "  grid {:.0e}..{:.0e}, {} per decade plus the targets ({} points); "
      "{} trials per row, sign {}{}\n"
      "  all = every trial caught at r and above; med = the median trial; "
      "(eff) = the largest relative change\n"
      "  the injection actually made after rounding to the storage format; "
      "assert_close = torch.testing.assert_close\n"
      "  defaults vs the oracle on the same injections. ill-cond: elements "
      "with kappa_e > {:g} (excluded from\n"
      "  element targets; rows/heads/fields inject them too). false alarms: "
      "runs whose uncorrupted field FAILs.\n",
      grid.front(), grid.back(), o.per_decade, grid.size(), trials, o.sign,
      problems_text, validation::kIllConditioned);
  const std::string head = fmt::format(
      "{:<4} {:<8} {:<13} {:<3} {:<7} | {:>7} {:>9} {:>7} | {:<15} | {:>7} "
      "{:>9} {:>7} | {:<20} | {}",
      "prec", "dist", "class", "fld", "gran", "qk all", "(eff)", "qk med",
      "target", "ac all", "(eff)", "ac med", "ill-cond", "false alarms qk/ac");
  const double lo = grid.front();
  for (size_t i = 0; i < pr.rows.size(); ++i) {
    const PowerRow& r = pr.rows[i];
    if (i == 0 || r.prec != pr.rows[i - 1].prec)
      out << "\n" << head << "\n" << std::string(head.size(), '-') << "\n";
    else if (r.dist != pr.rows[i - 1].dist)
      out << "\n";
    out << fmt::format(
        "{:<4} {:<8} {:<13} {:<3} {:<7} | {:>7} {:>9} {:>7} | {:<15} | {:>7} "
        "{:>9} {:>7} | {:<20} | {}/{} {}/{}\n",
        name(r.prec), validation::name(r.dist), validation::name(r.input_class),
        tensor_name(r.field), name(r.gran), thr(r.qk_all, lo),
        "(" + thr(r.qk_all_eff) + ")", thr(r.qk_med, lo), target_text(r),
        thr(r.ac_all, lo), "(" + thr(r.ac_all_eff) + ")", thr(r.ac_med, lo),
        ill_text(r), r.qk_false, r.runs, r.ac_false, r.runs);
  }
  // Footer: targets, false alarms, the verdict cross-check, the exit status.
  int with_target = 0, met = 0;
  std::vector<std::string> misses;
  for (const PowerRow& r : pr.rows) {
    if (!r.has_target()) continue;
    ++with_target;
    if (r.met() && !std::isnan(r.qk_all)) {
      ++met;
    } else {
      misses.push_back(fmt::format(
          "{} {} {} {}: {} > {:.0e} (x{:.3g})", name(r.prec),
          validation::name(r.dist), tensor_name(r.field), name(r.gran),
          thr(r.qk_all), r.target, r.qk_all / r.target));
    }
  }
  out << fmt::format(
      "\ntargets (issue 15; element: f32 1e-4, f16 1e-2, bf16 3e-2; row/head: "
      "f32 1e-5, 16-bit 3e-3; on O dQ dK dV): {} of {} met\n",
      met, with_target);
  for (const auto& m : misses) out << "  MISS " << m << "\n";
  out << fmt::format(
      "false alarms, qknorm verdict: {} of {} (entry, case, distribution) "
      "runs{}\n",
      pr.qk_false.size(), pr.runs,
      pr.qk_false.empty() ? "" : "  <-- FALSE ALARMS");
  for (const auto& m : pr.qk_false) out << "  !!! FALSE ALARM " << m << "\n";
  out << fmt::format("false alarms, assert_close defaults: {} of {} runs\n",
                     pr.ac_false.size(), pr.runs);
  for (const auto& m : pr.ac_false) out << "  assert_close fails " << m << "\n";
  out << fmt::format(
      "verdict cross-check (judge_attention on the whole corrupted field at "
      "each trial's threshold and one step below): {} checks, {} "
      "disagreements\n",
      pr.checks, pr.mismatches.size());
  for (const auto& m : pr.mismatches) out << "  !!! DISAGREEMENT " << m << "\n";
  for (const auto& m : pr.skipped) out << "  skipped: " << m << "\n";
  const bool pass =
      pr.qk_false.empty() && pr.mismatches.empty() && met == with_target;
  out << fmt::format("wall time {:.1f} s; exit {} ({})\n", seconds,
                     pass ? kExitPass : kExitFail,
                     pass ? "no false alarm, every target met"
                          : "false alarms, missed targets or disagreements");

  int rc = pass ? kExitPass : kExitFail;
  try {
    dump.finish();
    if (dump.enabled()) out << "wrote " << o.torch_dump << "/manifest.json\n";
  } catch (const std::exception& e) {
    err << "qknorm-check power: " << e.what() << "\n";
    return kExitInput;
  }
  if (o.out.empty()) return rc;

  // CSV, gnuplot data and script.
  std::ostringstream csv;
  csv << "precision,dist,field,granularity,trials,assert_close_trials,runs,"
         "qknorm_all,qknorm_all_"
         "eff,qknorm_median,qknorm_median_eff,assert_close_all,assert_close_"
         "all_eff,assert_close_median,assert_close_median_eff,target,target_"
         "met,ill_conditioned,elements,injected,injected_ill_conditioned,"
         "qknorm_false_alarms,assert_close_false_alarms,verdict_checks,"
         "verdict_disagreements,qknorm_rel_bound_max,class\n";
  for (const PowerRow& r : pr.rows)
    csv << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},"
        "{},{},{},{}\n",
        name(r.prec), validation::name(r.dist), validation::name(r.field),
        name(r.gran), r.trials, r.ac_trials, r.runs, csv_num(r.qk_all),
        csv_num(r.qk_all_eff), csv_num(r.qk_med), csv_num(r.qk_med_eff),
        csv_num(r.ac_all), csv_num(r.ac_all_eff), csv_num(r.ac_med),
        csv_num(r.ac_med_eff), csv_num(r.target),
        r.has_target() ? (r.met() ? "yes" : "no") : "", r.ill, r.elements,
        r.injected, r.injected_ill, r.qk_false, r.ac_false, r.checks,
        r.mismatches, csv_num(r.rel_bound), validation::name(r.input_class));
  // One data block per precision: x, label, target, then qk and ac
  // thresholds (every trial) per distribution.
  std::vector<Precision> plot_precs;
  for (const PowerRow& r : pr.rows)
    if (std::find(plot_precs.begin(), plot_precs.end(), r.prec) ==
        plot_precs.end())
      plot_precs.push_back(r.prec);
  std::ostringstream dat;
  for (Precision p : plot_precs) {
    dat << "# " << name(p) << ": x label target";
    for (Distribution d : dists)
      dat << " qk_" << validation::name(d) << " ac_" << validation::name(d);
    dat << "\n";
    int x = 0;
    for (Field f : fields)
      for (Granularity g : grans) {
        dat << x++ << " \"" << tensor_name(f) << "/" << name(g) << "\" "
            << plot_num(power_target(p, g, f));
        for (Distribution d : dists) {
          const PowerRow* row = nullptr;
          for (const PowerRow& r : pr.rows)
            if (r.prec == p && r.dist == d && r.field == f && r.gran == g)
              row = &r;
          dat << " " << plot_num(row ? row->qk_all : NAN) << " "
              << plot_num(row ? row->ac_all : NAN);
        }
        dat << "\n";
      }
    dat << "\n\n";
  }
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                  "#ff7f0e", "#8c564b", "#e377c2"};
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400," << 420 * plot_precs.size() + 80
     << " font 'Sans,10'\n"
     << "set output '" << o.out << ".png'\n"
     << "set datafile missing 'NaN'\n"
     << "set multiplot layout " << plot_precs.size()
     << ",1 title \"qknorm-check power: smallest injected relative error "
        "caught in every trial (lower is better)\\nsolid: qknorm verdict; "
        "dashed: torch.testing.assert\\\\_close defaults; black x: issue 15 "
        "target; never caught drawn at "
     << kPlotCeiling << "\"\n"
     << "set grid\nset key outside right top font 'Sans,8'\n"
     << "set logscale y\nset format y '10^{%L}'\n"
     << "set yrange [" << grid.front() / 2 << ":" << kPlotCeiling * 3 << "]\n"
     << "set xtics rotate by -45 font 'Sans,8'\nset xrange [-0.5:"
     << fields.size() * grans.size() - 0.5 << "]\n"
     << "set ylabel 'detection threshold r'\n";
  for (size_t pi = 0; pi < plot_precs.size(); ++pi) {
    gp << "set title '" << name(plot_precs[pi]) << "'\nplot ";
    for (size_t di = 0; di < dists.size(); ++di) {
      const char* c = kColors[di % 7];
      const int col = 4 + 2 * static_cast<int>(di);
      gp << (di ? ", \\\n     " : "") << "'" << o.out << ".dat' index " << pi
         << " using 1:" << col << ":xtic(2) with linespoints lw 2 pt 7 lc rgb '"
         << c << "' title 'qknorm " << validation::name(dists[di]) << "', \\\n"
         << "     '" << o.out << ".dat' index " << pi << " using 1:" << col + 1
         << " with linespoints dt 2 lw 1.5 pt 6 lc rgb '" << c
         << "' title 'assert\\_close " << validation::name(dists[di]) << "'";
    }
    gp << ", \\\n     '" << o.out << ".dat' index " << pi
       << " using 1:3 with points pt 2 ps 2 lw 2 lc rgb '#000000' title "
          "'target'\n";
  }
  gp << "unset multiplot\n";
  try {
    validation::write_file_bytes(o.out + ".csv", csv.str());
    validation::write_file_bytes(o.out + ".dat", dat.str());
    validation::write_file_bytes(o.out + ".gp", gp.str());
  } catch (const Error& e) {
    err << "qknorm-check power: " << e.what() << "\n";
    return kExitInput;
  }
  out << "wrote " << o.out << ".csv (" << pr.rows.size() << " rows)\n";
  if (o.no_plot) return rc;
  const int g = run_gnuplot(o.out + ".gp");
  if (g != 0) {
    err << "qknorm-check power: gnuplot " << (g == 127 ? "not found" : "failed")
        << " (exit " << g << "); the CSV and " << o.out << ".gp are written\n";
    return rc == kExitPass ? kExitTool : rc;
  }
  out << "wrote " << o.out << ".png\n";
  return rc;
}

}  // namespace qknorm::cli
