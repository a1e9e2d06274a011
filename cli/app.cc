#include "cli/app.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "cli/compare.h"
#include "cli/cost.h"
#include "cli/coverage.h"
#include "cli/determinism.h"
#include "cli/machine.h"
#include "cli/mutants.h"
#include "cli/options.h"
#include "cli/power.h"
#include "cli/report.h"
#include "cli/suite.h"
#include "cli/sweep.h"
#include "qknorm/error.h"
#include "qknorm/plugin_loader.h"

namespace qknorm::cli {
namespace {

constexpr const char* kExamples = R"(Examples:
  qknorm-check                                  # the default suite, every registry entry
  qknorm-check --backend 'simd:*' --precision bf16 --precision f16
  qknorm-check --target AVX2 --json report.json # machine-readable report as well
  qknorm-check --shape 1x4x128x64 --g 0 --g 25 --mask causal+pad --dist heavy
  qknorm-check --shape 1x4x32768x128 --mask causal --sample 256 --backend 'blas:*'
                                                # long sequences: judge a sample of rows
  qknorm-check sweep --over magnitude --out mag # mag.csv + mag.png, qknorm vs sdpa
  qknorm-check sweep --over seq --from 8 --to 4096 --precision f32
  qknorm-check power --out power                # detection power of the verdict: table, power.csv + power.png
  qknorm-check compare --inputs q.npy k.npy v.npy g.npy dO.npy \
                       --outputs O.npy dQ.npy dK.npy dV.npy dg.npy
  qknorm-check compare --inputs dump.safetensors --outputs dump.safetensors
  qknorm-check mutants                          # the suite's kill table: mutants FAIL, controls PASS
  qknorm-check --backend 'plugin:*' determinism # 3 runs at 1 and 2 threads: bitwise identical, each judged

Exit status: 0 every entry (or the compared output) passes, 1 something FAILs,
2 bad option, 3 unreadable or malformed input file, 4 gnuplot failed. See cli/README.md.
)";

// Writes `text` to `path` ("-": `out`).
void emit(const std::string& path, const std::string& text, std::ostream& out) {
  if (path == "-") {
    out << text;
    return;
  }
  std::ofstream f(path, std::ios::binary);
  if (!f) throw Error(path, {}, "cannot open for writing");
  f << text;
  if (!f) throw Error(path, {}, "write failed");
}

struct Common {
  SuiteOptions suite;
  int threads = 0;
  int jobs = 0;  // --jobs (0: jobs_for(threads))
  std::string json, csv;
  bool no_timing = false;
  std::vector<std::string> plugins;
  bool isolate = false;
  double max_seconds = 600;
  // --sample N: the sampled oracle on N query and N key rows at least per
  // attention case (0: the full oracle); --sample-seed (default: --seed if
  // given, else 1).
  int64_t sample = 0;
  uint64_t sample_seed = 1;
  bool seed_given = false, sample_seed_given = false;
};

void add_common(CLI::App& app, Common& c) {
  SuiteOptions& s = c.suite;
  app.add_option(
         "--shape", s.shapes,
         "Attention shape BxHxNxD or BxHxNqxNkxD (repeatable). Giving any of "
         "--shape/--g/--mask/--dist/--eps/--variant replaces the built-in "
         "attention cases by "
         "the product of the lists (defaults 2x8x72x64; g_init(72), 20 "
         "for that shape, g_init(Nk) for a --shape; causal, pad; "
         "gaussian, wide); the built-in ScaleNorm cases stay unless "
         "--scalenorm")
      ->type_name("SHAPE");
  app.add_option("--g", s.g,
                 "QKNorm scale g (repeatable); g_init(L) = log2(L^2 - L), "
                 "g_init(72) = 12.3197")
      ->type_name("G");
  app.add_option("--eps", s.eps,
                 "Normalization eps (l2: clamp; rms, layer: in the sqrt); "
                 "overrides a preset's")
      ->capture_default_str()
      ->each([&s](const std::string&) { s.eps_given = true; });
  app.add_option("--mask", s.masks,
                 "Mask (repeatable): none, causal, pad (per-batch key lengths "
                 "kv_len - b*kv_len/(2B)), pad:L1,L2,..., window:LEFT,RIGHT "
                 "(FlashAttention's sliding window, -1 unbounded), parts "
                 "joined with + (causal+pad, causal+window:127,0)")
      ->type_name("MASK");
  app.add_option("--dist", s.dists,
                 "Input distribution of the attention cases (repeatable; "
                 "ScaleNorm's gaussian and wide cases stay unless "
                 "--scalenorm): gaussian, uniform, heavy "
                 "(Student t3), "
                 "wide (row scales 10^U[-30,30] within the format), zerorows, "
                 "outliers (outlier rows), mixedv (V rows 10^U[-3,3]), sink "
                 "(first key and value rows 10^U[2,3]), channels (1-4 "
                 "channels 100x in every q, k row)")
      ->type_name("DIST");
  app.add_option("--classes", s.classes,
                 "Only the cases of these input classes run and count toward "
                 "the exit status (comma list, repeatable): realistic, "
                 "extreme-range, degenerate (validation/case.h). Default: "
                 "every class; any FAIL exits 1")
      ->type_name("LIST");
  app.add_option("--variant", s.variant, "Attention variant: qknorm or sdpa")
      ->capture_default_str();
  app.add_option("--formulation", s.formulations,
                 "QK-norm formulation preset (repeatable): paper, qwen3, "
                 "gemma3, olmo2, timm, vit22b, chameleon, ngpt "
                 "(include/qknorm/formulation.h); the flags below override "
                 "single fields")
      ->type_name("PRESET");
  app.add_option("--model", s.model,
                 "Model preset: one attention layer as the model ships it, "
                 "formulation and variants (RoPE, window, softcap, sinks): "
                 "qwen3, olmo2, gemma3-local, gemma3-global, llama4, "
                 "qwen3-next, gpt-oss, gemma2 (include/qknorm/formulation.h); "
                 "after --formulation, before the flags below. Its window "
                 "replaces --mask's; learned sinks are 0 unless given")
      ->type_name("MODEL");
  app.add_option("--kv-heads", s.kv_heads,
                 "Grouped-query attention: kv heads (divides heads)");
  app.add_option("--norm", s.norm,
                 "Normalization of q, k rows: l2, rms, "
                 "layer, none");
  app.add_option("--norm-axis", s.norm_axis,
                 "Normalization row: head (head_dim) or all-heads (OLMo2)");
  app.add_option("--weight", s.weight,
                 "Learned weight of q, k: none, dim ([head_dim]), head-dim "
                 "([heads, head_dim])");
  app.add_option("--norm-flags", s.flags,
                 "Comma list: one-plus-weight (Gemma), bias, shared-qk-weight "
                 "(nGPT), round-before-weight (Qwen3)");
  app.add_option("--scale", s.scale,
                 "Fixed logit scale instead of the learned g (0: as the "
                 "preset)");
  app.add_option("--softcap", s.softcap,
                 "Logit softcap: S' = cap tanh(S / cap) before the mask "
                 "(Gemma 2: 50; 0: off). Entries without it are skipped");
  app.add_option("--rope", s.rope,
                 "RoPE of q and k (attention.h, Rope): DIM[,half|interleaved]"
                 "[,after|before][,theta=X][,offset=N][,angle_f32]"
                 "[,cos_sin_storage], e.g. 64,half,after,theta=1000000 "
                 "(Qwen3). Entries without it are skipped")
      ->type_name("SPEC");
  app.add_option("--sinks", s.sinks,
                 "Attention sinks (gpt-oss; attention.h): one learned logit "
                 "per query head in every row's softmax denominator, X for "
                 "every head or X,Y,... one per head. Entries without them "
                 "are skipped")
      ->type_name("SPEC");
  app.add_option("--scalenorm", s.scalenorm,
                 "ScaleNorm shape ROWSxDIM (repeatable): replaces the built-in "
                 "ScaleNorm cases (144x512 gaussian, 33x31 wide) by these "
                 "shapes, gaussian")
      ->type_name("SHAPE");
  app.add_option("--seed", s.seed, "Base seed; case i uses seed + i")
      ->capture_default_str()
      ->each([&c](const std::string&) { c.seed_given = true; });
  app.add_option(
         "--precision", s.precisions,
         "Only entries of these precisions (repeatable): f64, f32, bf16, f16")
      ->type_name("PREC");
  app.add_option(
         "--backend", s.backends,
         "Only entries whose name or family matches this glob (repeatable), "
         "e.g. 'simd:*', 'reference', '*:f16'")
      ->type_name("GLOB");
  app.add_option("--target", s.targets,
                 "Only entries whose target matches this glob (repeatable): "
                 "AVX2, SSE4, "
                 "SSSE3, SCALAR, '-' (non-simd)")
      ->type_name("GLOB");
  app.add_option("--threads", c.threads,
                 "Threads per entry call (0: all cores)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--jobs", c.jobs,
                 "Steps judged at once (oracles, naive baselines, (case, "
                 "entry) checks), one worker each (0: one per core, or cores "
                 "/ --threads if --threads > 1); entries then run with one "
                 "thread each. Verdicts, margins and the exit status are "
                 "the same at any job count; 1: the serial order")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", c.json,
                 "Also write the full report as JSON to FILE ('-': stdout, "
                 "replacing the table)")
      ->type_name("FILE");
  app.add_option("--csv", c.csv,
                 "Also write one CSV line per (entry, field) to FILE "
                 "('-': stdout, replacing the table)")
      ->type_name("FILE");
  CLI::Option* full = app.add_flag(
      "--covering", [&s](int64_t) { s.covering = Covering::kFull; },
      "Append the full covering array of the shape model to the default "
      "suite: every pair of cells, also those over the default run's budget "
      "(issue 33; ~8x the default suite's time; qknorm-check --covering "
      "coverage lists what it reaches)");
  app.add_flag(
         "--no-covering", [&s](int64_t) { s.covering = Covering::kNone; },
         "The default suite alone, without the budgeted covering cases the "
         "default run appends (issue 33; the default run before it)")
      ->excludes(full);
  app.add_flag("--no-timing", c.no_timing,
               "Skip the forward GFLOP/s measurement");
  app.add_option("--plugin", c.plugins,
                 "Load a kernel plug-in (include/qknorm/plugin.h; "
                 "repeatable): its entries, plugin:<name>.<entry>:<prec>, "
                 "are judged beside ours (also QKNORM_PLUGIN=a.so:b.so)")
      ->type_name("LIB.so");
  app.add_option("--max-seconds", c.max_seconds,
                 "Budget of the default run and of every sweep: it "
                 "estimates its work first (oracle, baselines, entries, "
                 "timing; calibrated on this machine) and stops before "
                 "starting if the estimate exceeds this (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_option("--sample", c.sample,
                 "Judge every attention case on a sample of at least N query "
                 "rows and N key rows (validation/sampled.h: first/last, tile "
                 "boundaries, masked and zero rows, random rows, each exactly "
                 "in long double, plus O(n D) checks of every row) instead of "
                 "the full O(n^2 D) oracle, for long sequences; the naive "
                 "baseline is not run. 0: the full oracle")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sample-seed", c.sample_seed,
                 "Seed of the sample's random rows (default: --seed if given, "
                 "else 1); the report prints it, so any failure replays")
      ->type_name("S")
      ->each([&c](const std::string&) { c.sample_seed_given = true; });
  app.add_flag("--isolate", c.isolate,
               "Run every plug-in call in a child process: a crash is that "
               "entry's FAIL, not the end of the run (one job: no fork "
               "beside a running thread)");
}

