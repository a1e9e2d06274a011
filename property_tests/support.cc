#include "property_tests/support.h"

#include <rapidcheck.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "property_tests/rc_gens.h"
#include "property_tests/shape_coverage.h"
#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"
#include "tests/sanitize_subset.h"
#include "validation/buffers.h"
#include "validation/judge.h"

namespace qknorm::property {

using validation::AttentionCase;
using validation::ScaleNormCase;

namespace {
Budgets from_tables(const std::vector<validation::ToleranceTable>& tables) {
  Budgets b;
  for (const auto& t : tables) {
    std::vector<double>& v = b.bound[t.field];
    v.resize(t.expected.size());
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = validation::element_bound(t, i);
  }
  return b;
}
}  // namespace

double Budgets::operator[](validation::Field f) const {
  double m = 0;
  for (double x : of(f)) m = std::max(m, x);
  return m;
}

// The verdict's tables for this case (inputs rounded to prec, as every entry
// of that precision sees them).
Budgets attention_budgets(Precision prec, const AttentionCase& c) {
  const AttentionCase rc = validation::round_inputs(c, prec);
  return from_tables(validation::attention_tolerances(
      rc, prec, validation::oracle_attention(rc), false));
}
Budgets scalenorm_budgets(Precision prec, const ScaleNormCase& c) {
  const ScaleNormCase rc = validation::round_inputs(c, prec);
  return from_tables(validation::scalenorm_tolerances(
      rc, prec, validation::oracle_scalenorm(rc)));
}

bool hook_probabilities(const Backend& b, const AttentionCase& c,
                        std::vector<double>* probs) {
  const AttentionProblem& p = c.problem;
  // Guarded buffers: the hook reads its inputs through the views, and NaN
  // poison lies outside them (validation/buffers.h).
  validation::AttentionBuffers bufs(c, b.precision());
  const ForwardArgs fa = bufs.forward_args();
  validate_forward(p, fa, b.precision());
  probs->assign(static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len),
                std::numeric_limits<double>::quiet_NaN());
  auto ws = b.make_workspace();
  const bool hooked = b.attention_probabilities(p, fa, probs->data(), ws.get());
  const std::vector<validation::GuardViolation> g = bufs.guard_violations();
  if (!g.empty())
    throw std::logic_error(b.name() + " probabilities hook on " + c.describe() +
                           ": " + g.front().message());
  return hooked;
}

std::string bitwise_diff(const std::vector<double>& a,
                         const std::vector<double>& b,
                         const std::vector<bool>& selected, bool zero_sign) {
  if (a.size() != b.size()) return "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (!selected.empty() && !selected[i]) continue;
    if (!zero_sign && a[i] == 0 && b[i] == 0) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "index %zu: %.17g vs %.17g", i, a[i],
                    b[i]);
      return buf;
    }
  }
  return "";
}

std::string first_bitwise_diff(const std::vector<BitwiseField>& fields,
                               bool zero_sign) {
  for (const BitwiseField& f : fields) {
    const std::string d = bitwise_diff(*f.a, *f.b, f.selected, zero_sign);
    if (!d.empty()) return std::string(f.name) + " " + d;
  }
  return "";
}

int soak_multiplier() {
  const char* s = std::getenv("QKNORM_SOAK");
  if (s == nullptr || *s == '\0' || std::strcmp(s, "0") == 0) return 1;
  const int n = std::atoi(s);
  return n > 1 ? n : 50;
}

namespace {

class QuietListener final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&,
                      const rc::detail::TestResult&) override {}
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

bool rc_params_has(const char* key) {
  const char* s = std::getenv("RC_PARAMS");
  return s != nullptr && std::strstr(s, key) != nullptr;
}

}  // namespace

RunResult run_body(const std::string& name, const std::function<void()>& body,
                   int cases, const std::string& id, bool shrink,
                   bool honour_reproduce) {
  using namespace rc::detail;
  TestParams params = configuration().testParams;
  const int mult = soak_multiplier();
  if (!rc_params_has("max_success=")) params.maxSuccess = cases * mult;
  if (!rc_params_has("seed=")) {
    // Fixed per test id by default (reproducible CI); a soak run mixes in
    // rapidcheck's own random seed so every soak explores new cases.
    params.seed = fnv1a(id) ^ (mult > 1 ? configuration().testParams.seed : 0);
  }
  params.disableShrinking = !shrink;
  TestMetadata metadata;
  metadata.id = id;
  metadata.description = name;
  const rc::detail::Property property = toProperty([&body] { body(); });
  QuietListener quiet;
  const TestResult result =
      honour_reproduce ? checkProperty(property, metadata, params)
                       : checkProperty(property, metadata, params, quiet, {});
  RunResult r;
  r.pass = result.is<SuccessResult>();
  if (result.is<SuccessResult>())
    r.cases_run = result.get<SuccessResult>().numSuccess;
  if (result.is<FailureResult>())
    r.cases_run = result.get<FailureResult>().numSuccess + 1;
  if (!r.pass) {
    std::ostringstream ss;
    ss << "property " << name << ":\n";
    printResultMessage(result, ss);
    ss << "\nseed=" << params.seed << " max_success=" << params.maxSuccess
       << "  (rerun all its cases: RC_PARAMS=\"seed=" << params.seed
       << " max_success=" << params.maxSuccess
       << "\"; the RC_PARAMS=\"reproduce=...\" line rapidcheck prints at the "
          "end of the run, after GoogleTest's summary, replays just the "
          "failing cases)";
    r.message = ss.str();
  }
  return r;
}

