// Test cases: the input distributions, generating a case of a problem from
// a seed, and rounding its inputs to a storage format. No running, no
// oracle, no verdict (validation/run.h, oracle.h, judge.h).
#ifndef QKNORM_VALIDATION_CASE_H_
#define QKNORM_VALIDATION_CASE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"

namespace qknorm::validation {

enum class Distribution {
  kGaussian,       // N(0, 1)
  kUniform,        // U[-1, 1)
  kHeavyTailed,    // Student t, 3 dof
  kWideMagnitude,  // N(0,1) rows, each scaled by 10^U[-30, 30] clamped to
                   // what the storage format represents
  kZeroRows,       // Gaussian with about a quarter of q and k rows exactly zero
                   // (padding tokens)
  kOutlierRows,    // Gaussian with about one q and k row in eight scaled by
                   // 10^U[3, 5] (clamped to the storage format like
                   // kWideMagnitude): outlier tokens
  kMixedScaleV,    // Gaussian q, k, dO; each v row scaled by 10^U[-3, 3]
  // Activation statistics of trained models (issue 31: some field bugs show
  // only on real activations, never on Gaussian data). Both draw the
  // Gaussian case of the same seed first, then rescale it:
  kSink,      // an attention sink: the first key row of every (b, kv head),
              // and its value row, scaled by 10^U[2, 3] (ScaleNorm: x's
              // first row); clamped to the format like kOutlierRows. Norms
              // ~10^3 sqrt(D): an unscaled f32 sum of squares stays ~10^30
              // below overflow.
  kChannels,  // massive channels: 1 to min(4, D) channels, drawn per case,
              // 100x larger in every q and k row (ScaleNorm: x); clamped to
              // the format like kOutlierRows.
};
// kSink's row factor 10^U[kSinkLog10Min, kSinkLog10Max]; kChannels' factor
// 10^kChannelsLog10 on 1 to kMaxMassiveChannels channels.
inline constexpr double kSinkLog10Min = 2, kSinkLog10Max = 3;
inline constexpr double kChannelsLog10 = 2;
inline constexpr int64_t kMaxMassiveChannels = 4;
const char* name(Distribution d);
bool parse_distribution(const std::string& s, Distribution* out);
// "gaussian, uniform, ...": every distribution's name, for option help and
// error messages.
std::string distribution_names();

// Row structures of the property suite, applied to a drawn case by
// apply_structure (validation/generators.h, which documents each). Here
// because a case records its structure (AttentionCase::structure): its
// input class depends on it.
enum class Structure {
  kNone,
  kRowsBelowEps,
  kParallelRows,
  kAntiParallelRows,
  kDuplicatedKeys,
  kSubnormalEntries,
};

// Input classes (issue 31): every case belongs to one, and the report gives
// a verdict per class, so that a robustness finding on extreme inputs and a
// precision bug on realistic ones never look alike.
//   realistic:     the inputs of trained models: Gaussian, uniform, heavy
//                  tails (Student t), padding (key lengths in (0, kv_len]),
//                  outlier rows, mixed-scale V, attention sinks, massive
//                  channels, the formulation presets; row structures that
//                  keep magnitudes (parallel, antiparallel, duplicated rows).
//   extreme-range: rows near the ends of the representable range, where an
//                  unscaled f32 norm overflows or underflows: kWideMagnitude,
//                  kSubnormalEntries, and any q or k row (ScaleNorm: x row)
//                  whose norm n has n^2 outside f32's normal range
//                  (n > kExtremeNormHigh = 2^64 ~ 1.8e19, or
//                  0 < n < kExtremeNormLow = 2^-63 ~ 1.1e-19).
//   degenerate:    rows with no defined direction or no visible key:
//                  kZeroRows, kRowsBelowEps (the eps clamp region), any all-
//                  zero q or k row (ScaleNorm: x row), and fully masked query
//                  rows (a key length of 0, or causal with kv_len < q_len).
// Precedence, for a case that is more than one: extreme-range, then
// degenerate, then realistic. Extreme magnitudes are the likeliest cause of
// a failure (an unscaled norm breaks every row of them), and a case that
// has any of them says nothing about the realistic regime.
enum class InputClass { kRealistic, kExtremeRange, kDegenerate };
inline constexpr InputClass kAllInputClasses[] = {
    InputClass::kRealistic, InputClass::kExtremeRange, InputClass::kDegenerate};
const char* name(InputClass c);  // "realistic", "extreme-range", "degenerate"
bool parse_input_class(const std::string& s, InputClass* out);
std::string input_class_names();  // "realistic, extreme-range, degenerate"
// The row norms that bound extreme-range (see InputClass): 2^64 and 2^-63
// are sqrt of f32's largest finite value (to 2^-25) and of its smallest
// normal, so a row beyond them overflows or underflows an unscaled f32 sum
// of squares.
inline constexpr double kExtremeNormHigh = 0x1p64;
inline constexpr double kExtremeNormLow = 0x1p-63;

// An owned attention test case. Inputs are dense doubles: q, d_o
// [B,H,Nq,D], k, v [B,kv_heads,Nk,D]; the formulation's learned parameters
// (param_size() elements each; empty when it has none).
struct AttentionCase {
  AttentionProblem problem;
  std::vector<double> q, k, v, d_o;
  std::vector<double> q_weight, k_weight, q_bias, k_bias;
  // The storage format the inputs were rounded to (round_inputs); the oracle
  // rounds x_hat to it where the formulation says so
  // (norm.round_before_weight).
  Precision storage = Precision::kF64;
  uint64_t seed = 0;
  Distribution dist = Distribution::kGaussian;
  // The row structure applied after drawing (apply_structure).
  Structure structure = Structure::kNone;
  // Extra elements after each row in the buffers handed to entries (tests
  // strided layouts); 0 = dense.
  int64_t row_pad = 0;
  // "B=2 H=8 Nq=72 Nk=72 D=64 qknorm g=12.32 eps=1e-12 mask=causal
  //  dist=gaussian seed=42"
  std::string describe() const;
};

struct ScaleNormCase {
  ScaleNormProblem problem;
  std::vector<double> x, dy;
  uint64_t seed = 0;
  Distribution dist = Distribution::kGaussian;
  Structure structure = Structure::kNone;
  std::string describe() const;
};

// The input class of a case (see InputClass): from its generator's
// parameters (distribution, structure, mask, lengths) and, where the case
// holds its tensors, from its q and k rows (ScaleNorm: x rows). A case
// without tensors (a suite's spec, cli/suite.h describe_case) is classified
// by its parameters alone; the generators never draw a row that would move
// it (tested). Cases read from files (compare) or fuzzed bytes are
// classified by their rows and mask.
InputClass input_class(const AttentionCase& c);
InputClass input_class(const ScaleNormCase& c);
// True iff some query row of p sees no key: a key length of 0, or causal
// with kv_len < q_len.
bool has_fully_masked_rows(const AttentionProblem& p);

// The paper's problem of batch B, H heads, q_len Nq, kv_len Nk, head_dim D
// and logit scale g, every other field at AttentionProblem's default: the
// shapes of the default suite (cli/suite.cc) and the tests that mirror it.
AttentionProblem attention_shape(int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                                 int64_t D, double g);

// Draws q, k, v, dO for `problem` from `dist` with Rng(seed). `range`
// limits kWideMagnitude's row scales to what that storage format represents
// (row scales stay below max_finite / (32 sqrt(D)) and above
// min_normal * 2^12).
AttentionCase make_attention_case(const AttentionProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range = Precision::kF64);
ScaleNormCase make_scalenorm_case(const ScaleNormProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range = Precision::kF64);

// sdpa, one query q = (big, big), D = 2, keys k_0 = (big, big), k_1 = -k_0,
// k_2 = (1, 1) and, with_nan_key, k_3 = (big, -big); v = 1..2 Nk, dO =
// (0.5, -0.25). Where 2 big^2 exceeds the compute format, q . k_0 overflows
// to +inf, q . k_1 to -inf and q . k_3 = inf - inf is NaN: the entries'
// logit clamps must keep every output finite (and, without k_3, give
// O = v_0 exactly). The overflow tests of the simd and reference entries.
AttentionCase overflowing_logits_case(double big, bool with_nan_key);

// The case with every input rounded to `prec` (RNE). Every entry of that
// precision and the oracle are then fed identical values, so input rounding
// is never counted as error.
AttentionCase round_inputs(const AttentionCase& c, Precision prec);
ScaleNormCase round_inputs(const ScaleNormCase& c, Precision prec);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_CASE_H_
