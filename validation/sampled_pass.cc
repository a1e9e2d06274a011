// The sampled oracle's pass in double over the whole problem
// (validation/sampled.h): every query row's statistics and dg with its
// channels.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "validation/operands.h"
#include "validation/rule_terms.h"
#include "validation/sampled.h"
#include "validation/sampled_internal.h"

namespace qknorm::validation {
namespace {

// Partial sums over kChunk terms in double, merged into long double: each
// chunk's error is the probabilistic sum_units(kChunk) of its terms,
// whatever their order within the chunk (chunked_sums adds them in four
// partial sums), and dg's terms are summed so too. The pass's error per f64
// unit roundoff: pass_units (validation/rule_terms.cc), which counts one
// D-term dot (any order) and one chunk.
constexpr int64_t kChunk = kPassChunk;

// The pass's two O(n^2 D) loops, for one block of query rows (rows r of
// the block see keys [0, nv[r])): S[r][j] = q_r . k_j and dP[r][j] = dO_r .
// v_j; then O_r += P[r][j] v_j. They are register-blocked micro-kernels
// (below), compiled twice from one template, for AVX2 with FMA and for the
// baseline's SSE2, and chosen once by the CPU (the validation library is
// built for the baseline). Neither reads or writes S, dP or P of row r at a
// key j >= nv[r].
struct BlockArgs {
  const double *q, *d_o, *k, *v;  // q, dO rows of the block; k, v of the head
  const int64_t* nv;
  int64_t rows, jmax, D, ld;  // ld: the S, dP, P row stride (Nk)
  double *S, *dP, *P, *O;
};

// GCC's vector extensions: 8 doubles (AVX-512), 4 (AVX2) or 2 (SSE2).
typedef double V8 __attribute__((vector_size(64)));
typedef double V4 __attribute__((vector_size(32)));
typedef double V2 __attribute__((vector_size(16)));

// acc += a b, fused on AVX2 (at least as accurate as the unfused operations
// pass_units() counts) and unfused on the baseline, which has no FMA.
// Vectors go by reference: a 32-byte vector argument would change the
// baseline's ABI (the template bodies are compiled for it before the AVX2
// entry points inline them).
template <class V>
struct Simd;
template <>
struct Simd<V8> {
  __attribute__((target("avx512f"))) static void madd(V8& acc, const V8& a,
                                                      const V8& b) {
    acc = _mm512_fmadd_pd(a, b, acc);
  }
  __attribute__((target("avx512f"))) static void madd(double& acc, double a,
                                                      double b) {
    acc = __builtin_fma(a, b, acc);
  }
  __attribute__((target("avx512f"))) static void splat(V8& x, const double* p) {
    x = _mm512_set1_pd(*p);
  }
};
template <>
struct Simd<V4> {
  __attribute__((target("avx2,fma"))) static void madd(V4& acc, const V4& a,
                                                       const V4& b) {
    acc = _mm256_fmadd_pd(a, b, acc);
  }
  __attribute__((target("avx2,fma"))) static void madd(double& acc, double a,
                                                       double b) {
    acc = __builtin_fma(a, b, acc);
  }
  __attribute__((target("avx2,fma"))) static void splat(V4& x,
                                                        const double* p) {
    x = _mm256_broadcast_sd(p);
  }
};
template <>
struct Simd<V2> {
  static void madd(V2& acc, const V2& a, const V2& b) { acc += a * b; }
  static void madd(double& acc, double a, double b) { acc += a * b; }
  static void splat(V2& x, const double* p) { x = V2{*p, *p}; }
};

template <class V>
constexpr int64_t kLanes = sizeof(V) / sizeof(double);

template <class V>
inline void load(V& x, const double* p) {
  std::memcpy(&x, p, sizeof x);
}
template <class V>
inline void store(double* p, const V& x) {
  std::memcpy(p, &x, sizeof x);
}
template <class V>
inline double lane_sum(const V& x) {
  if constexpr (kLanes<V> == 4) return (x[0] + x[2]) + (x[1] + x[3]);
  return x[0] + x[1];
}

// The micro-kernels' shapes and the key tile, measured on the 2-core Zen 3
// (one thread, n = 4096, D = 128, loaded machine, best of five): a dot tile
// of kDotRows x kDotKeys dots keeps 12 accumulators of 4 partial sums in
// registers (7 loads feed 12 FMAs; 4 x 3 ran 22-25 GFLOP per CPU-second, 4 x
// 2 18-25, 3 x 4 19-22), a P.V tile kPvRows rows x kPvCols vectors of O (4 x
// 3 16-20, 4 x 2 11-18). kKeyTile keys of K and V (64 KB each at D = 128)
// stay in the L2 cache while every row group of the block reads them (64
// keys 22-25, 128 keys 18-23).
constexpr int kDotRows = 4, kDotKeys = 3, kPvRows = 4, kPvCols = 3;
constexpr int64_t kKeyTile = 64;

// s[r * ld + k] = a_r . b_k for R rows of a and K consecutive rows of b
// (both of stride D): kLanes partial sums per dot, then the D % kLanes
// remaining terms (any order is within sum_units(D)).
template <class V, int R, int K>
inline void dot_tile(const double* a, const double* b, int64_t D, double* s,
                     int64_t ld) {
  V acc[R][K];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) acc[r][k] = V{};
  int64_t d = 0;
  for (; d + kLanes<V> <= D; d += kLanes<V>) {
    V bv[K];
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) load(bv[k], b + k * D + d);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      V av;
      load(av, a + r * D + d);
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) Simd<V>::madd(acc[r][k], av, bv[k]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      double t = lane_sum(acc[r][k]);
      for (int64_t e = d; e < D; ++e)
        Simd<V>::madd(t, a[r * D + e], b[k * D + e]);
      s[r * ld + k] = t;
    }
}

