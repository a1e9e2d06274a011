#include "validation/sampled.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "qknorm/error.h"
#include "validation/operands.h"

namespace qknorm::validation {

int64_t visible_keys(const AttentionProblem& p, int64_t b, int64_t i) {
  int64_t n = p.kv_len;
  if (p.mask.causal) n = std::min(n, i + p.kv_len - p.q_len + 1);
  if (!p.mask.key_lengths.empty())
    n = std::min(n, p.mask.key_lengths[static_cast<size_t>(b)]);
  return std::max<int64_t>(n, 0);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The calling thread's CPU time in seconds.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The first query row of batch b that sees key j (q_len: none does).
int64_t first_query(const AttentionProblem& p, int64_t b, int64_t j) {
  if (!p.mask.key_lengths.empty() &&
      j >= p.mask.key_lengths[static_cast<size_t>(b)])
    return p.q_len;
  if (!p.mask.causal) return 0;
  return std::clamp<int64_t>(j - p.kv_len + p.q_len, 0, p.q_len);
}

// Runs f(i, t) for i = 0 .. n-1 on `threads` threads, t the thread's index
// (0 .. threads - 1).
void parallel_for(int64_t n, int threads,
                  const std::function<void(int64_t, int)>& f) {
  std::atomic<int64_t> next{0};
  auto work = [&](int t) {
    for (int64_t i = next++; i < n; i = next++) f(i, t);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------
// The sample.

struct Picker {
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  std::vector<SampledRow>* out;
  void add(int64_t b, int64_t h, int64_t n, const char* why) {
    if (seen.insert({b, h, n}).second) out->push_back({b, h, n, why});
  }
};

// Positions 0 .. N-1 along one axis: the first and last, tile boundaries of
// every block size, then what `extra` adds, then random positions until
// `rows` rows are chosen; each at a random (b, h) but the first and last
// (every (b, h) when there are at most 8).
std::vector<SampledRow> pick_rows(int64_t B, int64_t H, int64_t N,
                                  const SampleOptions& opt, Rng& rng,
                                  const std::function<void(Picker&)>& extra) {
  std::vector<SampledRow> rows;
  Picker pk{{}, &rows};
  auto any_bh = [&](int64_t n, const char* why) {
    pk.add(rng.uniform_int(0, B - 1), rng.uniform_int(0, H - 1), n, why);
  };
  for (int64_t n : {int64_t{0}, N - 1}) {
    const char* why = n == 0 ? "first" : "last";
    if (B * H <= 8) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) pk.add(b, h, n, why);
    } else {
      for (int r = 0; r < 4; ++r) any_bh(n, why);
    }
  }
  std::vector<int64_t> blocks = {16, 32, 64, 128, 256};
  for (int64_t b : opt.blocks)
    if (b > 1) blocks.push_back(b);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  // Every boundary (rows k blk - 1 and k blk) when they fit in half the
  // budget; else the first two, the last full block's, the last partial
  // block's first row, and random boundaries up to half the budget.
  std::vector<int64_t> all, must;
  for (int64_t blk : blocks) {
    const int64_t K = (N - 1) / blk;  // boundaries k blk, 1 <= k <= K
    for (int64_t k = 1; k <= K; ++k) {
      all.push_back(k * blk - 1);
      all.push_back(k * blk);
    }
    for (int64_t k : {int64_t{1}, int64_t{2}, K - 1, K})
      if (k >= 1 && k <= K) {
        must.push_back(k * blk - 1);
        must.push_back(k * blk);
      }
    if (N / blk >= 1 && N % blk != 0) must.push_back(N / blk * blk);
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const int64_t half = std::max<int64_t>(opt.rows / 2, 1);
  if (static_cast<int64_t>(all.size()) <= half) {
    for (int64_t n : all) any_bh(n, "tile boundary");
  } else {
    for (int64_t n : must) any_bh(n, "tile boundary");
    while (static_cast<int64_t>(rows.size()) < half)
      any_bh(all[static_cast<size_t>(
                 rng.uniform_int(0, static_cast<int64_t>(all.size()) - 1))],
             "tile boundary");
  }
  extra(pk);
  // Random rows; stop early when every row is in.
  const int64_t total = B * H * N;
  while (static_cast<int64_t>(rows.size()) < std::min(opt.rows, total)) {
    const size_t before = rows.size();
    any_bh(rng.uniform_int(0, N - 1), "random");
    if (rows.size() == before && static_cast<int64_t>(pk.seen.size()) >= total)
      break;
  }
  return rows;
}

bool zero_row(const std::vector<double>& x, int64_t row, int64_t D) {
  for (int64_t d = 0; d < D; ++d)
    if (x[static_cast<size_t>(row * D + d)] != 0) return false;
  return true;
}

// ---------------------------------------------------------------------------
// The pass: every query row's lse, delta, Del and sum |dS| / P in double,
// and dg with its channels, over the visible pairs.

// Partial sums over kChunk terms in double, merged into long double: each
// chunk's error is the probabilistic sum_units(kChunk) of its terms.
constexpr int64_t kChunk = 16;

// The pass's error, per f64 unit roundoff u (the derivation the header
// promises). The pass computes each logit as a correct f64 kernel does, to
// dS_ik = kDotUnits u A in the rule's model (it reads x_tilde rounded once
// from long double, so no divisor term), and l_i in chunked sums: lse_i is
// off by at most e = kDotUnits A + sum_units(kChunk) + 2 kOpUnits units
// (exp, log). A sampled key row's oracle forms S_ij exactly and P_ij =
// exp(S_ij - lse_i): every P_ij of row i scales by the same (1 - d lse_i),
// so dV_jd = sum_i P_ij dO_id moves by e u dv_mag. delta_i = sum_k P_ik dP_ik
// moves by sum_k P_ik (dS_ik - d lse_i) dP_ik = sum_k P_ik dS_ik (dP_ik -
// delta_i) - d lse_i delta_i, plus its own dots and chunked sums, u
// (sum_units(D) + sum_units(kChunk)) Del_i. So dS_ij = P_ij (dP_ij -
// delta_i) moves by at most
//   u e P_ij (|dP_ij - delta_i| + sum_k P_ik |dP_ik - delta_i|) + ...
// <= 2 e u (the softmax terms ds_mag: P_ij (|dP_ij - delta_i| + ds_l1 / 2))
//  + u (sum_units(D) + sum_units(kChunk)) (the magnitudes P_ij Del_i).
// soft_units = 2 e (also bounding dV's e), units = sum_units(D) +
// sum_units(kChunk); dg sums both over dg_scale.
void pass_units(double A, int64_t D, GivenRows* g) {
  const double e = kDotUnits * std::fabs(A) + sum_units(kChunk) + 2 * kOpUnits;
  g->soft_units = 2 * e;
  g->units = sum_units(static_cast<double>(D)) + sum_units(kChunk);
}

struct Pass {
  GivenRows rows;      // [B, H, Nq]
  OracleAttention dg;  // dg and its channels only
  double logit_shift = 0;
  double flops = 0;
};

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

// GCC's vector extensions: 4 doubles (AVX2) or 2 (SSE2).
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

bool has_avx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

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

Pass run_pass(const AttentionCase& c, double A, const std::vector<LD>& p_del,
              int threads) {
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
          for (int64_t j = 0; j < Nk; ++j) {
            LD t = 0;
            for (int64_t d = 0; d < D; ++d)
              t += wqv[d] * km.xt[static_cast<size_t>((bk * Nk + j) * D + d)];
            wk[static_cast<size_t>(bh * Nk + j)] =
                static_cast<double>(std::fabs(t));
          }
          for (int64_t i = 0; i < Nq; ++i) {
            LD t = 0;
            for (int64_t d = 0; d < D; ++d)
              t += wkv[d] * qm.xt[static_cast<size_t>((bh * Nq + i) * D + d)];
            wq[static_cast<size_t>(bh * Nq + i)] =
                static_cast<double>(std::fabs(t));
          }
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
  out.rows.ds_l1.assign(nrows, 0);
  out.rows.o_abs.assign(nrows, 0);
  pass_units(A, D, &out.rows);
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
  auto work = [&](int) {
    std::vector<double> S(static_cast<size_t>(kRows * Nk)),
        dP(static_cast<size_t>(kRows * Nk)), P(static_cast<size_t>(kRows * Nk)),
        O(static_cast<size_t>(kRows * D));
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
      (has_avx2() ? dots_avx2 : dots_base)(ba);
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
      }
      // O_i = sum_j P_ij v_j (for |dO_i|.|O_i|, the stored-O relative
      // channel), over the keys once per block.
      std::fill(O.begin(), O.end(), 0.0);
      (has_avx2() ? pv_avx2 : pv_base)(ba);
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
        LD delta = 0, del = 0;
        for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
          double t = 0, u = 0;
          for (int64_t j = j0; j < std::min(n, j0 + kChunk); ++j) {
            t += Pi[j] * dPi[j];
            u += Pi[j] * vn[static_cast<size_t>(bk * Nk + j)];
          }
          delta += t;
          del += u;
        }
        del *= don[r];  // sum_j P_ij ||dO_i|| ||v_j|| >= Del_i
        LD ds_l1 = 0;
        const double dl = static_cast<double>(delta);
        for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
          double t = 0;
          for (int64_t j = j0; j < std::min(n, j0 + kChunk); ++j)
            t += Pi[j] * std::fabs(dPi[j] - dl);
          ds_l1 += t;
        }
        out.rows.delta[r] = delta;
        out.rows.del[r] = del;
        out.rows.ds_l1[r] = ds_l1;
        out.rows.o_abs[r] = o_abs;
        // dg and its channels, as the oracle forms them per pair
        // (harness.cc), with |dO_i|.|v_j| bounded by ||dO_i|| ||v_j||.
        if (!learned) continue;
        // Three loops over the row, each running sum taking the same terms
        // in the same order as one loop would: seven long-double sums in one
        // loop overflowed the x87 stack, and the 80-bit spills cost more
        // than the dots (measured at n = 8192, D = 128).
        const double* kan_j = kan.data() + bk * Nk;
        const double* vn_j = vn.data() + bk * Nk;
        const double dn = don[r], d1 = dol1[r], dd = static_cast<double>(del);
        auto cm_of = [&](int64_t j) {
          return std::max(1.0, qan[r] * kan_j[j]);
        };
        LD dg = a.dg, scale = a.scale, o_sens = a.o_sens;
        for (int64_t j = 0; j < n; ++j) {
          const double pij = Pi[j], cm = cm_of(j);
          dg += static_cast<LD>(pij * (dPi[j] - dl)) * Si[j];
          scale += pij * (dn * vn_j[j] + dd) * cm;
          o_sens += pij * d1 * cm;
        }
        a.dg = dg, a.scale = scale, a.o_sens = o_sens;
        LD o_rel = a.o_rel, uf = a.uf;
        for (int64_t j = 0; j < n; ++j) {
          const double pij = Pi[j], cm = cm_of(j);
          o_rel += pij * o_abs * cm;
          uf += (pij * static_cast<double>(2 * D + 1) + 1) * cm + 1;
        }
        a.o_rel = o_rel, a.uf = uf;
        LD p_sens = a.p_sens, shift = a.shift;
        const double pd = static_cast<double>(p_del[r]);
        for (int64_t j = 0; j < n; ++j) {
          const double pij = Pi[j], adpd = std::fabs(dPi[j] - dl);
          if (pij > 0) p_sens += (adpd + pij * pd) * cm_of(j);
          if (layer) shift += pij * adpd * dc_of(j);  // dc_of is 0 otherwise
        }
        a.p_sens = p_sens, a.shift = shift;
      }
    }
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
  // C_ij = S_ij / s: dg = sum dS_ij C_ij (the dot held q_tilde . k_tilde).
  out.dg.given_units = out.rows.units;
  out.dg.given_soft_units = out.rows.soft_units;
  return out;
}

