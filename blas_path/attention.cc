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

// Keys visible to query i of batch b: the interval [first(i), m_i),
// m_i = (*this)(i) (attention.h, visible_keys); both bounds non-decreasing
// in i. Without a window's left side first(i) = 0: a prefix, and the
// causal tiling applies (a window (-1, r) is a shifted causal mask).
struct VisibleKeys {
  const Mask* mask;
  int64_t b, q_len, kv_len;
  bool window;
  VisibleKeys(const AttentionProblem& p, int64_t b_)
      : mask(&p.mask),
        b(b_),
        q_len(p.q_len),
        kv_len(p.kv_len),
        window(p.mask.window_left >= 0) {}
  int64_t operator()(int64_t i) const {
    return visible_keys(*mask, b, i, q_len, kv_len).end;
  }
  int64_t first(int64_t i) const {
    return window ? visible_keys(*mask, b, i, q_len, kv_len).begin : 0;
  }
  bool empty(int64_t i) const {
    const KeyRange r = visible_keys(*mask, b, i, q_len, kv_len);
    return r.begin >= r.end;
  }
};

// The GEMM tiles of one query block (attention.h, "Masks"). Block row r is
// query i0 + r and sees keys [0, m_r), m_r = vis(i0 + r) >= 1 for every row
// (fully masked rows are taken off the block first), m_r non-decreasing. A
// tile is the GEMM rectangle rows [r0, r1) x keys [c0, c1); the tiles cover
// every visible (row, key) pair, so the GEMMs skip the masked upper
// triangle and the padded keys instead of computing and discarding them:
//   rect   rows [0, R) x keys [0, m_0): the keys every row of the block
//          sees, one tall GEMM (the whole product when no causal mask cuts
//          the block); left out when narrower than kTileRows keys (then
//          the leaves start at key 0);
//   leaves rows [r0, r0 + kTileRows) x keys [c0, m_{r1-1}), c0 = m_0 if
//          the rect was taken, else 0: a staircase down the diagonal.
// The masked work left is the part of each leaf above the diagonal, under
// kTileRows / 2 keys per row (about kTileRows / n of the visible pairs).
// kTileRows balances that waste against OpenBLAS's cost per call (packing
// both operands, its beta pass): measured (f32, H = 8, one thread, Zen 3,
// CPU time) 32 rows beat 64 rows and a recursive split into squares of
// 256, 128, ... rows at n = 128 (by 5-9% of the causal forward's time and
// 6-13% of the backward's, d = 64 and 128) and tied with them within the
// noise (3%) at n = 512. The tiling depends on the shape
// and the mask only, so the backward recomputes the forward's logits bit
// for bit. Per row, its leaf's c1 (ext) is how far its scores were
// computed: entries [m_r, ext) are set to exactly 0 by the row kernels,
// because the leaf's P V, P^T dO, dS K and dS^T Q GEMMs read them. first
// marks the tiles that write their rows of O (dQ) first: beta = 0 there, so
// no output row is cleared beforehand.
// A sliding window (issue 34) starts row r at f_r = vis.first(i0 + r),
// non-decreasing too: no rect then, only leaves, each over keys
// [f_{r0}, m_{r1-1}) (a band down the diagonal, so the cost follows the
// window, not n); entries [f_{r0}, f_r) of a row are set to exactly 0 as
// [m_r, ext) are. A leaf computes (kTileRows - 1) keys more per row than
// the row sees at each end (at a window of 128 and 32 rows, about 160 keys
// for 129).
constexpr int64_t kTileRows = kCausalTileRows;
// query_block()'s upper bound.
constexpr int64_t kMaxBlockRows = 512;

struct Tile {
  int64_t r0, r1, c0, c1;
  bool first, leaf;
};

class BlockTiles {
 public:
  template <class Vis>
  BlockTiles(const Vis& vis, int64_t i0, int64_t rows) {
    if (vis.window) {
      for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
        const int64_t r1 = std::min(rows, r0 + kTileRows);
        t_[n_++] = {r0, r1, vis.first(i0 + r0), vis(i0 + r1 - 1), true, true};
      }
      return;
    }
    const int64_t m0 = vis(i0), mlast = vis(i0 + rows - 1);
    int64_t c0 = 0;
    if (m0 >= kTileRows || m0 == mlast) {
      t_[n_++] = {0, rows, 0, m0, true, false};
      c0 = m0;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int64_t r1 = std::min(rows, r0 + kTileRows);
      t_[n_++] = {r0, r1, c0, vis(i0 + r1 - 1), c0 == 0, true};
    }
  }
  const Tile* begin() const { return t_; }
  const Tile* end() const { return t_ + n_; }

 private:
  Tile t_[1 + kMaxBlockRows / kTileRows];
  int n_ = 0;
};

// Rows at the start of a query block whose queries see no key (m_i is
// non-decreasing, so they are a prefix of the block), and (with a window)
// at its end: a row whose window starts at or past the padding's end sees
// none, and so does every later row (f_i, m_i non-decreasing; a window
// row in between sees l + r + 1 keys or up to the padding).
template <class Vis>
int64_t masked_rows(const Vis& vis, int64_t i0, int64_t rows) {
  int64_t z = 0;
  while (z < rows && vis.empty(i0 + z)) ++z;
  return z;
}
template <class Vis>
int64_t masked_tail(const Vis& vis, int64_t i0, int64_t rows) {
  int64_t z = 0;
  while (vis.window && z < rows && vis.empty(i0 + rows - 1 - z)) ++z;
  return z;
}

// log(e) in the row kernels' exponential base: log2(e) for float (exp2), 1
// for double (exp), see row_kernels.h.
template <class T>
constexpr double kLogE = std::is_same_v<T, float> ? std::numbers::log2e : 1.0;

// The logit scale in log2 units, g log2(e) or log2(e) / sqrt(D), rounded to
// T once; forward and backward use this same value.
// The logit scale: g (learned) or the fixed scale for qknorm, 1/sqrt(D) for
// sdpa.
double logit_scale(const AttentionProblem& p) {
  if (p.variant != Variant::kQKNorm)
    return 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  return p.fixed_scale ? p.scale : p.g;
}

// The logit softcap (attention.h): the row's cosines c[0, m) become the
// capped logits cap tanh(s c / cap) in natural units, in T (three roundings
// and tanh's, as rule.h's "The logit softcap" counts them). The row kernels
// then take alpha = kLogE (the logits are already scaled). A logit that
// overflows T is clamped to +-max and a NaN one (a cosine of inf - inf:
// terms overflowing with both signs) becomes -max first, as the reference's
// logits_row does, so the cap stays finite (+-cap).
template <class T>
void softcap_row(T* c, int64_t m, T scale, T cap) {
  const T big = std::numeric_limits<T>::max();
  for (int64_t j = 0; j < m; ++j) {
    const T x = scale * c[j];
    c[j] = cap *
           std::tanh((std::isnan(x) ? -big : std::clamp(x, -big, big)) / cap);
  }
}