// The workers of a run: --jobs if given, else one per core, or as many as
// --threads leaves whole cores for (each entry call then owns its threads).
int jobs_for(const Common& c) {
  // --isolate forks a child for every plug-in call. A fork while another
  // job's thread holds a lock leaves it held forever in the child (Clang
  // 14's ASan allocator: the sanitizer CI's crash-plug-in test hung), so an
  // isolated run has one job, whatever --jobs says.
  if (c.isolate) return 1;
  if (c.jobs > 0) return c.jobs;
  const int cores =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return c.threads > 1 ? std::max(1, cores / c.threads) : cores;
}

// Loads --plugin libraries before anything reads the registry.
// A subcommand (a tool) with its own options; the common options given
// before it reach it too (fallthrough).
template <typename Options>
CLI::App* add_tool(CLI::App& app, const char* name, const char* what,
                   void (*add_options)(CLI::App&, Options&), Options& o) {
  CLI::App* tool = app.add_subcommand(name, what);
  add_options(*tool, o);
  tool->fallthrough();
  return tool;
}

bool load_plugins(const Common& c, std::ostream& err) {
  set_plugin_isolation(c.isolate);
  try {
    for (const std::string& p : c.plugins) load_plugin(p);
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return false;
  }
  return true;
}

// The progress line on a terminal (issue 19): a bar, the step, the time
// spent and an ETA, redrawn on every step and once a second in between (a
// long step, the sampled oracle's pass, keeps the clock moving). The ETA is
// the estimate of the steps left (cli/cost.h), scaled by how the finished
// steps' time compared with their estimate; without an estimate, by count.
class ProgressLine {
 public:
  ProgressLine() : t0_(Clock::now()), ticker_([this] { tick(); }) {}
  ~ProgressLine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    ticker_.join();
    std::cerr << "\r" << std::string(kWidth, ' ') << "\r" << std::flush;
  }
  void update(const Progress& p) {
    std::lock_guard<std::mutex> lock(mu_);
    last_ = p;
    t_event_ = Clock::now();
    seen_ = true;
    draw();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kWidth = 79;

  static double since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  void tick() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; }))
      if (seen_) draw();
  }

  // Seconds left, or < 0 if unknown.
  double eta() const {
    const Progress& p = last_;
    const double at_event =
        std::chrono::duration<double>(t_event_ - t0_).count();
    if (p.est_total > 0) {
      const double speed = p.est_done > 0 && at_event > 1
                               ? std::clamp(at_event / p.est_done, 0.2, 5.0)
                               : 1.0;
      return std::max(0.0,
                      (p.est_total - p.est_done) * speed - since(t_event_));
    }
    if (p.done == 0) return -1;
    return std::max(0.0,
                    at_event * (p.total - p.done) / p.done - since(t_event_));
  }

  void draw() {
    const double el = since(t0_), left = eta();
    const double frac =
        left >= 0 ? el / std::max(el + left, 1e-9)
                  : static_cast<double>(last_.done) / std::max(1, last_.total);
    constexpr int kBar = 16;
    const int fill = std::clamp(static_cast<int>(frac * kBar), 0, kBar);
    std::string what = last_.what;
    if (what.size() > 30) what = what.substr(0, 29) + "~";
    std::string line =
        fmt::format("[{}{}] {:>3}/{} {:<30} {:>7}{}", std::string(fill, '#'),
                    std::string(kBar - fill, '.'), last_.done + 1, last_.total,
                    what, duration_text(el),
                    left >= 0 ? " ETA " + duration_text(left) : std::string());
    if (line.size() > kWidth) line.resize(kWidth);
    std::cerr << "\r" << line << std::string(kWidth - line.size(), ' ')
              << std::flush;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, seen_ = false;
  Progress last_;
  Clock::time_point t0_, t_event_;
  std::thread ticker_;  // last: starts once the rest is initialized
};

