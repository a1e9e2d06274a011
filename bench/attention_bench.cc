// qknorm-bench: Google Benchmark binary for issue 8. It iterates the registry
// (never a hard-coded kernel list) and registers, in one binary and one run:
//   attn/<entry>/<fwd|bwd>/d:<d>/n:<n>/mask:<none|causal>/T:<threads>
//       an entry's attention_forward / attention_backward, fp32, B = 1, H = 8;
//   attn/<entry>/fwd/d:<d>/n:<n>/mask:causal+window<l>/T:1
//       the sliding window rows (issue 34), best simd target's f32 entry:
//       window (l, 0) at n, beside the causal row of the reference n;
//   attn/<entry>/fwd/d:<d>/n:<n>/mask:none+rope<d>/T:1
//       the RoPE rows (issue 34), same entry: the grid's problem with RoPE
//       over all d dims (half-split, after the norm, theta 10^6), beside
//       the same problem without it (attn/<entry>/fwd/d:<d>/n:<n>/mask:none
//       /T:1, the grid's own row when present);
//   gemm/<qk|pv|dv|dp|dq|dk>/d:<d>/n:<n>/T:<threads>
//       the anchors: bare cblas_sgemm on the same attention-shaped GEMMs,
//       per head, with openblas_set_num_threads(T): the forward's QK^T
//       (n x n x d) and PV (n x d x n); the backward's own dV = P^T dO,
//       dP = dO V^T, dQ = dS K, dK = dS^T Q (registered when bwd is
//       measured; report.py weights each set by its FLOPs);
//   fma/<avx2|avx512>/T:<threads>
//       the FMA-peak microbenchmark (independent FMA chains, fma_peak.h).
// Every benchmark reports real (wall) time, since the kernels run their own
// threads, and a counter "flops" (FLOPs per iteration) plus the rate
// "GFLOPS". FLOPs follow issue 8: forward 4 n^2 d per head, backward
// 10 n^2 d, causal counting only the n (n + 1) / 2 visible pairs, a window
// only the pairs it leaves visible; RoPE adds none (the rope and no-rope
// rows count the same FLOPs, so their rates' ratio is their times').
//
// Each benchmark makes one untimed call first (the workspace is warm, pages
// are touched, backward has this entry's own o and lse). Repetitions and
// their interleaving come from the command line (bench.sh passes
// --benchmark_repetitions and --benchmark_enable_random_interleaving).
//
// Own flags (before Google Benchmark's; see bench/README.md):
//   --qk_entries=GLOBS     entries to measure on the full grid
//                          (default "simd:*:f32,blas:f32")
//   --qk_full_targets=N    only the first N available simd targets in
//                          registry order get the full grid; later targets
//                          get the sanity grid (default 2)
//   --qk_sanity=GLOBS      extra entries measured on the sanity grid only:
//                          smallest n and d, one thread (default
//                          "reference:f32,blas:f64,simd:*:bf16,simd:*:f16":
//                          every other precision and target gets a row)
//   --qk_n=LIST --qk_d=LIST --qk_threads=LIST --qk_masks=LIST --qk_dirs=LIST
//                          the grid (defaults 128,512,2048 / 64,128 / 1,2 /
//                          none,causal / fwd,bwd)
//   --qk_formulations=LIST formulation presets measured (issue 16) at the
//                          production GQA shape, one thread, with the paper's
//                          variant at the same shape beside them, for the
//                          first full-grid simd target and blas:f32; rows
//                          attn/<entry>+<preset>/... (default "qwen3"; empty
//                          to skip); anchors gemm/*/d:<form_d>/n:<form_n>
//   --qk_form_n=LIST --qk_form_d=D --qk_form_heads=H,KV
//                          their shape (defaults 512,2048 / 128 / 32,8)
//   --qk_window=L@N[,R]    the window rows (issue 34's speed target): the
//                          best simd target's f32 forward, d --qk_window_d
//                          (128), one thread, H = 8, at causal window (L, 0)
//                          and n = N, and causal at n = R (default
//                          "127@4096,512"; empty to skip); report.py's goal
//                          compares the two rates
//   --qk_rope=N            the RoPE rows (issue 34's speed target): the
//                          same entry's forward, d --qk_rope_d (128), one
//                          thread, H = 8, no mask, at n = N with and without
//                          RoPE (default 512; empty to skip); report.py's
//                          goal compares the two times
//   --qk_rope_form=PRESET  their formulation (default empty: the paper's,
//                          as the grid; a preset gives rows
//                          attn/<entry>+<preset>@H8kv8/..., both registered)
//   --qk_no_anchors        skip the gemm and fma benchmarks
//   --qk_list              print the registry with availability and exit
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/attention_setup.h"
#include "bench/fma_peak.h"
#include "qknorm/backend.h"
#include "qknorm/formulation.h"

