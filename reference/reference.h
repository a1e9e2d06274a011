// The reference: plain loops over dense row-major arrays, templated on the
// arithmetic type T. Built with -ffp-contract=off, never -ffast-math, so each
// instantiation rounds exactly as its source says.
//
// Instantiations:
//   float       - the "naive same-precision" baseline of the f32/bf16/f16
//                 entries (the entry rounds inputs/outputs to storage);
//   double      - the f64 reference entry, and the oracle of the f32, bf16
//                 and f16 entries (validation/oracle.h, OraclePrecision: its
//                 own error is a channel of the rule, validation/rule.h);
//   long double - the oracle of the f64 entries (and wherever double's
//                 range would not do). x87 extended: 64-bit significand (u =
//                 2^-64), 2048x smaller roundoff than double, in hardware, with
//                 expl/logl/sqrtl from glibc. __float128 (u = 2^-113) would be
//                 ~50-100x slower in software; the property and fuzz suites
//                 evaluate the oracle thousands of times, and what we measure
//                 against it are f32/bf16/f16 errors (>= 2^-24) and double
//                 errors (>= 2^-53): an oracle error 2^-11 below double's
//                 unit roundoff resolves those to within ~0.05%.
//
// Layout: q, o, d_o, dq [B,H,q_len,D]; k, v, dk, dv [B,H,kv_len,D];
// lse [B,H,q_len]; all dense. Semantics, zero rows and fully masked rows: see
// include/qknorm/attention.h. The backward recomputes P from the saved lse
// (P_ij = exp(S_ij - lse_i)); it never keeps a copy of P.
#ifndef QKNORM_REFERENCE_REFERENCE_H_
#define QKNORM_REFERENCE_REFERENCE_H_

#include <vector>

#include "qknorm/attention.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"

namespace qknorm::reference {

using Oracle = long double;

// Euclidean norm of x[0..n) with scaled accumulation (max-abs scaling, as in
// two-pass nrm2): no overflow or harmful underflow for any finite input.
template <class T>
T nrm2(const T* x, int64_t n);

// The formulation's learned parameters (attention.h; dense, param_size()
// elements each, null when the formulation has none) and the storage format
// x_hat is rounded to when p.norm.round_before_weight (bf16, f16 only).
template <class T>
struct NormArgs {
  const T *q_weight = nullptr, *k_weight = nullptr, *q_bias = nullptr,
          *k_bias = nullptr;
  Precision storage = Precision::kF64;
  // RoPE (attention.h, Rope): false rotates as the problem's claims say a
  // kernel may (an f32 angle from an f32 inverse frequency, as Hugging
  // Face forms it; cos and sin rounded to storage), the naive baseline's
  // way; true rotates exactly in T (the oracle: angle pos * inv_freq and
  // cos, sin all in T).
  bool exact_rope = false;
};
// Their gradients (null where the formulation has none), and the sinks'
// (attention.h, `heads` values; null: not formed).
template <class T>
struct NormGrads {
  T *q_weight = nullptr, *k_weight = nullptr, *q_bias = nullptr,
    *k_bias = nullptr;
  T* sinks = nullptr;
};

// One normalization row's statistics, what its backward needs: l2 the norm;
// rms and layer the divisor d1 * d2 (reference.cc, normalize_row).
template <class T>
struct RowStats {
  T nrm = 0;
  T d1 = 1, d2 = 1;
};

// One side's logit operands, prepared once (prepare_operand) and read by the
// overloads below that take them: the oracle computes them once per case
// instead of once in each of forward, backward and probabilities (with the
// magnitudes of validation/operands.h, the unrounded x_hat once more): at
// n = 4096 those repeated normalizations were a third of a sampled
// sub-case's time. Dense arrays in the layout of x, owned by the caller.
template <class T>
struct OperandView {
  NormRows rows{};
  const T* xh = nullptr;  // x_hat as the weight multiplies it (rounded to
                          // storage where the formulation rounds)
  const T* xu = nullptr;  // x_hat unrounded, as the normalization backward
                          // reads it (== xh where nothing rounds)
  const T* xt = nullptr;  // x_tilde, as the logits read it
  const RowStats<T>* stats = nullptr;  // per normalization row
};

// True where x_hat is rounded to storage before the weight (then xh and xu
// differ and need two arrays).
bool rounds_x_hat(const AttentionProblem& p, Precision storage);

// RoPE's cos and sin of side `side` (attention.h, Rope): [N, rotary_dim / 2]
// each, N the side's rows (q_len or kv_len), pair e of row n at n * pairs +
// e; empty without RoPE. exact: NormArgs::exact_rope.
template <class T>
struct RopeTable {
  int64_t pairs = 0;
  std::vector<T> cos, sin;
};
template <class T>
RopeTable<T> rope_table(const AttentionProblem& p, int side, Precision storage,
                        bool exact);
// Rotates every [D] row of the dense side tensor x ([B, H_x, N, D]) in
// place by its position's table entries (inverse: by the opposite angle,
// the backward's transpose).
template <class T>
void rope_rotate(const AttentionProblem& p, int side, const RopeTable<T>& t,
                 T* x, bool inverse);

// Fills side `side`'s x_hat (xh), x_tilde (xt), the row statistics and,
// where xu is not null, the unrounded x_hat (the same values as xh unless
// rounds_x_hat). xh, xu, xt: as many elements as x; stats: norm_rows(p,
// side).rows(). With RoPE after the normalization (and sdpa) xt is the
// rotated x_tilde, xh and xu unrotated; before it, xh, xu and xt are those
// of the rotated x (RopeOrder::kBeforeNorm).
template <class T>
void prepare_operand(const AttentionProblem& p, int side, const T* x,
                     const NormArgs<T>& w, T* xh, T* xu, T* xt,
                     RowStats<T>* stats);

// k, v, dk, dv are [B, kv_heads, kv_len, D] (GQA: attention.h).
template <class T>
void attention_forward(const AttentionProblem& p, const T* q, const T* k,
                       const T* v, T* o, T* lse, const NormArgs<T>& w = {});

// ds (optional, may be null): receives dS, dense [B,H,q_len,kv_len], for the
// invariant tests (rows of dS sum to 0; with a softcap dS is the gradient of
// the logit before the cap, whose rows do not). dg receives sum over b, h (0
// for a fixed logit scale).
template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds = nullptr,
                        const NormArgs<T>& w = {}, const NormGrads<T>& dw = {});