int run_default(const Common& c, std::ostream& out, std::ostream& err,
                bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Suite suite;
  std::vector<const Backend*> entries;
  int covering = 0;
  double case_cap = 0;
  try {
    entries = select_entries(all_backends(), c.suite);
    // The default suite gets the covering cases of the entries' shape
    // model (issue 33; cli/coverage.h).
    suite = default_run_suite(c.suite, entries, c.threads, &covering,
                              custom_suite(c.suite) ? nullptr : &case_cap);
    // The sampled oracle has no softcap (validation/sampled.cc): a usage
    // error up front, not an errored (FAILing) entry per case.
    if (c.sample > 0 && c.suite.softcap != 0)
      throw Error("--sample", {},
                  "the sampled oracle does not take a logit softcap "
                  "(--softcap) yet; judge capped cases without --sample");
    if (c.sample > 0 && !c.suite.sinks.empty())
      throw Error("--sample", {},
                  "the sampled oracle does not take attention sinks "
                  "(--sinks) yet; judge cases with sinks without --sample");
    if (c.sample > 0 && !c.suite.rope.empty())
      throw Error("--sample", {},
                  "the sampled oracle does not take RoPE (--rope) yet; "
                  "judge rotated cases without --sample");
    // Nor a sliding window (its pass takes visible keys as prefixes).
    for (const auto& sc : suite.attention)
      if (c.sample > 0 && has_window(sc.problem.mask))
        throw Error("--sample", {},
                    "the sampled oracle does not take a sliding window "
                    "(--mask window:L,R) yet; judge windowed cases without "
                    "--sample");
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  const uint64_t sample_seed = c.sample_seed_given ? c.sample_seed
                               : c.seed_given      ? c.suite.seed
                                                   : 1;
  // The estimate comes first, and the budget stops a run that would take
  // hours before it starts (issue 19).
  const ExecConfig exec{c.threads};
  CostRates rates;
  CostEstimate cost;
  if (!suite.attention.empty() && !entries.empty()) {
    // The sampled oracle's rates too if any case is sampled (--sample, or
    // the long covering cases).
    const bool any_sampled =
        c.sample > 0 ||
        std::any_of(suite.attention.begin(), suite.attention.end(),
                    [](const AttentionSpec& a) { return a.sample_rows > 0; });
    const bool any_full =
        c.sample == 0 &&
        std::any_of(suite.attention.begin(), suite.attention.end(),
                    [](const AttentionSpec& a) { return a.sample_rows == 0; });
    rates = calibrate(entries, exec, any_sampled, largest_work(suite),
                      jobs_for(c), any_full);
    cost = estimate(rates, entries, suite, !c.no_timing, c.sample, c.threads,
                    jobs_for(c));
  } else {
    cost = estimate_cost(entries, suite, exec, !c.no_timing, c.sample);
  }
  err << "qknorm-check: " << describe(cost) << "\n" << std::flush;
  const std::string note = long_run_note(c.suite);
  if (!note.empty()) err << "qknorm-check: " << note << "\n" << std::flush;
  // Stops: past the budget, or (whatever the budget) when the full
  // oracle's [B, H, Nq, Nk] arrays cannot fit in memory (n = 32768, H = 4:
  // 137 GB). Both suggest --sample with that run's own estimate.
  const double mem = physical_memory();
  const bool no_memory = c.sample == 0 && mem > 0 && cost.oracle_bytes > mem;
  if (no_memory || cost.total() > c.max_seconds) {
    constexpr int64_t kSuggested = 256;
    std::string sample_est;
    bool sample_over = false;
    if (c.sample == 0 && !suite.attention.empty()) {
      // The sampled oracle's rates cost a fraction of a second to measure.
      calibrate_sampled(&rates, exec);
      const CostEstimate s = estimate(rates, entries, suite, !c.no_timing,
                                      kSuggested, c.threads, jobs_for(c));
      sample_est = duration_text(s.total());
      sample_over = s.total() > c.max_seconds;
    }
    if (no_memory) {
      err << fmt::format(
          "qknorm-check: stopped before starting: the full oracle needs at "
          "least {:.1f} GiB (long-double [B, H, Nq, Nk] arrays) and this "
          "machine has {:.1f} GiB. Judge a sample of rows instead: --sample "
          "{} (estimated ~{}{}), or use smaller shapes (--shape).\n",
          cost.oracle_bytes / (1 << 30), mem / (1 << 30), kSuggested,
          sample_est,
          sample_over ? fmt::format(", over --max-seconds {:.0f}: also "
                                    "filter entries",
                                    c.max_seconds)
                      : "");
      return kExitUsage;
    }
    const std::string largest = top_entries_text(cost);
    const std::string sample_hint =
        sample_est.empty()
            ? std::string()
            : fmt::format(
                  ", or judge a sample of rows: --sample {} (estimated ~{}{})",
                  kSuggested, sample_est,
                  sample_over ? ", still over the budget: also filter entries"
                              : "");
    err << fmt::format(
        "qknorm-check: stopped before starting: the estimate ({}) exceeds "
        "--max-seconds {:.0f}. Judge fewer entries (--backend, --target, "
        "--precision; largest: {}), smaller shapes (--shape), skip the "
        "timing (--no-timing), raise --max-seconds{}.\n",
        duration_text(cost.total()), c.max_seconds, largest, sample_hint);
    return kExitUsage;
  }
  Report rep;
  rep.estimate_s = cost.total();
  rep.estimate = describe(cost);
  rep.est_oracle_s = cost.oracle_s;
  rep.est_pass_s = cost.pass_s;
  rep.est_rows_s = cost.rows_s;
  rep.est_naive_s = cost.naive_s;
  rep.est_entries_s = cost.entries_s;
  rep.est_timing_s = cost.timing_s;
  rep.calibration_s = cost.calibration_s;
  rep.case_estimates = cost.case_s;
  rep.sample_rows = c.sample;
  rep.sample_seed = c.sample > 0 ? sample_seed : 0;
  rep.machine = machine_info(all_backends());
  rep.seed = c.suite.seed;
  rep.threads = c.threads;
  rep.jobs = jobs_for(c);
  rep.note = note;
  rep.classes = parse_classes(c.suite.classes);  // build_suite checked them
  rep.covering_cases = covering;
  if (!custom_suite(c.suite))
    rep.coverage =
        coverage_json(union_model(entries, c.threads),
                      suite_coverage(entries, suite, c.threads, case_cap),
                      covering, c.suite.covering, case_cap);
  for (const AttentionSpec& s : suite.attention) {
    rep.cases.push_back(describe_case(s));
    rep.case_classes.push_back(input_class(s));
  }
  for (const ScaleNormSpec& s : suite.scalenorm) {
    rep.cases.push_back(
        validation::make_scalenorm_case(s.problem, s.dist, s.seed).describe());
    rep.case_classes.push_back(input_class(s));
  }
  RunOptions opt;
  opt.exec.threads = c.threads;
  opt.jobs = jobs_for(c);
  opt.time_forward = !c.no_timing;
  opt.sample_rows = c.sample;
  opt.sample_seed = sample_seed;
  opt.costs = &cost.steps;
  opt.case_costs = &rep.case_costs;
  {
    // main sets `progress` only when stderr is a terminal.
    std::unique_ptr<ProgressLine> line;
    if (progress) {
      line = std::make_unique<ProgressLine>();
      opt.progress = [&line](const Progress& p) { line->update(p); };
    }
    rep.rows = run_suite(entries, suite, opt);
  }
  finalize(&rep);
  rep.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  try {
    if (!c.json.empty()) emit(c.json, to_json(rep) + "\n", out);
    if (!c.csv.empty()) {
      std::ostringstream s;
      write_csv(s, rep);
      emit(c.csv, s.str(), out);
    }
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitInput;
  }
  if (c.json != "-" && c.csv != "-") print_table(out, rep);
  return rep.pass ? kExitPass : kExitFail;
}

}  // namespace