// S and dP of rows [r0, r0 + R) of the block at keys [j0, j1), which every
// one of them sees.
template <class V, int R>
inline void dots_rows(const BlockArgs& a, int64_t r0, int64_t j0, int64_t j1) {
  const int64_t D = a.D;
  for (int t = 0; t < 2; ++t) {
    const double* x = (t == 0 ? a.q : a.d_o) + r0 * D;
    const double* y = t == 0 ? a.k : a.v;
    double* s = (t == 0 ? a.S : a.dP) + r0 * a.ld;
    int64_t j = j0;
    for (; j + kDotKeys <= j1; j += kDotKeys)
      dot_tile<V, R, kDotKeys>(x, y + j * D, D, s + j, a.ld);
    for (; j < j1; ++j) dot_tile<V, R, 1>(x, y + j * D, D, s + j, a.ld);
  }
}

// O[r0 + r][d, d + C kLanes) += sum over j in [j0, j1) of P[r0 + r][j] v_j,
// r < R, in increasing j (the order of the plain loop).
template <class V, int R, int C>
inline void pv_tile(const BlockArgs& a, int64_t r0, int64_t d, int64_t j0,
                    int64_t j1) {
  V acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      load(acc[r][c], a.O + (r0 + r) * a.D + d + c * kLanes<V>);
  for (int64_t j = j0; j < j1; ++j) {
    V vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) load(vv[c], a.v + j * a.D + d + c * kLanes<V>);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      V p;
      Simd<V>::splat(p, a.P + (r0 + r) * a.ld + j);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) Simd<V>::madd(acc[r][c], p, vv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      store(a.O + (r0 + r) * a.D + d + c * kLanes<V>, acc[r][c]);
}

// The same for rows [r0, r0 + R) over every column: kPvCols vectors at a
// time, then single vectors, then the D % kLanes last columns one by one.
template <class V, int R>
inline void pv_rows(const BlockArgs& a, int64_t r0, int64_t j0, int64_t j1) {
  if (j0 >= j1) return;
  int64_t d = 0;
  for (; d + kPvCols * kLanes<V> <= a.D; d += kPvCols * kLanes<V>)
    pv_tile<V, R, kPvCols>(a, r0, d, j0, j1);
  for (; d + kLanes<V> <= a.D; d += kLanes<V>)
    pv_tile<V, R, 1>(a, r0, d, j0, j1);
  for (; d < a.D; ++d)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      double o = a.O[(r0 + r) * a.D + d];
      for (int64_t j = j0; j < j1; ++j)
        Simd<V>::madd(o, a.P[(r0 + r) * a.ld + j], a.v[j * a.D + d]);
      a.O[(r0 + r) * a.D + d] = o;
    }
}

