// QKNorm attention (Henry et al. 2020) and the scaled dot-product baseline:
// problem description and non-owning tensor views shared by every backend.
//
// Math, per (batch b, head h), with Q [q_len, D], K, V [kv_len, D]:
//   qknorm: q_hat_i = q_i / max(||q_i||_2, eps), k_hat_j likewise (never v),
//           S_ij = g * (q_hat_i . k_hat_j)            (no 1/sqrt(D))
//   sdpa:   S_ij = (q_i . k_j) / sqrt(D)             (g and eps unused)
//   P_i = softmax over the keys j visible to query i, O_i = sum_j P_ij v_j,
//   lse_i = log sum_{visible j} exp(S_ij).
// Backward (shared/NUMERICS.md): dV = P^T dO, dP = dO V^T,
//   delta_i = rowsum(dO * O)_i, dS = P * (dP - delta), dg = sum dS * C with
//   C = Q_hat K_hat^T, dQ_hat = g dS K_hat, dK_hat = g dS^T Q_hat, then the
//   unit-normalization backward: dx = (du - u (u . du)) / ||x|| if ||x|| > eps,
//   dx = du / eps otherwise.
//
// Defined results for extreme but valid input:
// - A zero row (or any row with ||x|| <= eps) is divided by eps: q_hat is
//   x / eps (0 for a zero row), logits are finite, the gradient is du / eps.
// - A fully masked query row (no visible key) gives O_i = 0, lse_i = -inf (the
//   exact log of an empty sum; the only non-finite value any entry returns),
//   and contributes nothing to any gradient: dQ_i = 0, and it adds nothing to
//   dK, dV or dg.
// - Norms are computed with scaling, so no finite input overflows or
//   underflows in the normalization.
#ifndef QKNORM_ATTENTION_H_
#define QKNORM_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qknorm {

enum class Variant { kQKNorm, kSDPA };

// Default eps of the authors' code (framework default of F.normalize), applied
// as a clamp on the norm.
inline constexpr double kDefaultQKNormEps = 1e-12;

// The paper's initial g: g0 = log2(L^2 - L), L = 97.5th-percentile training
// sequence length (L = 72 gives 12.3197). Requires L > 1.
double g_init(double L);

// Which keys a query sees. Both parts may be combined.
struct Mask {
  // Key j visible to query i iff j <= i + kv_len - q_len (bottom-right
  // aligned; a square problem gets the usual lower triangle). With
  // kv_len < q_len the first q_len - kv_len rows are fully masked.
  bool causal = false;
  // Empty: no padding. Otherwise one entry per batch, 0 <= len <= kv_len:
  // keys j >= key_lengths[b] are invisible to every query of batch b.
  std::vector<int64_t> key_lengths;
};

// True iff key j is visible to query i of batch b.
inline bool visible(const Mask& m, int64_t b, int64_t i, int64_t j,
                    int64_t q_len, int64_t kv_len) {
  if (m.causal && j > i + kv_len - q_len) return false;
  if (!m.key_lengths.empty() && j >= m.key_lengths[static_cast<size_t>(b)])
    return false;
  return true;
}

struct AttentionProblem {
  int64_t batch = 1, heads = 1, q_len = 1, kv_len = 1;
  int64_t head_dim = 1;  // also the value dimension
  Variant variant = Variant::kQKNorm;
  double g = 1.0;  // one scalar shared by all heads (qknorm only)
  double eps = kDefaultQKNormEps;  // norm clamp (qknorm only)
  Mask mask;
};

// Strides in elements of a [B, H, N, D] tensor; the D dimension is always
// contiguous (stride 1). Element (b, h, n, d) is at
//   b * batch_stride + h * head_stride + n * row_stride + d.
struct Layout4 {
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};
// Dense row-major layout of a [*, heads, rows, dim] tensor.
inline Layout4 contiguous_layout(int64_t heads, int64_t rows, int64_t dim) {
  return Layout4{heads * rows * dim, rows * dim, dim};
}

// Non-owning view of a 4-D tensor. `size` is the number of elements the
// buffer holds (the validator checks every addressed element lies inside).
// The element type is the Precision of the entry that reads it.
template <class Ptr>
struct TensorRef4 {
  Ptr data = nullptr;
  int64_t size = 0;
  Layout4 layout;
};
using ConstTensor4 = TensorRef4<const void*>;
using MutTensor4 = TensorRef4<void*>;

// lse is dense [B, H, q_len] doubles for every precision (a f32 entry stores
// its f32 value exactly).
struct ForwardArgs {
  ConstTensor4 q, k, v;  // q [B,H,q_len,D], k and v [B,H,kv_len,D]
  MutTensor4 o;          // [B,H,q_len,D]
  double* lse = nullptr;
  int64_t lse_size = 0;
};

// Outputs must not alias inputs. dg receives the sum over batch and heads
// (0 for sdpa).
struct BackwardArgs {
  ConstTensor4 q, k, v, o, d_o;  // o and lse as returned by forward
  const double* lse = nullptr;
  int64_t lse_size = 0;
  MutTensor4 dq, dk, dv;
  double* dg = nullptr;
};

}  // namespace qknorm

#endif  // QKNORM_ATTENTION_H_
