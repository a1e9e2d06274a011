// Model presets (issue 34, qknorm/formulation.h apply_model): each model
// applies and validates at several head dims with the fields its public code
// gives (core/formulation.cc cites the sources); every model passes the
// verdict on every registry entry that implements it, at every precision,
// on small cases and on cases long enough for its sliding window to act;
// and for each model one wrong setting of the kind a port gets wrong (a
// theta, a window off by one, the RoPE pairing, the partial rotary factor,
// the sinks, the softcap) FAILs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"
#include "tests/test_support.h"
#include "validation/check.h"
#include "validation/forwarding_backend.h"

namespace qknorm {
namespace {

using test_support::error_of;
using test_support::shape;
using validation::AttentionCase;
using validation::Distribution;

// The model's layer on a causal problem of the given shape; a model with
// sinks gets one per head, -1 + 0.75 h (gpt-oss's learned sinks are O(1)).
AttentionProblem model_problem(const char* model, AttentionProblem p) {
  p.mask.causal = true;
  p.g = 6.5;  // unused: every model's logit scale is fixed (or sdpa's)
  apply_model(model, &p);
  for (size_t h = 0; h < p.sinks.size(); ++h)
    p.sinks[h] = -1 + 0.75 * static_cast<double>(h);
  return p;
}

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const ModelPreset& m : model_presets()) out.push_back(m.name);
  return out;
}

TEST(ModelPresets, EveryModelAppliesAndValidatesAtSeveralHeadDims) {
  for (const std::string& name : model_names())
    for (int64_t D : {8, 16, 64, 128, 256}) {
      AttentionProblem p = shape(2, 4, 9, 12, D, 2);
      apply_model(name, &p);
      EXPECT_NO_THROW(validate_problem(p)) << name << " D " << D;
      const ModelPreset& m = *find_model(name);
      EXPECT_EQ(p.variant, m.variant) << name;
      EXPECT_EQ(p.rope.rotary_dim, static_cast<int64_t>(static_cast<double>(D) *
                                                        m.rotary_fraction))
          << name;
      EXPECT_EQ(p.rope.theta, m.theta) << name;
      EXPECT_TRUE(p.rope.angle_f32) << name;
      EXPECT_EQ(p.softcap, m.softcap) << name;
      EXPECT_EQ(p.sinks.size(), m.sinks ? 4u : 0u) << name;
      EXPECT_EQ(p.mask.window_left, m.window > 0 ? m.window - 1 : -1) << name;
      EXPECT_EQ(p.mask.window_right, m.window > 0 ? 0 : -1) << name;
      // The normalization presets keep their names under a model.
      if (*m.formulation != '\0') {
        EXPECT_EQ(formulation_name(p), m.formulation) << name;
      }
    }
  // The values the public code gives (core/formulation.cc).
  AttentionProblem p = shape(1, 4, 3, 3, 256, 2);
  apply_model("qwen3-next", &p);
  EXPECT_EQ(p.rope.rotary_dim, 64);
  EXPECT_TRUE(p.norm.one_plus_weight);
  EXPECT_EQ(p.norm.kind, NormKind::kRms);
  EXPECT_EQ(p.scale, 1.0 / 16);
  apply_model("llama4", &p);
  EXPECT_EQ(p.rope.order, RopeOrder::kBeforeNorm);
  EXPECT_EQ(p.rope.pairing, RopePairing::kInterleaved);
  EXPECT_FALSE(p.rope.cos_sin_storage);
  EXPECT_EQ(p.norm.weight, ParamShape::kNone);
  EXPECT_EQ(p.eps, 1e-5);
  apply_model("gemma2", &p);
  EXPECT_EQ(p.norm.kind, NormKind::kNone);
  EXPECT_TRUE(p.fixed_scale);
  EXPECT_EQ(p.scale, 1.0 / 16);
  EXPECT_EQ(p.softcap, 50);
  EXPECT_EQ(p.mask.window_left, 4095);
  apply_model("gpt-oss", &p);
  EXPECT_EQ(p.variant, Variant::kSDPA);
  EXPECT_EQ(p.softcap, 0);
  EXPECT_EQ(p.mask.window_left, 127);
  EXPECT_EQ(p.sinks, std::vector<double>(4, 0.0));
  // Given sinks are kept; a model without sinks clears them.
  p.sinks = {1, 2, 3, 4};
  apply_model("gpt-oss", &p);
  EXPECT_EQ(p.sinks, (std::vector<double>{1, 2, 3, 4}));
  apply_model("gemma3-global", &p);
  EXPECT_TRUE(p.sinks.empty());
  EXPECT_EQ(p.mask.window_left, -1);
  EXPECT_EQ(p.rope.theta, 1e6);
}

TEST(ModelPresets, AnUnknownModelNamesTheOptionAndTheKnownNames) {
  AttentionProblem p = shape(1, 2, 3, 3, 16);
  const std::string e = error_of([&] { apply_model("qwen4", &p); });
  EXPECT_NE(e.find("model"), std::string::npos) << e;
  EXPECT_NE(e.find("qwen4"), std::string::npos) << e;
  for (const std::string& name : model_names())
    EXPECT_NE(e.find(name), std::string::npos) << e;
  // The normalization presets are not models (gemma3 is two layers).
  EXPECT_NE(error_of([&] { apply_model("gemma3", &p); }).find("model"),
            std::string::npos);
}

