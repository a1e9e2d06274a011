// The likely cause of a failure (issue 31): from the pattern of the failing
// elements, checked against the oracle's intermediates and the case, a named
// cause and where it starts. Pure: nothing here runs an entry (the oracle is
// evaluated again on a modified case where a diagnosis needs the value a
// suspected bug would give). A diagnosis never changes a verdict: judge.h
// forms the verdict, then asks diagnose_*() why a failing case fails.
//
// The diagnoses and their triggers (each independent: several may hold; the
// list is ordered by confidence). "Failing rows" are the rows (b, h, n) of
// the failing elements: query rows for o, lse, dq; key rows for dk, dv.
//  kNormRange  A q or k normalization row whose sum of squares leaves the
//      compute format's range: sum x^2 > max_finite (||x|| > 1.8e19 in f32)
//      or, where the clamp does not govern (||x|| > eps), below the smallest
//      normal. Fires when either
//      (i) at least 90% of the failing o and lse elements equal, within
//      their bound, the forward the oracle gives with those rows replaced
//      by zero rows (x_hat = 0: what an unscaled f32 norm gives, inf or 0
//      divisor), and at least 90% of the failing rows are such a row or read
//      one through the softmax; or
//      (ii) at least 90% of the failing rows are such rows themselves (the
//      norm or its backward goes wrong on those rows alone).
//      ScaleNorm: the same on its rows (x_hat = 0 is y = 0).
//  kMaskedRowNonFinite  A non-finite failure of o, lse or dq on a fully
//      masked query row (oracle lse = -inf), and at least 90% of those
//      fields' non-finite failures on such rows.
//  kSixteenBit  In one of o, lse, dq, dk, dv: at least a quarter of the
//      elements fail, at least half have margin >= 1/2, the failures lie in
//      at least half the rows, and the median over the failing elements of
//      err / M (M the element's magnitude before cancellation, the rule's
//      M_e) lies in [2^-12, 2^-4]: the unit roundoff of f16 (2^-11) or bf16
//      (2^-8) times a sum of up to a few hundred terms, far above what
//      f32 arithmetic loses (2^-24 sqrt(n)) and below an O(1) formula error.
//  kGqaGroupSum  kv_heads < heads; dk and/or dv fail while o, lse and dq
//      pass; and at least 90% of the failing dk, dv elements equal, within
//      their bound, the oracle's dk, dv of one query head of each group
//      alone (the first, then the last; the others' dO zeroed).
//  kTailBlock  (i) The failing rows of every failing side lie after the last
//      full block of one block size b (the entry's declared sizes first,
//      then 8, 16, 32, 64, 128; per batch up to the key length for keys),
//      with at least one full block before them (so earlier rows pass);
//      or (ii) dk and/or dv fail while o, lse, dq pass, and at least 90% of
//      their failing elements equal, within their bound, the oracle's with
//      the query rows after the last full block of b left out (their dO
//      zeroed): a reduction that drops the partial last query block.
//  kOutOfBoundsWrite  The entry wrote outside its views: a guard element
//      (before or after a view, a row-pad gap, a sequence's tail rows:
//      validation/buffers.h) holds another value after the call
//      (MemoryEvidence::writes, validation/run.h). Certain (confidence 1):
//      it fails the case whatever the outputs.
//  kOutOfBoundsRead  Some field fails and an output holds an input's NaN
//      poison (MemoryEvidence::poisoned): the entry read outside an input
//      view (past a sequence's last row, in a row-pad gap, before the
//      view) and the NaN it read reached the output. Confidence 1: no
//      arithmetic makes the poison's payload.
//  kParameterGradient  Every failing field is a learned parameter's
//      gradient (dg, dq_weight, dk_weight, dq_bias, dk_bias; ScaleNorm dg)
//      while o, lse and every input gradient present (dq, dk, dv; ScaleNorm
//      y, dx) pass.
#ifndef QKNORM_VALIDATION_DIAGNOSE_H_
#define QKNORM_VALIDATION_DIAGNOSE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/precision.h"
#include "validation/case.h"
#include "validation/oracle.h"
#include "validation/rule.h"
#include "validation/run.h"

namespace qknorm::validation {

enum class DiagnosisKind {
  kNormRange,
  kMaskedRowNonFinite,
  kSixteenBit,
  kGqaGroupSum,
  kTailBlock,
  kParameterGradient,
  kSink,
  kOutOfBoundsWrite,
  kOutOfBoundsRead,
};
// "norm-range", "masked-row-nonfinite", "16-bit", "gqa-group-sum",
// "tail-block", "parameter-gradient", "sink", "out-of-bounds-write",
// "out-of-bounds-read".
const char* name(DiagnosisKind k);

struct Diagnosis {
  DiagnosisKind kind = DiagnosisKind::kNormRange;
  // One short phrase for summaries: "norm overflow", "16-bit softmax/P.V".
  std::string phrase;
  // The cause and its evidence (counts, rows, the threshold), one line.
  std::string message;
  // In [0, 1]; orders the list only.
  double confidence = 0;
};

// The diagnoses of a judged attention case: `tables` the judged fields'
// tables (attention_tolerances, those judged), `entry` the entry's results,
// `blocks` the block sizes the entry declares (Backend::block_sizes; tried
// before the common sizes). Empty when no field fails. c, s and oracle as
// judge_attention takes them.
std::vector<Diagnosis> diagnose_attention(
    const AttentionCase& c, Precision s, const OracleAttention& oracle,
    const std::vector<ToleranceTable>& tables, const AttentionResult& entry,
    const std::vector<int64_t>& blocks = {});
// The diagnoses of the memory evidence alone (kOutOfBoundsWrite whenever a
// guard was written; kOutOfBoundsRead when `fields_fail` and an output
// holds poison). diagnose_attention and diagnose_scalenorm put them first;
// the sampled verdict (no value diagnoses) uses them alone.
std::vector<Diagnosis> memory_diagnoses(const MemoryEvidence& m,
                                        bool fields_fail);
std::vector<Diagnosis> diagnose_scalenorm(
    const ScaleNormCase& c, Precision s, const OracleScaleNorm& oracle,
    const std::vector<ToleranceTable>& tables, const ScaleNormResult& entry);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_DIAGNOSE_H_