// The row's cosines c[0, m) (raw dots for sdpa) clamped so that alpha c
// stays finite, a NaN (inf - inf in the dot) becoming the most negative, as
// the reference's logits_row does: without it an sdpa row of 1e30 (logits
// of 1e42 in f32) made the row's max inf and exp(inf - inf) a NaN in O
// (tests/window_test.cc, sdpa `wide`, f32). Finite values within the
// bound are unchanged. Only where the operands are not unit rows
// (clamped_logits): the paper's cosines are at most 1 + a few ulp.
template <class T>
void clamp_row(T* c, int64_t m, T alpha) {
  const T big = std::numeric_limits<T>::max() /
                std::max(T(1), static_cast<T>(std::fabs(alpha)));
  for (int64_t j = 0; j < m; ++j)
    c[j] = std::isnan(c[j]) ? -big : std::clamp(c[j], -big, big);
}
bool clamped_logits(const AttentionProblem& p) {
  return p.variant != Variant::kQKNorm || !is_paper_formulation(p);
}

// The attention sink of query head h (attention.h) in T (blas:f32 forms it
// in f32): the logit in natural units and in the row kernels' (times log2 e
// for float, rounded once, clamped to T's range: an f32 sink near FLT_MAX
// times log2 e would overflow). A key with no value in every row's
// denominator: the shift of a row is the larger of its largest argument
// alpha c_r and the sink's (so no exp overflows), lse = that shift in
// natural units + log(sum_j e_j + e_sink), and a fully masked row's lse is
// the sink itself (O = 0). The backward's row kernel takes it too
// (row_kernels.h) and returns each row's p_sink delta.
template <class T>
struct SinkLogit {
  bool on = false;
  T natural = 0, base = 0;
};
template <class T>
SinkLogit<T> sink_logit(const AttentionProblem& p, int64_t h) {
  if (!has_sinks(p)) return {};
  const T s = static_cast<T>(p.sinks[static_cast<size_t>(h)]);
  const double big = std::numeric_limits<T>::max();
  return {
      true, s,
      static_cast<T>(std::clamp(static_cast<double>(s) * kLogE<T>, -big, big))};
}
// The row kernels' exponential of one value (row_kernels.h: base 2 for
// float, bit for bit each lane's, e for double).
inline float exp_base(float x) { return exp2_f32(x); }
inline double exp_base(double x) { return std::exp(x); }

template <class T>
T logit_alpha(const AttentionProblem& p) {
  if (p.softcap > 0) return static_cast<T>(kLogE<T>);
  return static_cast<T>(p.variant == Variant::kQKNorm
                            ? logit_scale(p) * kLogE<T>
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

template <class T>
void zero_rows(T* x, int64_t rows, int64_t ld, int64_t D) {
  for (int64_t r = 0; r < rows; ++r)
    std::fill(x + r * ld, x + r * ld + D, T(0));
}

// Forward of query head h (reading kv head hk) on its logit operands;
// probs (dense [Nq, Nk]) selects the inspection mode, which skips the PV
// GEMM and writes no o/lse.
template <class T>
void forward_core(const AttentionProblem& p, const ForwardArgs& a, int64_t b,
                  int64_t h, int64_t hk, const Operands<T>& op, double* probs,
                  Scratch<T>& ws) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const VisibleKeys vis(p, b);
  const T alpha = logit_alpha<T>(p);
  // The GEMM computes C = A B^T (alpha = 1); the exp pass evaluates
  // exp2(alpha C - shift) with one FMA, the expression the backward
  // recomputes P with. shift = alpha * (max of C for alpha >= 0, min
  // otherwise), so the largest term of each row has argument 0 (up to one
  // rounding). A constant shift |alpha| (valid for qknorm, |C| <= 1) would
  // save this pass but costs accuracy: the dominant terms' arguments would be
  // up to 2|alpha| in magnitude and carry a rounding of u * 2|alpha| each
  // (measured: 3.5x the naive error of O at g = 12.32, two keys).
  const double scale_d = logit_scale(p);
  const bool capped = p.softcap > 0, clamp = clamped_logits(p);
  const int64_t bq = std::min(query_block(Nk, sizeof(T)), Nq),
                ld = block_ld(Nk);
  T* s = ws.blk0.get(static_cast<size_t>(bq * ld));
  double* rowsum = ws.row0.get(static_cast<size_t>(bq));
  const T* v = probs ? nullptr : head_ptr<T>(a.v, b, hk);
  T* o = probs ? nullptr : head_ptr<T>(a.o, b, h);
  const int64_t rsv = blas_ld(a.v.layout, Nk, D),
                rso = blas_ld(a.o.layout, Nq, D);
  double* lse = probs ? nullptr : a.lse + (b * p.heads + h) * Nq;
  const SinkLogit<T> sk = sink_logit<T>(p, h);

  for (int64_t b0 = 0; b0 < Nq; b0 += bq) {
    const int64_t brows = std::min(bq, Nq - b0);
    // Rows that see no key: O = 0, lse = -inf (the sink with one), P = 0,
    // and no GEMM.
    const int64_t z = masked_rows(vis, b0, brows),
                  zt = z < brows ? masked_tail(vis, b0, brows) : 0;
    auto no_keys = [&](int64_t i) {
      if (lse)
        lse[i] = sk.on ? static_cast<double>(sk.natural)
                       : -std::numeric_limits<double>::infinity();
      if (probs) std::fill(probs + i * Nk, probs + (i + 1) * Nk, 0.0);
      if (o) std::fill(o + i * rso, o + i * rso + D, T(0));
    };
    for (int64_t i = b0; i < b0 + z; ++i) no_keys(i);
    for (int64_t i = b0 + brows - zt; i < b0 + brows; ++i) no_keys(i);
    const int64_t i0 = b0 + z, rows = brows - z - zt;
    if (rows == 0) continue;
    const BlockTiles tiles(vis, i0, rows);
    for (const Tile& t : tiles)
      if (t.c1 > t.c0)
        gemm(CblasNoTrans, CblasTrans, t.r1 - t.r0, t.c1 - t.c0, D, T(1),
             op.a + (i0 + t.r0) * op.lda, op.lda, op.b + t.c0 * op.ldb, op.ldb,
             T(0), s + t.r0 * ld + t.c0, ld);
    for (const Tile& t : tiles) {
      if (!t.leaf) continue;
      for (int64_t r = t.r0; r < t.r1; ++r) {
        const int64_t i = i0 + r, f = vis.first(i), m = vis(i);
        // The row's visible logits [f, m) (f = 0 without a window); the
        // leaf computed [t.c0, t.c1) and reads all of it below.
        T* sr = s + r * ld;
        T* sw = sr + f;
        if (capped)
          softcap_row(sw, m - f, static_cast<T>(scale_d),
                      static_cast<T>(p.softcap));
        else if (clamp)
          clamp_row(sw, m - f, alpha);
        const T cm = alpha >= 0 ? row_max(sw, m - f) : row_min(sw, m - f);
        // The shift: the largest argument, or a sink above it (SinkLogit).
        const T top = alpha * cm;
        const bool sink_top = sk.on && sk.base > top;
        const T shift = sink_top ? sk.base : top;
        // Zeroes [m, t.c1), then [t.c0, f): the leaf's P V GEMM reads them.
        T sum = exp_affine_row(sw, m - f, t.c1 - f, alpha, shift);
        if (sk.on) sum += exp_base(sk.base - shift);
        std::fill(sr + t.c0, sr + std::max(t.c0, f), T(0));
        rowsum[r] = static_cast<double>(sum);
        // lse in natural units from the extreme logit itself (scale * C in
        // double: one rounding, as the naive g * dot; capped: the logit
        // itself; a sink above it: the sink) plus log(sum) in double,
        // rounded to T once.
        if (lse)
          lse[i] = static_cast<double>(static_cast<T>(
              (sink_top ? static_cast<double>(sk.natural)
                        : (capped ? 1.0 : scale_d) * static_cast<double>(cm)) +
              std::log(static_cast<double>(sum))));
        if (probs) {
          double* pr = probs + i * Nk;
          for (int64_t j = 0; j < Nk; ++j)
            pr[j] = j >= f && j < m ? static_cast<double>(sr[j] / sum) : 0.0;
        }
      }
    }
    if (probs) continue;
    for (const Tile& t : tiles) {
      T* ot = o + (i0 + t.r0) * rso;
      if (t.c1 > t.c0)
        gemm(CblasNoTrans, CblasNoTrans, t.r1 - t.r0, D, t.c1 - t.c0, T(1),
             s + t.r0 * ld + t.c0, ld, v + t.c0 * rsv, rsv,
             t.first ? T(0) : T(1), ot, rso);
      else if (t.first)  // not reached: every row sees a key (m_r >= 1)
        zero_rows(ot, t.r1 - t.r0, rso, D);
    }
    for (int64_t r = 0; r < rows; ++r)
      divide_row(o + (i0 + r) * rso, D, static_cast<T>(rowsum[r]));
  }
}

// The paper's formulation (and sdpa) without GQA: q_hat, k_hat per head in
// the slot's scratch.
template <class T>
void forward_head(const AttentionProblem& p, const ForwardArgs& a, int64_t b,
                  int64_t h, double* probs, Scratch<T>& ws) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const int64_t nk_used = VisibleKeys(p, b)(Nq - 1);  // max_i m_i
  const T* q = head_ptr<T>(a.q, b, h);
  const T* k = head_ptr<T>(a.k, b, h);
  const Operands<T> op = head_operands(p, q, blas_ld(a.q.layout, Nq, D), k,
                                       blas_ld(a.k.layout, Nk, D), nk_used, ws);
  forward_core(p, a, b, h, h, op, probs, ws);
}

