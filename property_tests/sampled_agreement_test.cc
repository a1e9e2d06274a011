// The sampled verdict (validation/sampled.h, issue 19) against the full one
// on problems small enough for both: on every mutant and every control
// (mutants.h), the two verdicts agree, case by case. And on a long problem,
// a mutant that breaks only the rows after the last full query block is
// caught by the sampled run (its tile-boundary rows), while the correct
// entry it wraps passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mutants/mutants.h"
#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "validation/forwarding_backend.h"
#include "validation/judge.h"
#include "validation/sampled.h"

namespace qknorm::property {
namespace {

using validation::AttentionCase;
using validation::Distribution;

struct Spec {
  std::string name;
  AttentionProblem p;
  Distribution dist;
  uint64_t seed;
};

// The default suite's shapes (validation/case.h).
constexpr auto shape = &validation::attention_shape;

// The default suite's paper-formulation cases at 4 heads (cli/suite.cc).
std::vector<Spec> paper_specs() {
  std::vector<Spec> s;
  AttentionProblem p = shape(2, 4, 72, 72, 64, g_init(72));
  p.mask.causal = true;
  s.push_back({"72 causal gaussian", p, Distribution::kGaussian, 11});
  p = shape(2, 4, 72, 72, 64, 20);
  p.mask.key_lengths = {72, 48};
  s.push_back({"72 padding wide", p, Distribution::kWideMagnitude, 12});
  p = shape(1, 2, 33, 47, 31, 20);
  p.mask.causal = true;
  p.mask.key_lengths = {29};
  s.push_back({"33x47 causal+padding", p, Distribution::kGaussian, 13});
  return s;
}

// A formulation mutant's own cases (mutation_test.cc's shapes): its preset
// (every GQA preset for gqa_no_group_sum), 4 distributions.
std::vector<Spec> formulation_specs(const std::string& f) {
  const std::vector<const char*> presets =
      f == "gqa"
          ? std::vector<const char*>{"qwen3", "gemma3", "olmo2", "chameleon"}
          : std::vector<const char*>{f.c_str()};
  std::vector<Spec> s;
  uint64_t seed = 1000;
  for (const char* pr : presets)
    for (Distribution d :
         {Distribution::kGaussian, Distribution::kOutlierRows,
          Distribution::kZeroRows, Distribution::kWideMagnitude}) {
      AttentionProblem p = shape(1, 4, 24, 24, 64, 1);
      apply_preset(pr, &p);
      p.kv_heads = find_preset(pr)->gqa ? 2 : 0;
      p.mask.causal = seed % 2 == 0;
      if (!p.mask.causal) p.mask.key_lengths = {19};
      s.push_back({std::string(pr) + " " + validation::name(d), p, d, seed++});
    }
  return s;
}

// Both oracles of a (spec, precision), computed once.
struct Oracles {
  AttentionCase c;
  validation::OracleAttention full;
  validation::SampledOracle sampled;
};

const Oracles& oracles_of(const Spec& spec, Precision s) {
  static std::map<std::pair<std::string, int>, Oracles> cache;
  const auto key = std::make_pair(spec.name, static_cast<int>(s));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Oracles o;
  o.c = validation::round_inputs(
      validation::make_attention_case(spec.p, spec.dist, spec.seed, s), s);
  o.full = validation::oracle_attention(o.c);
  validation::SampleOptions opt;
  opt.rows = 16;  // of 576 query rows: the first, last, tile boundaries,
  opt.seed = 5;   // masked and zero rows, and random ones
  o.sampled = validation::sampled_oracle(o.c, s, opt);
  return cache.emplace(key, std::move(o)).first->second;
}

TEST(SampledVerdict, AgreesWithTheFullVerdictOnEveryMutantAndControl) {
  int agree = 0, total = 0, fail_both = 0, pass_both = 0;
  std::string table;
  std::vector<const Backend*> entries = mutant_registry().entries();
  for (const Backend* c : control_registry().entries()) entries.push_back(c);
  for (const Backend* e : entries) {
    const MutantInfo* info = nullptr;
    for (const MutantInfo& i : mutant_list())
      if (e->family() == "mutant" && e->target() == i.name) info = &i;
    // softcap_dropped's cases are capped and the window mutants' windowed,
    // which the sampled oracle refuses (sampled.cc): they meet the paper's
    // cases, where they are correct copies.
    const bool own = info != nullptr && info->formulation &&
                     std::string(info->formulation) != "softcap" &&
                     std::string(info->formulation) != "window" &&
                     std::string(info->formulation) != "rope" &&
                     std::string(info->formulation) != "sinks";
    const std::vector<Spec> specs =
        own ? formulation_specs(info->formulation) : paper_specs();
    int full_fail = 0, sampled_fail = 0, n = 0;
    for (const Spec& spec : specs) {
      const Precision s = e->precision();
      const Oracles& o = oracles_of(spec, s);
      const validation::AttentionResult r = validation::run_attention(*e, o.c);
      const bool full = validation::judge_attention(o.c, s, o.full, r, nullptr,
                                                    false, e->name(), "")
                            .pass;
      const auto srep = validation::judge_sampled(o.c, o.sampled, r, e->name());
      ++total;
      ++n;
      full_fail += !full;
      sampled_fail += !srep.pass;
      if (full == srep.pass) {
        ++agree;
        (full ? pass_both : fail_both)++;
      } else {
        ADD_FAILURE() << e->name() << " on " << spec.name << ": full verdict "
                      << (full ? "PASS" : "FAIL") << ", sampled "
                      << (srep.pass ? "PASS" : "FAIL") << "\n"
                      << srep.failure_message();
      }
    }
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "  %-40s full FAIL %d/%d, sampled FAIL %d/%d\n",
                  e->name().c_str(), full_fail, n, sampled_fail, n);
    table += buf;
  }
  std::printf("Sampled (16 rows) vs full verdict, %d entries:\n%s",
              static_cast<int>(entries.size()), table.c_str());
  std::printf(
      "agree on %d of %d (entry, case) pairs: %d fail both, %d pass "
      "both\n",
      agree, total, fail_both, pass_both);
  EXPECT_EQ(agree, total);
}

// A correct entry whose forward writes O of the rows after the last full
// query block of kBlock wrong by a relative 2^-10 (a tail-block epilogue
// bug, n % kBlock != 0); everything else is the wrapped entry's.
class TailRowsMutant final : public validation::ForwardingBackend {
 public:
  static constexpr int64_t kBlock = 64;
  TailRowsMutant(const Backend& inner, bool active)
      : ForwardingBackend(inner, active ? "tail_rows" : "tail_rows_off"),
        active_(active) {}
  bool supports(const AttentionProblem& p) const override {
    return inner().supports(p);
  }
  std::vector<int64_t> block_sizes(const AttentionProblem&) const override {
    return {kBlock};
  }
  std::unique_ptr<Workspace> make_workspace() const override {
    return inner().make_workspace();
  }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    inner().attention_forward(p, a, ws, cfg);
    const int64_t tail = p.q_len / kBlock * kBlock;
    if (!active_ || p.q_len % kBlock == 0 || tail == 0) return;
    if (precision() != Precision::kF32)
      throw std::runtime_error("tail_rows mutant: f32 only");
    const Layout4& l = a.o.layout;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h)
        for (int64_t i = tail; i < p.q_len; ++i)
          for (int64_t d = 0; d < p.head_dim; ++d) {
            float* x = static_cast<float*>(a.o.data) + b * l.batch_stride +
                       h * l.head_stride + i * l.row_stride + d;
            *x *= 1 + 0x1p-10f;
          }
  }

 private:
  bool active_;
};

