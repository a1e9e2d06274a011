#include "cli/app.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>

#include "cli/compare.h"
#include "cli/cost.h"
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
  qknorm-check sweep --over magnitude --out mag # mag.csv + mag.png, qknorm vs sdpa
  qknorm-check sweep --over seq --from 8 --to 4096 --precision f32
  qknorm-check power --out power                # detection power of the verdict: table, power.csv + power.png
  qknorm-check compare --inputs q.npy k.npy v.npy g.npy dO.npy \
                       --outputs O.npy dQ.npy dK.npy dV.npy dg.npy
  qknorm-check compare --inputs dump.safetensors --outputs dump.safetensors
  qknorm-check mutants                          # the suite's kill table: mutants FAIL, controls PASS

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
  std::string json, csv;
  bool no_timing = false;
  std::vector<std::string> plugins;
  bool isolate = false;
  double max_seconds = 600;
};

void add_common(CLI::App& app, Common& c) {
  SuiteOptions& s = c.suite;
  app.add_option(
         "--shape", s.shapes,
         "Attention shape BxHxNxD or BxHxNqxNkxD (repeatable). Giving any of "
         "--shape/--g/--mask/--dist/--eps/--variant replaces the built-in "
         "suite by "
         "the product of the lists (defaults 2x8x72x64; g_init(72), 20; "
         "causal, pad; "
         "gaussian, wide)")
      ->type_name("SHAPE");
  app.add_option("--g", s.g,
                 "QKNorm scale g (repeatable); g_init(72) = 12.3197")
      ->type_name("G");
  app.add_option("--eps", s.eps,
                 "Normalization eps (l2: clamp; rms, layer: in the sqrt); "
                 "overrides a preset's")
      ->capture_default_str()
      ->each([&s](const std::string&) { s.eps_given = true; });
  app.add_option("--mask", s.masks,
                 "Mask (repeatable): none, causal, pad (per-batch key lengths "
                 "kv_len - b*kv_len/(2B)), pad:L1,L2,..., causal+pad")
      ->type_name("MASK");
  app.add_option("--dist", s.dists,
                 "Input distribution (repeatable): gaussian, uniform, heavy "
                 "(Student t3), "
                 "wide (row scales 10^U[-30,30] within the format), zerorows")
      ->type_name("DIST");
  app.add_option("--variant", s.variant, "Attention variant: qknorm or sdpa")
      ->capture_default_str();
  app.add_option("--formulation", s.formulations,
                 "QK-norm formulation preset (repeatable): paper, qwen3, "
                 "gemma3, olmo2, timm, vit22b, chameleon, ngpt "
                 "(include/qknorm/formulation.h); the flags below override "
                 "single fields")
      ->type_name("PRESET");
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
  app.add_option("--scalenorm", s.scalenorm,
                 "ScaleNorm shape ROWSxDIM (repeatable)")
      ->type_name("SHAPE");
  app.add_option("--seed", s.seed, "Base seed; case i uses seed + i")
      ->capture_default_str();
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
  app.add_option("--json", c.json,
                 "Also write the full report as JSON to FILE ('-': stdout, "
                 "replacing the table)")
      ->type_name("FILE");
  app.add_option("--csv", c.csv,
                 "Also write one CSV line per (entry, field) to FILE "
                 "('-': stdout, replacing the table)")
      ->type_name("FILE");
  app.add_flag("--no-timing", c.no_timing,
               "Skip the forward GFLOP/s measurement");
  app.add_option("--plugin", c.plugins,
                 "Load a kernel plug-in (include/qknorm/plugin.h; "
                 "repeatable): its entries, plugin:<name>.<entry>:<prec>, "
                 "are judged beside ours (also QKNORM_PLUGIN=a.so:b.so)")
      ->type_name("LIB.so");
  app.add_option("--max-seconds", c.max_seconds,
                 "Budget of the default run: it estimates its work first "
                 "(oracle, baselines, entries, timing; calibrated on this "
                 "machine) and stops before starting if the estimate exceeds "
                 "this (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--isolate", c.isolate,
               "Run every plug-in call in a child process: a crash is that "
               "entry's FAIL, not the end of the run");
}

// Loads --plugin libraries before anything reads the registry.
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