// ---------------------------------------------------------------------------
// Sub-cases.

// The heads of one side a sub-case keeps.
struct Heads {
  int64_t first = 0, count = 1;
};

// Copies rows [n0, n0 + n) of heads hs of batch b from a dense [B, Hx, N, D]
// tensor.
std::vector<double> slice(const std::vector<double>& x, int64_t Hx, int64_t N,
                          int64_t D, int64_t b, Heads hs, int64_t n0,
                          int64_t n) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(hs.count * n * D));
  for (int64_t h = hs.first; h < hs.first + hs.count; ++h) {
    const auto* src = x.data() + ((b * Hx + h) * N + n0) * D;
    out.insert(out.end(), src, src + n * D);
  }
  return out;
}

// A weight or bias of the side restricted to heads hs ([heads_x, D] shaped
// parameters; [D] and across-heads ones are kept whole).
std::vector<double> slice_param(const AttentionProblem& p,
                                const std::vector<double>& w, Heads hs) {
  if (w.empty() || p.norm.weight != ParamShape::kHeadDim ||
      p.norm.axis == NormAxis::kAllHeads)
    return w;
  const auto D = static_cast<size_t>(p.head_dim);
  return std::vector<double>(
      w.begin() + static_cast<ptrdiff_t>(hs.first * p.head_dim),
      w.begin() + static_cast<ptrdiff_t>((hs.first + hs.count) * p.head_dim));
  (void)D;
}

