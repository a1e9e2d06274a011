// See attention.h. Nothing here allocates once the workspace has grown to the
// largest shape seen.
#include "blas_path/attention.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <string>
#include <thread>
#include <type_traits>

#include "blas_path/normalize.h"
#include "blas_path/row_kernels.h"
#include "qknorm/error.h"

namespace qknorm::blas {
namespace {

// OpenBLAS (Debian, LP64) takes 32-bit dimensions; check_blas_range() has
// verified every one before any work starts (workers must not throw).
blasint to_blas(int64_t x, const char*) { return static_cast<blasint>(x); }

void check_range(int64_t x, const char* tensor, const char* what) {
  if (x > INT_MAX)
    throw Error(tensor, {},
                std::string(what) + " " + std::to_string(x) +
                    " exceeds OpenBLAS's 32-bit int range (blas entries " +
                    "only; the reference and simd entries take it)");
}

// The leading dimension a tensor of `rows` rows of D elements gets in the
// GEMMs: its row stride, except for a single row, whose stride addresses
// nothing and may be anything validate.h accepts (up to INT64_MAX; found by
// the fuzzer: q_len = 1 with a stride of 1.1e12 raised the range error
// above). D is then a valid leading dimension.
int64_t blas_ld(const Layout4& l, int64_t rows, int64_t D) {
  return rows > 1 ? l.row_stride : D;
}

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
          int64_t k, float alpha, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, to_blas(m, "M"), to_blas(n, "N"),
              to_blas(k, "K"), alpha, a, to_blas(lda, "lda"), b,
              to_blas(ldb, "ldb"), beta, c, to_blas(ldc, "ldc"));
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
          int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, to_blas(m, "M"), to_blas(n, "N"),
              to_blas(k, "K"), alpha, a, to_blas(lda, "lda"), b,
              to_blas(ldb, "ldb"), beta, c, to_blas(ldc, "ldc"));
}

template <class T>
const T* head_ptr(const ConstTensor4& t, int64_t b, int64_t h) {
  return static_cast<const T*>(t.data) + b * t.layout.batch_stride +
         h * t.layout.head_stride;
}
template <class T>
T* head_ptr(const MutTensor4& t, int64_t b, int64_t h) {
  return static_cast<T*>(t.data) + b * t.layout.batch_stride +
         h * t.layout.head_stride;
}

// Keys visible to query i of batch b: the prefix [0, m_i) (attention.h).
struct VisiblePrefix {
  int64_t key_limit, causal_offset;
  bool causal;
  VisiblePrefix(const AttentionProblem& p, int64_t b)
      : key_limit(p.mask.key_lengths.empty()
                      ? p.kv_len
                      : p.mask.key_lengths[static_cast<size_t>(b)]),
        causal_offset(p.kv_len - p.q_len + 1),
        causal(p.mask.causal) {}
  int64_t operator()(int64_t i) const {
    int64_t m = key_limit;
    if (causal) m = std::min(m, std::max<int64_t>(0, i + causal_offset));
    return m;
  }
};

// log(e) in the row kernels' exponential base: log2(e) for float (exp2), 1
// for double (exp), see row_kernels.h.
template <class T>
constexpr double kLogE = std::is_same_v<T, float> ? std::numbers::log2e : 1.0;

// The logit scale in log2 units, g log2(e) or log2(e) / sqrt(D), rounded to
// T once; forward and backward use this same value.
template <class T>
T logit_alpha(const AttentionProblem& p) {
  return static_cast<T>(p.variant == Variant::kQKNorm
                            ? p.g * kLogE<T>
                            : kLogE<T> /
                                  std::sqrt(static_cast<double>(p.head_dim)));
}

// The logits' operands of one head. qknorm: q_hat/k_hat in the workspace
// (dense, ld = D) and their norms; sdpa: the inputs in place.
template <class T>
struct Operands {
  const T* a;
  int64_t lda;
  const T* b;
  int64_t ldb;
  const RowNorm* qn = nullptr;
  const RowNorm* kn = nullptr;
};

