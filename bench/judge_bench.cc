// qknorm-judge-bench: what one entry's attention case costs besides its
// kernels (issue 32), step by step, on the default run's first case (B=2
// H=8 Nq=Nk=72 D=64, g0, causal, gaussian, seed 42) as cli/suite.cc runs it:
// the oracle and the naive baseline are shared per (case, precision) and made
// once here, outside every timing.
//
// Steps, each a benchmark per entry (--benchmark_filter picks them):
//   Buffers      AttentionBuffers: allocate, poison, NaN-fill, encode inputs
//   Forward      the entry's forward kernel (checked_attention_forward)
//   Feed         feed_backward: decode o and lse, check them as backward input
//   Backward     the entry's backward kernel
//   Result       fed_result: decode every output
//   Run          the four above and the kernels: run_attention_fed, whole
//   Tolerances   attention_tolerances (the rule's tables)
//   JudgeField   judge_field of o (2x8x72x64 elements) with the naive beside
//   Compare      compare() of o alone (the report's statistics)
//   Judge        judge_attention, whole (tables, every field, diagnoses)
//   Prepared     judge_attention on the case's PreparedAttention: an
//                entry's own share where the suite prepares it once per
//                case and precision (validation/judge.h)
// Nothing is asserted: like qknorm-bench, this measures and never gates.
#include <benchmark/benchmark.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/buffers.h"
#include "validation/case.h"
#include "validation/judge.h"
#include "validation/oracle.h"
#include "validation/rule.h"
#include "validation/run.h"

namespace qknorm::validation {
namespace {

// The shared part of one (case, precision): what the suite makes once.
struct Shared {
  AttentionCase rc;
  OracleAttention orc;
  AttentionResult naive;
  OracleSource source() const {
    return [this] { return ExactForward{orc.o, orc.lse}; };
  }
};

const Shared& shared(Precision s) {
  static Shared made[4];
  static bool ready[4] = {};
  const size_t i = static_cast<size_t>(s);
  if (!ready[i]) {
    AttentionProblem p;
    p.batch = 2;
    p.heads = 8;
    p.q_len = p.kv_len = 72;
    p.head_dim = 64;
    p.g = g_init(72);
    p.mask.causal = true;
    Shared& sh = made[i];
    sh.rc =
        round_inputs(make_attention_case(p, Distribution::kGaussian, 42, s), s);
    sh.orc = oracle_attention(sh.rc);
    sh.naive = run_attention_fed(naive_for(s), sh.rc, sh.source());
    ready[i] = true;
  }
  return made[i];
}

const Backend& entry(const std::string& name) {
  const Backend* b = all_backends().find(name);
  if (b == nullptr || !b->available())
    throw std::runtime_error("no available entry " + name);
  return *b;
}

void Buffers(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  for (auto _ : st) {
    AttentionBuffers bufs(sh.rc, b.precision());
    benchmark::DoNotOptimize(bufs.q.data());
  }
}

// The kernel steps and the decode steps around them, on one set of buffers.
void Steps(benchmark::State& st, const std::string& name, int step) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  const AttentionProblem& p = sh.rc.problem;
  AttentionBuffers bufs(sh.rc, b.precision());
  auto ws = b.make_workspace();
  checked_attention_forward(b, p, bufs.forward_args(), ws.get());
  BackwardFeed feed = feed_backward(sh.rc, sh.source(), &bufs);
  checked_attention_backward(b, p, bufs.backward_args(), ws.get());
  for (auto _ : st) {
    switch (step) {
      case 0:
        checked_attention_forward(b, p, bufs.forward_args(), ws.get());
        break;
      case 1:
        benchmark::DoNotOptimize(feed_backward(sh.rc, sh.source(), &bufs));
        break;
      case 2:
        checked_attention_backward(b, p, bufs.backward_args(), ws.get());
        break;
      case 3:
        benchmark::DoNotOptimize(fed_result(bufs, feed));
        break;
    }
  }
}

void Run(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  for (auto _ : st)
    benchmark::DoNotOptimize(run_attention_fed(b, sh.rc, sh.source()));
}

void Tolerances(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  for (auto _ : st)
    benchmark::DoNotOptimize(attention_tolerances(sh.rc, b.precision(), sh.orc,
                                                  false, b.contract()));
}

// o's table and values: the field every entry's verdict judges.
struct OField {
  ToleranceTable t;
  std::vector<double> actual, naive;
};
OField o_field(const Backend& b, const Shared& sh) {
  OField f;
  for (ToleranceTable& t :
       attention_tolerances(sh.rc, b.precision(), sh.orc, false, b.contract()))
    if (t.field == Field::kO) f.t = std::move(t);
  f.actual = run_attention_fed(b, sh.rc, sh.source()).o;
  f.naive = sh.naive.o;
  return f;
}

void JudgeField(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const OField f = o_field(b, shared(b.precision()));
  for (auto _ : st)
    benchmark::DoNotOptimize(judge_field(f.t, f.actual, &f.naive));
  st.SetItemsProcessed(st.iterations() *
                       static_cast<int64_t>(f.t.expected.size()));
}

void Compare(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const OField f = o_field(b, shared(b.precision()));
  for (auto _ : st)
    benchmark::DoNotOptimize(compare(f.actual, f.t.expected, f.t.fmt));
  st.SetItemsProcessed(st.iterations() *
                       static_cast<int64_t>(f.t.expected.size()));
}

void Judge(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  const AttentionResult er = run_attention_fed(b, sh.rc, sh.source());
  const bool naive = b.family() != "reference";  // as cli/suite.cc
  for (auto _ : st)
    benchmark::DoNotOptimize(judge_attention(
        sh.rc, b.precision(), sh.orc, er, naive ? &sh.naive : nullptr, false,
        b.name(), naive_for(b.precision()).name(), nullptr, b.contract()));
}

void Prepared(benchmark::State& st, const std::string& name) {
  const Backend& b = entry(name);
  const Shared& sh = shared(b.precision());
  const AttentionResult er = run_attention_fed(b, sh.rc, sh.source());
  const PreparedAttention prep =
      prepare_attention(sh.rc, b.precision(), sh.orc, &sh.naive, false,
                        naive_for(b.precision()).name(), b.contract());
  for (auto _ : st)
    benchmark::DoNotOptimize(
        judge_attention(prep, sh.rc, b.precision(), sh.orc, er, b.name()));
}

// A 16-bit, a 32-bit and a 64-bit entry of each family the default run has.
const char* const kEntries[] = {"simd:AVX2:f32", "simd:AVX2:bf16",
                                "simd:SCALAR:f16", "blas:f64", "reference:f32"};

void Register() {
  for (const char* e : kEntries) {
    const Backend* b = all_backends().find(e);
    if (b == nullptr || !b->available()) continue;
    const std::string n = e;
    benchmark::RegisterBenchmark(("Buffers/" + n).c_str(), Buffers, n)
        ->Unit(benchmark::kMillisecond);
    const char* steps[] = {"Forward/", "Feed/", "Backward/", "Result/"};
    for (int s = 0; s < 4; ++s)
      benchmark::RegisterBenchmark((steps[s] + n).c_str(), Steps, n, s)
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Run/" + n).c_str(), Run, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Tolerances/" + n).c_str(), Tolerances, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("JudgeField/" + n).c_str(), JudgeField, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Compare/" + n).c_str(), Compare, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Judge/" + n).c_str(), Judge, n)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("Prepared/" + n).c_str(), Prepared, n)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace qknorm::validation

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  qknorm::validation::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