// The sub-case of queries [i0, i0 + nq) of heads qh and keys [j0, j0 + nk)
// of kv heads kh of batch b, without a mask (both ranges are what the rows
// see), or everything masked: nk = 0 (a fully masked query row i0, with
// every key padded away) or nq = 0 (key j0 that no query sees, with every
// query): the full oracle's subnormal counts cover every pair, masked or
// not, and so do these.
AttentionCase sub_case(const AttentionCase& c, int64_t b, Heads qh, Heads kh,
                       int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim, Hk = kv_heads_of(p);
  AttentionCase s;
  s.problem = p;
  s.problem.batch = 1;
  s.problem.heads = qh.count;
  s.problem.kv_heads = kh.count;
  s.problem.mask = {};
  if (nk == 0) {
    j0 = 0;
    nk = p.kv_len;
    s.problem.mask.key_lengths = {0};
  } else if (nq == 0) {
    i0 = 0;
    nq = p.q_len;
    s.problem.mask.key_lengths = {0};
  }
  s.problem.q_len = nq;
  s.problem.kv_len = nk;
  s.q = slice(c.q, p.heads, p.q_len, D, b, qh, i0, nq);
  s.d_o = slice(c.d_o, p.heads, p.q_len, D, b, qh, i0, nq);
  s.k = slice(c.k, Hk, p.kv_len, D, b, kh, j0, nk);
  s.v = slice(c.v, Hk, p.kv_len, D, b, kh, j0, nk);
  s.q_weight = slice_param(p, c.q_weight, qh);
  s.q_bias = slice_param(p, c.q_bias, qh);
  s.k_weight = slice_param(p, c.k_weight, kh);
  s.k_bias = slice_param(p, c.k_bias, kh);
  s.storage = c.storage;
  s.seed = c.seed;
  s.dist = c.dist;
  return s;
}

