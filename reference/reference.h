// The reference: plain loops over dense row-major arrays, templated on the
// arithmetic type T. Built with -ffp-contract=off, never -ffast-math, so each
// instantiation rounds exactly as its source says.
//
// Instantiations:
//   float       - the "naive same-precision" baseline of the f32/bf16/f16
//                 entries (the entry rounds inputs/outputs to storage);
//   double      - the f64 reference entry;
//   long double - THE ORACLE. x87 extended: 64-bit significand (u = 2^-64),
//                 2048x smaller roundoff than double, in hardware, with
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
};
// Their gradients (null where the formulation has none).
template <class T>
struct NormGrads {
  T *q_weight = nullptr, *k_weight = nullptr, *q_bias = nullptr,
    *k_bias = nullptr;
};

// k, v, dk, dv are [B, kv_heads, kv_len, D] (GQA: attention.h).
template <class T>
void attention_forward(const AttentionProblem& p, const T* q, const T* k,
                       const T* v, T* o, T* lse, const NormArgs<T>& w = {});

// ds (optional, may be null): receives dS, dense [B,H,q_len,kv_len], for the
// invariant tests (rows of dS sum to 0). dg receives sum over b, h (0 for a
// fixed logit scale).
template <class T>
void attention_backward(const AttentionProblem& p, const T* q, const T* k,
                        const T* v, const T* o, const T* d_o, const T* lse,
                        T* dq, T* dk, T* dv, T* dg, T* ds = nullptr,
                        const NormArgs<T>& w = {}, const NormGrads<T>& dw = {});

// P as forward computes it, dense [B,H,q_len,kv_len], 0 where masked.
template <class T>
void attention_probabilities(const AttentionProblem& p, const T* q, const T* k,
                             T* probs, const NormArgs<T>& w = {});

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
