// The oracle: the reference evaluated in long double on a case's inputs as
// given, with the magnitudes and sensitivities (the channels) the rule of
// validation/rule.h multiplies by its units. The channels' derivations are
// in oracle_attention.cc (the forward and backward sums) and
// oracle_operands.cc (the logit operands and the normalization backward);
// the resolution terms they read are the rule's own (rule_terms.h).
#ifndef QKNORM_VALIDATION_ORACLE_H_
#define QKNORM_VALIDATION_ORACLE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "validation/case.h"
#include "validation/field.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {

// The arithmetic the oracle runs in (oracle_attention; validation/README.md,
// "The oracles"). kAuto: double for a case stored in f32, bf16 or f16 (the
// rule's oracle channel, validation/rule.h, is then ~1e-9 of the entry's
// bound), long double for f64 storage and wherever double's range or
// rounding would not do (oracle_attention.cc, use_double). kFloat exists
// for the tests only: an oracle too coarse for its claimed unit roundoff.
enum class OraclePrecision { kAuto, kFloat, kDouble, kLongDouble };
// A whole case's logit operands, normalized once in the arithmetic kAuto
// picks for it (oracle_attention.cc): the sampled verdict's sub-cases
// (validation/sampled.cc) read theirs from here instead of normalizing the
// same head's q and k rows once per sub-case (issue 19 measured a third of
// a sub-case's time there). A normalization row depends on its own inputs
// and the parameters only, so the slice holds the same values as the
// sub-case's own normalization.
class SharedOperands {
 public:
  explicit SharedOperands(const AttentionCase& whole);
  ~SharedOperands();
  // The whole case's cosine rows (rule_terms.h): its cosine_units, and
  // each sub-case's own (oracle_in) without re-sorting its rows.
  const CosineRows& cosine() const;
  struct Impl;
  std::unique_ptr<Impl> impl;
};
// Where a sub-case's rows lie in the whole case (SharedOperands): batch b,
// its first query head and row, its first kv head and key row; the
// sub-case holds heads [q_head, q_head + its heads) and rows [q_row,
// q_row + its q_len) of the whole case (the same for k).
struct SubCaseOf {
  const SharedOperands* shared = nullptr;
  int64_t b = 0, q_head = 0, q_row = 0, k_head = 0, k_row = 0;
};
struct OracleOptions {
  OraclePrecision precision = OraclePrecision::kAuto;
  SubCaseOf sub;  // shared == nullptr: the case normalizes its own operands
};

