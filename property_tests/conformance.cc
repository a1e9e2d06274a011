// qknorm::conformance (include/qknorm/conformance.h) and the per-entry test
// bodies the registry suite shares with it (entry_checks.h).
#include "qknorm/conformance.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <iostream>
#include <set>
#include <utility>

#include "property_tests/entry_checks.h"
#include "property_tests/rc_gens.h"
#include "property_tests/shape_coverage.h"
#include "property_tests/support.h"
#include "qknorm/error.h"
#include "validation/nonsaturation.h"
#include "validation/run.h"

namespace qknorm::property {

void check_entry_property(const Backend& b, const std::string& property) {
  if (!b.available()) GTEST_SKIP() << b.name() << " cannot run on this CPU";
  const Property& prop = entry_property(property);
  if (is_formulation_property(prop) && !implements_formulations(b))
    GTEST_SKIP() << b.name()
                 << " implements the paper's formulation only "
                    "(Backend::supports refuses the qwen3 preset with GQA)";
  // The variants' properties (issue 34), on an entry that implements the
  // formulations but not that variant (a plug-in: the C ABI has no softcap
  // or window field yet).
  if (is_formulation_property(prop) && !implements_variant_of(prop, b))
    GTEST_SKIP() << b.name() << " does not implement the attention variant "
                 << property << " is about";
  // What the entry does not implement (a forward-only or attention-only
  // plug-in, issue 35): the properties that run it are skipped, named.
  if (prop.reads_gradients && !b.has_attention_backward())
    GTEST_SKIP() << b.name() << " is forward only; " << property
                 << " compares the gradients it computes";
  if (prop.runs_scalenorm && !b.has_scalenorm())
    GTEST_SKIP() << b.name() << " implements no ScaleNorm; " << property
                 << " runs it";
  // The two properties about a mask, on an entry (a plug-in) that does not
  // implement that mask: nothing to check.
  const EntryLimits lim = entry_limits_of(b);
  if ((property == "CausalFuture" && !lim.causal) ||
      (property == "PaddingInvisible" && !lim.padding))
    GTEST_SKIP() << b.name() << " does not implement the mask " << property
                 << " is about";
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string id =
      std::string(info->test_suite_name()) + "/" + info->name();
  const RunResult r = run_property(prop, b, id,
                                   /*shrink=*/true, /*honour_reproduce=*/true);
  // The generated cases this property ran (a soak's size is their sum over
  // the gtest JSON/XML output: --gtest_output=json:FILE).
  testing::Test::RecordProperty("cases_run", r.cases_run);
  // The shapes it judged, for the suite's coverage report (shape_coverage.h).
  write_recorded_problems(b, property);
  EXPECT_TRUE(r.pass) << r.message;
}

// The negative control of non-saturation: sdpa has no bound. With q and k
// scaled by 16 (logits x 256, exact in every format) the same checker that
// passes every qknorm entry must report a violation of the qknorm bound at
// |g| = kGMax on the sdpa probabilities, while the qknorm problem on the very
// same inputs satisfies it and unscaled sdpa (logits of a few units) does too.
// This shows the non-saturation property can fail.
void check_sdpa_saturates(const Backend& b) {
  if (!b.available()) GTEST_SKIP() << b.name() << " cannot run on this CPU";
  {
    AttentionProblem sd;
    sd.variant = Variant::kSDPA;
    if (!b.supports(sd))  // a plug-in without QKNORM_FEATURE_SDPA
      GTEST_SKIP() << b.name() << " does not implement sdpa, the control";
  }
  constexpr double kSaturatingScale = 16.0;
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    AttentionProblem p;
    p.batch = 1, p.heads = 2, p.q_len = 8, p.kv_len = 16, p.head_dim = 8;
    p.g = kGMax;
    p.variant = Variant::kQKNorm;
    validation::AttentionCase qk = validation::round_inputs(
        validation::make_attention_case(p, validation::Distribution::kGaussian,
                                        seed, b.precision()),
        b.precision());
    // The bound at |g| = kGMax (validation/nonsaturation.h), kept for the
    // sdpa controls below: unscaled sdpa's small logits satisfy it, scaled
    // ones do not.
    const double a_plus_e =
        validation::computed_logit_amplitude(qk, nullptr, b.precision(), kGMax);
    auto verdict = [&](const validation::AttentionCase& c) {
      std::vector<double> probs;
      if (!hook_probabilities(b, c, &probs)) return std::string("NO HOOK");
      const auto f = validation::run_attention_forward(b, c);
      return validation::check_nonsaturation(c.problem, probs, &f.lse, a_plus_e,
                                             b.precision());
    };
    const std::string qk_v = verdict(qk);
    ASSERT_NE(qk_v, "NO HOOK")
        << "entry " << b.name()
        << ": no inspection hook (attention_probabilities returned false)";
    EXPECT_EQ(qk_v, "") << "qknorm must satisfy the bound, seed " << seed;
    validation::AttentionCase sd = qk;
    sd.problem.variant = Variant::kSDPA;
    EXPECT_EQ(verdict(sd), "")
        << "unscaled sdpa (small logits) should satisfy it, seed " << seed;
    for (double& x : sd.q) x *= kSaturatingScale;
    for (double& x : sd.k) x *= kSaturatingScale;
    const std::string sd_v = verdict(sd);
    EXPECT_NE(sd_v, "") << "entry " << b.name()
                        << ": sdpa with q, k scaled by 16 did not saturate "
                           "(seed "
                        << seed << "): the non-saturation check cannot fail";
    if (seed == 1) std::cout << "sdpa saturates as expected: " << sd_v << "\n";
  }
}

}  // namespace qknorm::property

namespace qknorm::conformance {
namespace {

constexpr const char* kNegativeControl = "NegativeControlSdpaSaturates";

// One property on one entry.
class PropertyTest : public testing::Test {
 public:
  PropertyTest(const Backend* entry, std::string property)
      : entry_(entry), property_(std::move(property)) {}

  void TestBody() override {
    if (property_ == kNegativeControl) {
      property::check_sdpa_saturates(*entry_);
      return;
    }
    property::check_entry_property(*entry_, property_);
  }

 private:
  const Backend* entry_;
  std::string property_;
};

// Entries handed over by register_suite(unique_ptr), alive until exit (the
// registered tests point at them), and every registered entry's name.
std::vector<std::unique_ptr<Backend>>& owned() {
  static auto* v = new std::vector<std::unique_ptr<Backend>>;
  return *v;
}
std::set<std::string>& registered() {
  static auto* s = new std::set<std::string>;
  return *s;
}

}  // namespace

std::vector<std::string> property_names() {
  std::vector<std::string> names;
  for (const property::Property& p : property::entry_properties())
    names.emplace_back(p.name);
  names.emplace_back(kNegativeControl);
  return names;
}

void register_suite(const Backend& entry, const Options& o) {
  if (!registered().insert(entry.name()).second)
    throw Error("conformance", {},
                "entry '" + entry.name() + "' is registered already");
  const Backend* b = &entry;
  for (const std::string& prop : property_names()) {
    const std::string test = prop + "/" + property::test_name_of(entry.name());
    testing::RegisterTest(
        o.suite.c_str(), test.c_str(), nullptr, entry.name().c_str(), __FILE__,
        __LINE__,
        [b, prop]() -> PropertyTest* { return new PropertyTest(b, prop); });
  }
}

void register_suite(std::unique_ptr<Backend> entry, const Options& o) {
  if (entry == nullptr)
    throw Error("conformance", {}, "register_suite: null entry");
  register_suite(*entry, o);
  owned().push_back(std::move(entry));
}

}  // namespace qknorm::conformance
