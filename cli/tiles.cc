#include "cli/tiles.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "cli/app.h"
#include "cli/cost.h"
#include "cli/pool.h"
#include "qknorm/error.h"
#include "validation/sampled.h"
#include "validation/tensor_io.h"

namespace qknorm::cli {
namespace {

constexpr int64_t kDefaultTo = 32768;
constexpr const char* kDefaultShape = "1x2x16x128";
// Plot limits of the margin axis (log): an exactly zero margin is drawn at
// the floor, an entry that threw (no margin) at the ceiling.
constexpr double kMarginFloor = 1e-6;
constexpr double kMarginCeiling = 1e3;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string join(const std::set<std::string>& s) {
  std::string r;
  for (const std::string& x : s) r += (r.empty() ? "" : " ") + x;
  return r;
}

// The blocks of `entries` of precision `prec` at problem p (> 1 only).
void add_blocks(const std::vector<const Backend*>& entries, Precision prec,
                const AttentionProblem& p, std::set<int64_t>* out) {
  for (const Backend* b : entries)
    if (b->precision() == prec)
      for (int64_t k : b->block_sizes(p))
        if (k > 1) out->insert(k);
}

// "1x2xnx128": the shape with the swept length.
std::string shape_text(const SuiteOptions& s) {
  const AttentionProblem p =
      parse_shape(s.shapes.empty() ? kDefaultShape : s.shapes.front());
  return fmt::format("{}x{}xnx{}", p.batch, p.heads, p.head_dim);
}

// Shell quoting for the reproducer (globs, commas).
std::string quote(const std::string& s) {
  if (s.find_first_of(" *?[]'\"$;&|<>(){}\\") == std::string::npos) return s;
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

std::string reproducer(const SweepOptions& o, const SuiteOptions& s, int64_t n,
                       const std::string& entry) {
  std::string c = fmt::format(
      "qknorm-check sweep --over tiles --from {0} --to {0} --backend {1} "
      "--sample {2} --seed {3} --shape {4}",
      n, quote(entry), o.sample, s.seed,
      s.shapes.empty() ? kDefaultShape : s.shapes.front());
  auto opt = [&](const char* name, const std::string& v) {
    if (!v.empty()) c += fmt::format(" {} {}", name, quote(v));
  };
  if (!s.masks.empty()) opt("--mask", s.masks.front());
  if (!s.g.empty()) opt("--g", fmt::format("{:.17g}", s.g.front()));
  if (!s.dists.empty()) opt("--dist", s.dists.front());
  if (!s.formulations.empty()) opt("--formulation", s.formulations.front());
  if (s.eps_given) opt("--eps", fmt::format("{:.17g}", s.eps));
  if (s.variant != "qknorm") opt("--variant", s.variant);
  if (s.kv_heads) opt("--kv-heads", std::to_string(s.kv_heads));
  opt("--norm", s.norm);
  opt("--norm-axis", s.norm_axis);
  opt("--weight", s.weight);
  opt("--norm-flags", s.flags);
  if (s.scale != 0) opt("--scale", fmt::format("{:.17g}", s.scale));
  if (s.softcap != 0) opt("--softcap", fmt::format("{:.17g}", s.softcap));
  if (!s.rope.empty()) opt("--rope", s.rope);
  return c + " --out tiles-repro";
}

}  // namespace

TileLengths tile_lengths(int64_t from, int64_t to,
                         const std::vector<const Backend*>& entries,
                         const std::function<AttentionProblem(int64_t)>& at) {
  TileLengths L;
  std::map<int64_t, std::set<std::string>> why;
  if (from == to) {
    L.n = {to};
    L.why[to] = "--from = --to";
    for (const Backend* b : entries)
      for (int64_t k : b->block_sizes(at(to)))
        if (k > 1) L.blocks[k] += (L.blocks[k].empty() ? "" : " ") + b->name();
    return L;
  }
  std::vector<int64_t> probes;
  for (int k = 4; (int64_t{1} << k) - 1 <= to; ++k) {
    const int64_t p2 = int64_t{1} << k;
    why[p2 - 1].insert(fmt::format("2^{}-1", k));
    why[p2].insert(fmt::format("2^{}", k));
    why[p2 + 1].insert(fmt::format("2^{}+1", k));
    if (p2 <= to) probes.push_back(p2);
  }
  probes.push_back(to);
  // Block -> who declares it. Probed at every 2^k and at --to: a block may
  // depend on the problem (blas: query_block(kv_len)).
  std::map<int64_t, std::set<std::string>> blocks;
  blocks[64].insert("default");
  blocks[128].insert("default");
  for (int64_t n : probes) {
    const AttentionProblem p = at(n);
    for (const Backend* b : entries)
      for (int64_t k : b->block_sizes(p))
        if (k > 1) blocks[k].insert(b->name());
  }
  for (const auto& [k, who] : blocks) {
    L.blocks[k] = join(who);
    why[k - 1].insert(fmt::format("b{}-1", k));
    why[k].insert(fmt::format("b{}", k));
    why[k + 1].insert(fmt::format("b{}+1", k));
    why[2 * k - 1].insert(fmt::format("2b{}-1", k));
    why[2 * k + 1].insert(fmt::format("2b{}+1", k));
  }
  for (const auto& [n, w] : why)
    if (n >= std::max<int64_t>(from, 1) && n <= to) {
      L.n.push_back(n);
      L.why[n] = join(w);
    }
  return L;
}

AttentionProblem tile_problem(const SuiteOptions& s, int64_t n) {
  if (s.variant != "qknorm" && s.variant != "sdpa")
    throw Error("--variant", {},
                "must be qknorm or sdpa (got '" + s.variant + "')");
  if (!s.formulations.empty() && s.variant == "sdpa")
    throw Error("--formulation", {}, "applies to the qknorm variant only");
  AttentionProblem p =
      parse_shape(s.shapes.empty() ? kDefaultShape : s.shapes.front());
  p.q_len = p.kv_len = n;
  p.g = s.g.empty() ? (n > 1 ? g_init(static_cast<double>(n)) : 0.0)
                    : s.g.front();
  p.eps = s.eps;
  p.variant = s.variant == "sdpa" ? Variant::kSDPA : Variant::kQKNorm;
  apply_mask(s.masks.empty() ? "causal" : s.masks.front(), &p);
  apply_formulation(s, s.formulations.empty() ? "" : s.formulations.front(),
                    &p);
  return p;
}

namespace {

// The sweep's lengths for the options (validated; throws qknorm::Error).
TileLengths lengths_of(const SweepOptions& o, const SuiteOptions& s,
                       const std::vector<const Backend*>& entries) {
  const double from = std::isnan(o.from) ? 1 : o.from,
               to = std::isnan(o.to) ? kDefaultTo : o.to;
  if (from != std::round(from) || to != std::round(to) || from < 1 ||
      to > 65536 || from > to)
    throw Error("--from/--to", {},
                "--over tiles needs integer lengths 1 <= --from <= --to <= "
                "65536");
  if (o.points != 0)
    throw Error("--points", {},
                "does not apply to --over tiles (the lengths are the tile "
                "boundaries)");
  if (o.sample < 1) throw Error("--sample", {}, "must be >= 1");
  // The sweep judges with the sampled oracle, which takes neither.
  if (s.softcap != 0)
    throw Error("--softcap", {},
                "--over tiles judges with the sampled oracle, which does not "
                "take a logit softcap yet");
  if (!s.rope.empty())
    throw Error("--rope", {},
                "--over tiles judges with the sampled oracle, which does not "
                "take RoPE yet");
  for (const std::string& m : s.masks)
    if (m.find("window:") != std::string::npos)
      throw Error("--mask", {},
                  "--over tiles judges with the sampled oracle, which does "
                  "not take a sliding window yet");
  const auto problem_at = [&](int64_t n) { return tile_problem(s, n); };
  TileLengths L = tile_lengths(static_cast<int64_t>(from),
                               static_cast<int64_t>(to), entries, problem_at);
  for (int64_t n : L.n) (void)problem_at(n);  // every length is valid
  return L;
}

validation::Distribution dist_of(const SuiteOptions& s) {
  return s.dists.empty() ? validation::Distribution::kGaussian
                         : parse_dist(s.dists.front());
}

}  // namespace

CostEstimate estimate_tile_sweep(const SweepOptions& o, const SuiteOptions& s,
                                 const std::vector<const Backend*>& entries,
                                 int threads) {
  const TileLengths L = lengths_of(o, s, entries);
  // One sampled case per length, with one oracle per (length, precision)
  // and every entry once: what run_tile_points does.
  Suite est;
  for (int64_t n : L.n)
    est.attention.push_back(
        {tile_problem(s, n), dist_of(s), s.seed + static_cast<uint64_t>(n)});
  const ExecConfig exec{threads};
  const CostRates r = calibrate(entries, exec, true, largest_work(est));
  return estimate(r, entries, est, false, o.sample, threads, 1);
}

std::vector<TilePoint> run_tile_points(
    const SweepOptions& o, const SuiteOptions& s,
    const std::vector<const Backend*>& entries, int threads, bool progress,
    TileLengths* lengths_out, std::ostream* log) {
  const auto problem_at = [&](int64_t n) { return tile_problem(s, n); };
  const TileLengths L = lengths_of(o, s, entries);
  if (lengths_out) *lengths_out = L;
  const validation::Distribution dist = dist_of(s);
  const std::vector<Precision> precs = precisions_of(entries);
  std::vector<const Backend*> registry(all_backends().entries().begin(),
                                       all_backends().entries().end());
  // The lengths run on the pool (o.jobs, cli/pool.h), each into its own
  // slot; its log lines are written in length order as the lengths finish.
  // With jobs > 1 entries run on one thread each unless --threads
  // (cli/pool.h); the sampled oracle's pass keeps every core (the longest
  // lengths dominate, often alone at the end; its bits do not depend on
  // its thread count).
  const ExecConfig exec = pooled_exec(ExecConfig{threads}, o.jobs);
  const int pass_threads =
      threads > 0
          ? threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // ETA weights: n^2 per oracle and per entry run.
  double total = 0, done = 0;
  for (int64_t n : L.n)
    total += static_cast<double>(n) * static_cast<double>(n) *
             static_cast<double>(entries.size() + precs.size());
  const Clock::time_point t0 = Clock::now();
  std::mutex mu;  // guards done, the progress line and the log
  auto show = [&](size_t i, int64_t n, const std::string& what) {
    if (!progress) return;
    std::lock_guard<std::mutex> lock(mu);
    const double el = since(t0);
    const std::string eta =
        done > 0 ? fmt::format(" ETA {:.0f} s", el * (total - done) / done)
                 : std::string();
    std::cerr << fmt::format("\r[{:>3}/{}] n={:<6} {:<24}{:<14}", i + 1,
                             L.n.size(), n, what, eta)
              << std::flush;
  };
  std::vector<std::vector<TilePoint>> slots(L.n.size());
  std::vector<std::string> logs(L.n.size());
  std::vector<bool> finished(L.n.size(), false);
  size_t logged = 0;  // lengths whose log lines are written
  auto add_done = [&](double x) {
    std::lock_guard<std::mutex> lock(mu);
    done += x;
  };
  parallel_for(L.n.size(), o.jobs, [&](size_t i) {
    std::vector<TilePoint>& pts = slots[i];
    std::ostringstream length_log;
    const int64_t n = L.n[i];
    const double w = static_cast<double>(n) * static_cast<double>(n);
    const AttentionProblem p = problem_at(n);
    const Clock::time_point tn = Clock::now();
    double worst = -1;
    std::string worst_at;
    int fails = 0;
    for (Precision prec : precs) {
      std::vector<const Backend*> line;
      for (const Backend* b : entries)
        if (b->precision() == prec) line.push_back(b);
      // The case of this length: seeded by n, so that a reproducer running
      // the one length draws the same inputs and sample.
      const uint64_t seed = s.seed + static_cast<uint64_t>(n);
      const validation::AttentionCase rc = validation::round_inputs(
          validation::make_attention_case(p, dist, seed, prec), prec);
      validation::SampleOptions so;
      so.rows = o.sample;
      so.seed = seed;
      so.threads = pass_threads;
      std::set<int64_t> blocks;
      add_blocks(registry, prec, p, &blocks);
      add_blocks(entries, prec, p, &blocks);
      so.blocks.assign(blocks.begin(), blocks.end());
      show(i, n, fmt::format("oracle {}", name(prec)));
      validation::SampledOracle oracle;
      std::string oracle_error;
      const Clock::time_point to0 = Clock::now();
      try {
        oracle = validation::sampled_oracle(rc, prec, so);
      } catch (const std::exception& e) {
        oracle_error = e.what();
      }
      const double oracle_s = since(to0);
      add_done(w);
      for (const Backend* b : line) {
        TilePoint pt;
        pt.n = n;
        pt.entry = b->name();
        pt.precision = std::string(name(prec));
        pt.why = L.why.at(n);
        pt.input_class = validation::input_class(rc);
        pt.oracle_seconds = oracle_s;
        pt.query_rows = static_cast<int64_t>(oracle.query_rows.size());
        pt.key_rows = static_cast<int64_t>(oracle.key_rows.size());
        pt.margin = NAN;
        show(i, n, b->name());
        if (!b->available()) {
          pt.note = "entry not available on this CPU";
        } else if (!b->supports(p)) {
          pt.note = "not implemented for this problem";
        } else if (!oracle_error.empty()) {
          pt.run = true;
          pt.note = "sampled oracle failed: " + oracle_error;
        } else {
          pt.run = true;
          const Clock::time_point te = Clock::now();
          try {
            const validation::AttentionResult r =
                validation::run_attention(*b, rc, exec);
            pt.seconds = since(te);
            const validation::AgreementReport rep =
                validation::judge_sampled(rc, oracle, r, b->name());
            pt.pass = rep.pass;
            pt.margin = rep.margin;
            pt.worst_field = rep.worst_field;
            for (const validation::FieldVerdict& f : rep.fields)
              if (field_key(f) == rep.worst_field)
                pt.worst_where = f.worst_where;
            if (!rep.pass)
              pt.note = rep.failure_message() + " [" + oracle.describe() + "]";
          } catch (const std::exception& e) {
            pt.seconds = since(te);
            pt.note = std::string("threw: ") + e.what();
          }
        }
        add_done(w);
        if (pt.run && !pt.pass) {
          ++fails;
          pt.command = reproducer(o, s, n, b->name());
          if (log)
            length_log << (progress ? "\r" : "")
                       << fmt::format("FAIL n={} {}: {}\n  reproduce: {}\n", n,
                                      pt.entry, pt.note, pt.command);
        }
        if (pt.run && !std::isnan(pt.margin) && pt.margin > worst) {
          worst = pt.margin;
          worst_at =
              fmt::format("{} {}{}", pt.entry, pt.worst_field, pt.worst_where);
        }
        pts.push_back(std::move(pt));
      }
    }
    if (log) {
      if (progress) length_log << "\r" << std::string(70, ' ') << "\r";
      length_log << fmt::format(
                        "n={:<6} {:<28} worst margin {:<9} {:<40} {}{:.1f} s",
                        n, "[" + L.why.at(n) + "]",
                        worst < 0 ? std::string("-")
                                  : fmt::format("{:.4g}", worst),
                        worst_at, fails ? fmt::format("{} FAIL ", fails) : "",
                        since(tn))
                 << "\n";
    }
    std::lock_guard<std::mutex> lock(mu);
    logs[i] = length_log.str();
    finished[i] = true;
    for (; logged < L.n.size() && finished[logged]; ++logged)
      if (log) *log << logs[logged] << std::flush;
  });
  std::vector<TilePoint> pts;
  for (std::vector<TilePoint>& v : slots)
    for (TilePoint& pt : v) pts.push_back(std::move(pt));
  if (progress) std::cerr << "\r" << std::string(70, ' ') << "\r" << std::flush;
  return pts;
}

int run_tile_sweep(const SweepOptions& o, const SuiteOptions& s, int threads,
                   std::ostream& out, std::ostream& err, bool progress) {
  const Clock::time_point t0 = Clock::now();
  std::vector<TilePoint> pts;
  TileLengths L;
  std::vector<const Backend*> entries;
  try {
    entries = select_entries(all_backends(), s);
    const double to = std::isnan(o.to) ? kDefaultTo : o.to;
    // The estimate first; past the budget the sweep stops before it starts
    // (issue 19: the sweep to 32768 took 14 to 41 minutes here, silently).
    if (!within_budget(estimate_tile_sweep(o, s, entries, threads),
                       o.max_seconds,
                       "Sweep to a shorter length (--to), sample fewer rows "
                       "(sweep --sample)",
                       err))
      return kExitUsage;
    out << fmt::format(
               "tile sweep: shape {} (q_len = kv_len = n), mask {}, dist {}, "
               "g {}, sample {} rows, seed {} + n, up to n = {:g}; {} "
               "entries\n",
               shape_text(s), s.masks.empty() ? "causal" : s.masks.front(),
               s.dists.empty() ? "gaussian" : s.dists.front(),
               s.g.empty() ? "g_init(n)" : fmt::format("{:g}", s.g.front()),
               o.sample, s.seed, to, entries.size())
        << std::flush;
    pts = run_tile_points(o, s, entries, threads, progress, &L, &out);
  } catch (const Error& e) {
    err << "qknorm-check sweep: " << e.what() << "\n";
    return kExitUsage;
  }
  const double wall = since(t0);
  // CSV.
  std::ostringstream csv;
  csv << "n,entry,precision,pass,margin,worst_field,worst_where,seconds,"
         "oracle_seconds,query_rows,key_rows,why,note,reproduce,class\n";
  auto q = [](std::string t) {
    for (char& c : t)
      if (c == '"')
        c = '\'';
      else if (c == '\n')
        c = ' ';
    return "\"" + t + "\"";
  };
  for (const TilePoint& p : pts)
    csv << fmt::format(
        "{},{},{},{},{},{},{},{:.4f},{:.4f},{},{},{},{},{},{}\n", p.n, p.entry,
        p.precision,
        !p.run   ? ""
        : p.pass ? "1"
                 : "0",
        std::isnan(p.margin) ? std::string() : fmt::format("{:.6e}", p.margin),
        p.worst_field, q(p.worst_where), p.seconds, p.oracle_seconds,
        p.query_rows, p.key_rows, q(p.why), q(p.note), q(p.command),
        validation::name(p.input_class));
  // Per-entry summary, in selection order.
  std::vector<std::string> lines;
  for (const TilePoint& p : pts)
    if (std::find(lines.begin(), lines.end(), p.entry) == lines.end())
      lines.push_back(p.entry);
  int failures = 0;
  out << fmt::format("\n{} lengths ({} to {}), {} points, {:.0f} s wall\n",
                     L.n.size(), L.n.empty() ? 0 : L.n.front(),
                     L.n.empty() ? 0 : L.n.back(), pts.size(), wall);
  out << "blocks:";
  for (const auto& [k, who] : L.blocks)
    out << fmt::format("{} {} ({})", k == L.blocks.begin()->first ? "" : ";", k,
                       who);
  out << "\n"
      << fmt::format("{:<22} {:>6} {:>5} {:>10}  {}\n", "entry", "points",
                     "FAIL", "worst", "at (n, field, index, input class)");
  for (const std::string& l : lines) {
    int run = 0, fail = 0, skipped = 0;
    double worst = -1, secs = 0;
    const TilePoint* at = nullptr;
    for (const TilePoint& p : pts) {
      if (p.entry != l) continue;
      if (!p.run) {
        ++skipped;
        continue;
      }
      ++run;
      secs += p.seconds;
      if (!p.pass) ++fail;
      const double m = std::isnan(p.margin) ? INFINITY : p.margin;
      if (m > worst) {
        worst = m;
        at = &p;
      }
    }
    failures += fail;
    out << fmt::format("{:<22} {:>6} {:>5} {:>10}  {}{}\n", l, run, fail,
                       at ? fmt::format("{:.4g}", worst) : std::string("-"),
                       at ? fmt::format("n={} {}{} {} ({:.0f} s in all)", at->n,
                                        at->worst_field, at->worst_where,
                                        validation::name(at->input_class), secs)
                          : std::string(),
                       skipped ? fmt::format(" ({} not run: {})", skipped,
                                             [&] {
                                               for (const TilePoint& p : pts)
                                                 if (p.entry == l && !p.run)
                                                   return p.note;
                                               return std::string();
                                             }())
                               : std::string());
  }
  // Data blocks: one per entry (n, margin, seconds), then one per
  // precision of the oracle's time (n, seconds).
  std::ostringstream dat;
  for (const std::string& l : lines) {
    dat << "# " << l << "\n";
    for (const TilePoint& p : pts)
      if (p.entry == l && p.run) {
        const double m = std::isnan(p.margin)
                             ? kMarginCeiling
                             : std::max(p.margin, kMarginFloor);
        dat << fmt::format("{} {:.6e} {:.6e}\n", p.n, m,
                           std::max(p.seconds, 1e-6));
      }
    dat << "\n\n";
  }
  std::vector<std::string> precs;
  for (const TilePoint& p : pts)
    if (std::find(precs.begin(), precs.end(), p.precision) == precs.end())
      precs.push_back(p.precision);
  for (const std::string& pr : precs) {
    dat << "# sampled oracle " << pr << "\n";
    int64_t last = -1;
    for (const TilePoint& p : pts)
      if (p.precision == pr && p.n != last) {
        dat << fmt::format("{} {:.6e}\n", p.n,
                           std::max(p.oracle_seconds, 1e-6));
        last = p.n;
      }
    dat << "\n\n";
  }
  // The margin axis shows the line y = 1 above every point.
  double plot_max = 0;
  for (const TilePoint& p : pts)
    if (p.run)
      plot_max =
          std::max(plot_max, std::isnan(p.margin) ? kMarginCeiling : p.margin);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400,1100 font 'Sans,10'\n"
     << "set output '" << o.out << ".png'\n"
     << "set multiplot layout 2,1 title \""
     << fmt::format(
            "qknorm-check sweep --over tiles (shape {}, mask {}, dist {}, "
            "sampled oracle {} rows, seed {} + n)",
            shape_text(s), s.masks.empty() ? "causal" : s.masks.front(),
            s.dists.empty() ? "gaussian" : s.dists.front(), o.sample, s.seed)
     << "\\nn = 2^k - 1, 2^k, 2^k + 1 and block - 1, block, block + 1, "
        "2 block +- 1 of every declared block; margin 0 drawn at "
     << kMarginFloor << ", an entry that threw at " << kMarginCeiling << "\"\n"
     << "set grid\nset key outside right top font 'Sans,8'\n"
     << "set logscale x 2\nset format x '%g'\nset autoscale xfix\n"
     << "set xlabel 'n (queries = keys = n)'\n"
     << "set logscale y\nset format y '10^{%L}'\n"
     << fmt::format("set yrange [*:{:g}]\n", 3 * std::max(1.0, plot_max))
     << "set ylabel 'worst margin err / bound (> 1 FAILs)'\nplot ";
  // One line per entry (the colour gives the precision) of data column col.
  auto plot_entries = [&](int col) {
    for (size_t i = 0; i < lines.size(); ++i) {
      Precision prec = Precision::kF64;
      for (const TilePoint& p : pts)
        if (p.entry == lines[i]) parse_precision(p.precision, &prec);
      gp << (i ? ", \\\n     " : "") << "'" << o.out << ".dat' index " << i
         << " using 1:" << col << " with linespoints lc rgb '"
         << sweep_color(prec) << "' dt " << 1 + i % 4 << " lw 1.5 pt "
         << 1 + i % 13 << " title '" << lines[i] << "'";
    }
  };
  plot_entries(2);
  gp << (lines.empty() ? "" : ", \\\n     ")
     << "1 with lines lc rgb '#d62728' lw 3 dt 2 title 'margin 1 (FAIL "
        "above)'\n";
  gp << "set yrange [*:*]\nset ylabel 'seconds (wall)'\nplot ";
  plot_entries(3);
  for (size_t j = 0; j < precs.size(); ++j) {
    Precision prec = Precision::kF64;
    parse_precision(precs[j], &prec);
    gp << (lines.empty() && j == 0 ? "" : ", \\\n     ") << "'" << o.out
       << ".dat' index " << lines.size() + j << " using 1:2 with lines lc rgb '"
       << sweep_color(prec) << "' dt 3 lw 3 title 'sampled oracle " << precs[j]
       << "'";
  }
  gp << "\nunset multiplot\n";
  const int rc = write_sweep_files(o.out, csv.str(), dat.str(), gp.str(),
                                   pts.size(), lines.size(), o.no_plot,
                                   failures ? kExitFail : kExitPass, out, err);
  if (failures) out << failures << " FAIL (reproducers above and in the CSV)\n";
  return rc;
}

}  // namespace qknorm::cli
