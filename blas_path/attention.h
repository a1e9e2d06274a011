// QKNorm / SDPA attention on OpenBLAS: forward, backward, probabilities.
//
// Algorithm, per (batch b, head h), over query blocks of at most
// query_block() rows [i0, i1), with A = q_hat, B = k_hat (normalized once per
// head into the workspace, normalize.h) and s = g for qknorm, A = q, B = k
// read in place through their row strides and s = 1/sqrt(D) for sdpa; exp is
// exp2 for f32 (alpha = s log2 e, the range reduction of exp2 is exact) and
// exp for f64 (alpha = s), see row_kernels.h:
//   forward:  C = A_blk B^T                     (GEMM: rows x m_blk x D)
//             per row: e_j = exp(alpha C_j - alpha max C), sum = sum_j e_j
//             O_blk = E V                       (GEMM: rows x D x m_blk)
//             O_i /= sum_i (the D-wide output row, not the m-wide P row: one
//             pass over the n^2 block fewer), lse_i = s max C + log(sum)
//   backward: C = A_blk B^T, dP = dO_blk V^T     (GEMMs)
//             per row (two passes, the row in L1): the forward's e_j again,
//             P = e / sum, delta = sum_j P dP, dS = P (dP - delta) (in a
//             cancellation-free form, row_kernels.h), dg += sum dS C,
//             stored as s dS (alpha = 1 below: dS A may overflow where the
//             exact s dS A does not, row_kernels.h)
//             dV += P^T dO_blk, dA_blk = (s dS) B, dB += (s dS)^T A_blk
//             (GEMMs),
//             then the normalization backward per row. O and lse are not
//             read (row_kernels.h says why).
// Formulations (issue 16) and GQA: the paper's formulation and sdpa without
// GQA take the per-head path above (unchanged); every other problem (rms,
// layer or no normalization, per head or across heads, weights, biases,
// 1 + w, a shared q/k weight, a fixed logit scale, kv_heads < heads) takes
// the general path:
//   A. every q and k normalization row (NormRows: one head's D values, or
//      all heads of a token) is normalized once in double (normalize.h,
//      formulation_row), times the weight plus the bias in double, rounded
//      to T once into dense x_tilde buffers [B,H,Nq,D] and [B,Hk,Nk,D]; the
//      rows in fixed chunks on the pool (round_before_weight rounds x_hat to
//      the storage format, which for f32/f64 storage is the identity);
//   B. the per-head algorithm above with A = q_tilde[b,h], B = k_tilde[b,hk],
//      V = v[b,hk], hk = h / (H / Hk), s = the learned g or the fixed scale
//      (sdpa: the inputs in place). Forward items are (b, h); backward items
//      are (b, hk): the group's query heads run in head order and accumulate
//      dk_tilde and dv (GEMMs with beta = 1), so the group sums have one
//      order whatever the thread count; dq_tilde goes to a dense buffer;
//   C. (backward) the normalization backward per row from x, the recomputed
//      x_hat and du = dx_tilde * w; each chunk of rows sums its parameter
//      gradients (dw += dx_tilde x_hat, dbeta += dx_tilde) into its own
//      partial, and the partials are added in chunk order, q's then k's (a
//      shared weight's gradient sums both). Chunks depend on the shape only.
//   dg is 0 for a fixed scale.
//   RoPE (issue 34) takes this path too: the cos and sin of every (position,
//   pair) are tabulated once per call in double (std::cos / std::sin of
//   pos * inv_freq_e in double); phase A rotates each head's D values of the
//   row in double before the single rounding to T: x_tilde after the
//   normalization, the raw x before it (the row then normalized), the raw
//   q and k for sdpa (which then also goes through the dense buffers);
//   phase C applies the transpose rotation to the gradient of the rotated
//   operand (after: dx_tilde before the weight and normalization backward;
//   before: the normalization backward's result, computed on the rotated
//   x; sdpa: dq_tilde, dk_tilde -> dq, dk). Measured (tools/blas_timing.cc,
//   f32, H = 8, D = 64, one thread, no GQA): qwen3 / olmo2 / chameleon forward
//   and backward at 0.58-0.87 of the paper path's speed at n = 128, 0.84-0.92
//   at n = 512, 0.93-0.99 at n = 2048 (the extra O(n D) passes: the
//   double gather, the recomputed x_hat, the dense copies).
//   Attention sinks (issue 34) take this path too: head h's sink, rounded
//   to T (blas:f32 forms it in f32) and scaled to the exponential's base
//   (times log2 e, rounded once, for f32), is one more term of each row's
//   sum, e_sink = exp(sink - shift), the shift being the larger of the
//   row's largest argument and the sink's (no exp overflows); lse is that
//   shift in natural units (the sink itself where it is larger) plus
//   log(sum), O = E V / sum as before, and a fully masked row gets O = 0,
//   lse = the sink. The backward's row kernel adds the sink to sigma as a
//   key with dP = 0 (row_kernels.h: the dP reference is the sink's 0 where
//   it dominates), which gives dS of the real keys unchanged in form, and
//   each row's p_sink delta; dsinks_h = -sum over rows, per (batch, head)
//   partials added in batch order. The probabilities hook returns P over
//   the real keys (a row sums to 1 - p_sink).
// GEMMs run single-threaded in OpenBLAS; (batch, head) items run in parallel
// on the workspace's pool (pool.h: OpenBLAS's own threading changes the bits).
//
// Masks: for both mask kinds, and their combination, the keys query i sees
// form a prefix [0, m_i) with m_i non-decreasing in i. Each query block runs
// its GEMMs in tiles over the visible prefix only (issue 18; attention.cc,
// BlockTiles): one tall tile over the keys every row of the block sees, then
// a staircase of 32-row tiles down the diagonal, each over its last row's
// prefix, in the forward (Q K^T, P V) and the backward (Q K^T, dO V^T,
// P^T dO, dS K, dS^T Q) alike. Only the part of each staircase tile above
// the diagonal is computed and discarded (its P and dS set to exactly 0,
// since the tile's later GEMMs read them); padded keys are never touched.
// Without a causal mask the block is one tile, one GEMM per product. Rows
// with m_i = 0 (fully masked) are taken off the block before any GEMM and
// get O = 0, lse = -inf and no gradient, without evaluating
// exp(-inf - -inf); keys no query sees get dK = dV = 0. A sliding window
// (issue 34) starts row i's keys at f_i (non-decreasing): the block is then
// only staircase tiles, each over keys [f of its first row, m of its last),
// a band down the diagonal; each row's entries before its own f are set to
// 0 as those past its m are, and rows that see no key can also end a block
// (a window past the padding).
// No output is cleared before a GEMM writes it: the first tile writing a
// row of O or dQ uses beta = 0; dV and dK take beta = 0 where a tile's keys
// are all new, and a staircase tile that also adds to older keys clears
// only its 32 new key rows first (cheaper than a second GEMM call). What
// remains is OpenBLAS's own pass clearing C before every beta = 0 product
// (sgemm_beta, a memset): the 10.6% of the forward's callgrind count that
// issue 18 quotes is that pass, counted one instruction per byte because
// glibc's memset runs `rep stosb`; in time it is about 1.5% of that forward
// (n = 256, H = 2: 655 KB at ~75 GB/s against ~0.6 ms on Zen 3).
//
// Why heads are not folded into bigger GEMMs: every GEMM here is a per-head
// product (Q_h K_h^T, P_h V_h, ...); stacking heads along M or N would compute
// the H^2 - H cross-head blocks and throw them away (H times the FLOPs), and
// OpenBLAS 0.3.21 has no batched GEMM. What is folded is the query dimension:
// a block holds up to query_block() query rows in one GEMM (a whole head for
// n <= 512 in f32), tall enough for OpenBLAS to run at its square-matrix
// rate (measured, query_block() in attention.cc), while the n x n matrix of a
// long sequence is never materialized.
//
// Workspace (grow-only, per thread slot, T elements unless stated):
//   both:   query_block * ld(Nk) per block buffer: 1 (forward), 2 (backward),
//           ld(Nk) = Nk rounded up to a multiple of 16; query_block doubles
//   qknorm: (Nq + Nk) D (q_hat, k_hat) and (Nq + Nk) RowNorms (norms as
//           mantissa and exponent, 16 bytes each, normalize.h);
//           backward also Nk D (dk_hat accumulator) + query_block D (dq_hat)
//   times min(threads, B H) slots, plus B H doubles (per-head dg) for the
//   backward; workspace_bytes() is the exact total (tested).
//   General path instead: per slot the block buffers and row statistics
//   above, (qknorm) 2 (forward) or 3 (backward) normalization rows of
//   doubles and (backward with a softcap) 2 ld(Nk) for a row's cosines and
//   capped logits; shared, (qknorm) q_tilde and k_tilde ((B H Nq + B Hk Nk) D),
//   backward also their gradients (as much again) and the parameter
//   partials (chunks x parameters), and B Hk doubles (per-item dg); with
//   RoPE also the table, (Nq + Nk) rotary_dim doubles, and sdpa with RoPE
//   holds what qknorm does (the normalization rows, its rotated q and k
//   and their gradients; no parameter partials); with attention sinks, the
//   backward's B H doubles of dsinks partials.
//   Example, f32, qknorm, Nq = Nk = 2048, D = 64 (query_block = 256), per
//   slot: forward 3.0 MiB, forward + backward 5.6 MiB, against 16 MiB for one
//   dense n x n f32 matrix (128 MiB for all 8 heads).
// The caller keeps the Workspace; after a call of the largest shape (and
// thread count), no call allocates (BlasWorkspace::bytes() stays constant and
// operator new is not called; tested).
#ifndef QKNORM_BLAS_PATH_ATTENTION_H_
#define QKNORM_BLAS_PATH_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "blas_path/normalize.h"
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
  Buffer<RowNorm> qn, kn;
  Buffer<double> row0;
  Buffer<double> frow;  // formulations: one normalization row, 2 or 3 times
  Buffer<T> cap;        // softcap backward: a row's cosines and capped logits
  size_t bytes() const {
    return qh.bytes() + kh.bytes() + dkh.bytes() + dqh.bytes() + blk0.bytes() +
           blk1.bytes() + qn.bytes() + kn.bytes() + row0.bytes() +
           frow.bytes() + cap.bytes();
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
  // Formulations (general path): q_tilde, k_tilde, their gradients (dense
  // [B,H,Nq,D] and [B,Hk,Nk,D]) and the per-chunk parameter-gradient sums.
  Buffer<T> qt, kt, dqt, dkt;
  Buffer<double> dparams;
  // RoPE: cos and sin of every (position, pair), q's rows then k's
  // (rope_table in attention.cc).
  Buffer<double> rope;
  // Attention sinks: the backward's per-(batch, query head) dsinks partials.
  Buffer<double> dsinks;
  WorkerPool pool;
  Scratch<T>& slot(size_t s) {
    while (slots.size() <= s) slots.push_back(std::make_unique<Scratch<T>>());
    return *slots[s];
  }
  // Bytes of scratch currently reserved (every buffer's size; the pool's
  // thread stacks are not counted).
  size_t bytes() const {
    size_t b = dg_items.bytes() + qt.bytes() + kt.bytes() + dqt.bytes() +
               dkt.bytes() + dparams.bytes() + rope.bytes() + dsinks.bytes();
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
// Rows of the staircase tiles a causal mask cuts a query block into (see
// Masks above).
inline constexpr int64_t kCausalTileRows = 32;
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
// T, see the header comment; with a sink, sum_i includes it), dense
// [B,H,Nq,Nk], 0 where masked.
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
