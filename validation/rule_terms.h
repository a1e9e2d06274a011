// The terms of the rule (validation/rule.h, THE VERDICT) that the oracle
// and the sampled pass need too: the named constants, the unit counts and
// the resolution terms, as pure functions of the problem and the operands.
// This header includes no oracle (the oracle calls these terms; the rule's
// tables, rule.h, read the oracle): nothing else computes a term of a bound.
#ifndef QKNORM_VALIDATION_RULE_TERMS_H_
#define QKNORM_VALIDATION_RULE_TERMS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::validation {

struct AttentionCase;
template <class T>
struct OperandMagsT;  // validation/operands.h, the oracle's logit operands

// The named constants of the rule (derivations in rule.h and below).
inline constexpr double kSumLambda = 8.0;
inline constexpr double kOpUnits = 4.0;
inline constexpr double kDotUnits = 4.0;
inline constexpr double kIllConditioned = 100.0;
// A channel of a logit operand row is dominant where its square is at least
// kDominantRatio times the mean square of the row's smaller channels
// (cosine_units; rule.h).
inline constexpr double kDominantRatio = 64.0;
// A pair's cosine is taken as one of random-sign products up to
// kChanceCosine / sqrt(D); beyond, its excess shares a sign (cosine_units,
// the coherent excess; rule.h).
inline constexpr double kChanceCosine = 6.0;
// The logit softcap (rule.h, "The logit softcap"): a capped logit's own
// units beyond the cosine's (per |A| u_c), and its slope's (per u_c, times
// the magnitude of dS' = P (dP - delta)).
inline constexpr double kSoftcapLogitUnits = 13.0;
// logit_units: a logit's whole error per u_c (rule.h).
double softcap_slope_units(double logit_units, double cap);

// Attention sinks (rule.h, "Attention sinks"): the error of a sink's
// exponent sink - m per u_c, absolute: the sink rounded to the compute
// format (|sink|), the subtraction of the row's shift m (|sink - m| <= 2
// |sink| + |A|: m is a visible logit, |S| <= |A|, or the sink, or a fixed
// shift of either's size) and the exp's own kSinkExpUnits (4 ulp, as the
// softcap's tanh): sink_logit_units = 3 max_h |sink_h| + |A| +
// kSinkExpUnits; 0 without sinks.
inline constexpr double kSinkExpUnits = 8.0;
double sink_logit_units(const AttentionProblem& p, double amplitude);
// A visible logit's exponent S - m when the row's shift m is a sink above
// |A| (a kernel may shift by the sink): its subtraction rounds at |S - m| <=
// |A| + |sink|, max(0, max_h |sink_h| - |A|) units beyond the 2 |A| the
// cosine units allow for; 0 without sinks.
double sink_shift_units(const AttentionProblem& p, double amplitude);

// RoPE (rule.h, "RoPE"): a rotated element's error per unit roundoff u_c,
// relative to its pair's |x_a| + |x_b|, is eps = kRopeRotateUnits (the two
// products and the sum) + kRopeCosSinUnits (cos and sin to 4 ulp) + the
// claimed cos/sin storage rounding (u_s / u_c) + the angle's error (below)
// + the oracle's own rotation error in u_c.
inline constexpr double kRopeRotateUnits = 3.0;
inline constexpr double kRopeCosSinUnits = 8.0;
// The gradients' units per eps (rule.h, "RoPE"): after the normalization
// (and sdpa) the other side's rotated operand (2 sqrt 2) and the transpose
// rotation (1), on the pair-summed magnitude; before it, through the
// normalization backward, 16 on rope_mag.
inline constexpr double kRopeGradAfter = 4.0;
inline constexpr double kRopeGradBefore = 16.0;
// The angle t_e = pos inv_freq_e: inv_freq_e = theta^(-x), x = 2e / r,
// from theta costs ln(theta) x + 4 units of the angle's arithmetic (x
// rounded: ln(theta) x units of theta^x; pow, the reciprocal and the
// product: 4), a given table 2 (its rounding and the product), times
// |t_e|. rope_angle_error: the case's largest, max_e units_e |t_e|max, per
// unit roundoff of the angle's arithmetic (|pos| at its largest).
double rope_angle_error(const AttentionProblem& p);
struct RopeUnits {
  double eps = 0;    // per element, above
  double logit = 0;  // per |A| u_c: 4 eps (2 eps per side's row norm)
  double grad = 0;   // per u_c on dq, dk and the parameters' magnitudes
};
// uc: the compute unit roundoff; uo: the oracle's. Zero without RoPE.
RopeUnits rope_units(const AttentionProblem& p, Precision storage, double uc,
                     double uo);