// P as forward computes it, dense [B,H,q_len,kv_len], 0 where masked.
template <class T>
void attention_probabilities(const AttentionProblem& p, const T* q, const T* k,
                             T* probs, const NormArgs<T>& w = {});

// The same three on prepared operands (q, k: prepare_operand's views of
// both sides), with the same results. The backward's dq, dk, dv and dg may
// be null: that output is not formed, nor what only it reads (a side's
// gradient accumulation and normalization backward, which the sampled
// oracle's one-row sub-cases do not judge: validation/sampled.cc).
// The forward may also return P (probs, as attention_probabilities forms
// it) and S (logits, dense [B,H,q_len,kv_len], written where visible), and
// the backward read S from there instead of forming it again: the same
// D-term dots, formed once instead of three times.
template <class T>
void attention_forward(const AttentionProblem& p, const OperandView<T>& q,
                       const OperandView<T>& k, const T* v, T* o, T* lse,
                       T* probs = nullptr, T* logits = nullptr);
template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const OperandView<T>& qo, const OperandView<T>& ko,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds, const NormArgs<T>& w,
                        const NormGrads<T>& dw, const T* logits = nullptr);
template <class T>
void attention_probabilities(const AttentionProblem& p, const OperandView<T>& q,
                             const OperandView<T>& k, T* probs);

// The normalized, weighted rows x_tilde of q (side 0, [B,H,q_len,D]) or k
// (side 1, [B,kv_heads,kv_len,D]) as the attention uses them.
template <class T>
void normalized_operand(const AttentionProblem& p, int side, const T* x,
                        const NormArgs<T>& w, T* out);

template <class T>
void scalenorm_forward(const ScaleNormProblem& p, const T* x, T* y);
template <class T>
void scalenorm_backward(const ScaleNormProblem& p, const T* x, const T* dy,
                        T* dx, T* dg);

#define QKNORM_REFERENCE_EXTERN(T)                                             \
  extern template T nrm2<T>(const T*, int64_t);                                \
  extern template void attention_forward<T>(const AttentionProblem&, const T*, \
                                            const T*, const T*, T*, T*,        \
                                            const NormArgs<T>&);               \
  extern template void attention_backward<T>(                                  \
      const AttentionProblem&, const T*, const T*, const T*, const T*,         \
      const T*, const T*, T*, T*, T*, T*, T*, const NormArgs<T>&,              \
      const NormGrads<T>&);                                                    \
  extern template void attention_probabilities<T>(                             \
      const AttentionProblem&, const T*, const T*, T*, const NormArgs<T>&);    \
  extern template void normalized_operand<T>(                                  \
      const AttentionProblem&, int, const T*, const NormArgs<T>&, T*);         \
  extern template void prepare_operand<T>(const AttentionProblem&, int,        \
                                          const T*, const NormArgs<T>&, T*,    \
                                          T*, T*, RowStats<T>*);               \
  extern template void attention_forward<T>(                                   \
      const AttentionProblem&, const OperandView<T>&, const OperandView<T>&,   \
      const T*, T*, T*, T*, T*);                                               \
  extern template void attention_backward<T>(                                  \
      const AttentionProblem&, const T*, const T*, const OperandView<T>&,      \
      const OperandView<T>&, const T*, const T*, const T*, const T*, T*, T*,   \
      T*, T*, T*, const NormArgs<T>&, const NormGrads<T>&, const T*);          \
  extern template void attention_probabilities<T>(const AttentionProblem&,     \
                                                  const OperandView<T>&,       \
                                                  const OperandView<T>&, T*);  \
  extern template void scalenorm_forward<T>(const ScaleNormProblem&, const T*, \
                                            T*);                               \
  extern template void scalenorm_backward<T>(const ScaleNormProblem&,          \
                                             const T*, const T*, T*, T*);
QKNORM_REFERENCE_EXTERN(float)
QKNORM_REFERENCE_EXTERN(double)
QKNORM_REFERENCE_EXTERN(long double)
#undef QKNORM_REFERENCE_EXTERN

}  // namespace qknorm::reference

#endif  // QKNORM_REFERENCE_REFERENCE_H_