// One key tile after another; in each, every group of R rows over the keys
// all of them see (the common prefix), then each row's ragged rest (causal:
// up to R - 1 keys), then the block's last rows one by one.
template <int R, void (*Full)(const BlockArgs&, int64_t, int64_t, int64_t),
          void (*One)(const BlockArgs&, int64_t, int64_t, int64_t)>
inline void block_body(const BlockArgs& a) {
  for (int64_t t0 = 0; t0 < a.jmax; t0 += kKeyTile) {
    const int64_t t1 = std::min(a.jmax, t0 + kKeyTile);
    int64_t r = 0;
    for (; r + R <= a.rows; r += R) {
      const int64_t common = *std::min_element(a.nv + r, a.nv + r + R);
      Full(a, r, t0, std::min(t1, common));
      for (int64_t i = r; i < r + R; ++i)
        One(a, i, std::max(t0, common), std::min(t1, a.nv[i]));
    }
    for (; r < a.rows; ++r) One(a, r, t0, std::min(t1, a.nv[r]));
  }
}

__attribute__((target("avx512f"), flatten)) void pv_avx512(const BlockArgs& a) {
  block_body<kPvRows, pv_rows<V8, kPvRows>, pv_rows<V8, 1>>(a);
}
__attribute__((target("avx2,fma"), flatten)) void dots_avx2(
    const BlockArgs& a) {
  block_body<kDotRows, dots_rows<V4, kDotRows>, dots_rows<V4, 1>>(a);
}
__attribute__((target("avx2,fma"), flatten)) void pv_avx2(const BlockArgs& a) {
  block_body<kPvRows, pv_rows<V4, kPvRows>, pv_rows<V4, 1>>(a);
}
__attribute__((flatten)) void dots_base(const BlockArgs& a) {
  block_body<kDotRows, dots_rows<V2, kDotRows>, dots_rows<V2, 1>>(a);
}
__attribute__((flatten)) void pv_base(const BlockArgs& a) {
  block_body<kPvRows, pv_rows<V2, kPvRows>, pv_rows<V2, 1>>(a);
}

// The widest of the micro-kernels' builds this CPU runs.
enum class Isa { kBase, kAvx2, kAvx512 };
Isa isa() {
  static const Isa best =
      __builtin_cpu_supports("avx512f") ? Isa::kAvx512
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
          ? Isa::kAvx2
          : Isa::kBase;
  return best;
}
// The dots stay at 4 lanes on AVX-512: their 8-lane build, whose per-dot
// lane sums cost 8 lanes' shuffles, took 1.45x the time of the 4-lane one
// (Zen 4, n = 8192, D = 128, one thread), while P.V, which has no lane
// sums, ran 1.3x faster on 8 lanes.
void dots(const BlockArgs& a) {
  (isa() == Isa::kBase ? dots_base : dots_avx2)(a);
}
void pv(const BlockArgs& a) {
  switch (isa()) {
    case Isa::kAvx512:
      return pv_avx512(a);
    case Isa::kAvx2:
      return pv_avx2(a);
    case Isa::kBase:
      return pv_base(a);
  }
}

// Sums over a row's visible keys j < n, as pass_units counts them: chunks
// of kChunk terms, each summed in double by kSumLanes partial sums that are
// added in a fixed order, then into long double. term(j) returns key j's
// terms of the N sums; sums[k] += the k-th sum. The partial sums let the
// compiler vectorize across keys without reassociating anything (no
// -ffast-math), and leave the x87 unit one add per chunk instead of one per
// key (seven long-double sums per key took a fifth of the pass).
constexpr int kSumLanes = 4;
template <int N, class Term>
inline void chunked_sums(int64_t n, LD* sums, Term term) {
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = std::min(n, j0 + kChunk);
    double t[N][kSumLanes] = {};
    int64_t j = j0;
    for (; j + kSumLanes <= j1; j += kSumLanes)
#pragma GCC unroll 4
      for (int l = 0; l < kSumLanes; ++l) {
        const std::array<double, N> v = term(j + l);
#pragma GCC unroll 8
        for (int k = 0; k < N; ++k) t[k][l] += v[k];
      }
    for (int l = 0; j < j1; ++j, ++l) {
      const std::array<double, N> v = term(j);
      for (int k = 0; k < N; ++k) t[k][l] += v[k];
    }
    for (int k = 0; k < N; ++k)
      sums[k] += (t[k][0] + t[k][2]) + (t[k][1] + t[k][3]);
  }
}

