// Shared machinery of the property suite: per-field error budgets from the
// tolerance rule, the inspection-hook call, bitwise comparisons, and the
// property table and runner used by both the GoogleTest cases and the
// mutation test.
#ifndef QKNORM_PROPERTY_TESTS_SUPPORT_H_
#define QKNORM_PROPERTY_TESTS_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/case.h"
#include "validation/field.h"

namespace qknorm::property {

// Per-element budget of the verdict (validation/rule.h) for one case:
// bound_e, the largest deviation from the oracle the rule lets ONE run of an
// entry of that precision have at element e. It does not depend on the
// entry, only on the case and the precision. Transform properties compare two
// runs of the same entry on inputs the oracle maps exactly onto each other, so
// the two runs may differ by the sum of the two cases' budgets (triangle
// inequality through the oracle). Where the bound is an a-priori gamma, two
// runs get kTwoRuns of it.
inline constexpr double kTwoRuns = 2.0;

struct Budgets {
  // bound_e of every field the rule judges: attention kO, kLse, kDq, kDk,
  // kDv, kDg (and the parameter gradients of a formulation that has them);
  // ScaleNorm kY, kDx, kScaleNormDg.
  std::map<validation::Field, std::vector<double>> bound;
  // The field's per-element budgets.
  const std::vector<double>& of(validation::Field f) const {
    return bound.at(f);
  }
  // Element i's budget.
  double at(validation::Field f, size_t i) const { return of(f).at(i); }
  // The field's largest budget (for properties that sum over elements).
  double operator[](validation::Field f) const;
};
Budgets attention_budgets(Precision prec, const validation::AttentionCase& c);
Budgets scalenorm_budgets(Precision prec, const validation::ScaleNormCase& c);

// Calls the entry's inspection hook on the case (inputs encoded densely in
// the entry's storage). Returns false if the entry has no hook.
bool hook_probabilities(const Backend& b, const validation::AttentionCase& c,
                        std::vector<double>* probs);

// Bitwise equality of two decoded outputs restricted to `selected` indices
// (all if empty). On a mismatch returns a description (index, both values).
// zero_sign = false treats +0 and -0 as the same value (every other value
// must match bit for bit): a kernel that adds a masked key's exact 0 * x
// term instead of skipping it can flip the sign of an underflowed zero, which
// no consumer can observe except through 1/x.
std::string bitwise_diff(const std::vector<double>& a,
                         const std::vector<double>& b,
                         const std::vector<bool>& selected = {},
                         bool zero_sign = true);

// One output of two runs, restricted to `selected` (all if empty).
struct BitwiseField {
  const char* name;
  const std::vector<double>* a;
  const std::vector<double>* b;
  std::vector<bool> selected = {};
};
// "<name> <bitwise_diff>" of the first field whose runs differ, "" if none.
std::string first_bitwise_diff(const std::vector<BitwiseField>& fields,
                               bool zero_sign = true);

// Index helpers for dense [B, H, rows, D] tensors.
inline int64_t idx4(const AttentionProblem& p, int64_t rows, int64_t b,
                    int64_t h, int64_t r, int64_t d) {
  return ((b * p.heads + h) * rows + r) * p.head_dim + d;
}

// --- The property table -------------------------------------------------
// Every property is a function of one entry; inside it draws its inputs with
// rapidcheck's `*gen` and fails with RC_ASSERT / RC_FAIL. The same table runs
// on every registry entry (property_test.cc) and on every mutant
// (mutation_test.cc).
using PropertyFn = void (*)(const Backend&);
struct Property {
  const char* name;
  PropertyFn fn;
  int cases;  // rapidcheck max_success of a default run
  // What the property runs besides the attention forward (issue 35): the
  // attention backward, whose gradients it compares itself (a property
  // judged by the verdict, such as AttentionAgreement, needs neither: a
  // forward-only entry's gradient fields are "not judged" there), and
  // ScaleNorm. check_entry_property skips it on an entry that lacks either.
  bool reads_gradients = false;
  bool runs_scalenorm = false;
};
const std::vector<Property>& entry_properties();
const Property& entry_property(const std::string& name);

// FormulationAgreement and FormulationNonSaturation: the properties that
// draw the formulations of issue 16 (presets, free combinations, GQA).
bool is_formulation_property(const Property& p);
// True if the entry implements those formulations (its supports() accepts
// the qwen3 preset with GQA); an entry implementing the paper's formulation
// only (the Backend default) fails every formulation property with "does
// not implement".
bool implements_formulations(const Backend& b);
// True if the entry implements the attention variant (issue 34) a
// formulation property is about: the softcap for FormulationSoftcapAgreement,
// the window for FormulationWindowAgreement, RoPE for
// FormulationRopeAgreement, sinks for FormulationSinksAgreement (the qwen3
// preset with GQA and
// that variant); true for the other properties.
bool implements_variant_of(const Property& prop, const Backend& b);

// QKNORM_SOAK=<n> multiplies every property's case count by n (QKNORM_SOAK=1
// means 50x) and draws a fresh random seed per run (printed on failure);
// without it, each property runs with a fixed seed derived from its test id so
// a CI run is reproducible. RC_PARAMS="seed=..." / "max_success=..." override
// both; RC_PARAMS="reproduce=..." replays a failure.
int soak_multiplier();

// How every property failure names its entry and its case: "entry <name>
// (family F, target T, precision P) on <case>".
std::string entry_and_case(const Backend& b, const std::string& desc);
// The case the running property is on (its describe(): shape, formulation,
// distribution, seed), for the failures that do not name it themselves: an
// exception escaping the property (an entry that throws), an RC_FAIL that
// names no case. build_case (rc_gens.h) notes every case it builds; a
// property that makes its case otherwise notes it. run_property clears it
// before each case and adds entry_and_case to any failure message that
// lacks the entry's name or the noted case.
void note_case(const std::string& describe);

// The case count run_property gives `prop` when the caller does not name
// one: prop.cases, except in the sanitizer stage (QKNORM_SANITIZE_SUBSET=1,
// exported by scripts/sanitize.sh; tests/sanitize_subset.h), which is for
// memory safety and UB on every code path, not for the properties'
// statistics: there a quarter of them, and at least kSanitizeMinCases (or
// all, if fewer). The seed stays the test id's; rapidcheck spreads any
// count over every generator size from 0 to its maximum, so the smaller run
// still reaches the largest shapes. Measured in the Clang tree: the quick
// EntryProperty tests under ASan, 182 test-s of that stage (CTestCostData
// of 938c795's fresh clone). The GCC stage and every soak run the full
// count; QKNORM_SANITIZE_SUBSET=0 restores it under the sanitizers.
inline constexpr int kSanitizeCaseDivisor = 4;
inline constexpr int kSanitizeMinCases = 20;
int default_cases(const Property& prop);

struct RunResult {
  bool pass = true;
  std::string message;  // rapidcheck's report + seed + how to reproduce
  int cases_run = 0;
};
// Runs `prop` on `b` under rapidcheck; every failure message names the
// entry and the case (note_case). `id` is the reproduce key (the GTest
// "Suite/Name"); shrink = false for the mutation test (speed);
// honour_reproduce = false ignores RC_PARAMS="reproduce=..." (mutants).
RunResult run_property(const Property& prop, const Backend& b,
                       const std::string& id, bool shrink,
                       bool honour_reproduce, int cases_override = 0);
// The same for a property of no entry (the oracle's own checks).
RunResult run_body(const std::string& name, const std::function<void()>& body,
                   int cases, const std::string& id, bool shrink,
                   bool honour_reproduce);

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_SUPPORT_H_
