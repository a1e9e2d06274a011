#include "cli/sweep.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "cli/app.h"
#include "cli/cost.h"
#include "cli/pool.h"
#include "cli/tiles.h"
#include "qknorm/error.h"
#include "qknorm/name_table.h"
#include "reference/reference.h"
#include "validation/metrics.h"
#include "validation/tensor_io.h"

extern char** environ;

namespace qknorm::cli {
namespace {

// Plot range limits for log axes: an exactly zero error is drawn at kPlotFloor
// and a non-finite output (NaN/Inf where the oracle is finite) at kPlotCeiling,
// so both stay visible instead of vanishing from a log plot. The CSV keeps the
// raw values.
constexpr double kPlotFloor = 1e-20;
constexpr double kPlotCeiling = 10;

struct Defaults {
  double from, to;
  int points;
  const char* shape;
  bool log_x;
  const char* label;
};

Defaults defaults_for(const std::string& over) {
  // seq: the oracle's O(n^2 D) long-double backward dominates; 8..1024 runs in
  // well under a minute on 2 cores (4096 is reachable with --to).
  if (over == "seq")
    return {8,          1024, 0,
            "1x2x8x64", true, "sequence length n (queries = keys = n)"};
  // g: the learned range 10..25 (NUMERICS.md) with margin.
  if (over == "g") return {0, 30, 16, "1x8x72x64", false, "g"};
  // magnitude: q and k scaled by c, from 1e-20 to 1e20 (every 100x).
  if (over == "magnitude")
    return {1e-20,       1e20, 21,
            "1x2x64x64", true, "input magnitude c (q, k scaled by c)"};
  throw Error("--over", {},
              "must be seq, g, magnitude or tiles (got '" + over + "')");
}

}  // namespace

// One color per precision, the same in every sweep's plot.
constexpr NamedValue<Precision> kSweepColors[] = {
    {Precision::kF64, "#000000"},
    {Precision::kF32, "#1f77b4"},
    {Precision::kBF16, "#ff7f0e"},
    {Precision::kF16, "#d62728"},
};

std::string sweep_color(Precision p) {
  return name_in(kSweepColors, p, "#777777");
}

namespace {

// Mean over rows with a visible key of max_j P_ij, from the oracle.
double mean_max_prob(const validation::AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  std::vector<long double> q(c.q.begin(), c.q.end()), k(c.k.begin(), c.k.end());
  std::vector<long double> probs(
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
  reference::attention_probabilities<long double>(p, q.data(), k.data(),
                                                  probs.data());
  long double sum = 0;
  int64_t rows = 0;
  for (size_t r = 0; r < probs.size() / static_cast<size_t>(p.kv_len); ++r) {
    long double m = 0;
    for (int64_t j = 0; j < p.kv_len; ++j)
      m = std::max(
          m, probs[r * static_cast<size_t>(p.kv_len) + static_cast<size_t>(j)]);
    if (m > 0) {
      sum += m;
      ++rows;
    }
  }
  return rows ? static_cast<double>(sum / rows) : 0.0;
}

double scaled_err(const std::vector<double>& a,
                  const std::vector<long double>& e, Precision p) {
  const validation::ErrorStats s = validation::compare(a, e, p);
  if (s.nonfinite_mismatch) return INFINITY;
  return s.scale > 0 ? s.max_abs / s.scale : s.max_abs;
}

std::string plot_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (!std::isfinite(v)) return fmt::format("{:g}", kPlotCeiling);
  return fmt::format("{:.6e}", std::max(v, kPlotFloor));
}

}  // namespace

int run_gnuplot(const std::string& script) {
  const char* argv[] = {"gnuplot", script.c_str(), nullptr};
  pid_t pid;
  if (posix_spawnp(&pid, "gnuplot", nullptr, nullptr,
                   const_cast<char* const*>(argv), environ) != 0)
    return 127;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::vector<Precision> precisions_of(
    const std::vector<const Backend*>& entries) {
  std::vector<Precision> precs;
  for (const Backend* b : entries)
    if (std::find(precs.begin(), precs.end(), b->precision()) == precs.end())
      precs.push_back(b->precision());
  return precs;
}

std::vector<double> sweep_values(const SweepOptions& o) {
  const Defaults d = defaults_for(o.over);
  const double from = std::isnan(o.from) ? d.from : o.from;
  const double to = std::isnan(o.to) ? d.to : o.to;
  if (!std::isfinite(from) || !std::isfinite(to) || from >= to)
    throw Error("--from/--to", {}, "need finite --from < --to");
  if (d.log_x && from <= 0)
    throw Error("--from", {}, "must be > 0 for --over " + o.over);
  if (o.over == "seq" && (from < 1 || to > 65536))
    throw Error("--from/--to", {}, "sequence lengths must lie in [1, 65536]");
  std::vector<double> xs;
  if (o.over == "seq" && o.points == 0) {
    for (double n = std::round(from); n <= to; n *= 2) xs.push_back(n);
    if (xs.back() != std::round(to)) xs.push_back(std::round(to));
    return xs;
  }
  const int n = o.points ? o.points : d.points;
  for (int i = 0; i < n; ++i) {
    const double t = static_cast<double>(i) / (n - 1);
    double x =
        d.log_x ? std::exp(std::log(from) + t * (std::log(to) - std::log(from)))
                : from + t * (to - from);
    if (o.over == "seq") x = std::round(x);
    if (xs.empty() || x != xs.back()) xs.push_back(x);
  }
  return xs;
}

namespace {

// The problem of the sweep's point at swept value x (--over magnitude
// scales the drawn q and k afterwards).
AttentionProblem point_problem(const SweepOptions& o, const SuiteOptions& s,
                               double x) {
  const Defaults d = defaults_for(o.over);
  AttentionProblem p =
      parse_shape(s.shapes.empty() ? d.shape : s.shapes.front());
  p.eps = s.eps;
  if (o.over == "seq") p.q_len = p.kv_len = static_cast<int64_t>(x);
  p.g = !s.g.empty()      ? s.g.front()
        : o.over == "g"   ? x
        : o.over == "seq" ? (x > 1 ? g_init(x) : 0.0)
                          : g_init(72);
  if (!s.masks.empty()) apply_mask(s.masks.front(), &p);
  return p;
}

}  // namespace

CostEstimate estimate_value_sweep(const SweepOptions& o, const SuiteOptions& s,
                                  const std::vector<const Backend*>& entries,
                                  int threads) {
  std::vector<AttentionProblem> points;
  Suite est;  // for largest_work only
  for (double x : sweep_values(o)) {
    points.push_back(point_problem(o, s, x));
    est.attention.push_back({points.back(), {}, 0});
  }
  // The full oracle's and the naive baselines' rates are calibrate's.
  CostRates r =
      calibrate(entries, ExecConfig{threads}, false, largest_work(est));
  calibrate_probabilities(&r);
  return estimate_sweep(r, entries, points, !o.no_sdpa);
}

std::vector<SweepPoint> run_sweep_points(
    const SweepOptions& o, const SuiteOptions& s,
    const std::vector<const Backend*>& entries, int threads, bool progress) {
  const std::vector<double> xs = sweep_values(o);
  const validation::Distribution dist =
      s.dists.empty() ? validation::Distribution::kGaussian
                      : parse_dist(s.dists.front());
  const std::vector<Precision> precs = precisions_of(entries);
  // Each (x, variant) is a step of the pool (cli/pool.h): its case, its
  // oracles and its entries' points land in its own slot, concatenated in
  // the serial order after.
  const ExecConfig exec = pooled_exec(ExecConfig{threads}, o.jobs);
  const size_t n_variants = o.no_sdpa ? 1 : 2;
  std::vector<std::vector<SweepPoint>> slots(xs.size() * n_variants);
  std::mutex progress_mu;
  parallel_for(slots.size(), o.jobs, [&](size_t slot) {
    const size_t xi = slot / n_variants;
    const bool sdpa = slot % n_variants == 1;
    std::vector<SweepPoint>& pts = slots[slot];
    const double x = xs[xi];
    const AttentionProblem p = point_problem(o, s, x);
    validation::AttentionCase c0 =
        validation::make_attention_case(p, dist, s.seed + xi);
    if (o.over == "magnitude") {
      for (double& v : c0.q) v *= x;
      for (double& v : c0.k) v *= x;
    }
    {
      validation::AttentionCase cv = c0;
      cv.problem.variant = sdpa ? Variant::kSDPA : Variant::kQKNorm;
      const double max_prob = mean_max_prob(cv);
      for (Precision prec : precs) {
        const validation::AttentionCase rc = validation::round_inputs(cv, prec);
        // The swept magnitudes can leave the format: such a point is recorded
        // with its reason, not judged.
        std::string skip;
        for (const auto* t : {&rc.q, &rc.k})
          for (double v : *t)
            if (!std::isfinite(v))
              skip = "inputs overflow " + std::string(name(prec));
        validation::OracleAttention orc;
        if (skip.empty()) orc = validation::oracle_attention(rc);
        std::vector<const Backend*> line_entries;
        if (sdpa) {
          line_entries.push_back(&validation::naive_for(prec));
        } else {
          for (const Backend* b : entries)
            if (b->precision() == prec) line_entries.push_back(b);
        }
        for (const Backend* b : line_entries) {
          SweepPoint pt;
          pt.line = sdpa ? "sdpa " + b->name() : b->name();
          pt.variant = sdpa ? "sdpa" : "qknorm";
          pt.precision = std::string(name(prec));
          pt.x = x;
          pt.max_prob = max_prob;
          pt.input_class = validation::input_class(rc);
          pt.o_err = pt.dq_err = NAN;
          if (progress) {
            std::lock_guard<std::mutex> lock(progress_mu);
            std::cerr << fmt::format("\r[{:>3}/{}] {}={:<10g} {:<28}", xi + 1,
                                     xs.size(), o.over, x, pt.line)
                      << std::flush;
          }
          if (!skip.empty()) {
            pt.error = skip;
          } else if (!b->available()) {
            pt.error = "entry not available on this CPU";
          } else {
            try {
              // Forward first: a forward that overflows (sdpa at huge c)
              // gives a non-finite O, drawn at the ceiling; the backward then
              // does not run on that O (validation/run.h) and dQ is counted
              // non-finite too.
              const validation::AttentionResult f =
                  validation::run_attention_forward(*b, rc, exec);
              pt.o_err = scaled_err(f.o, orc.o, prec);
              if (!b->has_attention_backward()) {
                // A forward-only entry: no dQ (NaN, which the plot leaves
                // out, not the ceiling of a failed backward).
                pt.dq_err = NAN;
                pt.error = validation::kForwardOnlyNote;
              } else {
                const validation::AttentionResult r =
                    validation::run_attention(*b, rc, exec);
                pt.dq_err = scaled_err(r.dq, orc.dq, prec);
                if (r.backward_input != validation::BackwardInput::kEntry &&
                    r.backward_input !=
                        validation::BackwardInput::kRecomputes) {
                  pt.dq_err = INFINITY;
                  pt.error = r.backward_note;
                }
              }
            } catch (const std::exception& e) {
              if (std::isinf(pt.o_err)) pt.dq_err = INFINITY;
              pt.error = e.what();
            }
          }
          pts.push_back(pt);
        }
      }
    }
  });
  std::vector<SweepPoint> pts;
  for (std::vector<SweepPoint>& v : slots)
    for (SweepPoint& pt : v) pts.push_back(std::move(pt));
  if (progress) std::cerr << "\r" << std::string(60, ' ') << "\r" << std::flush;
  return pts;
}

bool within_budget(const CostEstimate& cost, double max_seconds,
                   const std::string& cut, std::ostream& err) {
  err << "qknorm-check sweep: " << describe(cost) << "\n" << std::flush;
  if (cost.total() <= max_seconds) return true;
  err << fmt::format(
      "qknorm-check sweep: stopped before starting: the estimate ({}) "
      "exceeds --max-seconds {:.0f}. {}, judge fewer entries (--backend, "
      "--target, --precision; largest: {}), or raise --max-seconds (before "
      "the subcommand).\n",
      duration_text(cost.total()), max_seconds, cut, top_entries_text(cost));
  return false;
}

int run_sweep(const SweepOptions& o, const SuiteOptions& s, int threads,
              std::ostream& out, std::ostream& err, bool progress) {
  if (o.over == "tiles")
    return run_tile_sweep(o, s, threads, out, err, progress);
  std::vector<SweepPoint> pts;
  try {
    const std::vector<const Backend*> entries =
        select_entries(all_backends(), s);
    // The estimate first; past the budget the sweep stops before it starts
    // (issue 32, as --over tiles does): --over seq --to 4096 is O(n^2 D)
    // long-double oracles per point and precision.
    if (!within_budget(estimate_value_sweep(o, s, entries, threads),
                       o.max_seconds,
                       "Sweep fewer or smaller points (--to, --points, "
                       "--shape), leave out the sdpa lines (--no-sdpa)",
                       err))
      return kExitUsage;
    pts = run_sweep_points(o, s, entries, threads, progress);
  } catch (const Error& e) {
    err << "qknorm-check sweep: " << e.what() << "\n";
    return kExitUsage;
  }
  const Defaults d = defaults_for(o.over);
  // CSV: raw values ("inf" for non-finite output, empty where not run).
  std::ostringstream csv;
  csv << "over,x,line,variant,precision,o_err,dq_err,mean_max_prob,note,"
         "class\n";
  auto raw = [](double v) {
    return std::isnan(v) ? std::string() : fmt::format("{:.6e}", v);
  };
  for (const SweepPoint& p : pts)
    csv << fmt::format("{},{:g},{},{},{},{},{},{:.6f},\"{}\",{}\n", o.over, p.x,
                       p.line, p.variant, p.precision, raw(p.o_err),
                       raw(p.dq_err), p.max_prob, p.error,
                       validation::name(p.input_class));
  // Data blocks for gnuplot, one per line, in first-seen order.
  std::vector<std::string> lines;
  std::map<std::string, const SweepPoint*> first;
  for (const SweepPoint& p : pts)
    if (!first.count(p.line)) {
      first[p.line] = &p;
      lines.push_back(p.line);
    }
  std::ostringstream dat;
  for (const std::string& l : lines) {
    dat << "# " << l << "\n";
    for (const SweepPoint& p : pts)
      if (p.line == l)
        dat << fmt::format("{:.9g} {} {} {:.9g}\n", p.x, plot_value(p.o_err),
                           plot_value(p.dq_err), p.max_prob);
    dat << "\n\n";
  }
  const std::string title =
      fmt::format("qknorm-check sweep over {} (shape {}, dist {}, seed {})",
                  o.over, s.shapes.empty() ? d.shape : s.shapes.front(),
                  s.dists.empty() ? "gaussian" : s.dists.front(), s.seed);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1500,1300 font 'Sans,10'\n"
     << "set output '" << o.out << ".png'\n"
     << "set datafile missing 'NaN'\n"
     // Double quotes: gnuplot expands \n only there.
     << "set multiplot layout 3,1 title \"" << title
     << "\\nerrors against the long-double oracle; exact 0 drawn at 1e-20, "
        "non-finite "
        "output (NaN/Inf) at 10; gaps: inputs overflow the format\"\n"
     << "set grid\nset key outside right top font 'Sans,8'\n"
     << (d.log_x ? "set logscale x\nset format x '10^{%L}'\n" : "")
     << "set autoscale xfix\n"
     << "set xlabel '" << d.label << "'\n";
  auto plot = [&](int col, const std::string& ylabel) {
    gp << "set logscale y\nset format y '10^{%L}'\n"
       << "set ylabel '" << ylabel << "'\nplot ";
    for (size_t i = 0; i < lines.size(); ++i) {
      const SweepPoint& p = *first[lines[i]];
      Precision prec;
      parse_precision(p.precision, &prec);
      const bool sdpa = p.variant == "sdpa";
      gp << (i ? ", \\\n     " : "") << "'" << o.out << ".dat' index " << i
         << " using 1:" << col << " with linespoints lc rgb '"
         << sweep_color(prec) << "' dt " << (sdpa ? 2 : 1 + i % 4) << " lw "
         << (sdpa ? 3 : 1.5) << " pt " << (sdpa ? 6 : 1 + i % 13) << " title '"
         << p.line << "'";
    }
    gp << "\n";
  };
  plot(2, "max|O - oracle| / max|O|");
  plot(3, "max|dQ - oracle| / max|dQ|");
  gp << "unset logscale y\nset format y '%g'\nset yrange [0:1.05]\n"
     << "set ylabel 'softmax saturation: mean_i max_j P_{ij} (oracle)'\nplot ";
  int n = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const SweepPoint& p = *first[lines[i]];
    // One saturation curve per variant (it is a property of the inputs).
    bool seen = false;
    for (size_t j = 0; j < i; ++j)
      seen = seen || first[lines[j]]->variant == p.variant;
    if (seen) continue;
    gp << (n++ ? ", \\\n     " : "") << "'" << o.out << ".dat' index " << i
       << " using 1:4 with linespoints lw 3 dt "
       << (p.variant == "sdpa" ? 2 : 1) << " lc rgb '"
       << (p.variant == "sdpa" ? "#9467bd" : "#2ca02c") << "' title '"
       << p.variant << "'";
  }
  gp << "\nunset multiplot\n";
  // The input classes the points' cases fall in (validation/case.h):
  // --over magnitude leaves the realistic class at large and small scales.
  std::string classes;
  for (validation::InputClass k : validation::kAllInputClasses) {
    const auto n = std::count_if(pts.begin(), pts.end(), [&](const auto& p) {
      return p.input_class == k;
    });
    if (n > 0)
      classes += fmt::format("{}{} {}", classes.empty() ? "" : ", ",
                             validation::name(k), n);
  }
  out << "input classes of the points: " << classes << "\n";
  return write_sweep_files(o.out, csv.str(), dat.str(), gp.str(), pts.size(),
                           lines.size(), o.no_plot, kExitPass, out, err);
}

int write_sweep_files(const std::string& prefix, const std::string& csv,
                      const std::string& dat, const std::string& gp,
                      size_t points, size_t lines, bool no_plot, int verdict,
                      std::ostream& out, std::ostream& err) {
  try {
    validation::write_file_bytes(prefix + ".csv", csv);
    validation::write_file_bytes(prefix + ".dat", dat);
    validation::write_file_bytes(prefix + ".gp", gp);
  } catch (const Error& e) {
    err << "qknorm-check sweep: " << e.what() << "\n";
    return kExitInput;
  }
  out << "wrote " << prefix << ".csv (" << points << " points, " << lines
      << " lines)\n";
  if (no_plot || lines == 0) return verdict;
  const int rc = run_gnuplot(prefix + ".gp");
  if (rc != 0) {
    err << "qknorm-check sweep: gnuplot "
        << (rc == 127 ? "not found" : "failed") << " (exit " << rc
        << "); the CSV and " << prefix << ".gp are written\n";
    return verdict == kExitPass ? kExitTool : verdict;
  }
  out << "wrote " << prefix << ".png\n";
  return verdict;
}

}  // namespace qknorm::cli