// out[n] = |<w, x_n>| for the n_rows rows x_n of D elements starting at x.
void abs_dots(const LD* w, const LD* x, int64_t n_rows, int64_t D,
              double* out) {
  for (int64_t n = 0; n < n_rows; ++n) {
    LD t = 0;
    for (int64_t d = 0; d < D; ++d) t += w[d] * x[n * D + d];
    out[n] = static_cast<double>(std::fabs(t));
  }
}

}  // namespace

// p_del_i = sum_j |dO_i|.|v_j| over row i's visible keys (GivenRows), for
// every query row [B, H, Nq]: per (b, h) the rows in order of their visible
// prefix, against the running column sums of |v|. O((Nq + Nk) D) per head.
// Each value is raised by the sums' relative rounding (positive terms), so
// it bounds the exact one.
std::vector<LD> row_p_del(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const int64_t H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len, Nk = p.kv_len,
                D = p.head_dim, group = H / Hk;
  std::vector<LD> out(static_cast<size_t>(p.batch * H * Nq), 0);
  const double up = 1 + 2 *
                            (sum_units(static_cast<double>(Nk)) +
                             sum_units(static_cast<double>(D))) *
                            unit_roundoff(Precision::kF64);
  std::vector<int64_t> order(static_cast<size_t>(Nq)), nv(order.size());
  std::vector<double> col(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < Nq; ++i) {
      order[static_cast<size_t>(i)] = i;
      nv[static_cast<size_t>(i)] = visible_keys(p, b, i);
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return nv[static_cast<size_t>(x)] < nv[static_cast<size_t>(y)];
    });
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h, bk = b * Hk + h / group;
      std::fill(col.begin(), col.end(), 0.0);
      int64_t j = 0;
      for (const int64_t i : order) {
        for (; j < nv[static_cast<size_t>(i)]; ++j)
          for (int64_t d = 0; d < D; ++d)
            col[static_cast<size_t>(d)] +=
                std::fabs(c.v[static_cast<size_t>((bk * Nk + j) * D + d)]);
        double t = 0;
        for (int64_t d = 0; d < D; ++d)
          t += std::fabs(c.d_o[static_cast<size_t>((bh * Nq + i) * D + d)]) *
               col[static_cast<size_t>(d)];
        out[static_cast<size_t>(bh * Nq + i)] = t * up;
      }
    }
  }
  return out;
}