namespace qknorm::bench {
namespace {

struct Options {
  std::string entries = "simd:*:f32,blas:f32";
  std::string sanity = "reference:f32,blas:f64,simd:*:bf16,simd:*:f16";
  int full_targets = 2;
  std::vector<int64_t> ns = {128, 512, 2048}, ds = {64, 128};
  std::vector<int64_t> threads = {1, 2};
  std::vector<std::string> masks = {"none", "causal"}, dirs = {"fwd", "bwd"};
  bool anchors = true;
  bool list = false;
  std::vector<std::string> formulations = {"qwen3"};
  std::vector<int64_t> form_ns = {512, 2048};
  int64_t form_d = 128, form_heads = 32, form_kv = 8;
  // The window rows: window (window_left, 0) at window_n, the causal
  // reference at window_ref_n, d window_d (window_left < 0: none).
  int64_t window_left = 127, window_n = 4096, window_ref_n = 512;
  int64_t window_d = 128;
  // The RoPE rows: with and without RoPE over all rope_d dims at n = rope_n
  // (rope_n <= 0: none), formulation rope_form (empty: the paper's).
  int64_t rope_n = 512, rope_d = 128;
  std::string rope_form;
};

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> out;
  for (const std::string& x : split_list(s)) out.push_back(std::stoll(x));
  return out;
}

// Consumes the --qk_* flags, leaving the rest for Google Benchmark.
Options parse_options(int* argc, char** argv) {
  Options o;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag, std::string* out) {
      const std::string f = std::string(flag) + "=";
      if (a.rfind(f, 0) != 0) return false;
      *out = a.substr(f.size());
      return true;
    };
    std::string v;
    if (value("--qk_entries", &v)) {
      o.entries = v;
    } else if (value("--qk_sanity", &v)) {
      o.sanity = v;
    } else if (value("--qk_full_targets", &v)) {
      o.full_targets = std::stoi(v);
    } else if (value("--qk_n", &v)) {
      o.ns = split_ints(v);
    } else if (value("--qk_d", &v)) {
      o.ds = split_ints(v);
    } else if (value("--qk_threads", &v)) {
      o.threads = split_ints(v);
    } else if (value("--qk_masks", &v)) {
      o.masks = split_list(v);
    } else if (value("--qk_dirs", &v)) {
      o.dirs = split_list(v);
    } else if (value("--qk_formulations", &v)) {
      o.formulations = split_list(v);
    } else if (value("--qk_form_n", &v)) {
      o.form_ns = split_ints(v);
    } else if (value("--qk_form_d", &v)) {
      o.form_d = std::stoll(v);
    } else if (value("--qk_form_heads", &v)) {
      const std::vector<int64_t> hk = split_ints(v);
      o.form_heads = hk.at(0);
      o.form_kv = hk.size() > 1 ? hk[1] : 0;
    } else if (value("--qk_window", &v)) {
      o.window_left = -1;
      const std::vector<std::string> w = split_list(v);
      if (!w.empty()) {
        const size_t at = w[0].find('@');
        o.window_left = std::stoll(w[0].substr(0, at));
        if (at != std::string::npos)
          o.window_n = std::stoll(w[0].substr(at + 1));
        if (w.size() > 1) o.window_ref_n = std::stoll(w[1]);
      }
    } else if (value("--qk_window_d", &v)) {
      o.window_d = std::stoll(v);
    } else if (value("--qk_rope", &v)) {
      o.rope_n = v.empty() ? 0 : std::stoll(v);
    } else if (value("--qk_rope_d", &v)) {
      o.rope_d = std::stoll(v);
    } else if (value("--qk_rope_form", &v)) {
      o.rope_form = v;
    } else if (a == "--qk_no_anchors") {
      o.anchors = false;
    } else if (a == "--qk_list") {
      o.list = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return o;
}

// Buffers per (precision, n, d), shared by every entry of that precision and
// kept for the whole run (they are the largest allocations; rebuilding them
// per benchmark would touch fresh pages each time).
AttentionBuffers& buffers_for(Precision prec, const Shape& s) {
  static std::map<
      std::tuple<Precision, int64_t, int64_t, int64_t, std::string, int64_t>,
      std::unique_ptr<AttentionBuffers>>
      cache;
  auto& slot = cache[{prec, s.heads, s.n, s.d, s.formulation, s.kv_heads}];
  if (!slot) {
    Shape base = s;
    base.causal = false;
    base.window_left = -1;
    base.rope_dim = 0;
    slot = std::make_unique<AttentionBuffers>(base, prec);
  }
  return *slot;
}

// One workspace per entry, for the whole run.
AttentionRun& run_for(const Backend* entry) {
  static std::map<const Backend*, std::unique_ptr<AttentionRun>> cache;
  auto& slot = cache[entry];
  if (!slot) slot = std::make_unique<AttentionRun>(*entry);
  return *slot;
}

// Which mask the forward that last wrote each buffer set's o and lse used
// (-1: none yet; mask_key). Backward needs an o and lse of its own mask; which
// f32 entry produced them changes only roundings, not the work backward does.
std::map<AttentionBuffers*, int>& o_mask() {
  static std::map<AttentionBuffers*, int> m;
  return m;
}

// OpenBLAS's pthread workers spin (sched_yield) for about 2^28 cycles, some
// 0.1 s, after each parallel call before they sleep. With two cores, a
// benchmark that follows a multi-threaded OpenBLAS one in the interleaved
// order would share the cores with those spinners, so it first waits them
// out (untimed). Benchmarks that use OpenBLAS themselves reuse the workers.
constexpr int kOpenBlasSpinMs = 150;
int g_openblas_spinning_threads = 0;

void used_openblas(int threads) { g_openblas_spinning_threads = threads; }

void quiesce_openblas() {
  if (g_openblas_spinning_threads > 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(kOpenBlasSpinMs));
  g_openblas_spinning_threads = 0;
}

int mask_key(const Shape& s) {
  return 2 * (static_cast<int>(s.causal) +
              2 * static_cast<int>(s.window_left + 1)) +
         static_cast<int>(s.rope_dim > 0);
}

void attention_benchmark(benchmark::State& state, const Backend* entry,
                         bool backward, Shape shape, int threads) {
  if (entry->family() == "blas") {
    used_openblas(threads);
  } else {
    quiesce_openblas();
  }
  AttentionBuffers& buf = buffers_for(entry->precision(), shape);
  AttentionRun& run = run_for(entry);
  try {
    // One untimed warm-up call (validates the arguments on the way).
    int& mask = o_mask().try_emplace(&buf, -1).first->second;
    if (!backward || mask != mask_key(shape)) {
      run.prepare_forward(buf, shape.causal, threads, shape.window_left,
                          shape.rope_dim);
      mask = mask_key(shape);
    }
    if (backward)
      run.prepare_backward(buf, shape.causal, threads, shape.window_left,
                           shape.rope_dim);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    if (backward) {
      run.backward(buf, shape.causal, threads, shape.window_left,
                   shape.rope_dim);
    } else {
      run.forward(buf, shape.causal, threads, shape.window_left,
                  shape.rope_dim);
    }
    benchmark::ClobberMemory();
  }
  const double flops = backward ? backward_flops(shape) : forward_flops(shape);
  state.counters["flops"] = flops;
  state.counters["GFLOPS"] = benchmark::Counter(
      flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void gemm_benchmark(benchmark::State& state, GemmOp op, Shape shape,
                    int threads) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<GemmAnchor>>
      cache;
  auto& slot = cache[{shape.n, shape.d}];
  if (!slot) slot = std::make_unique<GemmAnchor>(shape);
  set_openblas_threads(threads);
  used_openblas(threads);
  slot->run(op);  // untimed warm-up
  for (auto _ : state) {
    slot->run(op);
    benchmark::ClobberMemory();
  }
  state.counters["flops"] = slot->flops_per_gemm();
  state.counters["GFLOPS"] =
      benchmark::Counter(slot->flops_per_gemm() * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// About 20 ms per iteration at 2 FMAs per cycle and 2.6 GHz.
constexpr int64_t kFmaSteps = 4 << 20;

void fma_benchmark(benchmark::State& state, std::string isa, int threads) {
  quiesce_openblas();
  run_fma_chains(isa, kFmaSteps / 16, threads);  // untimed warm-up
  double flops = 0;
  for (auto _ : state) flops = run_fma_chains(isa, kFmaSteps, threads);
  state.counters["flops"] = flops;
  state.counters["GFLOPS"] = benchmark::Counter(
      flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

std::string attn_name(const Backend& e, const std::string& dir, const Shape& s,
                      int64_t t) {
  return "attn/" + e.name() + "/" + dir + "/d:" + std::to_string(s.d) +
         "/n:" + std::to_string(s.n) +
         "/mask:" + (s.causal ? "causal" : "none") +
         (s.window_left >= 0 ? "+window" + std::to_string(s.window_left) : "") +
         (s.rope_dim > 0 ? "+rope" + std::to_string(s.rope_dim) : "") +
         "/T:" + std::to_string(t);
}

template <class T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The window rows (issue 34's speed target) of entry e: the forward, one
// thread, H = 8, d window_d, at causal window (window_left, 0), n =
// window_n, and the causal reference at n = window_ref_n unless the full
// grid already has that row (same name, measured once).
void register_window(const Backend* e, const Options& o, bool sanity) {
  if (o.window_left < 0) return;
  // The grid register_attention gave e (sanity: smallest n and d).
  const int64_t n_min = *std::min_element(o.ns.begin(), o.ns.end());
  const int64_t d_min = *std::min_element(o.ds.begin(), o.ds.end());
  const bool ref_in_grid =
      (sanity ? d_min == o.window_d : contains(o.ds, o.window_d)) &&
      (sanity ? n_min == o.window_ref_n : contains(o.ns, o.window_ref_n)) &&
      contains<std::string>(o.masks, "causal") &&
      contains<std::string>(o.dirs, "fwd") && contains<int64_t>(o.threads, 1);
  std::vector<Shape> shapes;
  Shape w;
  w.heads = 8, w.n = o.window_n, w.d = o.window_d, w.causal = true;
  w.window_left = o.window_left;
  shapes.push_back(w);
  if (!ref_in_grid) {
    Shape r;
    r.heads = 8, r.n = o.window_ref_n, r.d = o.window_d, r.causal = true;
    shapes.push_back(r);
  }
  for (const Shape& s : shapes)
    benchmark::RegisterBenchmark(
        attn_name(*e, "fwd", s, 1).c_str(),
        [=](benchmark::State& st) { attention_benchmark(st, e, false, s, 1); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

// The RoPE rows (issue 34's speed target) of entry e: the forward, one
// thread, H = 8, no mask, d rope_d, n rope_n, with RoPE over all d dims
// (bench_rope) and without it, registered one after the other. Without a
// preset the no-RoPE row is the grid's own when the grid has it (same name,
// measured once); with one (rope_form) both rows are registered under
// attn/<entry>+<preset>@H8kv8 (kv heads = heads: the same problem).
void register_rope(const Backend* e, const Options& o, bool sanity) {
  if (o.rope_n <= 0) return;
  const int64_t n_min = *std::min_element(o.ns.begin(), o.ns.end());
  const int64_t d_min = *std::min_element(o.ds.begin(), o.ds.end());
  const bool ref_in_grid =
      o.rope_form.empty() &&
      (sanity ? d_min == o.rope_d : contains(o.ds, o.rope_d)) &&
      (sanity ? n_min == o.rope_n : contains(o.ns, o.rope_n)) &&
      contains<std::string>(o.masks, "none") &&
      contains<std::string>(o.dirs, "fwd") && contains<int64_t>(o.threads, 1);
  if (!o.rope_form.empty() && find_preset(o.rope_form) == nullptr) {
    std::fprintf(stderr, "qknorm-bench: unknown preset %s\n",
                 o.rope_form.c_str());
    return;
  }
  Shape s;
  s.heads = 8, s.n = o.rope_n, s.d = o.rope_d, s.causal = false;
  s.formulation = o.rope_form;
  std::vector<Shape> shapes;
  if (!ref_in_grid) shapes.push_back(s);
  s.rope_dim = o.rope_d;
  shapes.push_back(s);
  for (const Shape& r : shapes) {
    std::string name = attn_name(*e, "fwd", r, 1);
    if (!o.rope_form.empty()) {  // attn/<entry>+<preset>@H8kv8/...
      const std::string tag = "attn/" + e->name();
      name = tag + "+" + o.rope_form + "@H8kv8" + name.substr(tag.size());
    }
    benchmark::RegisterBenchmark(
        name.c_str(),
        [=](benchmark::State& st) { attention_benchmark(st, e, false, r, 1); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

void register_attention(const Backend* e, const Options& o, bool sanity) {
  const std::vector<int64_t> ns =
      sanity ? std::vector<int64_t>{*std::min_element(o.ns.begin(), o.ns.end())}
             : o.ns;
  const std::vector<int64_t> ds =
      sanity ? std::vector<int64_t>{*std::min_element(o.ds.begin(), o.ds.end())}
             : o.ds;
  const std::vector<int64_t> ts = sanity ? std::vector<int64_t>{1} : o.threads;
  for (int64_t d : ds) {
    for (int64_t n : ns) {
      for (const std::string& mask : o.masks) {
        for (const std::string& dir : o.dirs) {
          for (int64_t t : ts) {
            Shape s;
            s.heads = 8, s.n = n, s.d = d, s.causal = mask == "causal";
            const bool bwd = dir == "bwd";
            benchmark::RegisterBenchmark(
                attn_name(*e, dir, s, t).c_str(),
                [=](benchmark::State& st) {
                  attention_benchmark(st, e, bwd, s, static_cast<int>(t));
                })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
}

// The formulation rows: each preset and the paper's variant at the same
// shape (heads form_heads; the preset's kv heads form_kv where it ships
// GQA), forward and backward, one thread, no mask.
void register_formulations(const Backend* e, const Options& o) {
  std::vector<std::pair<std::string, int64_t>> forms = {{"paper", 0}};
  for (const std::string& f : o.formulations) {
    const Preset* p = find_preset(f);
    if (p == nullptr) {
      std::fprintf(stderr, "qknorm-bench: unknown preset %s\n", f.c_str());
      continue;
    }
    forms.push_back({f, p->gqa ? o.form_kv : 0});
  }
  for (const auto& [f, kv] : forms)
    for (int64_t n : o.form_ns)
      for (const std::string& dir : o.dirs) {
        Shape s{o.form_heads, n, o.form_d, false, f, kv};
        const bool bwd = dir == "bwd";
        const std::string name = "attn/" + e->name() + "+" + f + "@H" +
                                 std::to_string(o.form_heads) + "kv" +
                                 std::to_string(kv > 0 ? kv : o.form_heads) +
                                 "/" + dir + "/d:" + std::to_string(s.d) +
                                 "/n:" + std::to_string(n) + "/mask:none/T:1";
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& st) {
                                       attention_benchmark(st, e, bwd, s, 1);
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
}

void register_anchors(const Options& o) {
  std::vector<int64_t> ds = o.ds, ns = o.ns;
  if (!o.formulations.empty()) {  // the formulation rows' anchors too
    if (std::find(ds.begin(), ds.end(), o.form_d) == ds.end())
      ds.push_back(o.form_d);
    for (int64_t n : o.form_ns)
      if (std::find(ns.begin(), ns.end(), n) == ns.end()) ns.push_back(n);
  }
  // The forward's GEMMs always (every row's table group names them); the
  // backward's own four when backward rows are measured.
  std::vector<GemmOp> ops = {GemmOp::kQK, GemmOp::kPV};
  if (std::find(o.dirs.begin(), o.dirs.end(), "bwd") != o.dirs.end())
    ops.insert(ops.end(), {GemmOp::kDV, GemmOp::kDP, GemmOp::kDQ, GemmOp::kDK});
  for (int64_t d : ds) {
    for (int64_t n : ns) {
      for (int64_t t : o.threads) {
        for (GemmOp op : ops) {
          Shape s;
          s.heads = 8, s.n = n, s.d = d;
          const std::string name = std::string("gemm/") + gemm_op_name(op) +
                                   "/d:" + std::to_string(d) +
                                   "/n:" + std::to_string(n) +
                                   "/T:" + std::to_string(t);
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) {
                                         gemm_benchmark(st, op, s,
                                                        static_cast<int>(t));
                                       })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  for (const FmaIsa& isa : fma_isas()) {
    if (!isa.supported) continue;
    for (int64_t t : o.threads) {
      const std::string name = "fma/" + isa.name + "/T:" + std::to_string(t);
      const std::string isa_name = isa.name;
      benchmark::RegisterBenchmark(name.c_str(),
                                   [=](benchmark::State& st) {
                                     fma_benchmark(st, isa_name,
                                                   static_cast<int>(t));
                                   })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Registers the full grid for the matched entries (simd targets beyond the
// first `full_targets` available ones get the sanity grid) and the sanity
// grid for --qk_sanity entries. Returns the number of entries registered.
int register_entries(const Options& o) {
  int count = 0;
  std::set<const Backend*> done;
  std::vector<std::string> simd_targets;
  for (const Backend* e : match_entries(o.entries)) {
    if (!e->available()) {
      std::fprintf(stderr, "qknorm-bench: %s not available on this CPU\n",
                   e->name().c_str());
      continue;
    }
    bool sanity = false;
    if (e->family() == "simd") {
      auto it =
          std::find(simd_targets.begin(), simd_targets.end(), e->target());
      if (it == simd_targets.end()) {
        simd_targets.push_back(e->target());
        it = simd_targets.end() - 1;
      }
      sanity = it - simd_targets.begin() >= o.full_targets;
    }
    register_attention(e, o, sanity);
    if (!o.formulations.empty() && !sanity &&
        (e->family() == "blas" || e->target() == simd_targets.front()))
      register_formulations(e, o);
    if (e->family() == "simd" && e->target() == simd_targets.front() &&
        e->precision() == Precision::kF32) {
      register_window(e, o, sanity);
      register_rope(e, o, sanity);
    }
    done.insert(e);
    ++count;
  }
  for (const Backend* e : match_entries(o.sanity)) {
    if (done.count(e) || !e->available()) continue;
    register_attention(e, o, /*sanity=*/true);
    ++count;
  }
  return count;
}

}  // namespace
}  // namespace qknorm::bench

int main(int argc, char** argv) {
  using namespace qknorm::bench;
  const Options o = parse_options(&argc, argv);
  if (o.list) {
    for (const qknorm::Backend* e : qknorm::all_backends().entries())
      std::printf("%-24s family=%-9s available=%d\n", e->name().c_str(),
                  e->family().c_str(), e->available() ? 1 : 0);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_corename", openblas_corename());
  std::string isas;
  for (const FmaIsa& isa : fma_isas())
    if (isa.supported) isas += (isas.empty() ? "" : ",") + isa.name;
  benchmark::AddCustomContext("fma_isas", isas);
  const int entries = register_entries(o);
  if (o.anchors) register_anchors(o);
  if (entries == 0)
    std::fprintf(stderr, "qknorm-bench: no registry entry matched %s\n",
                 o.entries.c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