template <class T>
Operands<T> head_operands(const AttentionProblem& p, const T* q, int64_t rsq,
                          const T* k, int64_t rsk, int64_t nk_used,
                          Scratch<T>& ws) {
  if (p.variant == Variant::kSDPA) return {q, rsq, k, rsk};
  const int64_t D = p.head_dim;
  T* qh = ws.qh.get(static_cast<size_t>(p.q_len * D));
  T* kh = ws.kh.get(static_cast<size_t>(p.kv_len * D));
  RowNorm* qn = ws.qn.get(static_cast<size_t>(p.q_len));
  RowNorm* kn = ws.kn.get(static_cast<size_t>(p.kv_len));
  normalize_rows(q, p.q_len, rsq, D, p.eps, qh, qn);
  normalize_rows(k, nk_used, rsk, D, p.eps, kh, kn);
  return {qh, D, kh, D, qn, kn};
}

// Forward of one head; probs (dense [Nq, Nk]) selects the inspection mode,
// which skips the PV GEMM and writes no o/lse.
template <class T>
void forward_head(const AttentionProblem& p, const ForwardArgs& a, int64_t b,
                  int64_t h, double* probs, Scratch<T>& ws) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const VisiblePrefix vis(p, b);
  const int64_t nk_used = vis(Nq - 1);  // max_i m_i
  const T* q = head_ptr<T>(a.q, b, h);
  const T* k = head_ptr<T>(a.k, b, h);
  const Operands<T> op = head_operands(p, q, blas_ld(a.q.layout, Nq, D), k,
                                       blas_ld(a.k.layout, Nk, D), nk_used, ws);
  const T alpha = logit_alpha<T>(p);
  // The GEMM computes C = A B^T (alpha = 1); the exp pass evaluates
  // exp2(alpha C - shift) with one FMA, the expression the backward
  // recomputes P with. shift = alpha * (max of C for alpha >= 0, min
  // otherwise), so the largest term of each row has argument 0 (up to one
  // rounding). A constant shift |alpha| (valid for qknorm, |C| <= 1) would
  // save this pass but costs accuracy: the dominant terms' arguments would be
  // up to 2|alpha| in magnitude and carry a rounding of u * 2|alpha| each
  // (measured: 3.5x the naive error of O at g = 12.32, two keys).
  const double scale_d = p.variant == Variant::kQKNorm
                             ? p.g
                             : 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t bq = std::min(query_block(Nk, sizeof(T)), Nq),
                ld = block_ld(Nk);
  T* s = ws.blk0.get(static_cast<size_t>(bq * ld));
  double* rowsum = ws.row0.get(static_cast<size_t>(bq));
  const T* v = probs ? nullptr : head_ptr<T>(a.v, b, h);
  T* o = probs ? nullptr : head_ptr<T>(a.o, b, h);
  const int64_t rsv = blas_ld(a.v.layout, Nk, D),
                rso = blas_ld(a.o.layout, Nq, D);
  double* lse = probs ? nullptr : a.lse + (b * p.heads + h) * Nq;

  for (int64_t i0 = 0; i0 < Nq; i0 += bq) {
    const int64_t rows = std::min(bq, Nq - i0);
    const int64_t mb = vis(i0 + rows - 1);  // columns this block needs
    if (mb > 0)
      gemm(CblasNoTrans, CblasTrans, rows, mb, D, T(1), op.a + i0 * op.lda,
           op.lda, op.b, op.ldb, T(0), s, ld);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r, m = vis(i);
      T* sr = s + r * ld;
      if (m == 0) {
        rowsum[r] = 0;
        std::fill(sr, sr + mb, T(0));
        if (lse) lse[i] = -std::numeric_limits<double>::infinity();
        if (probs) std::fill(probs + i * Nk, probs + (i + 1) * Nk, 0.0);
        continue;
      }
      const T cm = alpha >= 0 ? row_max(sr, m) : row_min(sr, m);
      const T sum = exp_affine_row(sr, m, mb, alpha, alpha * cm);
      rowsum[r] = static_cast<double>(sum);
      // lse in natural units from the extreme logit itself (scale * C in
      // double: one rounding, as the naive g * dot) plus log(sum) in double,
      // rounded to T once.
      if (lse)
        lse[i] = static_cast<double>(
            static_cast<T>(scale_d * static_cast<double>(cm) +
                           std::log(static_cast<double>(sum))));
      if (probs) {
        double* pr = probs + i * Nk;
        for (int64_t j = 0; j < Nk; ++j)
          pr[j] = j < m ? static_cast<double>(sr[j] / sum) : 0.0;
      }
    }
    if (probs) continue;
    if (mb > 0)
      gemm(CblasNoTrans, CblasNoTrans, rows, D, mb, T(1), s, ld, v, rsv, T(0),
           o + i0 * rso, rso);
    for (int64_t r = 0; r < rows; ++r) {
      T* orow = o + (i0 + r) * rso;
      if (rowsum[r] == 0)
        std::fill(orow, orow + D, T(0));
      else
        divide_row(orow, D, static_cast<T>(rowsum[r]));
    }
  }
}

