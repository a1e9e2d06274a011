// Input validation: the rules every checked_* entry point enforces. Kernels
// themselves skip these checks for speed. Each failure throws qknorm::Error
// naming the tensor, the index and the rule, e.g.
//   "qknorm: k[1,0,3,7]: element is +Inf (finite input required)".
#ifndef QKNORM_VALIDATE_H_
#define QKNORM_VALIDATE_H_

#include <cstdint>

#include "qknorm/attention.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"

namespace qknorm {

// Shape, parameter and mask rules: every dimension >= 1; the element count of
// every tensor fits in int64 (and size_t bytes); eps finite and > 0; g finite;
// key_lengths empty or one per batch with 0 <= len <= kv_len.
// validate_forward / _backward / _scalenorm_* add, for entries computing in
// f32 (precision f32, bf16, f16; qknorm variant or ScaleNorm): eps must not
// round to 0 in f32, and eps and |g| must be <= FLT_MAX.
void validate_problem(const AttentionProblem& p);
void validate_problem(const ScaleNormProblem& p);

// Layout rules for one tensor of logical shape [B, H, rows, D]: non-null data,
// non-negative strides, row_stride >= D, every addressed element inside
// [0, size), and no overflow computing the last offset.
void validate_tensor(const char* name, const void* data, int64_t size,
                     const Layout4& l, int64_t B, int64_t H, int64_t rows,
                     int64_t D);
// First NaN/Inf element, in (b, h, n, d) order, throws.
void validate_finite(const char* name, const void* data, const Layout4& l,
                     int64_t B, int64_t H, int64_t rows, int64_t D,
                     Precision prec);

// Everything above for the forward / backward arguments. Backward also
// requires lse_size = B*H*q_len and a non-null dg; lse may hold -inf only
// (fully masked rows), never NaN or +inf.
void validate_forward(const AttentionProblem& p, const ForwardArgs& a,
                      Precision prec);
void validate_backward(const AttentionProblem& p, const BackwardArgs& a,
                       Precision prec);
void validate_scalenorm_forward(const ScaleNormProblem& p,
                                const ScaleNormForwardArgs& a, Precision prec);
void validate_scalenorm_backward(const ScaleNormProblem& p,
                                 const ScaleNormBackwardArgs& a,
                                 Precision prec);

}  // namespace qknorm

#endif  // QKNORM_VALIDATE_H_
