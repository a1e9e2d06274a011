// The verdict, pure: elements -> field -> case. judge_element holds one
// value to its bound in a table of the rule (validation/rule.h), judge_field
// one field, judge_attention / judge_scalenorm a case's results. Nothing
// here runs an entry (validation/check.h runs and judges).
#ifndef QKNORM_VALIDATION_JUDGE_H_
#define QKNORM_VALIDATION_JUDGE_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qknorm/precision.h"
#include "validation/case.h"
#include "validation/diagnose.h"
#include "validation/field.h"
#include "validation/metrics.h"
#include "validation/oracle.h"
#include "validation/rule.h"
#include "validation/run.h"

namespace qknorm::validation {

enum class ElementClass {
  kWithin,            // finite and within its bound
  kEqualInfinity,     // the oracle is +-inf and so is the value
  kNotRepresentable,  // an infinity on a side the bound's interval reaches
  kOver,              // finite, beyond its bound
  kWrongNonFinite,    // NaN or inf where another value is defined
};
bool passes(ElementClass c);

struct ElementJudgement {
  ElementClass cls = ElementClass::kWithin;
  double err = 0;     // |actual - x| (inf for a wrong non-finite)
  double bound = 0;   // delta + half spacing
  double margin = 0;  // err / bound (inf if bound == 0 < err)
};
ElementJudgement judge_element(const ToleranceTable& t, size_t i,
                               double actual);
// Where round to nearest gives inf in fmt: max_finite + ulp(max_finite) / 2
// (65520 in f16; the tie rounds to inf, max_finite's last bit being odd).
long double overflow_threshold(Precision fmt);
// Which infinities element i of a finite x_i may correctly round to: those
// on the sides where [x_i - delta_i, x_i + delta_i] reaches the threshold.
struct InfinityReach {
  bool positive = false, negative = false;
};
InfinityReach infinity_reach(const ToleranceTable& t, size_t i);
// The bound element i of a finite answer is held to (delta_i + the half
// spacing at x_i, x_i clamped to the format's range); 0 where x_i = +-inf.
double element_bound(const ToleranceTable& t, size_t i);

// The componentwise verdict of one field.
struct FieldVerdict {
  Field id = Field::kO;
  // The O(n D) property a sampled verdict judges the field by ("finite,
  // masked rows defined"; validation/sampled.h); null for the rule's
  // element verdict.
  const char* property = nullptr;
  double amplitude = 0;
  ErrorStats entry, naive;  // statistics for the report and the JSON
  bool has_naive = false;
  int64_t count = 0;
  int64_t failures = 0;           // elements that fail
  int64_t not_representable = 0;  // accepted infinities (interval overflows)
  int64_t ill_conditioned = 0;    // elements with kappa_e > kIllConditioned
  // The element of largest margin err_e / bound_e (> 1 fails).
  double margin = 0;
  int64_t worst_index = -1;
  std::string worst_where;  // "[b,h,n,d]"
  double worst_expected = 0, worst_actual = 0, worst_bound = 0;
  double naive_margin = 0;  // the naive's own largest margin
  std::string diagnosis;    // the first failing element's diagnosis
  bool pass = true;
  // False where the field could not be judged (the backward did not run:
  // BackwardInput::kNotRun, validation/run.h); it then neither passes nor
  // fails the case (pass stays true, failures 0) and `note` says why.
  bool judged = true;
  // "judged on the oracle's O and lse", "not judged: <reason>"; "" when
  // judged on the entry's own outputs.
  std::string note;
};

// The field's name, with the property where there is one: "o", "o[all
// rows: within the visible v]".
std::string label(const FieldVerdict& v);

// Judges `actual` against table `t`; `naive` (may be null) is judged too,
// for its margin only.
FieldVerdict judge_field(const ToleranceTable& t,
                         std::span<const double> actual,
                         const std::vector<double>* naive);
FieldVerdict judge_field(const ToleranceTable& t,
                         const std::vector<double>& actual,
                         const std::vector<double>* naive);

struct AgreementReport {
  std::string entry_name, naive_name, case_desc;
  std::vector<FieldVerdict> fields;
  bool pass = true;
  // The largest element margin err_e / bound_e over every field (> 1 fails)
  // and the field it is in.
  double margin = 0;
  std::string worst_field;
  // The likely causes of the failure, most confident first (empty when the
  // case passes; validation/diagnose.h). They never change the verdict.
  std::vector<Diagnosis> diagnoses;
  // The compute contract the entry was judged under (qknorm/contract.h) and
  // how much looser its bound is than f32-accumulate's (contract_looseness;
  // 1 for f32-accumulate, 0 where not computed: the sampled verdict).
  std::string contract = "f32-accumulate";
  double looseness = 1;
  // What the backward read where it was not the entry's own O and lse
  // (apply_backward_input); "" otherwise.
  std::string note;
  // Each guard the entry wrote (GuardViolation::message(), validation/
  // run.h MemoryEvidence): any fails the case, whatever its fields say
  // (apply_memory).
  std::vector<std::string> out_of_bounds;
  // Every failing field: entry, case (shape, seed), the element of largest
  // margin (index, expected, actual, bound), the first failure's diagnosis;
  // then "likely cause: ..." for each of `diagnoses`.
  std::string failure_message() const;
};

// Marks an attention report's backward fields by what the backward read
// (entry.backward_input): kOracle notes that they were judged on the
// oracle's O and lse, kNotRun replaces each by "not judged: <reason>".
// judge_attention and judge_sampled call it before they sum up the case.
void apply_backward_input(const AttentionResult& entry, AgreementReport* rep);

// Fails the case where the entry wrote outside its views (the result's
// MemoryEvidence: the report's out_of_bounds, pass false). judge_attention,
// judge_sampled and judge_scalenorm call it after summing up the fields.
void apply_memory(const MemoryEvidence& m, AgreementReport* rep);

// The verdict on results already computed (check_* = run + judge_*): `c` is
// the case as the entries saw it (round_inputs(case, s)), `oracle` its
// oracle, `entry` the judged result and `naive` (may be null) the result of
// naive_for(s) on it. `only` (may be null) restricts the verdict to those
// fields (compare judges the tensors the files give). Callers that judge
// many entries of one precision on one case compute the oracle once.
AgreementReport judge_attention(const AttentionCase& c, Precision s,
                                const OracleAttention& oracle,
                                const AttentionResult& entry,
                                const AttentionResult* naive, bool forward_only,
                                const std::string& entry_name,
                                const std::string& naive_name,
                                const std::vector<Field>* only = nullptr,
                                const ComputeContract& contract = {});
// What judge_attention derives from everything but the entry's result:
// the rule's tables, the expected values' compare basis (validation/
// metrics.h) and the naive baseline's statistics and margin per field. The
// entries of one precision judged on one case against one oracle and naive
// under one contract share it (the suite prepares it once per case and
// precision): judge_attention(prepared, ...) gives exactly the report
// judge_attention(c, s, oracle, entry, naive, ...) gives.
struct PreparedAttention {
  std::string case_desc, naive_name, contract;
  double amplitude = 0, looseness = 1;
  std::vector<ToleranceTable> tables;
  std::vector<CompareBasis> bases;  // one per table
  // One per table: has_naive, naive and naive_margin (has_naive false
  // without a naive).
  std::vector<FieldVerdict> naive;
};
PreparedAttention prepare_attention(const AttentionCase& c, Precision s,
                                    const OracleAttention& oracle,
                                    const AttentionResult* naive,
                                    bool forward_only,
                                    const std::string& naive_name,
                                    const ComputeContract& contract = {},
                                    const std::vector<Field>* only = nullptr);
AgreementReport judge_attention(const PreparedAttention& prepared,
                                const AttentionCase& c, Precision s,
                                const OracleAttention& oracle,
                                const AttentionResult& entry,
                                const std::string& entry_name);
// How much looser a contract's bound is than f32-accumulate's on the same
// case: the median over o's elements of element_bound(tables) /
// element_bound(base), 1 where o is absent or no ratio is defined (inf
// where the contract's o is unresolved).
double contract_looseness(const std::vector<ToleranceTable>& tables,
                          const std::vector<ToleranceTable>& base);
AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& oracle,
                                const ScaleNormResult& entry,
                                const ScaleNormResult* naive,
                                const std::string& entry_name,
                                const std::string& naive_name,
                                const std::vector<Field>* only = nullptr);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_JUDGE_H_
