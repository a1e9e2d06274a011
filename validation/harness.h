// Test cases, running any registry entry on them, the oracle, and the
// verdict: judge_attention / judge_scalenorm apply the componentwise rule of
// validation/tolerance.h (the one place the tolerance lives) to results.
// Used by tests, property tests, the CLI, compare and the fuzzers.
#ifndef QKNORM_VALIDATION_HARNESS_H_
#define QKNORM_VALIDATION_HARNESS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/metrics.h"
#include "validation/rng.h"
#include "validation/tolerance.h"

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
  // Per element (issue 15; validation/tolerance.h): the magnitudes before
  // cancellation (o_mag: sum_j P_ij |v_jd|; dv_mag: sum_i P_ij |dO_id|;
  // dq_mag, dk_mag: the dS terms through the normalization backward), the
  // stored-O sensitivities (absolute per ulp_s(0): *_o_sens_e; relative per
  // u_s: *_o_rel_e) and the subnormal-intermediate counts (*_uf_sens_e).
  // The scalars above are their maxima.
  std::vector<long double> o_mag, dv_mag, dq_mag, dk_mag;
  std::vector<long double> dq_o_sens_e, dk_o_sens_e, dq_uf_sens_e, dk_uf_sens_e,
      dq_o_rel_e, dk_o_rel_e;
  // The terms the softmax's conditioning perturbs: o_dev_mag = sum_j P_ij
  // |v_jd - O_id| (dO = sum_j dP_ij v_jd with sum_j dP_ij = 0), and for dq,
  // dk the terms P_ij (|dP_ij - delta_i| + sum_k P_ik |dP_ik - delta_i| / 2)
  // carried through the same sums as dq_mag (tolerance.cc).
  std::vector<long double> o_dev_mag, dq_ds_mag, dk_ds_mag;
  // Sensitivities to the compute format's absolute resolution of each
  // probability P_ij, per unit of its smallest normal (an exp may flush a
  // result below the normal range to 0; validation/tolerance.h): O, dV: sum
  // over visible j of |v_jd|, resp. over visible i of |dO_id|; dq, dk, dg:
  // the terms |dP_ij - delta_i| of the visible P_ij through the same sums as
  // dq_mag.
  std::vector<long double> o_p_sens_e, dv_p_sens_e, dq_p_sens_e, dk_p_sens_e;
  long double dg_p_sens = 0;
  // The formulation's parameter gradients (issue 16; empty when it has
  // none) and, per element, the same seven channels as dq's (0 magnitude, 1
  // stored-O absolute, 2 subnormal count, 3 stored-O relative, 4 softmax
  // terms, 5 P resolution, 6 layer mean shift), and the number of
  // normalization rows each
  // element sums over (q_param_rows, k_param_rows).
  std::vector<long double> dq_weight, dk_weight, dq_bias, dk_bias;
  std::array<std::vector<long double>, 7> dq_weight_ch, dk_weight_ch,
      dq_bias_ch, dk_bias_ch;
  int64_t q_param_rows = 0, k_param_rows = 0;
  // Round-before-weight formulations in 16-bit storage (Qwen3): a correct
  // kernel's x_hat may round to the other neighbour where the exact x_hat
  // lies within its own error of a rounding midpoint; the largest logit
  // change those flips can make (0 otherwise).
  double logit_flip = 0;
  // LayerNorm: the computed mean of a row is an L-term sum, off by up to
  // sum_units(L) u_c sum|x| / L, which shifts every x_hat of the row by that
  // over the divisor; near-zero x_hat_e (x_e at the mean) have no relative
  // accuracy at all (found by the fuzzer, issue 16: a row summing exactly to
  // 0, x_e = 0, reference:f64's weight gradient 1.5e-20 against 7e-24).
  // Per u_c (units included): the shift's effect on dq, dk (per element),
  // dg, and the largest logit change it makes (all 0 without layer).
  std::vector<long double> dq_shift_e, dk_shift_e;
  long double dg_shift = 0;
  double logit_shift = 0;
  // Sampled verdicts (validation/sampled.h) judge one row of a long problem
  // on a sub-case holding that row and what it reads. The rule's counts and
  // logit amplitude are then the whole case's, not the sub-case's (0: the
  // case's own): the tables of a sampled row equal the full verdict's.
  double amplitude = 0;
  int64_t count_q_len = 0, count_kv_len = 0;
  // Sampled key rows read every query row's lse and delta from a pass in
  // double (GivenRows); its error per f64 unit roundoff, times the
  // gradients' magnitudes (given_units) and their softmax terms
  // (given_soft_units), joins dk, dv and dg (validation/tolerance.h).
  double given_units = 0, given_soft_units = 0;
};
// The statistics of every query row (b, h, i) of a case, dense [B, H, Nq],
// given instead of computed: lse_i, delta_i = dO_i . O_i, Del_i >= sum_j
// P_ij |dO_i|.|v_j|, sum_j P_ij |dP_ij - delta_i|, o_abs_i >= |dO_i|.|O_i|
// and p_del_i >= sum_j |dO_i|.|v_j| over the visible keys. A sampled key row's
// sub-case holds only the queries that see that key, so its rows' softmax
// normalization must come from outside.
struct GivenRows {
  std::vector<long double> lse, delta, del, ds_l1, o_abs, p_del;
  double units = 0, soft_units = 0;  // OracleAttention::given_*units
};
// The rule's counts of the whole case for a sub-case (0: the sub-case's
// own): the subnormal counts of the sums forming du (OracleAttention
// channel 2) then equal the full oracle's. q_side / k_side false: the
// channels of dq (resp. dk and the k parameters) are not needed and stay 0
// (a sampled query row's sub-case needs no dk; a key row's no dq), and
// neither are the values: dq (resp. dk and dv) stay empty. With either side
// off (a sub-case) the case-wide scalars are not formed either (dg and its
// channels, logit_flip, logit_shift stay 0; the parameter gradients lack
// the other side's terms): a sub-case's are not the whole case's, and the
// sampled oracle sets or judges the whole case's itself.
struct RowCounts {
  int64_t q_len = 0, kv_len = 0;
  bool q_side = true, k_side = true;
};
struct OracleScaleNorm {
  std::vector<long double> y, dx;
  long double dg = 0, dg_scale = 0;
};
// Scratch arrays oracle_attention reuses from call to call (one per
// thread): the sampled oracle runs hundreds of sub-cases of n keys or
// queries, and allocating and zero-filling their n x D long-double arrays
// afresh, page faults included, was a fifth of each sub-case's time (perf,
// n = 4096). The arrays keep their largest size until the workspace goes.
class OracleWorkspace {
 public:
  OracleWorkspace();
  ~OracleWorkspace();
  struct Arrays;
  std::unique_ptr<Arrays> arrays;
};
// given (may be null): the query rows' statistics from outside (GivenRows);
// then only dk, dv and their channels are meaningful. ws (may be null): the
// scratch arrays to use; the result does not depend on them.
OracleAttention oracle_attention(const AttentionCase& c,
                                 const GivenRows* given = nullptr,
                                 const RowCounts& counts = {},
                                 OracleWorkspace* ws = nullptr);
OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c);

struct AgreementReport {
  std::string entry_name, naive_name, case_desc;
  std::vector<FieldVerdict> fields;
  bool pass = true;
  // The largest element margin err_e / bound_e over every field (> 1 fails)
  // and the field it is in.
  double margin = 0;
  std::string worst_field;
  // Every failing field: entry, case (shape, seed), the element of largest
  // margin (index, expected, actual, bound), the first failure's diagnosis.
  std::string failure_message() const;
};

// The naive same-precision baseline for precision p: reference:<p>.
const Backend& naive_for(Precision p);

// The logit amplitude A of the rule for the (rounded) case.
double logit_amplitude(const AttentionCase& c);

// Runs `entry` on round_inputs(c, entry precision) and judges it
// (judge_attention) against the oracle; with_naive also runs and judges the
// naive baseline, for its margin and error statistics (never for the
// entry's verdict). forward_only: o and lse.
AgreementReport check_attention(const Backend& entry, const AttentionCase& c,
                                const ExecConfig& cfg = {},
                                bool forward_only = false,
                                bool with_naive = true);
AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c,
                                const ExecConfig& cfg = {},
                                bool with_naive = true);

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
                                double compute_unit = 0);
AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& oracle,
                                const ScaleNormResult& entry,
                                const ScaleNormResult* naive,
                                const std::string& entry_name,
                                const std::string& naive_name,
                                const std::vector<Field>* only = nullptr);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_HARNESS_H_