// The shapes each model is judged on: a small GQA prefill, a decode-like
// one (q_len < kv_len), and where the model has a window one long enough
// for it to drop keys (kv_len > window), few heads and queries so it stays
// cheap.
std::vector<AttentionProblem> shapes_for(const ModelPreset& m) {
  std::vector<AttentionProblem> out = {shape(2, 4, 9, 12, 32, 2),
                                       shape(1, 4, 3, 17, 16, 1)};
  if (m.window > 0) out.push_back(shape(1, 2, 6, m.window + 9, 16, 1));
  return out;
}

// Under the sanitizer subset (test_support::sanitize_keeps) every other
// case of each model: its every shape and precision, one distribution each.
TEST(ModelPresets, EveryModelPassesTheVerdictOnEveryEntryWithIt) {
  for (const ModelPreset& m : model_presets()) {
    test_support::EveryEntry all;
    int64_t index = 0;
    for (const AttentionProblem& s : shapes_for(m))
      for (Precision prec : kAllPrecisions)
        for (Distribution d :
             {Distribution::kGaussian, Distribution::kOutlierRows}) {
          if (!test_support::sanitize_keeps(index++, 2)) continue;
          const AttentionProblem p = model_problem(m.name, s);
          all.judge(
              validation::make_attention_case(p, d, 3400 + all.cases, prec),
              prec);
        }
    EXPECT_GT(all.worst.count("reference:f64"), 0u) << m.name;
    EXPECT_GT(all.worst.count("reference:f32"), 0u) << m.name;
    all.print(m.name);
  }
}

// An entry that computes a model with one setting wrong: the inner entry
// runs the problem as `wrong` leaves it (forward and backward; a dropped
// sink's gradient is 0).
class WrongSetting final : public validation::ForwardingBackend {
 public:
  WrongSetting(const Backend& inner, std::string what,
               std::function<void(AttentionProblem*)> wrong)
      : ForwardingBackend(inner, std::move(what)), wrong_(std::move(wrong)) {}
  bool supports(const AttentionProblem&) const override { return true; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    inner().attention_forward(changed(p), a, ws, c);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& c) const override {
    const AttentionProblem q = changed(p);
    BackwardArgs b = a;
    if (!has_sinks(q)) {
      b.d_sinks = nullptr;
      b.d_sinks_size = 0;
    }
    inner().attention_backward(q, b, ws, c);
    if (!has_sinks(q))
      for (int64_t h = 0; h < a.d_sinks_size; ++h) a.d_sinks[h] = 0;
  }

 private:
  AttentionProblem changed(const AttentionProblem& p) const {
    AttentionProblem q = p;
    wrong_(&q);
    return q;
  }
  std::function<void(AttentionProblem*)> wrong_;
};

struct Mutation {
  const char* model;
  const char* what;
  std::function<void(AttentionProblem*)> wrong;
  AttentionProblem shape;
};

TEST(ModelPresets, AWrongSettingOfEachModelFails) {
  const AttentionProblem small = shape(2, 4, 9, 12, 32, 2);
  const std::vector<Mutation> mutations = {
      // The config class's default theta 10000 for the released one.
      {"qwen3", "theta_1e4", [](AttentionProblem* p) { p->rope.theta = 1e4; },
       small},
      {"olmo2", "theta_1e4", [](AttentionProblem* p) { p->rope.theta = 1e4; },
       small},
      // transformers #39408's off-by-one: i - j <= w for i - j < w.
      {"gemma3-local", "window_1024_0",
       [](AttentionProblem* p) { p->mask.window_left = 1024; },
       shape(1, 2, 6, 1033, 16, 1)},
      // The local layers' base (rope_local_base_freq) on a global layer.
      {"gemma3-global", "theta_1e4",
       [](AttentionProblem* p) { p->rope.theta = 1e4; }, small},
      // rotate_half's pairing for Llama 4's complex (adjacent) pairs.
      {"llama4", "half_pairing",
       [](AttentionProblem* p) { p->rope.pairing = RopePairing::kHalf; },
       small},
      // partial_rotary_factor ignored: the whole head rotated.
      {"qwen3-next", "full_rotary",
       [](AttentionProblem* p) { p->rope.rotary_dim = p->head_dim; }, small},
      {"gpt-oss", "sinks_dropped",
       [](AttentionProblem* p) { p->sinks.clear(); }, small},
      {"gpt-oss", "window_128_0",
       [](AttentionProblem* p) { p->mask.window_left = 128; },
       shape(1, 4, 20, 150, 16, 2)},
      // head_dim 256 as the model: logits of O(1), where the cap bends them.
      {"gemma2", "softcap_dropped", [](AttentionProblem* p) { p->softcap = 0; },
       shape(1, 2, 9, 12, 256, 1)},
  };
  const Backend& r64 = *all_backends().find("reference:f64");
  const Backend& r32 = *all_backends().find("reference:f32");
  int n = 0;
  for (const Mutation& mu : mutations)
    for (Precision prec : {Precision::kF64, Precision::kF32}) {
      const WrongSetting bad(prec == Precision::kF64 ? r64 : r32, mu.what,
                             mu.wrong);
      const AttentionCase c = validation::make_attention_case(
          model_problem(mu.model, mu.shape), Distribution::kGaussian,
          3900 + n++, prec);
      const auto rep = validation::check_attention(bad, c, {}, false, false);
      EXPECT_FALSE(rep.pass)
          << mu.model << " " << mu.what << " passed " << c.describe();
      std::printf("%s %s (%s): margin %.3g\n", mu.model, mu.what,
                  std::string(name(prec)).c_str(), rep.margin);
    }
}

}  // namespace
}  // namespace qknorm