template <class T>
double backward_head(const AttentionProblem& p, const BackwardArgs& a,
                     int64_t b, int64_t h, Scratch<T>& ws) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const bool qk = p.variant == Variant::kQKNorm;
  const VisiblePrefix vis(p, b);
  const int64_t nk_used = vis(Nq - 1);
  const T* q = head_ptr<T>(a.q, b, h);
  const T* k = head_ptr<T>(a.k, b, h);
  const T* v = head_ptr<T>(a.v, b, h);
  // O is not read: delta comes from the recomputed P and dP (row_kernels.h).
  const T* d_o = head_ptr<T>(a.d_o, b, h);
  T* dq = head_ptr<T>(a.dq, b, h);
  T* dk = head_ptr<T>(a.dk, b, h);
  T* dv = head_ptr<T>(a.dv, b, h);
  const int64_t rsv = blas_ld(a.v.layout, Nk, D),
                rsdo = blas_ld(a.d_o.layout, Nq, D),
                rsdq = blas_ld(a.dq.layout, Nq, D),
                rsdk = blas_ld(a.dk.layout, Nk, D),
                rsdv = blas_ld(a.dv.layout, Nk, D);
  // The saved lse is not read (row_kernels.h, softmax_backward_row).

  const Operands<T> op = head_operands(p, q, blas_ld(a.q.layout, Nq, D), k,
                                       blas_ld(a.k.layout, Nk, D), nk_used, ws);
  const double scale_d = qk ? p.g : 1.0 / std::sqrt(static_cast<double>(D));
  const T scale = static_cast<T>(scale_d);
  const T alpha2 = logit_alpha<T>(p);  // the forward's, bit for bit
  const int64_t bq = std::min(query_block(Nk, sizeof(T)), Nq),
                ld = block_ld(Nk);
  T* c = ws.blk0.get(static_cast<size_t>(bq * ld));
  T* dp = ws.blk1.get(static_cast<size_t>(bq * ld));
  // dk accumulates in the workspace for qknorm (the normalization backward
  // follows), in place in dk for sdpa; dv accumulates in place.
  T* dkacc = qk ? ws.dkh.get(static_cast<size_t>(Nk * D)) : dk;
  const int64_t lddk = qk ? D : rsdk;
  T* dqh = qk ? ws.dqh.get(static_cast<size_t>(bq * D)) : nullptr;
  for (int64_t j = 0; j < Nk; ++j) {
    std::fill(dkacc + j * lddk, dkacc + j * lddk + D, T(0));
    std::fill(dv + j * rsdv, dv + j * rsdv + D, T(0));
  }

  double dg = 0;
  for (int64_t i0 = 0; i0 < Nq; i0 += bq) {
    const int64_t rows = std::min(bq, Nq - i0);
    const int64_t mb = vis(i0 + rows - 1);
    if (mb == 0) {  // every row of the block is fully masked
      for (int64_t r = 0; r < rows; ++r)
        std::fill(dq + (i0 + r) * rsdq, dq + (i0 + r) * rsdq + D, T(0));
      continue;
    }
    const T* a_blk = op.a + i0 * op.lda;
    const T* do_blk = d_o + i0 * rsdo;
    gemm(CblasNoTrans, CblasTrans, rows, mb, D, T(1), a_blk, op.lda, op.b,
         op.ldb, T(0), c, ld);
    gemm(CblasNoTrans, CblasTrans, rows, mb, D, T(1), do_blk, rsdo, v, rsv,
         T(0), dp, ld);
    for (int64_t r = 0; r < rows; ++r)
      dg += static_cast<double>(softmax_backward_row(c + r * ld, dp + r * ld,
                                                     vis(i0 + r), mb, alpha2));
    // c now holds P, dp holds dS.
    gemm(CblasTrans, CblasNoTrans, mb, D, rows, T(1), c, ld, do_blk, rsdo, T(1),
         dv, rsdv);
    gemm(CblasNoTrans, CblasNoTrans, rows, D, mb, scale, dp, ld, op.b, op.ldb,
         T(0), qk ? dqh : dq + i0 * rsdq, qk ? D : rsdq);
    gemm(CblasTrans, CblasNoTrans, mb, D, rows, scale, dp, ld, a_blk, op.lda,
         T(1), dkacc, lddk);
    if (qk)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        normalize_backward_row(op.a + i * D, op.qn[i], p.eps, 1.0, dqh + r * D,
                               D, dq + i * rsdq);
      }
  }
  if (qk) {
    for (int64_t j = 0; j < Nk; ++j) {
      T* dkj = dk + j * rsdk;
      if (j < nk_used)
        normalize_backward_row(op.b + j * D, op.kn[j], p.eps, 1.0,
                               dkacc + j * D, D, dkj);
      else
        std::fill(dkj, dkj + D, T(0));  // never visible: no gradient
    }
  }
  return qk ? dg : 0.0;
}

}  // namespace

