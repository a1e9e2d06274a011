// The fields of a result the verdict judges and the channels of the rule:
// the two small enums every module (and cli, fuzz, the tests) names fields
// and channels by. Strings only where text is printed or parsed (name()).
#ifndef QKNORM_VALIDATION_FIELD_H_
#define QKNORM_VALIDATION_FIELD_H_

#include <cstddef>

namespace qknorm::validation {

enum class Field {
  kO,
  kLse,
  kDq,
  kDk,
  kDv,
  kDg,
  kY,
  kDx,
  kScaleNormDg,
  // The formulation's parameter gradients (issue 16).
  kDqWeight,
  kDkWeight,
  kDqBias,
  kDkBias,
  // The sinks' gradient (issue 34; attention.h, BackwardArgs::d_sinks).
  kDSinks,
};
// "o", "lse", "dq", "dk", "dv", "dg", "y", "dx", "dg", "dq_weight",
// "dk_weight", "dq_bias", "dk_bias", "d_sinks".
const char* name(Field f);

// The channels of a gradient's bound (validation/rule.h, THE VERDICT): the
// per-element quantities the oracle carries through the same sums as the
// gradient itself (OracleAttention's *_ch arrays are indexed by them), each
// multiplied by its own unit in the rule's table.
enum class Channel {
  kMagnitude,       // M_e, the magnitude before cancellation (times u_c)
  kStoredOAbs,      // So_e, the stored O's absolute resolution (ulp_s(0))
  kSubnormalCount,  // Sc_e, subnormal intermediates (ulp_c(0))
  kStoredORel,      // R_e, the stored O's relative error (u_s)
  kSoftmaxTerms,    // the terms the softmax's conditioning perturbs
  kPResolution,     // Sp_e, each P_ij resolved to the smallest normal
  kLayerShift,      // LayerNorm's mean shift (per u_c)
  kRoundingFlip,    // Qwen3's x_hat rounding flips (absolute: rule.h)
};
inline constexpr int kChannels = 8;
// The index of channel ch in a per-channel array.
constexpr size_t at(Channel ch) { return static_cast<size_t>(ch); }
// "magnitude", "stored-O abs", ...
const char* name(Channel ch);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_FIELD_H_