// The subcommands' options. They live here, beside the app, and not in
// their subcommands' files: CLI11 (2.1, header-only) compiles ~200 KB of
// code into every file that includes it, ~7 CPU s of GCC -O3 each (mutants.cc
// 10.8 -> 4.0 s without it), paid again by the Clang sanitizer build: the
// CI's time (issue 32). Only this file includes CLI11.

void add_power_options(CLI::App& app, PowerOptions& o) {
  app.add_option("--trials", o.trials,
                 "Trials per (precision, distribution, field, granularity), "
                 "each a random target (default 8; --quick: 3)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--field", o.fields,
                 "Fields to corrupt (repeatable): o, dq, dk, dv, lse, dg "
                 "(default o dq dk dv)")
      ->type_name("FIELD");
  app.add_option("--granularity", o.granularities,
                 "What to corrupt (repeatable): element, row (the D elements "
                 "of one [b,h,n]), head (every row of one [b,h]), field "
                 "(default all four)")
      ->type_name("GRAN");
  app.add_option("--r-min", o.r_min, "Smallest injected relative error")
      ->capture_default_str();
  app.add_option("--r-max", o.r_max, "Largest injected relative error")
      ->capture_default_str();
  app.add_option("--per-decade", o.per_decade,
                 "Grid points per decade (the issue's targets are added)")
      ->capture_default_str();
  app.add_option("--sign", o.sign,
                 "Sign of the injected error: random (per element) or plus")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "plus"}));
  app.add_option("--out", o.out,
                 "Also write PREFIX.csv, PREFIX.dat, PREFIX.gp and PREFIX.png")
      ->type_name("PREFIX");
  app.add_flag("--no-plot", o.no_plot, "With --out: the CSV only (no gnuplot)");
  app.add_flag("--quick", o.quick,
               "CI subset: f32, zerorows, the causal case, 3 trials (options "
               "given explicitly still win)");
  app.add_option("--torch-dump", o.torch_dump,
                 "Write arrays and this tool's assert_close verdicts to DIR "
                 "for scripts/power_assert_close_check.py")
      ->type_name("DIR");
}