int64_t query_block(int64_t nk, size_t elem_bytes) {
  // Rows per block: the block buffer targets kBlockBytes, within
  // [kMinRows, kMaxRows]. Measured with tools/blas_timing.cc (f32, d = 64,
  // H = 8, one thread, quiet machine): at n = 2048, 64- and 128-row blocks
  // ran the forward at 0.82-0.83 of the bare GEMM rate, 256 rows and more at
  // 0.93 (OpenBLAS's own M blocking wants a tall A; the L2-sized blocks did
  // not pay). 2 MiB gives 256 rows at n = 2048 and whole heads up to n = 512.
  constexpr int64_t kMinRows = 32, kMaxRows = 512;
  constexpr int64_t kBlockBytes = 2 * 1024 * 1024;
  const int64_t rows =
      kBlockBytes / (block_ld(nk) * static_cast<int64_t>(elem_bytes));
  return std::clamp(rows, kMinRows, kMaxRows);
}

size_t workspace_bytes(const AttentionProblem& p, size_t elem_bytes,
                       bool backward, int threads) {
  ExecConfig cfg;
  cfg.threads = threads;
  const auto slots = static_cast<size_t>(item_threads(p, cfg));
  const auto Nq = static_cast<size_t>(p.q_len),
             Nk = static_cast<size_t>(p.kv_len),
             D = static_cast<size_t>(p.head_dim);
  const auto bq =
      static_cast<size_t>(std::min(query_block(p.kv_len, elem_bytes), p.q_len));
  const auto ld = static_cast<size_t>(block_ld(p.kv_len));
  const bool qk = p.variant == Variant::kQKNorm;
  size_t elems = bq * ld, doubles = bq;  // forward block, row statistics
  size_t norms = 0;
  if (qk) elems += (Nq + Nk) * D, norms = Nq + Nk;  // q_hat, k_hat, norms
  if (backward) {
    elems += bq * ld;                  // second block buffer
    if (qk) elems += Nk * D + bq * D;  // dk_hat, dq_hat block
  }
  const size_t per_slot =
      elems * elem_bytes + doubles * sizeof(double) + norms * sizeof(RowNorm);
  return slots * per_slot +
         (backward ? static_cast<size_t>(p.batch * p.heads) * sizeof(double)
                   : 0);
}