// sum_units(n) = kSumLambda sqrt(n) + kOpUnits: the probabilistic rounding
// error of an n-term sum plus the few roundings around it (rule.h).
double sum_units(double n);
// Repeated summands (rule.h, "Repeated summands"): the excess X of a row
// sum's tied term pairs over n distinct terms, from its terms (normalized
// to sum 1; *terms is sorted in place), the compute format's unit roundoff
// u and a term's own error per u relative (term_units); 0 when no two terms
// tie (then every bound that reads it is bitwise today's).
double row_tie_excess(std::vector<double>* terms, double u, double term_units);
// sum_units of an n-term sum whose tied pairs exceed n by `excess`: today's
// sum_units(n) where excess = 0, else the larger of that and min(kSumLambda
// sqrt(n + excess), n - 1) + kOpUnits.
double tie_sum_units(double n, double excess);
// softmax_units(A, dot) = 2 dot |A|: the logits' conditioning (rule.h), dot
// the case's cosine_units.
double softmax_units(double amplitude, double dot_units);

// The cosine's units of the case (rule.h, dot): kDotUnits plus, for logit
// operand rows concentrated on a few dominant channels, min(kSumLambda
// sqrt(D), D - 1) times the largest over the case's (q row, k row) pairs of
// |C| (s_q + s_k) / 2 + T + 2 e (s: the rows' dominant shares, T: the
// dominant channels' products, e: the coherent excess max(0, |C| -
// kChanceCosine / sqrt(D)) of pairs whose products share a sign).
double cosine_units(const AttentionCase& c);
// The same from each logit operand row's facts (its dominant share and
// channels, its norms and its signed unit row), formed once per case: the
// whole case's units(), and the units of any of its pairs' sub-blocks
// (Pairs: batches [b, b + batch), query heads [q_head, q_head + heads) with
// rows [q_row, q_row + q_len), and the key rows [k_row, k_row + kv_len) of
// kv heads [k_head, k_head + kv_heads), which must hold the query heads'
// kv heads), bitwise cosine_units of the sub-case holding those rows. A
// sampled row's sub-case reads its own this way (oracle_attention.cc): it
// re-sorted every row's channels once per sub-case, 38% of issue 32's
// 32768-key run. Reads c's q and k: c must outlive it.
class CosineRows {
 public:
  explicit CosineRows(const AttentionCase& c);
  ~CosineRows();
  CosineRows(const CosineRows&) = delete;
  CosineRows& operator=(const CosineRows&) = delete;
  struct Pairs {
    int64_t batch = 0, heads = 0, kv_heads = 0, q_len = 0, kv_len = 0;
    int64_t b = 0, q_head = 0, q_row = 0, k_head = 0, k_row = 0;
  };
  double units() const;
  double units(const Pairs& pairs) const;
  struct Impl;

 private:
  double unscaled_units(const Pairs& pairs) const;
  std::unique_ptr<Impl> impl;
};

// The logit amplitude A of the rule for the (rounded) case: |g| (the
// paper's qknorm), |scale| max ||q_a|| max ||k_a|| over the logit operands'
// magnitude rows (the other formulations), max ||q|| max ||k|| / sqrt(D)
// (sdpa).
double logit_amplitude(const AttentionCase& c);

// x_hat's absolute resolution per ulp_c(0) in one normalization row of
// length L and divisor den; scaled_row_resolution is its part at the scaled
// row's magnitude (derivations in rule_terms.cc).
long double scaled_row_resolution(const AttentionProblem& p, int64_t L);
long double x_hat_resolution(const AttentionProblem& p, int64_t L,
                             long double den);
// The logit operand x_tilde's resolution per ulp_c(0), per element of one
// side (m), into *out (resized); T: the oracle's arithmetic.
template <class T>
void operand_resolution(const AttentionProblem& p, const OperandMagsT<T>& m,
                        std::vector<T>* out);
// Whether a correct kernel's x_hat may round to either storage neighbour:
// round_before_weight in 16-bit storage (rule_terms.cc).
bool flips_x_hat(const AttentionCase& c);
// Per element of one side (m): ulp_s(x_hat_e) where a correct kernel's
// x_hat_e lies within its own error of a storage rounding midpoint, else 0,
// into *out (empty unless flips_x_hat).
template <class T>
void rounding_flips(const AttentionCase& c, const OperandMagsT<T>& m,
                    std::vector<T>* out);
// OracleAttention::logit_flip of the case (0 unless flips_x_hat), s the
// logit scale's magnitude (s = 1: the largest change of q_tilde . k_tilde,
// OracleAttention::operand_flip).
template <class T>
long double logit_flip(const AttentionCase& c, const OperandMagsT<T>& qm,
                       const OperandMagsT<T>& km, T s);

// The sampled oracle's pass in double (validation/sampled.h) sums in chunks
// of kPassChunk terms; its error per f64 unit roundoff joins the bounds of
// dK, dV and dg as units (times the magnitudes) and soft_units (times the
// softmax terms): GivenRows::units, soft_units.
inline constexpr int64_t kPassChunk = 16;
void pass_units(double A, double dot_units, int64_t D, double* units,
                double* soft_units);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_RULE_TERMS_H_
