// Test cases, running any registry entry on them, the oracle, and the
// suite's tolerance rule. Used by tests, property tests, the CLI and fuzzers.
//
// THE TOLERANCE RULE (issue 3; FlashAttention's test-suite rule):
//   err(X) = max |X - oracle| over elements, and an entry passes a field iff
//     err(entry) <= kNaiveFactor * err(naive same-precision) + atol,
//   where "naive same-precision" is the registry entry reference:<prec> (the
//   reference loops in the entry's compute precision on the same stored
//   inputs, outputs rounded to storage) and
//     atol = kAtolUnits * ((u_s + 2 A u_c) * scale(field) + ulp_fmt(0)),
//   u_s the unit roundoff of the storage format, u_c that of the compute
//   format, scale(field) the max |oracle| of that field for O (for dq, dk,
//   dv: the magnitude of their terms before cancellation; dg: dg_scale, the
//   magnitude of its terms before cancellation, with the unit u_c (1 + 2A):
//   dg is a compute-format scalar), A the logit amplitude (|g|
//   for qknorm; the bound max||q|| max||k|| / sqrt(D) on |S| for sdpa), and
//   ulp_fmt(0) the field format's smallest subnormal (its absolute
//   resolution below the normal range). dq, dk and dg add
//   kAtolUnits * ulp_s(0) * (their sensitivity to the stored O, which the
//   backward reads and which two correct entries round differently below
//   the normal range) and kAtolUnits * ulp_c(0) * (their sensitivity to
//   the compute format's subnormal intermediates; OracleAttention); dg adds
//   kAtolUnits * u_s * dg_o_rel_sens, the stored O's relative rounding
//   carried into delta and dg.
//   ScaleNorm's dx adds
//   kAtolUnits * ulp_c(0) * max_r (dim + 1) |g| / max(||x_r||, eps): the
//   compute format's absolute resolution in u . dy, times the factor g / n.
// Why these terms:
// - u_s * scale: rounding a correct result to storage costs up to 1/2 ulp,
//   and the naive baseline may round to the other side: 1 u_s * scale
//   between them; kAtolUnits = 4 doubles that again for the few-roundoff
//   differences of a reordered sum near the largest element.
// - 2 A u_c * scale: the conditioning of softmax attention. A correct kernel
//   computes C = q_hat . k_hat to a few u_c (|dC| <= e), so S = A C moves by
//   A e, each P_ij by 2 A e P_ij, and O (and every gradient through P) by
//   2 A e * scale. That error is intrinsic to the precision, not to the
//   algorithm, and the naive run may simply have been lucky on a small
//   tensor (seen: a D = 1, g = 25 sweep case with the naive at 1.6 u * scale
//   and a correct GEMM kernel at 8 u * scale); it does not grow with any
//   bug, which shows as O(1) relative error.
// lse is absolute in S: atol(lse) = kAtolUnits * u_c * (max|lse| + A).
// kNaiveFactor = 2 is the factor and is never widened.
#ifndef QKNORM_VALIDATION_HARNESS_H_
#define QKNORM_VALIDATION_HARNESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/metrics.h"
#include "validation/rng.h"