int run_default(const Common& c, std::ostream& out, std::ostream& err,
                bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  Suite suite;
  std::vector<const Backend*> entries;
  try {
    suite = build_suite(c.suite);
    entries = select_entries(all_backends(), c.suite);
  } catch (const Error& e) {
    err << "qknorm-check: " << e.what() << "\n";
    return kExitUsage;
  }
  // The estimate comes first, and the budget stops a run that would take
  // hours before it starts (issue 19).
  const CostEstimate cost =
      estimate_cost(entries, suite, ExecConfig{c.threads}, !c.no_timing);
  err << "qknorm-check: " << describe(cost) << "\n" << std::flush;
  if (cost.total() > c.max_seconds) {
    err << fmt::format(
        "qknorm-check: stopped before starting: the estimate ({:.0f} s) "
        "exceeds --max-seconds {:.0f}. Judge fewer entries (--backend, "
        "--target, --precision), smaller shapes (--shape), skip the timing "
        "(--no-timing), or raise --max-seconds.\n",
        cost.total(), c.max_seconds);
    return kExitUsage;
  }
  Report rep;
  rep.estimate_s = cost.total();
  rep.estimate = describe(cost);
  rep.machine = machine_info(all_backends());
  rep.seed = c.suite.seed;
  rep.threads = c.threads;
  for (const AttentionSpec& s : suite.attention)
    rep.cases.push_back(
        validation::make_attention_case(s.problem, s.dist, s.seed).describe());
  for (const ScaleNormSpec& s : suite.scalenorm)
    rep.cases.push_back(
        validation::make_scalenorm_case(s.problem, s.dist, s.seed).describe());
  RunOptions opt;
  opt.exec.threads = c.threads;
  opt.time_forward = !c.no_timing;
  if (progress)  // main sets `progress` only when stderr is a terminal
    opt.progress = [t0](int done, int total, const std::string& name) {
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      const std::string eta =
          done > 0 ? fmt::format(" ETA {:.0f} s", el * (total - done) / done)
                   : std::string();
      std::cerr << fmt::format("\r[{:>4}/{}] {:<28}{:<14}", done + 1, total,
                               name, eta)
                << std::flush;
    };
  rep.rows = run_suite(entries, suite, opt);
  if (progress) std::cerr << "\r" << std::string(60, ' ') << "\r" << std::flush;
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
  CLI::App* sweep =
      app.add_subcommand("sweep",
                         "Error against a swept value, one line per entry "
                         "(plus the sdpa baseline): CSV "
                         "and a gnuplot PNG");
  add_sweep_options(*sweep, sweep_opt);
  sweep->fallthrough();

  PowerOptions power_opt;
  CLI::App* power = app.add_subcommand(
      "power",
      "Measure the verdict's detection power: inject relative errors into "
      "correct outputs (one element, row, head or field) and report the "
      "smallest caught, beside torch.testing.assert_close's defaults");
  add_power_options(*power, power_opt);
  power->fallthrough();

  CompareOptions cmp_opt;
  CLI::App* compare =
      app.add_subcommand("compare",
                         "Validate another framework's outputs (.npy files or "
                         "one .safetensors) against "
                         "the oracle with the same metrics and rule");
  add_compare_options(*compare, cmp_opt);
  compare->fallthrough();

  MutantsOptions mut_opt;
  CLI::App* mutants = app.add_subcommand(
      "mutants",
      "Run the suite on every deliberately broken backend and every "
      "legitimate control (property_tests/mutants.h): kill table, exit 0 iff "
      "every mutant FAILs and every control PASSes");
  add_mutants_options(*mutants, mut_opt);
  mutants->fallthrough();
  app.require_subcommand(0, 1);

  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kExitPass : kExitUsage;
  }
  if (!load_plugins(common, err)) return kExitInput;
  if (*sweep)
    return run_sweep(sweep_opt, common.suite, common.threads, out, err,
                     progress);
  if (*power)
    return run_power(power_opt, common.suite, common.threads, out, err,
                     progress);
  if (*compare)
    return run_compare(cmp_opt, common.suite, common.json, out, err);
  if (*mutants) return run_mutants(mut_opt, common.suite, out, err, progress);
  return run_default(common, out, err, progress);
}

}  // namespace qknorm::cli