const Backend& fast_f32() {
  for (const char* n : {"simd:AVX3:f32", "simd:AVX2:f32", "blas:f32"}) {
    const Backend* b = all_backends().find(n);
    if (b != nullptr && b->available()) return *b;
  }
  return *all_backends().find("reference:f32");
}

TEST(SampledVerdict, CatchesAMutantOfTheRowsAfterTheLastFullBlock) {
  AttentionProblem p = shape(1, 2, 4000, 4000, 64, 12.32);  // 4000 % 64 = 32
  p.mask.causal = true;
  const AttentionCase c = validation::round_inputs(
      validation::make_attention_case(p, Distribution::kGaussian, 21,
                                      Precision::kF32),
      Precision::kF32);
  const TailRowsMutant off(fast_f32(), false), on(fast_f32(), true);
  validation::SampleOptions opt;
  opt.rows = 32;
  opt.seed = 9;
  opt.blocks = on.block_sizes(p);
  const auto so = validation::sampled_oracle(c, Precision::kF32, opt);
  std::printf("%s on %s\n  %s\n", fast_f32().name().c_str(),
              c.describe().c_str(), so.describe().c_str());
  const auto good = validation::judge_sampled(
      c, so, validation::run_attention(off, c), off.name());
  EXPECT_TRUE(good.pass) << good.failure_message();
  const auto bad = validation::judge_sampled(
      c, so, validation::run_attention(on, c), on.name());
  EXPECT_FALSE(bad.pass);
  // The failing rows are the tail block's (3968 ..).
  EXPECT_NE(bad.failure_message().find("o[0,"), std::string::npos)
      << bad.failure_message();
  std::printf("correct: margin %.3g; mutant: %s\n", good.margin,
              bad.failure_message().substr(0, 600).c_str());
}

}  // namespace
}  // namespace qknorm::property