// The oracle's values and channels in its arithmetic T (OracleAttention
// holds them in long double, whatever T the oracle ran in).
// dg_scale: sum P_ij (|dO_i|.|v_j| + Del_i) (resp. sum |dy . u| terms), the
// magnitude of the terms dg sums before they cancel (|C_ij| <= 1; it bounds
// sum |dS_ij|), used as dg's scale in the tolerance rule: dg is one scalar
// that can cancel to near 0, so max|dg| would be no scale at all.
template <class T>
struct OracleValues {
  std::vector<T> o, lse, dq, dk, dv;
  T dg = 0, dg_scale = 0;
  // Pre-cancellation magnitudes of the gradient sums (max over elements);
  // see oracle_attention().
  T dq_scale = 0, dk_scale = 0, dv_scale = 0;
  // Sensitivities of dq, dk (max over elements) and dg to an absolute error
  // of one unit in every element of the stored O the backward reads; times
  // ulp_s(0) they join the gradients' atol (oracle_attention()).
  T dq_o_sens = 0, dk_o_sens = 0, dg_o_sens = 0;
  // The same for the compute format's absolute resolution below its normal
  // range (dP, delta, dS, du formed as subnormals), per ulp_c(0).
  T dq_uf_sens = 0, dk_uf_sens = 0, dg_uf_sens = 0;
  // sum_ij P_ij |dO_i|.|O_i| (qknorm): dg's sensitivity to a relative error
  // of one unit in every element of the stored O; times u_s it joins dg's
  // atol (issue 14).
  T dg_o_rel_sens = 0;
  // Per element (issue 15; validation/rule.h): the magnitudes before
  // cancellation (o_mag: sum_j P_ij |v_jd|; dv_mag: sum_i P_ij |dO_id|;
  // dq_mag, dk_mag: the dS terms through the normalization backward), the
  // stored-O sensitivities (absolute per ulp_s(0): *_o_sens_e; relative per
  // u_s: *_o_rel_e) and the subnormal-intermediate counts (*_uf_sens_e).
  // The scalars above are their maxima.
  std::vector<T> o_mag, dv_mag, dq_mag, dk_mag;
  std::vector<T> dq_o_sens_e, dk_o_sens_e, dq_uf_sens_e, dk_uf_sens_e,
      dq_o_rel_e, dk_o_rel_e;
  // The terms the softmax's conditioning perturbs: o_dev_mag = sum_j P_ij
  // |v_jd - O_id| (dO = sum_j dP_ij v_jd with sum_j dP_ij = 0), and for dq,
  // dk the terms P_ij (|dP_ij - delta_i| + sum_k P_ik |dP_ik - delta_i| / 2)
  // carried through the same sums as dq_mag (rule.cc).
  std::vector<T> o_dev_mag, dq_ds_mag, dk_ds_mag;
  // RoPE before the normalization (rule.h, "RoPE"): the magnitude the
  // rotation's error reaches dq, dk through (dq_mag's sums pair-summed, the
  // normalization backward's magnitudes, pair-summed again); empty
  // otherwise (after the normalization it is dq_mag, dk_mag).
  std::vector<T> dq_rope_mag, dk_rope_mag;
  // Sensitivities to the compute format's absolute resolution of each
  // probability P_ij, per unit of its smallest normal (an exp may flush a
  // result below the normal range to 0; validation/rule.h): O, dV: sum
  // over visible j of |v_jd|, resp. over visible i of |dO_id|; dq, dk, dg:
  // the terms |dP_ij - delta_i| of the visible P_ij through the same sums as
  // dq_mag.
  std::vector<T> o_p_sens_e, dv_p_sens_e, dq_p_sens_e, dk_p_sens_e;
  T dg_p_sens = 0;
  // Repeated summands (validation/rule.h): per query row, the excess of its
  // row sum's tied term pairs over distinct terms (row_tie_excess,
  // rule_terms.h; 0 without ties, and on a sampled key row's sub-case,
  // which holds part of each row only). Per element of dV, its sensitivity
  // to the row normalizations' rounding (the stored lse the backward's P
  // reads; rule.h, "The row normalization in the backward"), x_i = P_ij
  // |dO_id| over the query rows: over the distinct rows, sum_i x_i^2 v_i
  // and sum_i x_i tau_i (the row sum's roundings: dv_norm_sq_e,
  // dv_norm_lin_e), sum_i x_i^2 c_i and sum_i x_i l_i (the log's and the
  // addition's: dv_norm_lse_sq_e, dv_norm_lse_lin_e); over the groups of
  // repeated rows P_Gj |sum_{i in G} dO_id| (tau_G + l_G) (dv_norm_rep_e;
  // a sampled sub-case: each row's x_i (tau_i + l_i)). v_i, tau_i, c_i, l_i
  // are the row's units (oracle_attention.cc).
  // Per element of dK, the same from each query row's share z_i = P_ij
  // (|dP_ij - delta_i| + |delta_i|) s |q_a|, carried like its magnitude:
  // max_i (v_i + c_i) z_i and max_i v_i z_i (dk_rowmax_e,
  // dk_sum_rowmax_e: the Hoeffding bounds' sum_i w_i z_i^2 <= max_i w_i
  // z_i sum_i z_i), sum_i z_i (dk_norm_z_e), sum_i tau_i z_i
  // (dk_norm_lin_e), sum_i l_i z_i (dk_norm_lse_lin_e), all over the
  // distinct rows, and the repeated rows' sum_i (tau_i + l_i) z_i
  // (dk_norm_rep_e).
  std::vector<T> row_ties, dv_norm_sq_e, dv_norm_lin_e, dv_norm_lse_sq_e,
      dv_norm_lse_lin_e, dv_norm_rep_e, dk_rowmax_e, dk_sum_rowmax_e,
      dk_norm_z_e, dk_norm_lin_e, dk_norm_lse_lin_e, dk_norm_rep_e;
  // The formulation's parameter gradients (issue 16; empty when it has
  // none) and, per element, the same seven channels as dq's, indexed by
  // Channel (validation/field.h: at(Channel::kMagnitude) ...), and the
  // number of normalization rows each element sums over (q_param_rows,
  // k_param_rows).
  std::vector<T> dq_weight, dk_weight, dq_bias, dk_bias;
  // The sinks' gradient (issue 34; empty without sinks). Its table reads
  // the O and lse tables (rule.cc, dsinks_table), not channels of its own.
  std::vector<T> d_sinks;
  std::array<std::vector<T>, kChannels> dq_weight_ch, dk_weight_ch, dq_bias_ch,
      dk_bias_ch;
  // LayerNorm with a weight: the weight's channels with each row's term
  // weighted by the row's mean shift per u_c (OperandMagsT::shr) instead of
  // |x_hat_e|, for the product of x_hat's and dx_tilde's errors (rule.h,
  // "The weight gradient's product"; empty otherwise).
  std::array<std::vector<T>, kChannels> dq_weight_sh_ch, dk_weight_sh_ch;
  // LayerNorm's mean shift per u_c (OracleAttention::logit_shift): its
  // effect on dq, dk (per element) and dg.
  std::vector<T> dq_shift_e, dk_shift_e;
  T dg_shift = 0;
  // Round-before-weight formulations in 16-bit storage: the absolute
  // change of dq, dk (per element) a kernel's x_hat rounding flips make
  // where they reach the gradients directly, not through the logits
  // (Channel::kRoundingFlip; rule.h; 0 otherwise).
  std::vector<T> dq_flip_e, dk_flip_e;
};
// The oracle: the reference evaluated in `precision` on the case's inputs
// as given (OracleValues, widened to long double), and what the rule needs
// beside them.
struct OracleAttention : OracleValues<long double> {
  // The unit roundoff of the arithmetic the oracle ran in (2^-64 long
  // double, 2^-53 double, 2^-24 float): the rule's oracle channel
  // (validation/rule.h) scales by it.
  double unit_roundoff = 0x1p-64;
  // Its absolute resolution (smallest subnormal) and smallest normal, as
  // doubles (0 for long double's, below double's range): the oracle
  // channel's ulp(0) and tiny terms.
  double resolution = 0, tiny = 0;
  int64_t q_param_rows = 0, k_param_rows = 0;
  // Round-before-weight formulations in 16-bit storage (Qwen3): a correct
  // kernel's x_hat may round to the other neighbour where the exact x_hat
  // lies within its own error of a rounding midpoint; the largest logit
  // change those flips can make (0 otherwise).
  double logit_flip = 0;
  // The same without the logit scale: the largest change of C_ij = q_tilde
  // . k_tilde those flips can make (dg's direct term, rule.h).
  double operand_flip = 0;
  // LayerNorm: the computed mean of a row is an L-term sum, off by up to
  // sum_units(L) u_c sum|x| / L, which shifts every x_hat of the row by that
  // over the divisor; near-zero x_hat_e (x_e at the mean) have no relative
  // accuracy at all (found by the fuzzer, issue 16: a row summing exactly to
  // 0, x_e = 0, reference:f64's weight gradient 1.5e-20 against 7e-24).
  // Per u_c (units included): the largest logit change the shift makes (0
  // without layer; its effect on dq, dk and dg: OracleValues::*_shift*).
  double logit_shift = 0;
  // Sampled verdicts (validation/sampled.h) judge one row of a long problem
  // on a sub-case holding that row and what it reads. The rule's counts and
  // logit amplitude are then the whole case's, not the sub-case's (0: the
  // case's own): the tables of a sampled row equal the full verdict's.
  double amplitude = 0;
  // cosine_units (rule_terms.h) of the case, set by oracle_attention (a
  // sampled sub-case's: the whole case's; 0: the rule computes it).
  double cosine_units = 0;
  int64_t count_q_len = 0, count_kv_len = 0;
  // Sampled key rows read every query row's lse and delta from a pass in
  // double (GivenRows); its error per f64 unit roundoff, times the
  // gradients' magnitudes (given_units) and their softmax terms
  // (given_soft_units), joins dk, dv and dg (validation/rule.h).
  double given_units = 0, given_soft_units = 0;
};
// The statistics of every query row (b, h, i) of a case, dense [B, H, Nq],
// given instead of computed: lse_i, delta_i = dO_i . O_i, Del_i >= sum_j
// P_ij |dO_i|.|v_j|, sum_j P_ij |dP_ij - delta_i|, o_abs_i >= |dO_i|.|O_i|
// and p_del_i >= sum_j |dO_i|.|v_j| over the visible keys. A sampled key row's
// sub-case holds only the queries that see that key, so its rows' softmax
// normalization must come from outside.
// ties: each row's row_tie_excess (OracleValues::row_ties; may be empty:
// 0).
struct GivenRows {
  std::vector<long double> lse, delta, del, ds_l1, o_abs, p_del, ties;
  double units = 0, soft_units = 0;  // OracleAttention::given_*units
};
// The rule's counts of the whole case for a sub-case (0: the sub-case's
// own): the subnormal counts of the sums forming du (OracleAttention
// Channel::kSubnormalCount) then equal the full oracle's. q_side / k_side
// false: the channels of dq (resp. dk and the k parameters) are not needed and
// stay 0 (a sampled query row's sub-case needs no dk; a key row's no dq), and
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
// options: the arithmetic and threads (OracleOptions).
OracleAttention oracle_attention(const AttentionCase& c,
                                 const GivenRows* given = nullptr,
                                 const RowCounts& counts = {},
                                 OracleWorkspace* ws = nullptr,
                                 const OracleOptions& options = {});
// The same into *out, whose arrays keep their memory from its last use
// (the sampled verdict's sub-cases: one per thread; the same values as a
// fresh result, and no page faults of fresh arrays per sub-case).
void oracle_attention_into(const AttentionCase& c, const GivenRows* given,
                           const RowCounts& counts, OracleWorkspace* ws,
                           const OracleOptions& options, OracleAttention* out);
OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c);
// True iff oracle_attention gives the same result on two cases of problem
// p that differ only in their storage, a and b (the same rounded values):
// it reads the storage only for its arithmetic (use_double: long double for
// f64), the compute format's roundoff (rule.h's ties) and, where the
// formulation rounds x_hat to storage (reference::rounds_x_hat), that
// rounding and its flips. So f32, bf16 and f16 agree unless the formulation
// rounds x_hat. The fuzzers compute one oracle for the precisions whose
// rounded inputs coincide (issue 32: one oracle per distinct input set).
bool oracle_storage_equivalent(const AttentionProblem& p, Precision a,
                               Precision b);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_ORACLE_H_