// Keys [0, *written) of the key-indexed accumulators (dV and dB) hold sums;
// the rows above are not written yet (no accumulator is cleared
// beforehand). Before a tile adds into keys [c0, c1): returns the GEMMs'
// beta, 0 when the tile's keys are all new (rows between *written and c0,
// none in practice, are cleared), else 1 after clearing the new keys
// [*written, c1) (a staircase leaf's last kTileRows keys: clearing
// kTileRows x D elements costs less than a second GEMM call for them).
// Advances *written.
template <class T>
T key_beta(int64_t c0, int64_t c1, int64_t* written, T* dv, int64_t rsdv,
           T* dbacc, int64_t lddb, int64_t D) {
  const int64_t w = *written;
  *written = std::max(w, c1);
  if (c0 >= w) {
    zero_rows(dv + w * rsdv, c0 - w, rsdv, D);
    zero_rows(dbacc + w * lddb, c0 - w, lddb, D);
    return T(0);
  }
  if (c1 > w) {
    zero_rows(dv + w * rsdv, c1 - w, rsdv, D);
    zero_rows(dbacc + w * lddb, c1 - w, lddb, D);
  }
  return T(1);
}

// Backward of query head h (reading kv head hk) on its logit operands, over
// the forward's tiles (BlockTiles): accumulates dV into dv and dB = s dS^T A
// into dbacc, keys [0, *written) of both already holding sums (key_beta;
// the caller clears [*written, Nk) after its last call), hands each query
// block's dA = s dS B to the sink (sink.dst(i0, &ld) gives its destination,
// sink.done(i0, rows, dst, ld) follows the GEMMs; sink.masked(i0, rows) for
// rows that see no key). Returns sum dS C (this head's dg before the
// variant's choice). With attention sinks, *dsink (not null) receives this
// head's -sum_i p_sink,i delta_i (rows that see no key add nothing).
template <class T, class Sink>
double backward_core(const AttentionProblem& p, const BackwardArgs& a,
                     int64_t b, int64_t h, int64_t hk, const Operands<T>& op,
                     T* dbacc, int64_t lddb, T* dv, int64_t rsdv,
                     int64_t* written, Scratch<T>& ws, Sink& sink,
                     double* dsink = nullptr) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const VisibleKeys vis(p, b);
  const T* v = head_ptr<T>(a.v, b, hk);
  // O is not read: delta comes from the recomputed P and dP (row_kernels.h).
  // The saved lse is not read either (row_kernels.h, softmax_backward_row).
  const T* d_o = head_ptr<T>(a.d_o, b, h);
  const int64_t rsv = blas_ld(a.v.layout, Nk, D),
                rsdo = blas_ld(a.d_o.layout, Nq, D);
  const T scale = static_cast<T>(logit_scale(p));
  const T alpha2 = logit_alpha<T>(p);  // the forward's, bit for bit
  const int64_t bq = std::min(query_block(Nk, sizeof(T)), Nq),
                ld = block_ld(Nk);
  T* c = ws.blk0.get(static_cast<size_t>(bq * ld));
  T* dp = ws.blk1.get(static_cast<size_t>(bq * ld));
  // Softcap: a row's cosines and capped logits (the row kernel overwrites c).
  const bool capped = p.softcap > 0, clamp = clamped_logits(p);
  const T cap = static_cast<T>(p.softcap);
  T* raw = capped ? ws.cap.get(static_cast<size_t>(2 * ld)) : nullptr;
  const SinkLogit<T> sk = sink_logit<T>(p, h);
  T share = 0;  // a row's p_sink delta
  T* sink_share = sk.on ? &share : nullptr;
  double dg = 0, ds_sink = 0;
  for (int64_t b0 = 0; b0 < Nq; b0 += bq) {
    const int64_t brows = std::min(bq, Nq - b0);
    const int64_t z = masked_rows(vis, b0, brows),
                  zt = z < brows ? masked_tail(vis, b0, brows) : 0;
    if (z > 0) sink.masked(b0, z);  // rows that see no key: no gradient
    if (zt > 0) sink.masked(b0 + brows - zt, zt);
    const int64_t i0 = b0 + z, rows = brows - z - zt;
    if (rows == 0) continue;
    // The forward's tiles: C is bit for bit the forward's logits.
    const BlockTiles tiles(vis, i0, rows);
    for (const Tile& t : tiles) {
      if (t.c1 == t.c0) continue;
      const int64_t tr = t.r1 - t.r0, tc = t.c1 - t.c0;
      gemm(CblasNoTrans, CblasTrans, tr, tc, D, T(1),
           op.a + (i0 + t.r0) * op.lda, op.lda, op.b + t.c0 * op.ldb, op.ldb,
           T(0), c + t.r0 * ld + t.c0, ld);
      gemm(CblasNoTrans, CblasTrans, tr, tc, D, T(1), d_o + (i0 + t.r0) * rsdo,
           rsdo, v + t.c0 * rsv, rsv, T(0), dp + t.r0 * ld + t.c0, ld);
    }
    for (const Tile& t : tiles) {
      if (!t.leaf) continue;
      // Zeroes P and dS in [m, t.c1) and [t.c0, f): the leaf's GEMMs below
      // read them.
      for (int64_t r = t.r0; r < t.r1; ++r) {
        const int64_t f = vis.first(i0 + r), m = vis(i0 + r) - f;
        std::fill(c + r * ld + t.c0, c + r * ld + std::max(t.c0, f), T(0));
        std::fill(dp + r * ld + t.c0, dp + r * ld + std::max(t.c0, f), T(0));
        if (!capped) {
          if (clamp) clamp_row(c + r * ld + f, m, alpha2);
          dg += static_cast<double>(
              softmax_backward_row(c + r * ld + f, dp + r * ld + f, m, t.c1 - f,
                                   alpha2, scale, sk.base, sink_share));
          ds_sink -= static_cast<double>(share);
          continue;
        }
        // Capped: the forward's capped logits (bit for bit), dS' of them
        // (scale 1), then dS = dS' (1 - (S' / cap)^2), dp = s dS and the
        // row's dg share sum dS C from the cosines (row keys [f, f + m)).
        T *cr = c + r * ld + f, *dr = dp + r * ld + f, *sp = raw + ld;
        std::copy(cr, cr + m, raw);
        softcap_row(cr, m, scale, cap);
        std::copy(cr, cr + m, sp);
        softmax_backward_row(cr, dr, m, t.c1 - f, alpha2, T(1), sk.base,
                             sink_share);
        ds_sink -= static_cast<double>(share);  // the sink is not capped
        double dg_row = 0;
        for (int64_t j = 0; j < m; ++j) {
          const T tj = sp[j] / cap;
          const T ds = dr[j] * (1 - tj * tj);
          dg_row += static_cast<double>(ds) * static_cast<double>(raw[j]);
          dr[j] = scale * ds;
        }
        dg += dg_row;
      }
    }
    // c now holds P, dp holds s dS (row_kernels.h): the GEMMs below take
    // alpha = 1, so no product dS x_tilde' the exact gradient does not need
    // is formed (it overflowed at s = 0 with |dS| ~ 3e287 and |q_tilde| ~
    // 1.45e38, and alpha = 0 turned the inf into NaN).
    int64_t lda_out = 0;
    T* da = sink.dst(i0, &lda_out);
    for (const Tile& t : tiles) {
      const int64_t tr = t.r1 - t.r0, tc = t.c1 - t.c0;
      T* dat = da + t.r0 * lda_out;
      if (tc == 0) {
        if (t.first) zero_rows(dat, tr, lda_out, D);  // not reached (m >= 1)
        continue;
      }
      const T* pt = c + t.r0 * ld + t.c0;
      const T* dst = dp + t.r0 * ld + t.c0;
      const T* at = op.a + (i0 + t.r0) * op.lda;
      const T kb = key_beta(t.c0, t.c1, written, dv, rsdv, dbacc, lddb, D);
      gemm(CblasTrans, CblasNoTrans, tc, D, tr, T(1), pt, ld,
           d_o + (i0 + t.r0) * rsdo, rsdo, kb, dv + t.c0 * rsdv, rsdv);
      gemm(CblasNoTrans, CblasNoTrans, tr, D, tc, T(1), dst, ld,
           op.b + t.c0 * op.ldb, op.ldb, t.first ? T(0) : T(1), dat, lda_out);
      gemm(CblasTrans, CblasNoTrans, tc, D, tr, T(1), dst, ld, at, op.lda, kb,
           dbacc + t.c0 * lddb, lddb);
    }
    sink.done(i0, rows, da, lda_out);
  }
  if (dsink) *dsink = ds_sink;
  return dg;
}

