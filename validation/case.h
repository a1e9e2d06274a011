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
};
const char* name(Distribution d);
bool parse_distribution(const std::string& s, Distribution* out);

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
  std::string describe() const;
};

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