int64_t block_ld(int64_t nk) { return (nk + 15) / 16 * 16; }

void set_blas_threads(const ExecConfig& cfg) {
  int t = cfg.threads;
  if (t <= 0)
    t = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (openblas_get_num_threads() != t) openblas_set_num_threads(t);
}

namespace {

// Every size and leading dimension the GEMMs get must fit OpenBLAS's int
// (blas_ld: a single row's stride never reaches OpenBLAS). Each entry is
// {tensor name, layout, rows, whether a GEMM reads its layout}: for qknorm,
// q, k, dq and dk go through the normalization (row pointers in int64) and
// only their normalized copies in the workspace meet OpenBLAS.
struct LdCheck {
  const char* name;
  const Layout4& layout;
  int64_t rows;
  bool sdpa_only = false;
};
void check_blas_range(const AttentionProblem& p,
                      std::initializer_list<LdCheck> tensors) {
  check_range(p.q_len, "q", "q_len");
  check_range(block_ld(p.kv_len), "k", "kv_len (rounded up to 16)");
  for (const LdCheck& t : tensors)
    if (!t.sdpa_only || p.variant == Variant::kSDPA)
      check_range(blas_ld(t.layout, t.rows, p.head_dim), t.name, "row stride");
}

// Sizes slot s's scratch for p before the parallel region, so that no worker
// allocates and bytes() does not depend on the scheduling.
template <class T>
void reserve(Scratch<T>& s, const AttentionProblem& p, bool backward) {
  const auto Nq = static_cast<size_t>(p.q_len),
             Nk = static_cast<size_t>(p.kv_len),
             D = static_cast<size_t>(p.head_dim);
  const auto bq =
      static_cast<size_t>(std::min(query_block(p.kv_len, sizeof(T)), p.q_len));
  const auto ld = static_cast<size_t>(block_ld(p.kv_len));
  const bool qk = p.variant == Variant::kQKNorm;
  s.blk0.get(bq * ld);
  s.row0.get(bq);
  if (qk) {
    s.qh.get(Nq * D), s.kh.get(Nk * D);
    s.qn.get(Nq), s.kn.get(Nk);
  }
  if (backward) {
    s.blk1.get(bq * ld);
    if (qk) s.dkh.get(Nk * D), s.dqh.get(bq * D);
  }
}

// Runs f(b, h, scratch) for every (batch, head) on `threads` threads with
// OpenBLAS single-threaded (pool.h), restoring OpenBLAS's thread count after.
template <class T, class F>
void for_each_head(const AttentionProblem& p, BlasWorkspace<T>& ws, int threads,
                   bool backward, F&& f) {
  for (int s = 0; s < threads; ++s)
    reserve(ws.slot(static_cast<size_t>(s)), p, backward);
  const int saved = openblas_get_num_threads();
  if (saved != 1) openblas_set_num_threads(1);
  auto item = [&](int64_t i, int slot) {
    f(i / p.heads, i % p.heads, ws.slot(static_cast<size_t>(slot)), i);
  };
  ws.pool.run(threads, p.batch * p.heads, item);
  if (saved != 1) openblas_set_num_threads(saved);
}

}  // namespace

int item_threads(const AttentionProblem& p, const ExecConfig& cfg) {
  int t = cfg.threads;
  if (t <= 0)
    t = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<int64_t>(t, p.batch * p.heads));
}

template <class T>
void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                       BlasWorkspace<T>& ws, const ExecConfig& cfg) {
  check_blas_range(p, {{"q", a.q.layout, p.q_len, true},
                       {"k", a.k.layout, p.kv_len, true},
                       {"v", a.v.layout, p.kv_len},
                       {"o", a.o.layout, p.q_len}});
  for_each_head(p, ws, item_threads(p, cfg), false,
                [&](int64_t b, int64_t h, Scratch<T>& s, int64_t) {
                  forward_head(p, a, b, h, nullptr, s);
                });
}