// dA of a block written straight to its destination rows (sdpa's dq, the
// formulations' dense dq_tilde).
template <class T>
struct DirectSink {
  T* base;
  int64_t ld, D;
  T* dst(int64_t i0, int64_t* l) {
    *l = ld;
    return base + i0 * ld;
  }
  void done(int64_t, int64_t, const T*, int64_t) {}
  void masked(int64_t i0, int64_t rows) {
    zero_rows(base + i0 * ld, rows, ld, D);
  }
};

template <class T>
double backward_head(const AttentionProblem& p, const BackwardArgs& a,
                     int64_t b, int64_t h, Scratch<T>& ws) {
  const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
  const bool qk = p.variant == Variant::kQKNorm;
  const int64_t nk_used = VisibleKeys(p, b)(Nq - 1);
  const T* q = head_ptr<T>(a.q, b, h);
  const T* k = head_ptr<T>(a.k, b, h);
  T* dq = head_ptr<T>(a.dq, b, h);
  T* dk = head_ptr<T>(a.dk, b, h);
  T* dv = head_ptr<T>(a.dv, b, h);
  const int64_t rsdq = blas_ld(a.dq.layout, Nq, D),
                rsdk = blas_ld(a.dk.layout, Nk, D),
                rsdv = blas_ld(a.dv.layout, Nk, D);
  const Operands<T> op = head_operands(p, q, blas_ld(a.q.layout, Nq, D), k,
                                       blas_ld(a.k.layout, Nk, D), nk_used, ws);
  const int64_t bq = std::min(query_block(Nk, sizeof(T)), Nq);
  // dk accumulates in the workspace for qknorm (the normalization backward
  // follows), in place in dk for sdpa; dv accumulates in place.
  T* dkacc = qk ? ws.dkh.get(static_cast<size_t>(Nk * D)) : dk;
  const int64_t lddk = qk ? D : rsdk;
  int64_t written = 0;  // keys of dkacc and dv holding sums (key_beta)
  double dg = 0;
  if (qk) {
    // dq_hat per block in the scratch, then the normalization backward.
    struct NormSink {
      T* dqh;
      T* dq;
      int64_t rsdq, D;
      const Operands<T>& op;
      double eps;
      T* dst(int64_t, int64_t* l) {
        *l = D;
        return dqh;
      }
      void done(int64_t i0, int64_t rows, const T*, int64_t) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          normalize_backward_row(op.a + i * D, op.qn[i], eps, 1.0, dqh + r * D,
                                 D, dq + i * rsdq);
        }
      }
      void masked(int64_t i0, int64_t rows) {
        zero_rows(dq + i0 * rsdq, rows, rsdq, D);
      }
    } sink{ws.dqh.get(static_cast<size_t>(bq * D)), dq, rsdq, D, op, p.eps};
    dg = backward_core(p, a, b, h, h, op, dkacc, lddk, dv, rsdv, &written, ws,
                       sink);
    for (int64_t j = 0; j < Nk; ++j) {
      T* dkj = dk + j * rsdk;
      if (j < nk_used)
        normalize_backward_row(op.b + j * D, op.kn[j], p.eps, 1.0,
                               dkacc + j * D, D, dkj);
      else
        std::fill(dkj, dkj + D, T(0));  // never visible: no gradient
    }
  } else {
    DirectSink<T> sink{dq, rsdq, D};
    backward_core(p, a, b, h, h, op, dkacc, lddk, dv, rsdv, &written, ws, sink);
    zero_rows(dk + written * rsdk, Nk - written, rsdk, D);  // never visible
  }
  zero_rows(dv + written * rsdv, Nk - written, rsdv, D);  // never visible
  return qk ? dg : 0.0;
}

