// Strided storage <-> dense arrays of an arithmetic type T, and the
// formulation's parameters in T: how the reference's entries (backend.cc)
// read their inputs and write their outputs, and how the formulation mutants
// (mutants/formulation_mutants.cc), which run the reference's loops, read and
// write them exactly as the reference does.
// Reading is exact (storage <= arithmetic width); writing rounds to storage
// (RNE, encode in precision.h).
#ifndef QKNORM_REFERENCE_STORAGE_H_
#define QKNORM_REFERENCE_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/precision.h"
#include "reference/reference.h"

namespace qknorm::reference {

// Calls f(i) with the storage index i of every element of a [B, H, rows, D]
// view laid out as l, in dense (row-major) order.
template <class F>
void for_each_element(const Layout4& l, int64_t B, int64_t H, int64_t rows,
                      int64_t D, F f) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        const int64_t base =
            b * l.batch_stride + h * l.head_stride + n * l.row_stride;
        for (int64_t d = 0; d < D; ++d) f(static_cast<size_t>(base + d));
      }
}

template <class T>
std::vector<T> gather(Precision prec, const ConstTensor4& t, int64_t B,
                      int64_t H, int64_t rows, int64_t D) {
  std::vector<T> out(static_cast<size_t>(B * H * rows * D));
  size_t idx = 0;
  for_each_element(t.layout, B, H, rows, D, [&](size_t i) {
    out[idx++] = static_cast<T>(decode(prec, t.data, i));
  });
  return out;
}

template <class T>
void scatter(Precision prec, const std::vector<T>& src, const MutTensor4& t,
             int64_t B, int64_t H, int64_t rows, int64_t D) {
  size_t idx = 0;
  for_each_element(t.layout, B, H, rows, D, [&](size_t i) {
    encode(prec, static_cast<double>(src[idx++]), t.data, i);
  });
}

// A [rows, dim] view as a [1, 1, rows, dim] one.
inline ConstTensor4 rows4(const ConstTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}
inline MutTensor4 rows4(const MutTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}

// A formulation parameter (doubles) in T.
template <class T>
std::vector<T> param_vec(const ParamRef& r) {
  std::vector<T> v(static_cast<size_t>(r.size));
  for (int64_t i = 0; i < r.size; ++i) v[i] = static_cast<T>(r.data[i]);
  return v;
}

// The formulation's parameters in T (exact: they are doubles holding values
// of the model's storage format, and T is at least that format's width for
// every value the generators produce; a double weight is rounded to T as any
// f32 kernel would read it).
template <class T>
struct Params {
  std::vector<T> qw, kw, qb, kb;
  NormArgs<T> args;  // pointers into the vectors above
};

template <class T>
void load_params(const NormParams& a, Precision s, Params<T>* out) {
  out->qw = param_vec<T>(a.q_weight);
  out->kw = param_vec<T>(a.k_weight);
  out->qb = param_vec<T>(a.q_bias);
  out->kb = param_vec<T>(a.k_bias);
  auto ptr = [](const std::vector<T>& v) {
    return v.empty() ? nullptr : v.data();
  };
  out->args.q_weight = ptr(out->qw);
  out->args.k_weight = ptr(out->kw);
  out->args.q_bias = ptr(out->qb);
  out->args.k_bias = ptr(out->kb);
  out->args.storage = s;
}

// What the forward and the backward both read: q, k, v gathered densely in T
// and the formulation's parameters.
template <class T>
struct QkvParams {
  std::vector<T> q, k, v;
  Params<T> w;
};

// Args: ForwardArgs or BackwardArgs (both carry q, k, v and params).
template <class T, class Args>
void load_qkv_params(const AttentionProblem& p, const Args& a, Precision s,
                     QkvParams<T>* out) {
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
  out->q = gather<T>(s, a.q, B, H, p.q_len, D);
  out->k = gather<T>(s, a.k, B, Hk, p.kv_len, D);
  out->v = gather<T>(s, a.v, B, Hk, p.kv_len, D);
  load_params(a.params, s, &out->w);
}

}  // namespace qknorm::reference

#endif  // QKNORM_REFERENCE_STORAGE_H_
