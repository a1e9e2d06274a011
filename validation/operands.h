// The oracle's view of the logit operands, shared by oracle_attention
// (validation/oracle_attention.cc), the rule's operand terms
// (rule_terms.cc) and the sampled oracle's pass (sampled_pass.cc); built in
// oracle_operands.cc. Internal to the validation library; includes no
// oracle.h.
#ifndef QKNORM_VALIDATION_OPERANDS_H_
#define QKNORM_VALIDATION_OPERANDS_H_

#include <array>
#include <vector>

#include "reference/reference.h"
#include "validation/case.h"

namespace qknorm::validation {

using LD = long double;

// One side's logit operands and what the magnitudes need (oracle_attention,
// logit_amplitude): x_hat (unweighted, unrounded), x_tilde (signed, as the
// logits use it), |x_hat| |w| + |beta| (the operand's magnitude before
// cancellation), the weight per element (w or 1 + w; 1 without), each
// row's divisor (l2: max(||x||, eps); rms: sqrt(mean x^2 + eps); layer:
// sqrt(var + eps); 1 otherwise) and the largest |w|. Layer only: each
// row's mean shift per u_c, sum_units(L) (sum |x| / L) / den (the computed
// mean is an L-term sum; OracleAttention::logit_shift), and per element
// that times |w| (0 for the other kinds).
//
// They come from the one normalization the reference's forward, backward
// and probabilities read too (view(); reference::prepare_operand): xr holds
// x_hat rounded to storage where the formulation rounds it before the
// weight (else it is empty and xh serves both), stats each row's
// statistics for the normalization backward. fl: each element's rounding
// flip, ulp_s(x_hat_e) where a correct kernel may round x_hat_e to either
// neighbour, else 0 (rounding_flips, rule_terms.h; empty where nothing
// rounds).
//
// T: the oracle's arithmetic (oracle.h, OraclePrecision): long double for
// the rule's terms and the f64 entries' oracle, double for the others'.
//
// RoPE (attention.h, Rope; rule.h "RoPE"): xt is the rotated logit operand.
// After the normalization xh, xa, wv, sh and fl stay in the unrotated
// coordinates the normalization and the weight use, and xar holds the
// rotated operand's magnitude before cancellation, |cos| xa_a + |sin| xa_b
// per pair (>= |xt| element by element); before it (and for sdpa) every
// array is already in the rotated coordinates and xar is empty.
// logit_mag() is the magnitude in the logits' coordinates.
template <class T>
struct OperandMagsT {
  NormRows rows;
  std::vector<T> xh, xt, xa, wv, den, shr, sh, xr, fl, xar;
  const std::vector<T>& logit_mag() const { return xar.empty() ? xa : xar; }
  std::vector<reference::RowStats<T>> stats;
  T wmax = 1;
  bool xa_finite = true;  // every element of xa
  reference::OperandView<T> view() const;
};
struct OperandMags : OperandMagsT<LD> {};

OperandMags operand_mags(const AttentionCase& c, int side);
// The same into *m, from x (the side's inputs converted to T) and the
// case's parameters w (norm_args), reusing m's arrays.
template <class T>
void fill_operand_mags(const AttentionCase& c, int side, const T* x,
                       const reference::NormArgs<T>& w, OperandMagsT<T>* m);

// Rows [n0, n0 + rows.N) of heads [h0, h0 + rows.H) of batch b of the
// whole case's operands into *m (rows: the sub-case's norm_rows): the same
// values fill_operand_mags gives the sub-case (SharedOperands, oracle.h).
template <class T>
void slice_operand_mags(const OperandMagsT<T>& whole, int64_t b, int64_t h0,
                        int64_t n0, const NormRows& rows, OperandMagsT<T>* m);

// The case's learned parameters converted to T (store keeps them).
template <class T>
reference::NormArgs<T> norm_args(const AttentionCase& c,
                                 std::array<std::vector<T>, 4>* store);

inline std::vector<LD> widen(const std::vector<double>& x) {
  return {x.begin(), x.end()};
}

// The normalization row (NormRows) holding dense element offset o.
size_t row_of(const NormRows& nr, size_t o);

// RoPE's maps between the rotated and the unrotated coordinates of a dense
// side array ([B, H_x, N, D], side 0 q or 1 k), no-ops without RoPE:
// rope_pair_sum sets both elements of every rotated pair to their sum (an
// element-wise magnitude of a rotation's result: |R x|_a <= |x_a| + |x_b|),
// rope_unrotate applies the exact transpose rotation in T (the oracle's
// signed gradients).
template <class T>
void rope_pair_sum(const AttentionProblem& p, std::vector<T>* x);
template <class T>
void rope_unrotate(const AttentionProblem& p, int side, std::vector<T>* x);
// True where the rotation follows the normalization (kAfterNorm) or there is
// none (sdpa): the backward unrotates before the normalization backward.
inline bool rope_before_norm_backward(const AttentionProblem& p) {
  return has_rope(p) && (p.variant != Variant::kQKNorm ||
                         p.rope.order == RopeOrder::kAfterNorm);
}

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_OPERANDS_H_