// ---- Formulations (issue 16) other than the paper's, and GQA ----------
// (attention.h, "Formulations"). Phase A normalizes every q and k row once
// into the dense x_tilde buffers (rows in parallel, in chunks); phase B runs
// the per-head attention above on them (forward: items (b, h); backward:
// items (b, kv head), the group's query heads in order, so that dk_tilde
// and dv sum over the group in a fixed order); phase C (backward) runs the
// normalization backward per row, each chunk of rows summing its parameter
// gradients into its own partial, the partials added in chunk order.

bool general_path(const AttentionProblem& p) {
  return !is_paper_formulation(p);
}

// The general path's logit operands live in the dense x_tilde buffers
// (phase A) and their gradients in dq_tilde / dk_tilde (phase C maps them
// back): qknorm, and sdpa with RoPE (its rotated q and k).
bool buffered(const AttentionProblem& p) {
  return p.variant == Variant::kQKNorm || has_rope(p);
}

// RoPE's table: per side, per position n, per pair e, cos then sin of
// pos(n) * inv_freq_e in double; q's positions first. Empty without RoPE.
int64_t rope_pairs(const AttentionProblem& p) {
  return has_rope(p) ? p.rope.rotary_dim / 2 : 0;
}
size_t rope_table_size(const AttentionProblem& p) {
  return static_cast<size_t>((p.q_len + p.kv_len) * 2 * rope_pairs(p));
}
// Side `side`'s rows of the table.
const double* rope_side(const AttentionProblem& p, const double* table,
                        int side) {
  if (!has_rope(p)) return nullptr;
  return table + (side == 0 ? 0 : p.q_len * 2 * rope_pairs(p));
}

// Rows per chunk of phases A and C: at most kMaxChunks chunks per side, a
// function of the shape only (never of the thread count).
constexpr int64_t kMaxChunks = 64;
int64_t chunk_rows(int64_t rows) {
  return (rows + kMaxChunks - 1) / kMaxChunks;
}
int64_t chunk_count(int64_t rows) {
  const int64_t c = chunk_rows(rows);
  return (rows + c - 1) / c;
}

// Parameter gradients one side's chunk accumulates: its weight's elements
// (a shared weight's for k too) and as many for the bias.
int64_t side_params(const AttentionProblem& p, int side) {
  if (p.variant != Variant::kQKNorm || p.norm.weight == ParamShape::kNone)
    return 0;
  return param_size(p, side == 1 && p.norm.shared_qk_weight ? 0 : side);
}
int64_t side_grad_slots(const AttentionProblem& p, int side) {
  return side_params(p, side) * (p.norm.bias ? 2 : 1);
}
size_t dparams_size(const AttentionProblem& p) {
  return static_cast<size_t>(
      chunk_count(norm_rows(p, 0).rows()) * side_grad_slots(p, 0) +
      chunk_count(norm_rows(p, 1).rows()) * side_grad_slots(p, 1));
}
int64_t max_row_len(const AttentionProblem& p) {
  return std::max(norm_rows(p, 0).len(), norm_rows(p, 1).len());
}

}  // namespace