Pass run_pass(const AttentionCase& c, double A, double dot_units,
              const std::vector<LD>& p_del, int threads) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim, group = H / Hk;
  const bool qk = p.variant == Variant::kQKNorm;
  const bool learned = qk && !p.fixed_scale;
  const bool layer = qk && p.norm.kind == NormKind::kLayer;
  const double sc = !qk             ? 1 / std::sqrt(static_cast<double>(D))
                    : p.fixed_scale ? p.scale
                                    : p.g;
  const LD s_abs = std::fabs(static_cast<LD>(sc));
  // The logit operands in double, their magnitude rows' norms (|C| <=
  // max(1, ||q_a|| ||k_a||)), and for layer the mean shifts per row and
  // the weighted sums the shift's logit change needs (as the oracle's
  // logit_shift and dg_shift, per pair).
  std::vector<double> qt, kt, qan, kan, qshr, kshr, wk, wq;
  {
    const OperandMags qm = operand_mags(c, 0);
    const OperandMags km = operand_mags(c, 1);
    auto to_d = [](const std::vector<LD>& x) {
      return std::vector<double>(x.begin(), x.end());
    };
    auto row_norms = [D](const std::vector<LD>& xa) {
      std::vector<double> n(xa.size() / static_cast<size_t>(D));
      for (size_t r = 0; r < n.size(); ++r) {
        LD t = 0;
        for (int64_t d = 0; d < D; ++d) {
          const LD x = xa[r * static_cast<size_t>(D) + static_cast<size_t>(d)];
          t += x * x;
        }
        n[r] = static_cast<double>(std::sqrt(t));
      }
      return n;
    };
    qt = to_d(qm.xt);
    kt = to_d(km.xt);
    qan = row_norms(qm.xa);
    kan = row_norms(km.xa);
    if (layer) {
      // Per (b, h, i) / (b, hk, j): the row's shift and |sum_d w_d x'_d|
      // with the other side's weight of the matching head.
      auto shifts = [&](const OperandMags& m, int64_t heads, int64_t N) {
        std::vector<double> out(static_cast<size_t>(B * heads * N));
        for (int64_t bh = 0; bh < B * heads; ++bh)
          for (int64_t n = 0; n < N; ++n) {
            const size_t o = static_cast<size_t>((bh * N + n) * D);
            const NormRows& nr = m.rows;
            const size_t r = nr.all_heads
                                 ? static_cast<size_t>((bh / heads) * N + n)
                                 : o / static_cast<size_t>(D);
            out[static_cast<size_t>(bh * N + n)] =
                static_cast<double>(m.shr[r]);
          }
        return out;
      };
      qshr = shifts(qm, H, Nq);
      kshr = shifts(km, Hk, Nk);
      wk.assign(static_cast<size_t>(B * H * Nk), 0);
      wq.assign(static_cast<size_t>(B * H * Nq), 0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t bh = b * H + h, bk = b * Hk + h / group;
          const LD* wqv = qm.wv.data() + bh * Nq * D;  // row 0 of (b, h)
          const LD* wkv = km.wv.data() + bk * Nk * D;
          abs_dots(wqv, km.xt.data() + bk * Nk * D, Nk, D, wk.data() + bh * Nk);
          abs_dots(wkv, qm.xt.data() + bh * Nq * D, Nq, D, wq.data() + bh * Nq);
        }
    }
  }
  auto l2 = [D](const double* x) {
    LD t = 0;
    for (int64_t d = 0; d < D; ++d) t += static_cast<LD>(x[d]) * x[d];
    return static_cast<double>(std::sqrt(t));
  };
  std::vector<double> don(static_cast<size_t>(B * H * Nq)),
      vn(static_cast<size_t>(B * Hk * Nk)), dol1(don.size());
  for (size_t r = 0; r < don.size(); ++r) {
    don[r] = l2(c.d_o.data() + r * static_cast<size_t>(D));
    double t = 0;
    for (int64_t d = 0; d < D; ++d)
      t +=
          std::fabs(c.d_o[r * static_cast<size_t>(D) + static_cast<size_t>(d)]);
    dol1[r] = t;
  }
  for (size_t r = 0; r < vn.size(); ++r)
    vn[r] = l2(c.v.data() + r * static_cast<size_t>(D));

  Pass out;
  const size_t nrows = static_cast<size_t>(B * H * Nq);
  out.rows.lse.assign(nrows, -std::numeric_limits<LD>::infinity());
  out.rows.delta.assign(nrows, 0);
  out.rows.del.assign(nrows, 0);
  // Each row sum's ties (rule.h, "Repeated summands"), as the oracle forms
  // them (oracle_attention.cc): for the key rows' sub-cases, which hold
  // part of each row.
  out.rows.ties.assign(nrows, 0);
  const double u_tie = compute_roundoff(c.storage),
               term_units = dot_units * std::fabs(A) + kOpUnits;
  out.rows.ds_l1.assign(nrows, 0);
  out.rows.o_abs.assign(nrows, 0);
  pass_units(A, dot_units, D, &out.rows.units, &out.rows.soft_units);
  // Work items: blocks of kRows query rows of one (b, h).
  // Larger blocks read K and V from memory fewer times: 64 rows ran the
  // whole pass at n = 8192 about 15% faster than 16 (their S, dP and P
  // take 3 x 64 x Nk doubles per thread, 50 MB at Nk = 32768).
  constexpr int64_t kRows = 64;
  const int64_t blocks_per_head = (Nq + kRows - 1) / kRows;
  struct Acc {
    LD dg = 0, scale = 0, o_sens = 0, o_rel = 0, uf = 0, p_sens = 0, shift = 0;
    double logit_shift = 0, flops = 0;
  };
  // One accumulator per work item, summed in item order after the threads
  // join: dg and its channels are then the same whichever thread took which
  // block (per-thread sums made dg differ between runs in its last bits).
  std::atomic<int64_t> next{0};
  const int64_t items = B * H * blocks_per_head;
  std::vector<Acc> acc(static_cast<size_t>(items));
  std::vector<double> block_cpu(static_cast<size_t>(std::max(1, threads)), 0);
  auto work = [&](int thread) {
    const double cpu0 = thread_cpu_seconds();
    std::vector<double> S(static_cast<size_t>(kRows * Nk)),
        dP(static_cast<size_t>(kRows * Nk)), P(static_cast<size_t>(kRows * Nk)),
        O(static_cast<size_t>(kRows * D));
    std::vector<double> tie_terms;  // a row's P (row_tie_excess sorts it)
    for (int64_t it = next++; it < items; it = next++) {
      Acc& a = acc[static_cast<size_t>(it)];
      const int64_t bh = it / blocks_per_head, b = bh / H, h = bh % H,
                    bk = b * Hk + h / group;
      const int64_t i0 = (it % blocks_per_head) * kRows,
                    i1 = std::min(Nq, i0 + kRows);
      int64_t jmax = 0;
      int64_t nv[kRows];
      for (int64_t i = i0; i < i1; ++i) {
        nv[i - i0] = visible_keys(p, b, i);
        jmax = std::max(jmax, nv[i - i0]);
      }
      BlockArgs ba{qt.data() + (bh * Nq + i0) * D,
                   c.d_o.data() + (bh * Nq + i0) * D,
                   kt.data() + bk * Nk * D,
                   c.v.data() + bk * Nk * D,
                   nv,
                   i1 - i0,
                   jmax,
                   D,
                   Nk,
                   S.data(),
                   dP.data(),
                   P.data(),
                   O.data()};
      dots(ba);
      for (int64_t i = i0; i < i1; ++i)
        a.flops += 6.0 * static_cast<double>(D * nv[i - i0]);
      // Per row: lse (chunked sums of exp(S - m)), P = exp(S - m) / l.
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t n = nv[i - i0];
        const size_t r = static_cast<size_t>(bh * Nq + i);
        if (n == 0) continue;  // fully masked: lse -inf, nothing else
        const double* Si = S.data() + (i - i0) * Nk;
        double* Pi = P.data() + (i - i0) * Nk;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, sc * Si[j]);
        LD l = 0;
        for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
          double t = 0;
          for (int64_t j = j0; j < std::min(n, j0 + kChunk); ++j) {
            Pi[j] = std::exp(sc * Si[j] - m);
            t += Pi[j];
          }
          l += t;
        }
        const double inv_l = static_cast<double>(1 / l);
        for (int64_t j = 0; j < n; ++j) Pi[j] *= inv_l;
        out.rows.lse[r] = m + std::log(l);
        tie_terms.assign(Pi, Pi + n);
        out.rows.ties[r] = row_tie_excess(&tie_terms, u_tie, term_units);
      }
      // O_i = sum_j P_ij v_j (for |dO_i|.|O_i|, the stored-O relative
      // channel), over the keys once per block.
      std::fill(O.begin(), O.end(), 0.0);
      pv(ba);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t n = nv[i - i0];
        const size_t r = static_cast<size_t>(bh * Nq + i);
        // LayerNorm's logit shift: the full oracle's maximum over every
        // pair, visible or not.
        auto dc_of = [&](int64_t j) {
          return layer ? qshr[r] * wk[static_cast<size_t>(bh * Nk + j)] +
                             kshr[static_cast<size_t>(bk * Nk + j)] * wq[r]
                       : 0.0;
        };
        if (layer)
          for (int64_t j = 0; j < Nk; ++j)
            a.logit_shift =
                std::max(a.logit_shift, static_cast<double>(s_abs) * dc_of(j));
        if (n == 0) continue;
        const double* Si = S.data() + (i - i0) * Nk;
        const double* dPi = dP.data() + (i - i0) * Nk;
        const double* Pi = P.data() + (i - i0) * Nk;
        const double* doi = c.d_o.data() + r * static_cast<size_t>(D);
        double o_abs = 0;
        for (int64_t d = 0; d < D; ++d)
          o_abs += std::fabs(doi[d]) *
                   std::fabs(O[static_cast<size_t>((i - i0) * D + d)]);
        o_abs *= 1 + 2 * sum_units(static_cast<double>(D)) *
                         unit_roundoff(Precision::kF64);  // an upper bound
        const double* vn_j = vn.data() + bk * Nk;
        LD dd_sums[2] = {0, 0};  // delta, Del / ||dO_i||
        chunked_sums<2>(n, dd_sums, [&](int64_t j) {
          return std::array<double, 2>{Pi[j] * dPi[j], Pi[j] * vn_j[j]};
        });
        const LD delta = dd_sums[0];
        const LD del = dd_sums[1] * don[r];  // sum_j P_ij ||dO_i|| ||v_j||
        LD ds_l1 = 0;
        const double dl = static_cast<double>(delta);
        chunked_sums<1>(n, &ds_l1, [&](int64_t j) {
          return std::array<double, 1>{Pi[j] * std::fabs(dPi[j] - dl)};
        });
        out.rows.delta[r] = delta;
        out.rows.del[r] = del;
        out.rows.ds_l1[r] = ds_l1;
        out.rows.o_abs[r] = o_abs;
        // dg and its channels, as the oracle forms them per pair
        // (oracle_attention.cc), with |dO_i|.|v_j| bounded by ||dO_i|| ||v_j||;
        // dg's terms summed as the rows' sums are (within pass_units).
        if (!learned) continue;
        const double* kan_j = kan.data() + bk * Nk;
        const double dn = don[r], d1 = dol1[r], dd = static_cast<double>(del),
                     qa = qan[r], pd = static_cast<double>(p_del[r]),
                     ud = static_cast<double>(2 * D + 1);
        LD ch[7] = {a.dg, a.scale, a.o_sens, a.o_rel, a.uf, a.p_sens, a.shift};
        chunked_sums<7>(n, ch, [&](int64_t j) {
          const double pij = Pi[j], cm = std::max(1.0, qa * kan_j[j]),
                       dpd = dPi[j] - dl, adpd = std::fabs(dpd);
          return std::array<double, 7>{pij * dpd * Si[j],
                                       pij * (dn * vn_j[j] + dd) * cm,
                                       pij * d1 * cm,
                                       pij * o_abs * cm,
                                       (pij * ud + 1) * cm + 1,
                                       pij > 0 ? (adpd + pij * pd) * cm : 0.0,
                                       layer ? pij * adpd * dc_of(j) : 0.0};
        });
        a.dg = ch[0], a.scale = ch[1], a.o_sens = ch[2], a.o_rel = ch[3];
        a.uf = ch[4], a.p_sens = ch[5], a.shift = ch[6];
      }
    }
    block_cpu[static_cast<size_t>(thread)] = thread_cpu_seconds() - cpu0;
  };
  {
    std::vector<std::thread> pool;
    for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& t : pool) t.join();
  }
  for (const Acc& a : acc) {
    out.dg.dg += a.dg;
    out.dg.dg_scale += a.scale;
    out.dg.dg_o_sens += a.o_sens;
    out.dg.dg_o_rel_sens += a.o_rel;
    out.dg.dg_uf_sens += a.uf;
    out.dg.dg_p_sens += a.p_sens;
    out.dg.dg_shift += a.shift;
    out.logit_shift = std::max(out.logit_shift, a.logit_shift);
    out.flops += a.flops;
  }
  for (double x : block_cpu) out.block_cpu_seconds += x;
  // C_ij = S_ij / s: dg = sum dS_ij C_ij (the dot held q_tilde . k_tilde).
  out.dg.given_units = out.rows.units;
  out.dg.given_soft_units = out.rows.soft_units;
  return out;
}

}  // namespace qknorm::validation