namespace qknorm::validation {

inline constexpr double kNaiveFactor = 2.0;
inline constexpr double kAtolUnits = 4.0;

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

// An owned attention test case. Inputs are dense [B,H,N,D] doubles.
struct AttentionCase {
  AttentionProblem problem;
  std::vector<double> q, k, v, d_o;
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

// The case with every input rounded to `prec` (RNE). Every entry of that
// precision and the oracle are then fed identical values, so input rounding
// is never counted as error.
AttentionCase round_inputs(const AttentionCase& c, Precision prec);
ScaleNormCase round_inputs(const ScaleNormCase& c, Precision prec);

// Outputs decoded to double, dense.
struct AttentionResult {
  std::vector<double> o, lse, dq, dk, dv;
  double dg = 0;
};
struct ScaleNormResult {
  std::vector<double> y, dx;
  double dg = 0;
};

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

// The oracle: reference<long double> on the case's inputs as given.
// dg_scale: sum P_ij (|dO_i|.|v_j| + Del_i) (resp. sum |dy . u| terms), the
// magnitude of the terms dg sums before they cancel (|C_ij| <= 1; it bounds
// sum |dS_ij|), used as dg's scale in the tolerance rule: dg is one scalar
// that can cancel to near 0, so max|dg| would be no scale at all.
struct OracleAttention {
  std::vector<long double> o, lse, dq, dk, dv;
  long double dg = 0, dg_scale = 0;
  // Pre-cancellation magnitudes of the gradient sums (max over elements);
  // see oracle_attention().
  long double dq_scale = 0, dk_scale = 0, dv_scale = 0;
  // Sensitivities of dq, dk (max over elements) and dg to an absolute error
  // of one unit in every element of the stored O the backward reads; times
  // ulp_s(0) they join the gradients' atol (oracle_attention()).
  long double dq_o_sens = 0, dk_o_sens = 0, dg_o_sens = 0;
  // The same for the compute format's absolute resolution below its normal
  // range (dP, delta, dS, du formed as subnormals), per ulp_c(0).
  long double dq_uf_sens = 0, dk_uf_sens = 0, dg_uf_sens = 0;
  // sum_ij P_ij |dO_i|.|O_i| (qknorm): dg's sensitivity to a relative error
  // of one unit in every element of the stored O; times u_s it joins dg's
  // atol (issue 14).
  long double dg_o_rel_sens = 0;
};
struct OracleScaleNorm {
  std::vector<long double> y, dx;
  long double dg = 0, dg_scale = 0;
};
OracleAttention oracle_attention(const AttentionCase& c);
OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c);

// The verdict of the tolerance rule for one field ("o", "dq", ..., "dg").
struct FieldVerdict {
  std::string field;
  double amplitude = 0;        // A of the rule
  ErrorStats entry, naive;     // both against the oracle
  double atol = 0, bound = 0;  // bound = kNaiveFactor * naive.max_abs + atol
  bool pass = false;
};

struct AgreementReport {
  std::string entry_name, naive_name, case_desc;
  std::vector<FieldVerdict> fields;
  bool pass = true;
  // Every failing field: entry, target, precision, case (shape, seed),
  // worst index, expected, actual, err, bound.
  std::string failure_message() const;
};

// The naive same-precision baseline for precision p: reference:<p>.
const Backend& naive_for(Precision p);

// The logit amplitude A of the rule for the (rounded) case.
double logit_amplitude(const AttentionCase& c);

// Runs `entry` and its naive baseline on round_inputs(c, entry precision),
// compares both with the oracle, applies the rule to o, lse, dq, dk, dv, dg
// (forward_only: o and lse).
AgreementReport check_attention(const Backend& entry, const AttentionCase& c,
                                const ExecConfig& cfg = {},
                                bool forward_only = false);
AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c,
                                const ExecConfig& cfg = {});

// The rule applied to results already computed (check_* = run + judge_*):
// `c` is the case as the entries saw it (round_inputs(case, s)), `oracle`
// its oracle, `entry` and `naive` the results of the judged entry and of
// naive_for(s) on it. Callers that judge many entries of one precision on
// one case (the fuzzers) compute the oracle and the naive result once.
AgreementReport judge_attention(const AttentionCase& c, Precision s,
                                const OracleAttention& oracle,
                                const AttentionResult& entry,
                                const AttentionResult& naive, bool forward_only,
                                const std::string& entry_name,
                                const std::string& naive_name);
AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& oracle,
                                const ScaleNormResult& entry,
                                const ScaleNormResult& naive,
                                const std::string& entry_name,
                                const std::string& naive_name);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_HARNESS_H_