int64_t query_block(int64_t nk, size_t elem_bytes) {
  // Rows per block: the block buffer targets kBlockBytes, within
  // [kMinRows, kMaxRows]. Measured with tools/blas_timing.cc (f32, d = 64,
  // H = 8, one thread, quiet machine): at n = 2048, 64- and 128-row blocks
  // ran the forward at 0.82-0.83 of the bare GEMM rate, 256 rows and more at
  // 0.93 (OpenBLAS's own M blocking wants a tall A; the L2-sized blocks did
  // not pay). 2 MiB gives 256 rows at n = 2048 and whole heads up to n = 512.
  constexpr int64_t kMinRows = 32, kMaxRows = kMaxBlockRows;
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
  if (general_path(p)) {
    const bool buf = buffered(p);
    // Per slot: the block buffers, the row statistics, the normalization
    // row; shared: x_tilde (and its gradient), the parameter partials and
    // the per-item dg.
    const auto nq = static_cast<size_t>(p.batch * p.heads) * Nq * D,
               nk = static_cast<size_t>(p.batch * kv_heads_of(p)) * Nk * D;
    const size_t slot_bytes =
        ((backward ? 2 : 1) * bq + (backward && p.softcap > 0 ? 2 : 0)) * ld *
            elem_bytes +
        (bq +
         (buf ? (backward ? 3 : 2) * static_cast<size_t>(max_row_len(p)) : 0)) *
            sizeof(double);
    size_t shared = buf ? (nq + nk) * elem_bytes * (backward ? 2 : 1) : 0;
    shared += rope_table_size(p) * sizeof(double);
    if (backward) {
      if (qk) shared += dparams_size(p) * sizeof(double);
      shared += static_cast<size_t>(p.batch * kv_heads_of(p)) * sizeof(double);
      if (has_sinks(p))
        shared += static_cast<size_t>(p.batch * p.heads) * sizeof(double);
    }
    return slots * slot_bytes + shared;
  }
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

// Segment s (head_dim contiguous values) of normalization row r in a tensor
// of layout l.
template <class P>
P row_segment(P base, const Layout4& l, const NormRows& sh, int64_t r,
              int64_t s) {
  int64_t b = 0, h = s, n = 0;
  if (sh.all_heads) {
    b = r / sh.N, n = r % sh.N;
  } else {
    b = r / (sh.H * sh.N), h = (r / sh.N) % sh.H, n = r % sh.N;
  }
  return base + b * l.batch_stride + h * l.head_stride + n * l.row_stride;
}

// One side's learned parameters (a shared weight for both sides).
struct SideWeights {
  const double* w = nullptr;
  const double* bias = nullptr;
};
SideWeights side_weights(const AttentionProblem& p, int side,
                         const NormParams& prm) {
  const Normalization& nm = p.norm;
  if (nm.weight == ParamShape::kNone) return {};
  return {
      side == 0 || nm.shared_qk_weight ? prm.q_weight.data : prm.k_weight.data,
      nm.bias ? (side == 0 ? prm.q_bias.data : prm.k_bias.data) : nullptr};
}

// The multiplier of x_hat: gamma, 1 + gamma (Gemma) or 1.
inline double weight_of(const AttentionProblem& p, const SideWeights& sw,
                        int64_t pi) {
  if (!sw.w) return 1.0;
  return p.norm.one_plus_weight ? 1.0 + sw.w[pi] : sw.w[pi];
}

// Gathers row r of x (its exact double images) into xr.
template <class T>
void gather_row(const ConstTensor4& x, const NormRows& sh, int64_t r,
                double* xr) {
  const int64_t D = sh.D, segs = sh.len() / D;
  for (int64_t s = 0; s < segs; ++s) {
    const T* src =
        row_segment(static_cast<const T*>(x.data), x.layout, sh, r, s);
    for (int64_t d = 0; d < D; ++d) xr[s * D + d] = static_cast<double>(src[d]);
  }
}

// RoPE's rotation (or its transpose) of every head segment of a gathered
// normalization row r (its position's row of the side's table cs).
void rope_row(const AttentionProblem& p, const NormRows& sh, const double* cs,
              int64_t r, bool inverse, double* row) {
  const double* at = cs + (r % sh.N) * 2 * rope_pairs(p);
  for (int64_t s = 0; s < sh.len() / sh.D; ++s)
    rope_rotate_row(p.rope, at, inverse, row + s * sh.D);
}
// Where RoPE acts: on the raw rows (before the normalization, and sdpa) or
// on x_tilde (after it).
bool rope_on_input(const AttentionProblem& p) {
  return has_rope(p) && (p.variant != Variant::kQKNorm ||
                         p.rope.order == RopeOrder::kBeforeNorm);
}
bool rope_on_output(const AttentionProblem& p) {
  return has_rope(p) && p.variant == Variant::kQKNorm &&
         p.rope.order == RopeOrder::kAfterNorm;
}

// Writes row r's L doubles, rounded to T, to the dense xt.
template <class T>
void store_dense(const NormRows& sh, int64_t r, const double* row, T* xt) {
  const int64_t D = sh.D, segs = sh.len() / D;
  for (int64_t s = 0; s < segs; ++s) {
    T* dst = xt + sh.at(r, s * D);
    const double* src = row + s * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(src[d]);
  }
}

// Phase A for rows [r0, r1) of one side: x_tilde = x_hat * w + beta in
// double (RoPE: rotated, see rope_row), rounded to T once, into the dense
// xt. sdpa (with RoPE only): the rotated x. row: 2 len() doubles; cs: the
// side's RoPE table (null without RoPE).
template <class T>
void normalize_side(const AttentionProblem& p, int side, const ConstTensor4& x,
                    const NormParams& prm, const double* cs, int64_t r0,
                    int64_t r1, T* xt, double* row) {
  const NormRows sh = norm_rows(p, side);
  const int64_t L = sh.len(), D = sh.D, segs = L / D;
  const bool qk = p.variant == Variant::kQKNorm;
  const bool rope_in = rope_on_input(p), rope_out = rope_on_output(p);
  const SideWeights sw = qk ? side_weights(p, side, prm) : SideWeights{};
  double *xr = row, *xh = row + L;
  for (int64_t r = r0; r < r1; ++r) {
    gather_row<T>(x, sh, r, xr);
    if (rope_in) rope_row(p, sh, cs, r, false, xr);
    if (!qk) {
      store_dense(sh, r, xr, xt);
      continue;
    }
    formulation_row(p.norm.kind, xr, L, p.eps, xh);
    // x_tilde in double into xr (the gathered row is no longer needed).
    for (int64_t s = 0; s < segs && sw.w; ++s) {
      const int64_t p0 = sh.param(r, s * D, p.norm.weight);
      const double* w = sw.w + p0;
      const double* beta = sw.bias ? sw.bias + p0 : nullptr;
      const double* hs = xh + s * D;
      double* ts = xr + s * D;
      for (int64_t d = 0; d < D; ++d) {
        const double t = hs[d] * (p.norm.one_plus_weight ? 1 + w[d] : w[d]);
        ts[d] = beta ? t + beta[d] : t;
      }
    }
    double* xtr = sw.w ? xr : xh;
    if (rope_out) rope_row(p, sh, cs, r, false, xtr);
    store_dense(sh, r, xtr, xt);
  }
}

// Phase C for rows [r0, r1) of one side: dx from dx_tilde (dense dxt), and
// the rows' parameter gradients added into gw / gb (zeroed by the caller;
// null when the side has none). RoPE: the transpose rotation on the
// gradient of the rotated operand (rope_row). row: 3 len() doubles.
template <class T>
void backward_side(const AttentionProblem& p, int side, const ConstTensor4& x,
                   const NormParams& prm, const double* cs, const T* dxt,
                   const MutTensor4& dx, int64_t r0, int64_t r1, double* row,
                   double* gw, double* gb) {
  const NormRows sh = norm_rows(p, side);
  const int64_t L = sh.len(), D = sh.D, segs = L / D;
  const bool qk = p.variant == Variant::kQKNorm;
  const bool rope_in = rope_on_input(p), rope_out = rope_on_output(p);
  const SideWeights sw = qk ? side_weights(p, side, prm) : SideWeights{};
  double *xr = row, *xh = row + L, *du = row + 2 * L;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t s = 0; s < segs; ++s) {
      const T* g = dxt + sh.at(r, s * D);
      for (int64_t d = 0; d < D; ++d) du[s * D + d] = static_cast<double>(g[d]);
    }
    if (rope_out) rope_row(p, sh, cs, r, true, du);
    if (qk) {
      gather_row<T>(x, sh, r, xr);
      if (rope_in) rope_row(p, sh, cs, r, false, xr);
      const FormRow st = formulation_row(p.norm.kind, xr, L, p.eps, xh);
      for (int64_t s = 0; s < segs && sw.w; ++s) {
        const int64_t p0 = sh.param(r, s * D, p.norm.weight);
        const double* hs = xh + s * D;
        double* dus = du + s * D;
        for (int64_t d = 0; d < D; ++d) {
          const double t = dus[d];
          gw[p0 + d] += t * hs[d];
          if (gb) gb[p0 + d] += t;
          dus[d] = t * weight_of(p, sw, p0 + d);
        }
      }
      formulation_row_backward(p.norm.kind, xh, st, p.eps, L, du);
    }
    if (rope_in) rope_row(p, sh, cs, r, true, du);
    for (int64_t s = 0; s < segs; ++s) {
      T* dst = row_segment(static_cast<T*>(dx.data), dx.layout, sh, r, s);
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(du[s * D + d]);
    }
  }
}