std::string entry_and_case(const Backend& b, const std::string& desc) {
  return "entry " + b.name() + " (family " + b.family() + ", target " +
         b.target() + ", precision " + std::string(name(b.precision())) +
         ") on " + desc;
}

namespace {

thread_local std::string noted_case;

// `message`, followed by the entry and the noted case where it does not
// name them already.
std::string with_entry_and_case(const Backend& b, const std::string& message) {
  const bool names_entry = message.find(b.name()) != std::string::npos;
  const bool names_case =
      noted_case.empty() || message.find(noted_case) != std::string::npos;
  if (names_entry && names_case) return message;
  return message + "\n  [" +
         entry_and_case(
             b, noted_case.empty() ? "(no case built yet)" : noted_case) +
         "]";
}

}  // namespace

void note_case(const std::string& describe) { noted_case = describe; }

int default_cases(const Property& prop) {
  if (!test_support::sanitize_subset() || soak_multiplier() > 1)
    return prop.cases;
  return std::max(std::min(prop.cases, kSanitizeMinCases),
                  prop.cases / kSanitizeCaseDivisor);
}

RunResult run_property(const Property& prop, const Backend& b,
                       const std::string& id, bool shrink,
                       bool honour_reproduce, int cases_override) {
  // The entry's shape model for the generators, and a fresh record of the
  // problems this run judges (the coverage report, shape_coverage.h).
  const ShapeContextScope shapes(b);
  clear_recorded_problems();
  return run_body(
      std::string(prop.name) + " on entry " + b.name(),
      [&b, &prop] {
        const EntryLimitsScope limits(
            b.family() == "plugin" ? entry_limits_of(b) : EntryLimits{});
        note_case("");
        // A plug-in entry declares the features it implements
        // (include/qknorm/plugin.h): a drawn problem it refuses is
        // discarded, not failed (rapidcheck gives up, and fails, if it must
        // discard too many). Our own entries implement every problem the
        // properties draw, so a refusal stays a failure there. Every other
        // failure, an exception included, names the entry and the case.
        using rc::detail::CaseResult;
        try {
          prop.fn(b);
        } catch (const CaseResult& r) {
          if (r.type != CaseResult::Type::Failure) throw;
          throw CaseResult(r.type, with_entry_and_case(b, r.description));
        } catch (const rc::GenerationFailure&) {
          throw;  // rapidcheck discards the case
        } catch (const Error& e) {
          if (b.family() == "plugin" && e.tensor() == "formulation")
            RC_DISCARD(e.what());
          throw CaseResult(
              CaseResult::Type::Failure,
              entry_and_case(b, noted_case) + ": threw: " + e.what());
        } catch (const std::exception& e) {
          throw CaseResult(
              CaseResult::Type::Failure,
              entry_and_case(b, noted_case) + ": threw: " + e.what());
        }
      },
      cases_override > 0 ? cases_override : default_cases(prop), id, shrink,
      honour_reproduce);
}

bool is_formulation_property(const Property& p) {
  return std::string(p.name).rfind("Formulation", 0) == 0;
}

bool implements_variant_of(const Property& prop, const Backend& b) {
  AttentionProblem p;
  p.heads = 2;
  p.kv_heads = 1;
  apply_preset("qwen3", &p);
  const std::string name = prop.name;
  if (name == "FormulationSoftcapAgreement") p.softcap = 5;
  if (name == "FormulationWindowAgreement") p.mask.window_left = 1;
  if (name == "FormulationRopeAgreement") p.rope.rotary_dim = 2;
  if (name == "FormulationSinksAgreement") p.sinks = {0.5, -0.5};
  return b.supports(p);
}

bool implements_formulations(const Backend& b) {
  AttentionProblem p;
  p.heads = 2;
  p.kv_heads = 1;
  apply_preset("qwen3", &p);
  return b.supports(p);
}

const Property& entry_property(const std::string& name) {
  for (const Property& p : entry_properties())
    if (name == p.name) return p;
  throw Error("property", {}, "unknown property '" + name + "'");
}

}  // namespace qknorm::property
