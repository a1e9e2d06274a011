// QKNorm / SDPA attention on OpenBLAS: forward, backward, probabilities.
//
// Algorithm, per (batch b, head h), over query blocks of at most
// query_block() rows [i0, i1):
//   forward:  S = alpha * A_blk B^T          (GEMM: rows x m_blk x D)
//             per row: e_j = exp2(S_j - max_j S), sum = sum_j e_j (row_kernels)
//             O_blk = E V                       (GEMM: rows x D x m_blk)
//             O_i *= 1 / sum_i, lse_i = ln2 * (max + log2(sum))
//   with A = q_hat, B = k_hat, alpha = g log2(e) for qknorm (q_hat, k_hat
//   normalized once per head into the workspace), and A = q, B = k read in
//   place through their row strides, alpha = log2(e) / sqrt(D) for sdpa. The
//   log2(e) folded into the GEMM's alpha makes the softmax an exp2, whose range
//   reduction is exact. Dividing the D-wide output row instead of the m-wide
//   probability row saves one pass over the n^2 block.
//   backward: C = A_blk B^T, dP = dO_blk V^T     (GEMMs, alpha = 1)
//             per row (one fused pass): P = exp2(alpha C - lse log2 e),
//             dS = P (dP - delta), dg += sum dS C, delta = dO_i . O_i
//             dV += P^T dO_blk, dA_blk = s dS B, dB += s dS^T A_blk (GEMMs,
//             s = g or 1/sqrt(D)), then the normalization backward per row.
//
// Masks: for both mask kinds, and their combination, the keys query i sees
// form a prefix [0, m_i) with m_i non-decreasing in i, so a block needs only
// the first m_{i1-1} columns: the GEMMs skip the masked upper triangle and the
// padded keys instead of computing and discarding them. Rows with m_i = 0
// (fully masked) get O = 0, lse = -inf and no gradient, without evaluating
// exp(-inf - -inf).
//
// Why heads are not folded into bigger GEMMs: every GEMM here is a per-head
// product (Q_h K_h^T, P_h V_h, ...); stacking heads along M or N would compute
// the H^2 - H cross-head blocks and throw them away (H times the FLOPs), and
// OpenBLAS 0.3.21 has no batched GEMM. What is folded is the query dimension:
// a block holds up to query_block() query rows in one GEMM (all of them for
// n <= query_block()), large enough for OpenBLAS to run at its square-matrix
// rate, small enough that the block (and in the backward its second buffer)
// stays in the L2/L3 cache between the GEMM that writes it and the row pass
// that reads it.
//
// Workspace (elements of T, grow-only, per calling thread):
//   qknorm: (Nq + Nk) D (q_hat, k_hat) + Nk D (dk_hat accumulator, backward)
//           + query_block D (dq_hat block, backward)
//   both:   query_block * ld(Nk) per block buffer: 1 (forward), 2 (backward),
//           ld(Nk) = Nk rounded up to a multiple of 16
//   plus (Nq + Nk) doubles of norms (qknorm) and query_block doubles of
//   row statistics (forward); workspace_bytes() below is the exact total.
//   Example, f32, qknorm, Nq = Nk = 2048, D = 64 (query_block = 256):
//   forward 2.6 MiB, forward + backward 5.3 MiB, against the 16 MiB of one
//   dense n x n f32 matrix (and 128 MiB for all 8 heads).
// The caller keeps the Workspace; after a call of the largest shape, no call
// allocates (BlasWorkspace::bytes() stays constant; tested).
#ifndef QKNORM_BLAS_PATH_ATTENTION_H_
#define QKNORM_BLAS_PATH_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "blas_path/pool.h"
#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "qknorm/scalenorm.h"

namespace qknorm::blas {

// Grow-only buffer: holds exactly the largest size requested so far, never
// shrinks, and neither initializes nor copies (callers write before they
// read), so a grow touches no page and a reuse costs nothing.
template <class T>
class Buffer {
 public:
  T* get(size_t n) {
    if (n > size_) {
      p_ = std::make_unique_for_overwrite<T[]>(n);
      size_ = n;
    }
    return p_.get();
  }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  std::unique_ptr<T[]> p_;
  size_t size_ = 0;
};

// The scratch of one thread (one (batch, head) item at a time).
template <class T>
struct Scratch {
  Buffer<T> qh, kh, dkh, dqh, blk0, blk1;
  Buffer<double> qn, kn, row0;
  size_t bytes() const {
    return qh.bytes() + kh.bytes() + dkh.bytes() + dqh.bytes() + blk0.bytes() +
           blk1.bytes() + qn.bytes() + kn.bytes() + row0.bytes();
  }
};

// The workspace of one entry (T = float for blas:f32, double for blas:f64):
// one Scratch per thread slot, the per-item dg partial sums, and the worker
// pool (pool.h), whose threads live as long as the workspace.
template <class T>
class BlasWorkspace final : public Workspace {
 public:
  std::vector<std::unique_ptr<Scratch<T>>> slots;
  Buffer<double> dg_items;
  WorkerPool pool;
  Scratch<T>& slot(size_t s) {
    while (slots.size() <= s) slots.push_back(std::make_unique<Scratch<T>>());
    return *slots[s];
  }
  // Bytes of scratch currently reserved (every buffer's size; the pool's
  // thread stacks are not counted).
  size_t bytes() const {
    size_t b = dg_items.bytes();
    for (const auto& s : slots) b += s->bytes();
    return b;
  }
};

// Bytes a fresh BlasWorkspace<T> (elem_bytes = sizeof(T)) holds after one
// forward (backward = false) or one forward and one backward of p: the
// formula of the header comment, exactly.
// threads as in ExecConfig (0 = number of cores).
size_t workspace_bytes(const AttentionProblem& p, size_t elem_bytes,
                       bool backward, int threads);

// Threads a call with this config uses for p: min(threads, B * H).
int item_threads(const AttentionProblem& p, const ExecConfig& cfg);

// Query rows per block for a key length nk and element size.
int64_t query_block(int64_t nk, size_t elem_bytes);
// Leading dimension of a block buffer: nk rounded up to a multiple of 16.
int64_t block_ld(int64_t nk);

// Sets the OpenBLAS thread count for cfg (0 = number of cores). The entries
// do not use it (pool.h): it is for the timing driver's bare-GEMM baseline.
void set_blas_threads(const ExecConfig& cfg);

template <class T>
void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                       BlasWorkspace<T>& ws, const ExecConfig& cfg);
template <class T>
void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                        BlasWorkspace<T>& ws, const ExecConfig& cfg);
// The normalized probabilities the forward applies (E_ij / sum_i rounded to
// T, see the header comment), dense [B,H,Nq,Nk], 0 where masked.
template <class T>
void attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                             double* probs, BlasWorkspace<T>& ws);

template <class T>
void scalenorm_forward(const ScaleNormProblem& p,
                       const ScaleNormForwardArgs& a);
// ScaleNorm: rows processed in double (normalize.h), one thread.
template <class T>
void scalenorm_backward(const ScaleNormProblem& p,
                        const ScaleNormBackwardArgs& a, BlasWorkspace<T>& ws);

}  // namespace qknorm::blas

#endif  // QKNORM_BLAS_PATH_ATTENTION_H_