// Fills RoPE's table (rope_side) on the pool: chunks of positions of both
// sides. Each entry is std::cos / std::sin of double(pos) * inv_freq_e
// (rope_inv_freq<double>), whatever T.
template <class T>
void fill_rope_table(const AttentionProblem& p, BlasWorkspace<T>& ws,
                     int threads) {
  if (!has_rope(p)) return;
  const int64_t P = rope_pairs(p);
  double* table = ws.rope.get(rope_table_size(p));
  const int64_t cq = chunk_count(p.q_len), ck = chunk_count(p.kv_len);
  auto item = [&](int64_t c, int) {
    const int side = c < cq ? 0 : 1;
    const int64_t N = side == 0 ? p.q_len : p.kv_len, cr = chunk_rows(N),
                  cc = side == 0 ? c : c - cq;
    double* cs = table + (side == 0 ? 0 : p.q_len * 2 * P);
    for (int64_t e = 0; e < P; ++e) {
      const double inv = rope_inv_freq<double>(p.rope, e);
      for (int64_t n = cc * cr; n < std::min(N, (cc + 1) * cr); ++n) {
        const double t = static_cast<double>(rope_position(p, side, n)) * inv;
        cs[(n * P + e) * 2] = std::cos(t);
        cs[(n * P + e) * 2 + 1] = std::sin(t);
      }
    }
  };
  ws.pool.run(threads, cq + ck, item);
}

// Sizes the general path's scratch (every slot and the shared buffers)
// before the parallel regions.
template <class T>
void reserve_general(BlasWorkspace<T>& ws, const AttentionProblem& p,
                     bool backward, int threads) {
  const auto bq =
      static_cast<size_t>(std::min(query_block(p.kv_len, sizeof(T)), p.q_len));
  const auto ld = static_cast<size_t>(block_ld(p.kv_len));
  const bool buf = buffered(p);
  for (int i = 0; i < threads; ++i) {
    Scratch<T>& s = ws.slot(static_cast<size_t>(i));
    s.blk0.get(bq * ld);
    s.row0.get(bq);
    if (backward) s.blk1.get(bq * ld);
    if (backward && p.softcap > 0) s.cap.get(2 * ld);
    if (buf)
      s.frow.get(static_cast<size_t>((backward ? 3 : 2) * max_row_len(p)));
  }
  const auto nq = static_cast<size_t>(p.batch * p.heads * p.q_len * p.head_dim),
             nk = static_cast<size_t>(p.batch * kv_heads_of(p) * p.kv_len *
                                      p.head_dim);
  if (buf) {
    ws.qt.get(nq), ws.kt.get(nk);
    if (backward) ws.dqt.get(nq), ws.dkt.get(nk);
  }
  if (backward && p.variant == Variant::kQKNorm)
    ws.dparams.get(dparams_size(p));
  if (has_rope(p)) ws.rope.get(rope_table_size(p));
  if (backward) ws.dg_items.get(static_cast<size_t>(p.batch * kv_heads_of(p)));
  if (backward && has_sinks(p))
    ws.dsinks.get(static_cast<size_t>(p.batch * p.heads));
}

// The logit operands of query head h (kv head hk): the dense x_tilde
// buffers for qknorm and for sdpa with RoPE, else the inputs in place.
template <class T>
Operands<T> general_operands(const AttentionProblem& p, const ConstTensor4& q,
                             const ConstTensor4& k, const T* qt, const T* kt,
                             int64_t b, int64_t h, int64_t hk) {
  const int64_t D = p.head_dim;
  if (!buffered(p))
    return {head_ptr<T>(q, b, h), blas_ld(q.layout, p.q_len, D),
            head_ptr<T>(k, b, hk), blas_ld(k.layout, p.kv_len, D)};
  return {qt + (b * p.heads + h) * p.q_len * D, D,
          kt + (b * kv_heads_of(p) + hk) * p.kv_len * D, D};
}

// Phase A: both sides' x_tilde (qknorm; sdpa: rotated with RoPE, else
// nothing), after RoPE's table.
template <class T>
void normalize_all(const AttentionProblem& p, const ConstTensor4& q,
                   const ConstTensor4& k, const NormParams& prm,
                   BlasWorkspace<T>& ws, int threads) {
  if (!buffered(p)) return;
  fill_rope_table(p, ws, threads);
  const double* table = ws.rope.get(0);
  const double *csq = rope_side(p, table, 0), *csk = rope_side(p, table, 1);
  const int64_t rq = norm_rows(p, 0).rows(), rk = norm_rows(p, 1).rows();
  const int64_t cq = chunk_count(rq), ck = chunk_count(rk);
  const int64_t crq = chunk_rows(rq), crk = chunk_rows(rk);
  T* qt = ws.qt.get(0);
  T* kt = ws.kt.get(0);
  auto item = [&](int64_t c, int slot) {
    double* row = ws.slot(static_cast<size_t>(slot)).frow.get(0);
    if (c < cq)
      normalize_side<T>(p, 0, q, prm, csq, c * crq, std::min(rq, (c + 1) * crq),
                        qt, row);
    else
      normalize_side<T>(p, 1, k, prm, csk, (c - cq) * crk,
                        std::min(rk, (c - cq + 1) * crk), kt, row);
  };
  ws.pool.run(threads, cq + ck, item);
}

// Forward (probs == nullptr) or the probabilities hook of the general path.
template <class T>
void general_forward(const AttentionProblem& p, const ForwardArgs& a,
                     double* probs, BlasWorkspace<T>& ws, int threads) {
  reserve_general(ws, p, false, threads);
  const int saved = openblas_get_num_threads();
  if (saved != 1) openblas_set_num_threads(1);
  normalize_all(p, a.q, a.k, a.params, ws, threads);
  const int64_t group = p.heads / kv_heads_of(p);
  const T* qt = ws.qt.get(0);
  const T* kt = ws.kt.get(0);
  const int64_t per_head = p.q_len * p.kv_len;
  auto item = [&](int64_t i, int slot) {
    const int64_t b = i / p.heads, h = i % p.heads;
    const Operands<T> op =
        general_operands(p, a.q, a.k, qt, kt, b, h, h / group);
    forward_core(p, a, b, h, h / group, op,
                 probs ? probs + i * per_head : nullptr,
                 ws.slot(static_cast<size_t>(slot)));
  };
  ws.pool.run(threads, p.batch * p.heads, item);
  if (saved != 1) openblas_set_num_threads(saved);
}

