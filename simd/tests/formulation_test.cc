// The QK-norm formulations (issue 16) on every runnable simd entry: every
// preset (GQA with 4 query heads over 2 kv heads where the model ships GQA)
// x distributions (Gaussian, zero rows, outlier rows) x masks (none, causal,
// padding with a fully masked batch) passes the componentwise verdict
// (validation::check_attention, with the naive baseline), the parameter
// gradients included; the worst margin per preset is printed. Results are
// bitwise identical for 1 and 2 threads on a shape with several row tasks,
// key groups and query blocks.
#include "qknorm/formulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "simd/tests/test_util.h"
#include "validation/check.h"

namespace qknorm::simd::testing {
namespace {

using validation::AttentionCase;
using validation::Distribution;

enum FormMask { kNoMask, kCausalMask, kPaddingMask };

AttentionProblem PresetProblem(const Preset& s, int64_t B, int64_t Nq,
                               int64_t Nk, int64_t D, int mask) {
  AttentionProblem p;
  p.batch = B, p.heads = s.gqa ? 4 : 2, p.kv_heads = 2;
  p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  apply_preset(s.name, &p);
  p.g = 3.5;
  p.mask.causal = mask == kCausalMask;
  if (mask == kPaddingMask) {
    p.mask.key_lengths.assign(static_cast<size_t>(B), Nk - 2);
    if (B > 1) p.mask.key_lengths[1] = 0;  // a fully masked batch
  }
  return p;
}

class SimdFormulations : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdFormulations, EveryPresetPassesTheVerdict) {
  const Backend& entry = *GetParam();
  std::map<std::string, double> worst;
  int n = 0;
  for (const Preset& s : presets())
    for (Distribution d : {Distribution::kGaussian, Distribution::kZeroRows,
                           Distribution::kOutlierRows})
      for (int mask : {kNoMask, kCausalMask, kPaddingMask}) {
        const AttentionProblem p = PresetProblem(s, 2, 5, 7, 12, mask);
        ASSERT_TRUE(entry.supports(p)) << s.name;
        AttentionCase c = validation::make_attention_case(
            p, d, 500 + static_cast<uint64_t>(n), entry.precision());
        if (n % 3 == 1) c.row_pad = 3;  // strided rows
        const auto rep =
            validation::check_attention(entry, c, ExecConfig{2}, false, true);
        EXPECT_TRUE(rep.pass) << s.name << ": " << rep.failure_message();
        worst[s.name] = std::max(worst[s.name], rep.margin);
        ++n;
      }
  for (const auto& [name, m] : worst)
    std::printf("%s %-10s worst margin %.3f\n", entry.name().c_str(),
                name.c_str(), m);
}

TEST_P(SimdFormulations, ThreadsOneAndTwoAgreeBitwise) {
  const Backend& entry = *GetParam();
  for (const Preset& s : presets()) {
    // 150 query rows: 3 row tasks and query blocks; 200 keys: 4 key blocks
    // (key groups); padding with a fully masked batch.
    const AttentionProblem p = PresetProblem(s, 2, 150, 200, 33, kPaddingMask);
    const auto c = validation::round_inputs(
        validation::make_attention_case(p, Distribution::kOutlierRows, 77,
                                        entry.precision()),
        entry.precision());
    const auto one = validation::run_attention(entry, c, ExecConfig{1});
    const auto two = validation::run_attention(entry, c, ExecConfig{2});
    ExpectSame(one, two, entry.name() + " " + s.name + " threads 1 vs 2");
  }
}

// Free combinations beyond the presets: every mode of each side (raw,
// unit l2, generic) with GQA, fixed scales, biases, Gemma's 1 + w, rounding
// before the weight with a bias, across-heads l2 and layer norms.
std::vector<std::pair<std::string, AttentionProblem>> FreeCombinations() {
  std::vector<std::pair<std::string, AttentionProblem>> r;
  auto base = [] {
    AttentionProblem p;
    p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 6, p.kv_len = 9;
    p.head_dim = 12, p.g = 2.5, p.eps = 1e-5;
    return p;
  };
  AttentionProblem p = base();
  p.variant = Variant::kSDPA;
  r.emplace_back("sdpa gqa", p);
  p = base();
  p.fixed_scale = true, p.scale = 4;
  r.emplace_back("l2 gqa fixed", p);
  p = base();
  p.norm.kind = NormKind::kNone, p.norm.weight = ParamShape::kDim;
  p.norm.bias = true, p.fixed_scale = true, p.scale = 0.25;
  r.emplace_back("none w b", p);
  p = base();
  p.norm.kind = NormKind::kLayer, p.norm.axis = NormAxis::kAllHeads;
  p.norm.weight = ParamShape::kHeadDim, p.norm.bias = true;
  p.norm.one_plus_weight = true;
  r.emplace_back("layer all 1+w b", p);
  p = base();
  p.norm.kind = NormKind::kRms, p.norm.weight = ParamShape::kHeadDim;
  p.norm.bias = true, p.norm.round_before_weight = true;
  p.fixed_scale = true, p.scale = 0.5;
  r.emplace_back("rms round w b", p);
  p = base();
  p.norm.axis = NormAxis::kAllHeads;
  r.emplace_back("l2 all", p);
  p = base();
  p.norm.kind = NormKind::kRms, p.norm.axis = NormAxis::kAllHeads;
  r.emplace_back("rms all", p);
  p = base();
  p.kv_heads = 4;
  p.norm.weight = ParamShape::kDim, p.norm.shared_qk_weight = true;
  p.norm.one_plus_weight = true;
  r.emplace_back("l2 shared 1+w", p);
  return r;
}

TEST_P(SimdFormulations, FreeCombinationsPassTheVerdict) {
  const Backend& entry = *GetParam();
  int n = 0;
  for (const auto& [what, p] : FreeCombinations())
    for (Distribution d : {Distribution::kGaussian, Distribution::kZeroRows})
      for (int mask : {kNoMask, kCausalMask}) {
        AttentionProblem pm = p;
        pm.mask.causal = mask == kCausalMask;
        ASSERT_TRUE(entry.supports(pm)) << what;
        AttentionCase c = validation::make_attention_case(
            pm, d, 700 + static_cast<uint64_t>(n++), entry.precision());
        const auto rep =
            validation::check_attention(entry, c, ExecConfig{2}, false, true);
        EXPECT_TRUE(rep.pass) << what << ": " << rep.failure_message();
      }
}

// The probabilities hook follows the formulation: each preset's
// probabilities equal the f64 reference's to f32 accuracy.
TEST_P(SimdFormulations, ProbabilitiesFollowTheFormulation) {
  const Backend& entry = *GetParam();
  if (entry.precision() != Precision::kF32) GTEST_SKIP() << "f32 suffices";
  const Backend& ref = *all_backends().find("reference:f64");
  for (const Preset& s : presets()) {
    const AttentionProblem p = PresetProblem(s, 2, 9, 70, 12, kPaddingMask);
    const auto c = validation::round_inputs(
        validation::make_attention_case(p, Distribution::kGaussian, 5,
                                        Precision::kF32),
        Precision::kF32);
    const auto mine = Probabilities(entry, c);
    const auto want = Probabilities(ref, c);
    ASSERT_FALSE(mine.empty()) << entry.name();
    ASSERT_EQ(mine.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < mine.size(); ++i)
      worst = std::max(worst, std::fabs(mine[i] - want[i]));
    EXPECT_LT(worst, 1e-5) << entry.name() << " " << s.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdFormulations,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