// Appends element e of table `from` to `to`, as element `full` of the whole
// tensor.
void append(ToleranceTable* to, const ToleranceTable& from, size_t e,
            int64_t full) {
  to->expected.push_back(from.expected[e]);
  to->delta.push_back(from.delta[e]);
  to->cond.push_back(from.cond[e]);
  to->masked_row.push_back(from.masked_row.empty() ? 0 : from.masked_row[e]);
  to->index_of.push_back(full);
}

ToleranceTable empty_table(Field f, Precision fmt, int64_t B, int64_t H,
                           int64_t rows, int64_t cols) {
  ToleranceTable t;
  t.field = f;
  t.fmt = fmt;
  t.B = B;
  t.H = H;
  t.rows = rows;
  t.cols = cols;
  return t;
}

const ToleranceTable& find(const std::vector<ToleranceTable>& ts, Field f) {
  for (const ToleranceTable& t : ts)
    if (t.field == f) return t;
  throw Error("sampled oracle", {}, std::string("no table ") + name(f));
}

}  // namespace

SampledOracle sampled_oracle(const AttentionCase& c, Precision s,
                             const SampleOptions& opt) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim, group = H / Hk;
  const bool all_heads =
      p.variant == Variant::kQKNorm && p.norm.axis == NormAxis::kAllHeads;
  SampledOracle so;
  so.options = opt;
  so.storage = s;
  Rng rng(opt.seed);
  so.query_rows = pick_rows(B, H, Nq, opt, rng, [&](Picker& pk) {
    for (int64_t b = 0; b < B; ++b) {  // fully masked rows: first and last
      int64_t first = -1, last = -1;
      for (int64_t i = 0; i < Nq; ++i)
        if (visible_keys(p, b, i) == 0) {
          if (first < 0) first = i;
          last = i;
        }
      if (first >= 0) {
        pk.add(b, rng.uniform_int(0, H - 1), first, "fully masked");
        pk.add(b, rng.uniform_int(0, H - 1), last, "fully masked");
      }
    }
    int zeros = 0;
    for (int64_t r = 0; r < B * H * Nq && zeros < 4; ++r)
      if (zero_row(c.q, r, D)) {
        pk.add(r / (H * Nq), (r / Nq) % H, r % Nq, "zero row");
        ++zeros;
      }
  });
  so.key_rows = pick_rows(B, Hk, Nk, opt, rng, [&](Picker& pk) {
    for (int64_t b = 0; b < B; ++b) {  // keys no query sees
      int64_t first = -1, last = -1;
      for (int64_t j = 0; j < Nk; ++j)
        if (first_query(p, b, j) >= Nq) {
          if (first < 0) first = j;
          last = j;
        }
      if (first >= 0) {
        pk.add(b, rng.uniform_int(0, Hk - 1), first, "seen by no query");
        pk.add(b, rng.uniform_int(0, Hk - 1), last, "seen by no query");
      }
    }
    int zeros = 0;
    for (int64_t r = 0; r < B * Hk * Nk && zeros < 4; ++r)
      if (zero_row(c.k, r, D)) {
        pk.add(r / (Hk * Nk), (r / Nk) % Hk, r % Nk, "zero row");
        ++zeros;
      }
  });

  // The whole case's logit amplitude, Qwen3's rounding flips and (from the
  // pass) LayerNorm's mean-shift logit change: every sampled row's tables
  // use them, as the full verdict does.
  so.amplitude = logit_amplitude(c);
  double flip = 0;
  if (p.variant == Variant::kQKNorm && p.norm.round_before_weight &&
      (s == Precision::kBF16 || s == Precision::kF16)) {
    const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
    flip = static_cast<double>(
        logit_flip(c, operand_mags(c, 0), operand_mags(c, 1), sc));
  }
  const auto t0 = Clock::now();
  const std::vector<LD> p_del = row_p_del(c);
  Pass pass = run_pass(c, so.amplitude, p_del, opt.threads);
  so.pass_seconds = seconds_since(t0);
  so.pass_flops = pass.flops;
  so.given_units = pass.rows.units + pass.rows.soft_units;
  auto scope = [&](OracleAttention* o) {
    o->amplitude = so.amplitude;
    o->count_q_len = Nq;
    o->count_kv_len = Nk;
    o->logit_flip = flip;
    o->logit_shift = pass.logit_shift;
  };

  // The sampled rows' sub-cases, on both cores.
  const auto t1 = Clock::now();
  const size_t nqr = so.query_rows.size(), nkr = so.key_rows.size();
  std::vector<std::vector<ToleranceTable>> sub(nqr + nkr);
  std::vector<int64_t> sub_head(nqr + nkr, 0);
  std::vector<std::string> errors(nqr + nkr);
  std::vector<double> cpu(nqr + nkr, 0);
  // One oracle workspace per thread: its n x D arrays are allocated once,
  // not once per sub-case.
  std::vector<OracleWorkspace> workspaces(
      static_cast<size_t>(std::max(1, opt.threads)));
  const auto items = static_cast<int64_t>(nqr + nkr);
  parallel_for(items, opt.threads, [&](int64_t w, int t) {
    OracleWorkspace* ws = &workspaces[static_cast<size_t>(t)];
    const double cpu0 = thread_cpu_seconds();
    try {
      if (static_cast<size_t>(w) < nqr) {
        const SampledRow& r = so.query_rows[static_cast<size_t>(w)];
        const Heads qh = all_heads ? Heads{0, H} : Heads{r.h, 1};
        const Heads kh = all_heads ? Heads{0, Hk} : Heads{r.h / group, 1};
        const int64_t n = visible_keys(p, r.b, r.n);
        const AttentionCase sc = sub_case(c, r.b, qh, kh, r.n, 1, 0, n);
        OracleAttention o =
            oracle_attention(sc, nullptr, {Nq, Nk, true, false}, ws);
        scope(&o);
        sub[static_cast<size_t>(w)] = attention_tolerances(sc, s, o, false);
        sub_head[static_cast<size_t>(w)] = all_heads ? r.h : 0;
      } else {
        const SampledRow& r = so.key_rows[static_cast<size_t>(w) - nqr];
        const Heads qh = all_heads ? Heads{0, H} : Heads{r.h * group, group};
        const Heads kh = all_heads ? Heads{0, Hk} : Heads{r.h, 1};
        const int64_t i0 = first_query(p, r.b, r.n);
        const AttentionCase sc = sub_case(c, r.b, qh, kh, i0, Nq - i0, r.n, 1);
        OracleAttention o;
        if (i0 < Nq) {
          GivenRows g;
          g.units = pass.rows.units;
          g.soft_units = pass.rows.soft_units;
          for (int64_t h = qh.first; h < qh.first + qh.count; ++h)
            for (int64_t i = i0; i < Nq; ++i) {
              const auto row = static_cast<size_t>((r.b * H + h) * Nq + i);
              g.lse.push_back(pass.rows.lse[row]);
              g.delta.push_back(pass.rows.delta[row]);
              g.del.push_back(pass.rows.del[row]);
              g.ds_l1.push_back(pass.rows.ds_l1[row]);
              g.o_abs.push_back(pass.rows.o_abs[row]);
              g.p_del.push_back(p_del[row]);
            }
          o = oracle_attention(sc, &g, {Nq, Nk, false, true}, ws);
        } else {
          o = oracle_attention(sc, nullptr, {Nq, Nk, false, true}, ws);
        }
        scope(&o);
        sub[static_cast<size_t>(w)] = attention_tolerances(sc, s, o, false);
        sub_head[static_cast<size_t>(w)] = all_heads ? r.h : 0;
      }
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(w)] = e.what();
    }
    cpu[static_cast<size_t>(w)] = thread_cpu_seconds() - cpu0;
  });
  for (const std::string& e : errors)
    if (!e.empty()) throw Error("sampled oracle", {}, e);
  so.rows_seconds = seconds_since(t1);
  for (double x : cpu) so.rows_cpu_seconds += x;

  // Gather the sampled rows' elements into tables of the whole tensors.
  const Precision wf = compute_format(s);
  ToleranceTable to = empty_table(Field::kO, s, B, H, Nq, D),
                 tl = empty_table(Field::kLse, wf, B, H, Nq, 1),
                 tq = empty_table(Field::kDq, s, B, H, Nq, D),
                 tk = empty_table(Field::kDk, s, B, Hk, Nk, D),
                 tv = empty_table(Field::kDv, s, B, Hk, Nk, D);
  for (size_t w = 0; w < nqr; ++w) {
    const SampledRow& r = so.query_rows[w];
    const auto hs = static_cast<size_t>(sub_head[w]);
    const int64_t row = (r.b * H + r.h) * Nq + r.n;
    for (int64_t d = 0; d < D; ++d) {
      const size_t e = hs * static_cast<size_t>(D) + static_cast<size_t>(d);
      append(&to, find(sub[w], Field::kO), e, row * D + d);
      append(&tq, find(sub[w], Field::kDq), e, row * D + d);
    }
    append(&tl, find(sub[w], Field::kLse), hs, row);
  }
  for (size_t w = 0; w < nkr; ++w) {
    const SampledRow& r = so.key_rows[w];
    const auto hs = static_cast<size_t>(sub_head[nqr + w]);
    const int64_t row = (r.b * Hk + r.h) * Nk + r.n;
    for (int64_t d = 0; d < D; ++d) {
      const size_t e = hs * static_cast<size_t>(D) + static_cast<size_t>(d);
      append(&tk, find(sub[nqr + w], Field::kDk), e, row * D + d);
      append(&tv, find(sub[nqr + w], Field::kDv), e, row * D + d);
    }
  }
  so.tables = {std::move(to), std::move(tl), std::move(tq), std::move(tk),
               std::move(tv)};
  if (p.variant == Variant::kQKNorm && !p.fixed_scale) {
    OracleAttention g = pass.dg;
    scope(&g);
    so.tables.push_back(attention_dg_tolerance(c, s, g));
  }
  // The lse range's slack: the rule's lse bound with |lse| <= log n + A.
  {
    OracleAttention o;
    scope(&o);
    const double uc = compute_roundoff(s);
    const double A = so.amplitude;
    double div = 0;
    if (p.variant == Variant::kQKNorm &&
        (p.norm.kind == NormKind::kRms || p.norm.kind == NormKind::kLayer))
      div = static_cast<double>(norm_rows(p, 0).len() - 1) / 2 +
            static_cast<double>(norm_rows(p, 1).len() - 1) / 2 + 2 * kOpUnits;
    so.lse_units = (kDotUnits + div) * std::fabs(A) +
                   sum_units(static_cast<double>(Nk)) + pass.logit_shift;
    so.lse_abs = flip + kOpUnits * ulp(wf, 0);
    (void)uc;
  }
  return so;
}