void add_sweep_options(CLI::App& app, SweepOptions& o) {
  app.add_option("--over", o.over,
                 "What to sweep: seq (n = 8..1024, g = g_init(n) unless --g), "
                 "g (0..30), "
                 "magnitude (q, k scaled by 1e-20..1e20), "
                 "tiles (n on the tile boundaries 2^k +- 1 and block +- 1 "
                 "up to 32768, shape 1x2xnx128 causal, judged by the sampled "
                 "oracle; cli/README.md)")
      ->required()
      ->check(CLI::IsMember({"seq", "g", "magnitude", "tiles"}));
  app.add_option("--from", o.from,
                 "First swept value (default per --over; tiles: 1, and "
                 "--from N --to N runs the one length N)");
  app.add_option("--to", o.to,
                 "Last swept value (default per --over; tiles: 32768)");
  app.add_option(
         "--points", o.points,
         "Number of values (seq default: powers of 2 from --from to --to)")
      ->check(CLI::Range(2, 200));
  app.add_option("--out", o.out,
                 "Output prefix: writes OUT.csv, OUT.dat, OUT.gp, OUT.png")
      ->capture_default_str();
  app.add_flag("--no-plot", o.no_plot, "Write the CSV only (no gnuplot)");
  app.add_flag("--no-sdpa", o.no_sdpa, "Leave out the sdpa baseline lines");
  app.add_option("--sample", o.sample,
                 "--over tiles: query rows and key rows (each, at least) the "
                 "sampled oracle computes per length (validation/sampled.h)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
}

void add_compare_options(CLI::App& app, CompareOptions& o) {
  app.add_option(
         "--inputs", o.inputs,
         "Input files: q.npy k.npy v.npy g.npy [dO.npy] (ScaleNorm: x.npy "
         "g.npy [dy.npy]), or one .safetensors (keys q, k, v, g, dO; x, g, "
         "dy), or NAME=PATH")
      ->required()
      ->type_name("FILE");
  app.add_option(
         "--outputs", o.outputs,
         "The framework's outputs: O.npy [dQ.npy dK.npy dV.npy dg.npy] "
         "(ScaleNorm: y.npy [dx.npy dg.npy]), or one .safetensors (keys O, "
         "dQ, dK, dV, dg; y, dx, dg), or NAME=PATH")
      ->required()
      ->type_name("FILE");
  app.add_option("--compute", o.compute,
                 "Alias of --contract: f32 is f32-accumulate, storage is "
                 "storage")
      ->check(CLI::IsMember({"f32", "storage"}))
      ->capture_default_str();
  app.add_option(
         "--contract", o.contract,
         "The framework's compute contract: where it rounds its "
         "intermediates, and to what (validation/rule.h derives the bound "
         "for it). f32-accumulate (default): f32 compute (f64 for f64 "
         "files), only the outputs rounded to the files' dtype; storage: "
         "every intermediate rounded to the files' dtype, as PyTorch's "
         "bfloat16 CPU autograd does; or rounding points KEY=FORMAT,... "
         "after an optional preset, KEY one of q (q at the dot product), kv "
         "(k_hat and v as cached), logits, p (P before P.V), pv_acc (the "
         "P.V accumulator), out (O before it is stored), compute (all other "
         "arithmetic), FORMAT one of f64, f32, bf16, f16, storage, compute; "
         "e.g. pv_acc=f16 or q=f16,p=f16")
      ->check(
          [](const std::string& spec) {
            ComputeContract c;
            std::string why;
            return parse_contract(spec, &c, &why) ? std::string() : why;
          },
          "")
      ->type_name("SPEC");
  // The rounding points one by one, the same as KEY=FORMAT items of
  // --contract (qknorm/contract.h).
  for (int r = 0; r < 6; ++r) {
    const std::string k(key(static_cast<RoundingPoint>(r)));
    std::string flag = "--round-" + k;
    std::replace(flag.begin(), flag.end(), '_', '-');
    app.add_option(flag, o.round_points[static_cast<size_t>(r)],
                   "Rounding point " + k +
                       " of the compute contract: the format FORMAT (f64, "
                       "f32, bf16, f16, storage, compute) the framework "
                       "rounds it to; overrides --contract's " +
                       k)
        ->check(
            [k](const std::string& f) {
              ComputeContract c;
              std::string why;
              return parse_contract(k + "=" + f, &c, &why) ? std::string()
                                                           : why;
            },
            "")
        ->type_name("FORMAT");
  }
  app.add_option("--kind", o.kind,
                 "What the files hold: attention, scalenorm, or auto (x, y, "
                 "dy or dx present and no attention tensor: scalenorm)")
      ->check(CLI::IsMember({"auto", "attention", "scalenorm"}))
      ->capture_default_str();
}

void add_mutants_options(CLI::App& app, MutantsOptions& o) {
  app.add_option("--jobs", o.jobs,
                 "Mutants / controls judged at once, one thread each (0: one "
                 "per core)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

void add_coverage_options(CLI::App& app, CoverageOptions& o) {
  app.add_flag("--pairs", o.pairs,
               "List every unreached pair (default: the first 10 per entry)");
  app.add_option("--json", o.json,
                 "Also write the coverage section as JSON to FILE ('-': "
                 "stdout, replacing the text)")
      ->type_name("FILE");
}

int run_cli(const std::vector<std::string>& args, std::ostream& out,
            std::ostream& err, bool progress) {
  CLI::App app{
      "qknorm-check: validates every registered QKNorm attention / ScaleNorm "
      "implementation (backend x Highway target x precision) against a "
      "long-double "
      "oracle under the suite's tolerance rule, sweeps error against sequence "
      "length, "
      "g or input magnitude, and checks tensors dumped from other frameworks.",
      "qknorm-check"};
  app.footer(kExamples);
  Common common;
  add_common(app, common);

  SweepOptions sweep_opt;
  CLI::App* sweep = add_tool(app, "sweep",
                             "Error against a swept value, one line per entry "
                             "(plus the sdpa baseline): CSV "
                             "and a gnuplot PNG",
                             add_sweep_options, sweep_opt);

  PowerOptions power_opt;
  CLI::App* power = add_tool(
      app, "power",
      "Measure the verdict's detection power: inject relative errors into "
      "correct outputs (one element, row, head or field) and report the "
      "smallest caught, beside torch.testing.assert_close's defaults",
      add_power_options, power_opt);

  CompareOptions cmp_opt;
  CLI::App* compare =
      add_tool(app, "compare",
               "Validate another framework's outputs (.npy files or "
               "one .safetensors) against "
               "the oracle with the same metrics and rule",
               add_compare_options, cmp_opt);

  CoverageOptions cov_opt;
  CLI::App* coverage = add_tool(
      app, "coverage",
      "The shape-coverage model (validation/coverage.h) and, for the suite "
      "the other options select, which cells and pairs of it each entry's "
      "cases reach and which they miss, without running kernels: exit 0 iff "
      "every entry reaches all of its model within the features it supports",
      add_coverage_options, cov_opt);

  MutantsOptions mut_opt;
  CLI::App* mutants =
      add_tool(app, "mutants",
               "Run the suite on every deliberately broken backend and every "
               "legitimate control (mutants/mutants.h): kill table, exit 0 iff "
               "every mutant FAILs and every control PASSes",
               add_mutants_options, mut_opt);
  DeterminismOptions det_opt;
  CLI::App* determinism = add_tool(
      app, "determinism",
      "Run every selected entry N times at 1 and 2 threads on each attention "
      "case: each run judged by the verdict, the runs compared bitwise; a "
      "deterministic entry (the default) FAILs on any difference, with the "
      "likely cause (a data race, thread-count-dependent reduction order, "
      "state carried between calls); exit 0 iff every entry passes",
      add_determinism_options, det_opt);
  app.require_subcommand(0, 1);

  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kExitPass : kExitUsage;
  }
  if ((*sweep || *power || *compare || *mutants || *coverage || *determinism) &&
      (common.sample > 0 || common.sample_seed_given)) {
    err << "qknorm-check: --sample/--sample-seed before a subcommand apply "
           "to the default run only (not to sweep, power, compare or "
           "mutants; the tile sweep takes its own: sweep --over tiles "
           "--sample N)\n";
    return kExitUsage;
  }
  if ((*sweep || *compare) && !common.suite.classes.empty()) {
    err << "qknorm-check: --classes selects the cases of the default run, "
           "power and mutants (a sweep's and compare's cases are given; "
           "their reports name each case's class)\n";
    return kExitUsage;
  }
  if (common.jobs > 1 && common.threads > 1) {
    // OpenBLAS's thread count is global to the process: entries that set
    // their own on several workers at once would race on it.
    err << "qknorm-check: --jobs > 1 with --threads > 1: give one of them "
           "(--threads T alone runs cores / T jobs)\n";
    return kExitUsage;
  }
  if (!load_plugins(common, err)) return kExitInput;
  power_opt.jobs = sweep_opt.jobs = jobs_for(common);
  if (*sweep) {
    sweep_opt.max_seconds = common.max_seconds;
    return run_sweep(sweep_opt, common.suite, common.threads, out, err,
                     progress);
  }
  if (*power)
    return run_power(power_opt, common.suite, common.threads, out, err,
                     progress);
  if (*compare)
    return run_compare(cmp_opt, common.suite, common.json, out, err);
  if (*coverage)
    return run_coverage(cov_opt, common.suite, common.threads, out, err);
  if (*determinism)
    return run_determinism(det_opt, common.suite, common.json, out, err);
  if (*mutants) {
    if (mut_opt.jobs == 0) mut_opt.jobs = common.jobs;  // --jobs before it
    return run_mutants(mut_opt, common.suite, out, err, progress);
  }
  return run_default(common, out, err, progress);
}

}  // namespace qknorm::cli