template <class T>
void attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                             double* probs, BlasWorkspace<T>& ws) {
  check_blas_range(
      p, {{"q", a.q.layout, p.q_len, true}, {"k", a.k.layout, p.kv_len, true}});
  const int64_t per_head = p.q_len * p.kv_len;
  for_each_head(p, ws, 1, false,
                [&](int64_t b, int64_t h, Scratch<T>& s, int64_t i) {
                  forward_head(p, a, b, h, probs + i * per_head, s);
                });
}

template <class T>
void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                        BlasWorkspace<T>& ws, const ExecConfig& cfg) {
  check_blas_range(p, {{"q", a.q.layout, p.q_len, true},
                       {"k", a.k.layout, p.kv_len, true},
                       {"v", a.v.layout, p.kv_len},
                       {"o", a.o.layout, p.q_len},
                       {"dO", a.d_o.layout, p.q_len},
                       {"dq", a.dq.layout, p.q_len, true},
                       {"dk", a.dk.layout, p.kv_len, true},
                       {"dv", a.dv.layout, p.kv_len}});
  double* dg = ws.dg_items.get(static_cast<size_t>(p.batch * p.heads));
  for_each_head(p, ws, item_threads(p, cfg), true,
                [&](int64_t b, int64_t h, Scratch<T>& s, int64_t i) {
                  dg[i] = backward_head(p, a, b, h, s);
                });
  // Per-head partial sums added in head order: the same bits for any
  // thread count.
  double sum = 0;
  for (int64_t i = 0; i < p.batch * p.heads; ++i) sum += dg[i];
  *a.dg = p.variant == Variant::kQKNorm ? sum : 0.0;
}

template <class T>
void scalenorm_forward(const ScaleNormProblem& p,
                       const ScaleNormForwardArgs& a) {
  const T* x = static_cast<const T*>(a.x.data);
  T* y = static_cast<T*>(a.y.data);
  for (int64_t r = 0; r < p.rows; ++r)
    normalize_row(x + r * a.x.row_stride, p.dim, p.eps, p.g,
                  y + r * a.y.row_stride);
}

template <class T>
void scalenorm_backward(const ScaleNormProblem& p,
                        const ScaleNormBackwardArgs& a, BlasWorkspace<T>& w) {
  Scratch<T>& ws = w.slot(0);
  const T* x = static_cast<const T*>(a.x.data);
  const T* dy = static_cast<const T*>(a.dy.data);
  T* dx = static_cast<T*>(a.dx.data);
  double dg = 0;
  // u = x / max(||x||, eps) rounded to T, as the forward's y / g.
  T* u = ws.qh.get(static_cast<size_t>(p.dim));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* xr = x + r * a.x.row_stride;
    const T* dyr = dy + r * a.dy.row_stride;
    const RowNorm nrm = normalize_row(xr, p.dim, p.eps, 1.0, u);
    dg += dot_double(dyr, u, p.dim);
    normalize_backward_row(u, nrm, p.eps, p.g, dyr, p.dim,
                           dx + r * a.dx.row_stride);
  }
  *a.dg = dg;
}

#define QKNORM_BLAS_INSTANTIATE(T)                                            \
  template void attention_forward<T>(const AttentionProblem&,                 \
                                     const ForwardArgs&, BlasWorkspace<T>&,   \
                                     const ExecConfig&);                      \
  template void attention_backward<T>(const AttentionProblem&,                \
                                      const BackwardArgs&, BlasWorkspace<T>&, \
                                      const ExecConfig&);                     \
  template void attention_probabilities<T>(const AttentionProblem&,           \
                                           const ForwardArgs&, double*,       \
                                           BlasWorkspace<T>&);                \
  template void scalenorm_forward<T>(const ScaleNormProblem&,                 \
                                     const ScaleNormForwardArgs&);            \
  template void scalenorm_backward<T>(const ScaleNormProblem&,                \
                                      const ScaleNormBackwardArgs&,           \
                                      BlasWorkspace<T>&);
QKNORM_BLAS_INSTANTIATE(float)
QKNORM_BLAS_INSTANTIATE(double)
#undef QKNORM_BLAS_INSTANTIATE

}  // namespace qknorm::blas