std::string SampledOracle::describe() const {
  auto counts = [](const std::vector<SampledRow>& rows) {
    std::vector<std::pair<std::string, int>> c;
    for (const SampledRow& r : rows) {
      auto it = std::find_if(c.begin(), c.end(),
                             [&](const auto& x) { return x.first == r.why; });
      if (it == c.end())
        c.push_back({r.why, 1});
      else
        ++it->second;
    }
    std::string s;
    for (const auto& [k, n] : c)
      s += (s.empty() ? "" : ", ") + k + " " + std::to_string(n);
    return s;
  };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "; pass %.3g flops in %.1f s (error channel %.0f u_f64), rows "
                "in %.1f s",
                pass_flops, pass_seconds, given_units, rows_seconds);
  return "sample seed " + std::to_string(options.seed) + ": " +
         std::to_string(query_rows.size()) + " query rows (" +
         counts(query_rows) + "), " + std::to_string(key_rows.size()) +
         " key rows (" + counts(key_rows) + ")" + buf;
}

AgreementReport judge_sampled(const AttentionCase& c, const SampledOracle& so,
                              const AttentionResult& er,
                              const std::string& entry_name) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim, group = H / Hk;
  const Precision s = so.storage;
  const Precision wf = compute_format(s);
  const double uc = compute_roundoff(s), c_res = ulp(wf, 0);
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.case_desc = c.describe() + " [" + so.describe() + "]";
  for (const ToleranceTable& t : so.tables) {
    const std::span<const double> all = field_values(er, t.field);
    std::vector<double> actual(t.index_of.empty() ? all.size()
                                                  : t.index_of.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      const size_t at =
          t.index_of.empty() ? i : static_cast<size_t>(t.index_of[i]);
      actual[i] =
          at < all.size() ? all[at] : std::numeric_limits<double>::quiet_NaN();
    }
    FieldVerdict v = judge_field(t, actual, nullptr);
    if (v.worst_index >= 0 && !t.index_of.empty())
      v.worst_index = t.index_of[static_cast<size_t>(v.worst_index)];
    v.amplitude = so.amplitude;
    rep.fields.push_back(std::move(v));
  }
  // The O(n D) properties of every row.
  auto property = [&](Field id, const char* label) {
    FieldVerdict v;
    v.id = id;
    v.field = std::string(name(id)) + "[all rows: " + label + "]";
    v.amplitude = so.amplitude;
    return v;
  };
  // Counts one judged element. describe() gives its (where, why) and runs
  // only for the field's first failure or a new worst: the properties below
  // judge up to B H Nq D elements (16.8M at 1x4x32768x128), and formatting
  // every one took about a quarter of an entry's time at n = 8192.
  auto note = [](FieldVerdict* v, double margin, double expected, double actual,
                 double bound, const auto& describe) {
    ++v->count;
    const bool fail = !(margin <= 1);
    const bool worst = !(margin <= v->margin);
    if (!(fail && v->failures == 0) && !worst) {
      if (fail) ++v->failures;
      return;
    }
    const auto [where, why] = describe();
    if (fail) {
      if (v->failures == 0) v->diagnosis = why;
      ++v->failures;
    }
    if (worst) {
      v->margin = margin;
      v->worst_where = where;
      v->worst_expected = expected;
      v->worst_actual = actual;
      v->worst_bound = bound;
    }
  };
  auto idx = [](int64_t b, int64_t h, int64_t n, int64_t d) {
    char buf[96];
    if (d < 0)
      std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld]", (long long)b,
                    (long long)h, (long long)n);
    else
      std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld,%lld]", (long long)b,
                    (long long)h, (long long)n, (long long)d);
    return std::string(buf);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // In f16 storage a gradient may exceed the format's range (a zero row's
  // du / eps with eps = 1e-12): the full verdict accepts the infinity where
  // the oracle's value overflows, and outside the sample the oracle's value
  // is unknown, so there an infinity (never a NaN) in dq, dk, dv is counted
  // as not representable instead of failed.
  auto grad_overflow = [&](double x) {
    return s == Precision::kF16 && std::isinf(x);
  };
  // Finite everywhere; fully masked rows exactly O = 0, lse = -inf, dQ = 0.
  {
    FieldVerdict v = property(Field::kO, "finite, masked rows defined");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Nq; ++i) {
          const int64_t row = (b * H + h) * Nq + i;
          const bool masked = visible_keys(p, b, i) == 0;
          const double l = er.lse[static_cast<size_t>(row)];
          if (masked ? !(l == -inf) : !std::isfinite(l))
            note(&v, inf, masked ? -inf : 0, l, 0, [&] {
              const std::string w = "lse" + idx(b, h, i, -1);
              return std::pair(w, w + " is " + std::to_string(l) +
                                      (masked ? " on a fully masked row "
                                                "(defined: -inf)"
                                              : ", not finite"));
            });
          for (int64_t d = 0; d < D; ++d) {
            const auto e = static_cast<size_t>(row * D + d);
            for (int f = 0; f < 2; ++f) {
              const double x = f == 0 ? er.o[e] : er.dq[e];
              const char* nm = f == 0 ? "o" : "dq";
              if (f == 1 && !masked && grad_overflow(x)) {
                ++v.not_representable;
                continue;
              }
              if (masked ? x != 0 : !std::isfinite(x))
                note(&v, inf, 0, x, 0, [&] {
                  const std::string w = nm + idx(b, h, i, d);
                  return std::pair(w, w + " = " + std::to_string(x) +
                                          (masked ? " on a fully masked row "
                                                    "(defined: 0)"
                                                  : ", not finite"));
                });
            }
          }
        }
    for (size_t e = 0; e < er.dk.size(); ++e)
      for (int f = 0; f < 2; ++f) {
        const double x = f == 0 ? er.dk[e] : er.dv[e];
        if (grad_overflow(x)) {
          ++v.not_representable;
          continue;
        }
        if (!std::isfinite(x)) {
          const auto r = static_cast<int64_t>(e) / D;
          const std::string w = std::string(f == 0 ? "dk" : "dv") +
                                idx(r / (Hk * Nk), (r / Nk) % Hk, r % Nk,
                                    static_cast<int64_t>(e) % D);
          note(&v, inf, 0, x, 0,
               [&] { return std::pair(w, w + " is not finite"); });
        }
      }
    for (Field f : {Field::kDg, Field::kDqWeight, Field::kDkWeight,
                    Field::kDqBias, Field::kDkBias}) {
      const std::span<const double> x = field_values(er, f);
      for (size_t e = 0; e < x.size(); ++e)
        if (!std::isfinite(x[e]))
          note(&v, inf, 0, x[e], 0, [&] {
            const std::string w =
                std::string(name(f)) + "[" + std::to_string(e) + "]";
            return std::pair(w, w + " is not finite");
          });
    }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  // Non-saturation: every logit lies in [-A, A], so lse_i lies in log(n_i)
  // +- A, with the rule's lse bound as slack.
  {
    FieldVerdict v = property(Field::kLse, "log n +- A");
    const double A = std::fabs(so.amplitude);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t n = visible_keys(p, b, i);
        if (n == 0) continue;
        const double ln = std::log(static_cast<double>(n));
        const double mag = std::fabs(ln) + A;
        const double slack = uc * (so.lse_units + 2 * mag) + so.lse_abs +
                             half_spacing(wf, mag, 0);
        for (int64_t h = 0; h < H; ++h) {
          const double l = er.lse[static_cast<size_t>((b * H + h) * Nq + i)];
          if (!std::isfinite(l)) continue;  // judged above
          const double out = std::max(0.0, std::fabs(l - ln) - A);
          const double margin = slack > 0 ? out / slack : (out > 0 ? inf : 0);
          note(&v, margin, ln, l, A + slack, [&] {
            char why[200];
            std::snprintf(why, sizeof why,
                          "lse%s = %.17g outside log(%lld) +- A = %.17g +- "
                          "%.6g (slack %.3e)",
                          idx(b, h, i, -1).c_str(), l, (long long)n, ln, A,
                          slack);
            return std::pair("lse" + idx(b, h, i, -1), std::string(why));
          });
        }
      }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  // O_id is a convex combination of the visible v_jd (a key prefix): it lies
  // within their range, up to the row sum's rounding (sum_units(n) + the
  // final operations, relative to max |v_jd|) and the subnormal resolution.
  {
    FieldVerdict v = property(Field::kO, "within the visible v");
    std::vector<double> lo(static_cast<size_t>(Nk * D)),
        hi(static_cast<size_t>(Nk * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < Hk; ++hk) {
        const double* vb = c.v.data() + (b * Hk + hk) * Nk * D;
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t d = 0; d < D; ++d) {
            const auto e = static_cast<size_t>(j * D + d);
            const double x = vb[e];
            lo[e] = j == 0 ? x : std::min(lo[e - static_cast<size_t>(D)], x);
            hi[e] = j == 0 ? x : std::max(hi[e - static_cast<size_t>(D)], x);
          }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i = 0; i < Nq; ++i) {
            const int64_t n = visible_keys(p, b, i);
            if (n == 0) continue;
            const double units = sum_units(static_cast<double>(n)) + kOpUnits;
            for (int64_t d = 0; d < D; ++d) {
              const auto e = static_cast<size_t>((n - 1) * D + d);
              const double x =
                  er.o[static_cast<size_t>(((b * H + h) * Nq + i) * D + d)];
              if (!std::isfinite(x)) continue;  // judged above
              const double top = std::max(std::fabs(lo[e]), std::fabs(hi[e]));
              const double slack =
                  uc * units * top +
                  c_res * (static_cast<double>(n) + 2 + kOpUnits) +
                  half_spacing(s, top, 0);
              const double out = std::max({0.0, lo[e] - x, x - hi[e]});
              const double margin = out / slack;
              note(&v, margin, x < lo[e] ? lo[e] : hi[e], x, slack, [&] {
                char why[220];
                std::snprintf(why, sizeof why,
                              "o%s = %.17g outside the visible v's range "
                              "[%.17g, %.17g] (slack %.3e)",
                              idx(b, h, i, d).c_str(), x, lo[e], hi[e], slack);
                return std::pair("o" + idx(b, h, i, d), std::string(why));
              });
            }
          }
      }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  rep.pass = true;
  rep.margin = 0;
  for (const FieldVerdict& f : rep.fields) {
    rep.pass = rep.pass && f.pass;
    if (f.margin > rep.margin || rep.worst_field.empty()) {
      rep.margin = std::max(rep.margin, f.margin);
      rep.worst_field = f.field;
    }
  }
  return rep;
}

}  // namespace qknorm::validation
