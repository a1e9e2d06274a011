// Running a registry entry on a case: the inputs encoded to the entry's
// storage format (rows padded as the case says, outputs prefilled with NaN),
// forward then backward through the checked_* front doors, the outputs
// decoded to double. And the naive same-precision baseline.
#ifndef QKNORM_VALIDATION_RUN_H_
#define QKNORM_VALIDATION_RUN_H_

#include <span>
#include <vector>

#include "qknorm/backend.h"
#include "validation/case.h"
#include "validation/field.h"

namespace qknorm::validation {

// Outputs decoded to double, dense.
struct AttentionResult {
  std::vector<double> o, lse, dq, dk, dv;
  double dg = 0;
  // The formulation's parameter gradients (empty when it has none).
  std::vector<double> dq_weight, dk_weight, dq_bias, dk_bias;
};
struct ScaleNormResult {
  std::vector<double> y, dx;
  double dg = 0;
};
// One field of a result (dg: a span of one). Attention fields only; a
// ScaleNorm field of an AttentionResult is empty.
std::span<const double> field_values(const AttentionResult& r, Field f);
std::span<double> field_values(AttentionResult& r, Field f);

// Encodes the (already rounded) inputs to the entry's storage, runs forward
// then backward (fed the entry's own o and lse) through the checked_* front
// doors, decodes. Output buffers are prefilled with NaN so that an element a
// kernel forgets to write is caught. Throws qknorm::Error on invalid input.
AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg = {},
                              Workspace* ws = nullptr);
ScaleNormResult run_scalenorm(const Backend& b, const ScaleNormCase& c,
                              const ExecConfig& cfg = {},
                              Workspace* ws = nullptr);
// Forward only (no dO needed); returns o and lse in the result.
AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg = {},
                                      Workspace* ws = nullptr);

// The naive same-precision baseline for precision p: reference:<p>.
const Backend& naive_for(Precision p);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_RUN_H_
