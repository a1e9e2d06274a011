// qknorm-callgrind: one fixed forward and one fixed backward call of every
// matched registry entry (plus the bare GEMMs of the same shape), each
// bracketed by callgrind client requests so that `valgrind --tool=callgrind
// --collect-atstart=no` counts exactly that call and dumps it under its own
// label ("fwd simd:AVX2:f32 nomask"). Timings are noisy on shared machines;
// instruction counts are not, so later work tracks regressions by count.
//
// Every call runs once untimed and uncounted first (workspace sized, pages
// touched), then once counted. Outside valgrind the requests are no-ops and
// the driver just prints the labels it would count.
//   usage: qknorm-callgrind [--entries=GLOBS] [--n=N] [--d=D] [--heads=H]
//          defaults: every available simd, blas and reference entry;
//          n = 256, d = 64, H = 2; threads 1 (pin OPENBLAS_NUM_THREADS=1).
#include <valgrind/callgrind.h>

#include <cstdio>
#include <string>

#include "bench/attention_setup.h"

namespace qknorm::bench {
namespace {

template <class F>
void count(const std::string& label, F&& call) {
  call();  // uncounted warm-up
  CALLGRIND_ZERO_STATS;
  CALLGRIND_TOGGLE_COLLECT;
  call();
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS_AT(label.c_str());
  std::printf("counted %s\n", label.c_str());
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  std::string globs = "simd:*,blas:*,reference:*";
  Shape shape;
  shape.heads = 2, shape.n = 256, shape.d = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&](const char* flag, int64_t* out) {
      const std::string f = std::string(flag) + "=";
      if (a.rfind(f, 0) != 0) return false;
      *out = std::stoll(a.substr(f.size()));
      return true;
    };
    if (a.rfind("--entries=", 0) == 0) {
      globs = a.substr(10);
    } else if (!num("--n", &shape.n) && !num("--d", &shape.d) &&
               !num("--heads", &shape.heads)) {
      std::fprintf(stderr, "qknorm-callgrind: unknown argument %s\n",
                   a.c_str());
      return 2;
    }
  }
  constexpr int kThreads = 1;
  set_openblas_threads(kThreads);
  std::printf("shape %s threads %d openblas %s\n", shape.describe().c_str(),
              kThreads, openblas_corename());
  {
    GemmAnchor gemm(shape);
    count("gemm qk", [&] { gemm.qk(); });
    count("gemm pv", [&] { gemm.pv(); });
  }
  for (const Backend* e : match_entries(globs)) {
    if (!e->available()) {
      std::printf("skipped %s (not available)\n", e->name().c_str());
      continue;
    }
    AttentionBuffers buf(shape, e->precision());
    AttentionRun run(*e);
    for (bool causal : {false, true}) {
      const std::string tail = e->name() + (causal ? " causal" : " nomask");
      try {
        run.prepare_forward(buf, causal, kThreads);
        count("fwd " + tail, [&] { run.forward(buf, causal, kThreads); });
        run.prepare_backward(buf, causal, kThreads);
        count("bwd " + tail, [&] { run.backward(buf, causal, kThreads); });
      } catch (const std::exception& ex) {
        std::printf("failed %s: %s\n", tail.c_str(), ex.what());
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace qknorm::bench

int main(int argc, char** argv) { return qknorm::bench::run(argc, argv); }