template <class T>
void general_backward(const AttentionProblem& p, const BackwardArgs& a,
                      BlasWorkspace<T>& ws, int threads) {
  reserve_general(ws, p, true, threads);
  const int saved = openblas_get_num_threads();
  if (saved != 1) openblas_set_num_threads(1);
  const bool qk = p.variant == Variant::kQKNorm, buf = buffered(p);
  normalize_all(p, a.q, a.k, a.params, ws, threads);
  const int64_t Hk = kv_heads_of(p), group = p.heads / Hk, D = p.head_dim,
                Nq = p.q_len, Nk = p.kv_len;
  const T* qt = ws.qt.get(0);
  const T* kt = ws.kt.get(0);
  T* dqt = ws.dqt.get(0);
  T* dkt = ws.dkt.get(0);
  double* dg_items = ws.dg_items.get(0);
  // Attention sinks: per (batch, query head) partial sums of dsinks.
  double* ds_items = has_sinks(p) ? ws.dsinks.get(0) : nullptr;
  // Phase B: one item per (batch, kv head).
  auto item = [&](int64_t i, int slot) {
    Scratch<T>& s = ws.slot(static_cast<size_t>(slot));
    const int64_t b = i / Hk, hk = i % Hk;
    T* dv = head_ptr<T>(a.dv, b, hk);
    const int64_t rsdv = blas_ld(a.dv.layout, Nk, D);
    T* dkacc = buf ? dkt + i * Nk * D : head_ptr<T>(a.dk, b, hk);
    const int64_t lddk = buf ? D : blas_ld(a.dk.layout, Nk, D);
    int64_t written = 0;  // keys of dkacc and dv holding sums (key_beta)
    double dg = 0;
    for (int64_t t = 0; t < group; ++t) {
      const int64_t h = hk * group + t;
      const Operands<T> op = general_operands(p, a.q, a.k, qt, kt, b, h, hk);
      DirectSink<T> sink =
          buf ? DirectSink<T>{dqt + (b * p.heads + h) * Nq * D, D, D}
              : DirectSink<T>{head_ptr<T>(a.dq, b, h),
                              blas_ld(a.dq.layout, Nq, D), D};
      dg +=
          backward_core(p, a, b, h, hk, op, dkacc, lddk, dv, rsdv, &written, s,
                        sink, ds_items ? ds_items + b * p.heads + h : nullptr);
    }
    // Keys no query of the group sees: no gradient.
    zero_rows(dkacc + written * lddk, Nk - written, lddk, D);
    zero_rows(dv + written * rsdv, Nk - written, rsdv, D);
    dg_items[i] = dg;
  };
  ws.pool.run(threads, p.batch * Hk, item);
  double dg = 0;
  for (int64_t i = 0; i < p.batch * Hk; ++i) dg += dg_items[i];
  *a.dg = qk && !p.fixed_scale ? dg : 0.0;
  // dsinks_h: the batches' partials in batch order.
  for (int64_t h = 0; ds_items && h < p.heads; ++h) {
    double d = 0;
    for (int64_t b = 0; b < p.batch; ++b) d += ds_items[b * p.heads + h];
    a.d_sinks[h] = d;
  }
  if (buf) {
    // Phase C.
    const double* table = ws.rope.get(0);
    const int64_t rq = norm_rows(p, 0).rows(), rk = norm_rows(p, 1).rows();
    const int64_t cq = chunk_count(rq), ck = chunk_count(rk);
    const int64_t crq = chunk_rows(rq), crk = chunk_rows(rk);
    const int64_t gq = side_grad_slots(p, 0), gk = side_grad_slots(p, 1);
    const int64_t pq = side_params(p, 0), pk = side_params(p, 1);
    double* part = ws.dparams.get(0);
    auto chunk = [&](int64_t c, int slot) {
      double* row = ws.slot(static_cast<size_t>(slot)).frow.get(0);
      const bool kside = c >= cq;
      const int64_t cc = kside ? c - cq : c, cr = kside ? crk : crq,
                    rows = kside ? rk : rq, g = kside ? gk : gq,
                    np = kside ? pk : pq;
      double* gw = g > 0 ? part + (kside ? cq * gq : 0) + cc * g : nullptr;
      double* gb = gw && p.norm.bias ? gw + np : nullptr;
      if (gw) std::fill(gw, gw + g, 0.0);
      backward_side<T>(p, kside ? 1 : 0, kside ? a.k : a.q, a.params,
                       rope_side(p, table, kside ? 1 : 0), kside ? dkt : dqt,
                       kside ? a.dk : a.dq, cc * cr,
                       std::min(rows, (cc + 1) * cr), row, gw, gb);
    };
    ws.pool.run(threads, cq + ck, chunk);
    // The partials in chunk order, q side first.
    const NormParamGrads& dp = a.d_params;
    for (const MutParamRef& r :
         {dp.q_weight, dp.k_weight, dp.q_bias, dp.k_bias})
      if (r.data) std::fill(r.data, r.data + r.size, 0.0);
    auto add = [&](double* dst, const double* src, int64_t n) {
      if (dst)
        for (int64_t x = 0; x < n; ++x) dst[x] += src[x];
    };
    for (int64_t c = 0; c < cq && gq > 0; ++c) {
      add(dp.q_weight.data, part + c * gq, pq);
      if (p.norm.bias) add(dp.q_bias.data, part + c * gq + pq, pq);
    }
    double* kw = p.norm.shared_qk_weight ? dp.q_weight.data : dp.k_weight.data;
    for (int64_t c = 0; c < ck && gk > 0; ++c) {
      const double* src = part + cq * gq + c * gk;
      add(kw, src, pk);
      if (p.norm.bias) add(dp.k_bias.data, src + pk, pk);
    }
  }
  if (saved != 1) openblas_set_num_threads(saved);
}

}  // namespace

int item_threads(const AttentionProblem& p, const ExecConfig& cfg) {
  int t = cfg.threads;
  if (t <= 0)
    t = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(std::min<int64_t>(t, p.batch * p.heads));
}

// The forward of every head on `threads` threads (O and lse written); with
// `probs`, each head's probabilities too, dense [B, H, q_len, kv_len].
template <class T>
void forward_all_heads(const AttentionProblem& p, const ForwardArgs& a,
                       double* probs, BlasWorkspace<T>& ws, int threads) {
  if (general_path(p)) return general_forward(p, a, probs, ws, threads);
  const int64_t per_head = p.q_len * p.kv_len;
  for_each_head(p, ws, threads, false,
                [&](int64_t b, int64_t h, Scratch<T>& s, int64_t i) {
                  forward_head(
                      p, a, b, h,
                      probs == nullptr ? nullptr : probs + i * per_head, s);
                });
}

template <class T>
void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                       BlasWorkspace<T>& ws, const ExecConfig& cfg) {
  check_blas_range(p, {{"q", a.q.layout, p.q_len, true},
                       {"k", a.k.layout, p.kv_len, true},
                       {"v", a.v.layout, p.kv_len},
                       {"o", a.o.layout, p.q_len}});
  forward_all_heads(p, a, nullptr, ws, item_threads(p, cfg));
}

template <class T>
void attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                             double* probs, BlasWorkspace<T>& ws) {
  check_blas_range(
      p, {{"q", a.q.layout, p.q_len, true}, {"k", a.k.layout, p.kv_len, true}});
  forward_all_heads(p, a, probs, ws, 1);
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
  if (general_path(p)) return general_backward(p, a, ws, item_threads(p, cfg));
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
