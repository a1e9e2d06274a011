// rapidcheck generators for the property suite: shapes, g, eps, masks,
// distributions and structures, drawn from integer generators and element
// lists (gen::arbitrary<double> never yields NaN, Inf or subnormals and
// gen::inRange is integer-only and half-open: shared/NUMERICS.md).
//
// A generated case is a Spec (problem + distribution + structure + seed); the
// tensor values come from validation's seeded Rng, so a case is small to
// shrink and print, and `describe()` reproduces it exactly.
#ifndef QKNORM_PROPERTY_TESTS_RC_GENS_H_
#define QKNORM_PROPERTY_TESTS_RC_GENS_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"
#include "validation/case.h"
#include "validation/generators.h"
#include "validation/metrics.h"
#include "validation/rng.h"

namespace qknorm::validation {
// rapidcheck prints drawn values through ADL showValue: the distribution and
// structure names instead of "<???>" in a counterexample.
void showValue(Distribution d, std::ostream& os);
void showValue(Structure s, std::ostream& os);
}  // namespace qknorm::validation

namespace qknorm::property {

// Size limits: the default run covers every registry entry (simd entries are
// targets x precisions), so shapes stay small; they still include 1, primes,
// non-multiples of every vector width (4, 8, 16 lanes) and q_len != kv_len.
inline constexpr int64_t kMaxLen = 24;
inline constexpr int64_t kMaxDim = 16;
inline constexpr int64_t kMaxBatch = 2;
inline constexpr int64_t kMaxHeads = 3;
// The top of the g range: the learned g of the QKNorm paper's models lie in
// [10.31, 24.85] (shared/NUMERICS.md); 30 leaves headroom.
inline constexpr double kGMax = 30.0;
// sdpa row scales: logits grow as the square of the scale, so 8 puts sdpa
// logits at a few hundred (past exp's f32 overflow at 88, the regime where a
// missing max subtraction shows). Such rows are saturated (P one-hot to
// within e^-100): every gradient is then a cancellation of O(1) terms down
// to an exact value ~e^-100, and the tolerance rule, whose atol is relative
// to max|oracle|, cannot judge it (any two correct summation orders differ
// by ~u times the terms). Scales above kSdpaMaxBackwardScale are therefore
// only used for forward checks (SpecOptions::saturating_sdpa).
inline constexpr double kSdpaScales[] = {1.0, 2.0, 8.0};
inline constexpr double kSdpaMaxBackwardScale = 2.0;

// eps of f16 cases with clamp-region rows (zero, below-eps or subnormal
// rows): their gradient is ~ dO v / eps, which must fit f16 (max 65504)
// for |g| <= kGMax.
inline constexpr double kF16ClampEps = 0.25;

struct AttentionSpec {
  AttentionProblem problem;
  validation::Distribution dist = validation::Distribution::kGaussian;
  validation::Structure structure = validation::Structure::kNone;
  double sdpa_scale = 1.0;  // q and k multiplier (sdpa only)
  uint64_t seed = 0;
  int64_t row_pad = 0;
  std::string describe() const;
  // sdpa rows scaled past kSdpaMaxBackwardScale: judge the forward only.
  bool saturated() const { return sdpa_scale > kSdpaMaxBackwardScale; }
};

struct ScaleNormSpec {
  ScaleNormProblem problem;
  validation::Distribution dist = validation::Distribution::kGaussian;
  validation::Structure structure = validation::Structure::kNone;
  uint64_t seed = 0;
  std::string describe() const;
};

// SpecOptions::model_shapes' default: true unless the environment sets
// QKNORM_MODEL_SHAPES=0 (read once).
bool model_shapes_default();

// What a property needs from the generator.
struct SpecOptions {
  bool allow_sdpa = true;     // else qknorm only
  bool force_sdpa = false;    // sdpa only (needs allow_sdpa)
  bool allow_causal = true;   // causal masks may be drawn
  bool force_causal = false;  // every case causal
  bool allow_padding = true;
  bool force_padding = false;  // every case has key_lengths
  // Only distributions/structures whose rows stay outside the clamp region
  // (no zero rows, no rows below eps, no subnormal rows).
  bool smooth_only = false;
  int64_t min_q_len = 1, min_kv_len = 1, min_batch_heads = 1;
  // sdpa scales above kSdpaMaxBackwardScale (saturated rows): only for a
  // property that checks the backward outside the rule's budgets or falls
  // back to forward-only checks for them (AttentionSpec::saturated()).
  bool saturating_sdpa = false;
  // Shapes from the entry's shape model (rc_gens.cc, draw_shape) where true;
  // the small shapes of before otherwise. On by default since the rule's
  // false alarms on the model's shapes are fixed (issue 33: long rows of
  // small head_dim, GradientSums at kv_len 2303, lse at head_dim 256..576
  // with parallel rows: the cosine units' coherent excess, rule.h);
  // QKNORM_MODEL_SHAPES=0 turns it off (model_shapes_default).
  bool model_shapes = model_shapes_default();
  // kv_heads < heads may be drawn (where the entry supports GQA): false for
  // a property that indexes k and v by the query heads.
  bool allow_gqa = true;
};

// What the entry under test implements, for entries that declare it (a
// plug-in: include/qknorm/plugin.h): draw_attention_spec draws no sdpa,
// causal or padding problem the entry refuses, and discards the case where
// the property forces one. run_property sets it for the property's run
// (EntryLimitsScope); every field is true otherwise, and the draws are
// then exactly those of an unlimited entry.
struct EntryLimits {
  bool sdpa = true, causal = true, padding = true;
};
EntryLimits entry_limits_of(const Backend& b);
class EntryLimitsScope {
 public:
  explicit EntryLimitsScope(const EntryLimits& l);
  ~EntryLimitsScope();

 private:
  EntryLimits saved_;
};

// Draws inside a property (uses rapidcheck's implicit `*gen`). `prec` limits
// kWideMagnitude row scales and subnormals to that storage format.
AttentionSpec draw_attention_spec(Precision prec, const SpecOptions& o = {});
ScaleNormSpec draw_scalenorm_spec(Precision prec, bool smooth_only = false);
// A qknorm case under a formulation (issue 16): a preset (3 in 4) or a free
// consistent combination of kind, axis, weight shape, 1 + w, bias, shared
// weight, round-before-weight and a fixed or learned scale, with kv_heads a
// random divisor of heads where the formulation allows GQA; the shape, mask,
// distribution and seed as draw_attention_spec (no row structure).
AttentionSpec draw_formulation_spec(Precision prec);

// g: [0, kGMax] with extra weight on the learned range 10..25 and on
// g_init(L); exact 0, 1 and negative values included.
double draw_g();
double draw_eps();

// The case, inputs rounded to `prec` (round_inputs), so every transform a
// property applies afterwards acts on exact storage values. Discards
// (RC_PRE) a case whose oracle outputs the storage format cannot hold
// ("limited to what the precision can represent"). Notes the case for the
// property's failure messages (note_case, support.h).
// require_fit = false keeps such a case and reports through *fits whether
// its backward outputs fit (its forward outputs always do: |O| <= max|V|).
validation::AttentionCase build_case(const AttentionSpec& s, Precision prec,
                                     bool require_fit = true,
                                     bool* fits = nullptr);
validation::ScaleNormCase build_case(const ScaleNormSpec& s, Precision prec);

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_RC_GENS_H_
