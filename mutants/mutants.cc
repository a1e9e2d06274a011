#include "mutants/mutants.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>

#include "qknorm/name_table.h"
#include "qknorm/precision.h"

namespace qknorm::property {
namespace {

// Gathers a strided [B,H,rows,D] storage tensor into dense T.
template <class T>
std::vector<T> gather(Precision s, const ConstTensor4& t, int64_t B, int64_t H,
                      int64_t rows, int64_t D) {
  std::vector<T> out(static_cast<size_t>(B * H * rows * D));
  size_t idx = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        const int64_t base = b * t.layout.batch_stride +
                             h * t.layout.head_stride + n * t.layout.row_stride;
        for (int64_t d = 0; d < D; ++d)
          out[idx++] =
              static_cast<T>(decode(s, t.data, static_cast<size_t>(base + d)));
      }
  return out;
}

// Stores dense T into strided storage; `truncate_bf16` is the bug of
// Highway 1.0.3's BF16FromF32 / DemoteTo (drops the low 16 bits).
template <class T>
void scatter(Precision s, const std::vector<T>& src, const MutTensor4& t,
             int64_t B, int64_t H, int64_t rows, int64_t D,
             bool truncate_bf16) {
  size_t idx = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < rows; ++n) {
        const int64_t base = b * t.layout.batch_stride +
                             h * t.layout.head_stride + n * t.layout.row_stride;
        for (int64_t d = 0; d < D; ++d) {
          const double x = static_cast<double>(src[idx++]);
          const size_t at = static_cast<size_t>(base + d);
          if (truncate_bf16 && s == Precision::kBF16) {
            const float f = static_cast<float>(x);
            uint32_t u;
            std::memcpy(&u, &f, 4);
            static_cast<uint16_t*>(t.data)[at] = static_cast<uint16_t>(u >> 16);
          } else {
            encode(s, x, t.data, at);
          }
        }
      }
}

ConstTensor4 as4(const ConstTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}
MutTensor4 as4(const MutTensor2& t) {
  return {t.data, t.size, {0, 0, t.row_stride}};
}

// Which reduction a sum_products() call computes: some mutants and controls
// act on some of them only.
enum class Sum {
  kNorm,    // sum of squares of a scaled row (nrm2)
  kLogit,   // q_hat . k_hat (the QK^T GEMM)
  kRowSum,  // softmax denominator, sum_j e_j
  kPV,      // sum_j e_j v_j (the PV GEMM)
  kDelta,   // dO_i . O_i
  kDP,      // dO_i . v_j (the dO V^T GEMM)
  kDV,      // sum_i P_ij dO_i (the P^T dO GEMM)
  kDQ,      // sum_j dS_ij k_hat_j (the dS K GEMM)
  kDK,      // sum_i dS_ij q_hat_i (the dS^T Q GEMM)
  kDG,      // sum_ij dS_ij C_ij
  kProj,    // u . du (normalization backward)
  kDot,     // ScaleNorm dy . u
};

bool is_gemm(Sum s) {
  return s == Sum::kLogit || s == Sum::kPV || s == Sum::kDP || s == Sum::kDV ||
         s == Sum::kDQ || s == Sum::kDK;
}

// x rounded to nearest even with `frac_bits` fraction bits (any exponent):
// TF32 operands (10 bits) and a 12-bit rsqrt estimate (11 bits).
template <class T>
T round_significand(T x, int frac_bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e;
  const T m = std::frexp(x, &e);  // |m| in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(m, frac_bits + 1)),
                    e - frac_bits - 1);
}

template <class T>
T round_prec(Precision p, T x) {
  return static_cast<T>(round_to(p, static_cast<double>(x)));
}

// Minimax cubic for 2^f on [0, 1] (Lawson iteration, relative error
// <= 7.5e-5): the kCheapExp mutant's polynomial.
constexpr double kExp2Cubic[4] = {0.99992523, 0.69583347, 0.22606720,
                                  0.078024567};

// Key and query block of the blocked mutants and the blocked control.
constexpr int64_t kBlock = 16;
// Key tile of the online softmax of the plain copy.
constexpr int64_t kTile = 4;
// The shape mutants' blocks (issue 33): the query block whose half-block
// tail half_block_tail_dq mishandles, the key block long_masked_run_nan
// starts from, and the head_dim from which stale_dq_head_dim_256 takes its
// split-accumulator path.
constexpr int64_t kTailQueryBlock = 128;
constexpr int64_t kLongRunBlock = 128;
constexpr int64_t kLargeHeadDim = 256;
// The decode mutant's split-KV path: taken for q_len <= kDecodeMaxQ, over
// key chunks of kSplitKvChunk (so with two chunks or more from kv_len 257).
constexpr int64_t kDecodeMaxQ = 16;
constexpr int64_t kSplitKvChunk = 256;

// ExecConfig::threads = 0: the number of cores.
int64_t hardware_threads() {
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

// Reference-style loops with one switchable bug, or one control variant.
template <class T>
class Kernel {
 public:
  Kernel(Bug bug, bool active, Control control, int threads)
      : bug_(bug), active_(active), control_(control), threads_(threads) {}

  bool on(Bug b) const { return active_ && bug_ == b; }

  bool visible(const AttentionProblem& p, int64_t b, int64_t i,
               int64_t j) const {
    const int64_t shift = p.kv_len - p.q_len;
    if (p.mask.causal &&
        (on(Bug::kCausalOffByOne) ? j >= i + shift : j > i + shift))
      return false;
    if (!p.mask.key_lengths.empty()) {
      int64_t len = p.mask.key_lengths[static_cast<size_t>(b)];
      if (on(Bug::kPaddingDropsLastKey)) len -= 1;
      // The mutant: a key length of 0 read as "not given" (no padding).
      if (on(Bug::kPadZeroMeansUnpadded) && len == 0) len = p.kv_len;
      if (j >= len) return false;
    }
    return true;
  }

  // The (batch, kv head) slice query head hd of batch b reads: GQA query
  // head hd uses kv head hd / (heads / kv_heads); without GQA, its own.
  static int64_t kv_slice(const AttentionProblem& p, int64_t b, int64_t hd) {
    const int64_t hk = kv_heads_of(p);
    return b * hk + hd / (p.heads / hk);
  }

  // The long-masked-run mutant's region: row i of batch b sees some key but
  // not one of the last kLongRunBlock keys (the kernel's first key block,
  // last to first, is fully masked).
  bool masked_last_block(const AttentionProblem& p, int64_t b,
                         int64_t i) const {
    if (p.kv_len < kLongRunBlock) return false;
    for (int64_t j = p.kv_len - kLongRunBlock; j < p.kv_len; ++j)
      if (visible(p, b, i, j)) return false;
    return true;
  }

  T eps(double e) const {
    return on(Bug::kF16EpsUnderflow)
               ? static_cast<T>(round_to(Precision::kF16, e))
               : static_cast<T>(e);
  }

  // exp, or the mutant's / control's variant of it.
  T ex(T x) const {
    if (on(Bug::kCheapExp)) {
      // 2^t, t = x log2(e) = n + f: 2^f by the cubic, 2^n exact.
      const T t = x * static_cast<T>(1.4426950408889634);
      if (!(t > -160)) return 0;  // also -inf
      if (t > 160) return std::numeric_limits<T>::infinity();
      const T n = std::floor(t), f = t - n;
      const T c0 = static_cast<T>(kExp2Cubic[0]),
              c1 = static_cast<T>(kExp2Cubic[1]),
              c2 = static_cast<T>(kExp2Cubic[2]),
              c3 = static_cast<T>(kExp2Cubic[3]);
      return std::ldexp(c0 + f * (c1 + f * (c2 + f * c3)), static_cast<int>(n));
    }
    if (on(Bug::kF64ExpInF32))
      return static_cast<T>(std::exp(static_cast<float>(x)));
    const T e = std::exp(x);
    if (control_ == Control::kExp2Ulp && e > 0 &&
        e < std::numeric_limits<T>::max() / 4) {
      // 2 ulp up or down, by a hash of x's bits: a deterministic exp with a
      // 2.5 ulp error bound (glibc's own <= 1 ulp plus 2).
      uint64_t bits = 0;
      std::memcpy(&bits, &x, sizeof x);
      const T dir = (bits * 0x9E3779B97F4A7C15ull) >> 63
                        ? std::numeric_limits<T>::infinity()
                        : T(0);
      return std::nextafter(std::nextafter(e, dir), dir);
    }
    return e;
  }

  // Rounding of an accumulator after each addition: the 16-bit-register
  // mutants, and the f32 accumulators of the 16-bit control.
  T acc_round(Sum kind, T x) const {
    const bool fwd_acc = kind == Sum::kPV || kind == Sum::kRowSum;
    if (on(Bug::kPvAccumBf16) && fwd_acc)
      return round_prec(Precision::kBF16, x);
    if (on(Bug::kDvAccumBf16) && kind == Sum::kDV)
      return round_prec(Precision::kBF16, x);
    if (control_ == Control::kF32Accum && (fwd_acc || kind == Sum::kDV))
      return static_cast<T>(static_cast<float>(x));
    return x;
  }

  enum class Order { kForward, kReversed, kPairwise, kBlocked, kFma };
  Order order(Sum kind) const {
    if (on(Bug::kThreadDependentOrder) && threads_ != 1 && kind == Sum::kDK)
      return Order::kReversed;
    switch (control_) {
      case Control::kReversed:
        return Order::kReversed;
      case Control::kPairwise:
        return Order::kPairwise;
      case Control::kBlocked:
        return Order::kBlocked;
      case Control::kFma:
        return Order::kFma;
      default:
        return Order::kForward;
    }
  }

  // sum_{i < n} a(i) * b(i) in this copy's order; every reduction of the
  // kernel goes through here.
  template <class A, class B>
  T sum_products(Sum kind, int64_t n, const A& a, const B& b) const {
    const bool tf32 = on(Bug::kTf32Matmul) && is_gemm(kind);
    auto term = [&](int64_t i) {
      if (tf32)
        return round_significand(a(i), 10) * round_significand(b(i), 10);
      return a(i) * b(i);
    };
    T s = 0;
    switch (order(kind)) {
      case Order::kForward:
        for (int64_t i = 0; i < n; ++i) s = acc_round(kind, s + term(i));
        return s;
      case Order::kReversed:
        for (int64_t i = n - 1; i >= 0; --i) s += term(i);
        return s;
      case Order::kPairwise:
        return n == 0 ? T(0) : pairwise(0, n, term);
      case Order::kBlocked:
        for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
          T part = 0;
          for (int64_t i = i0; i < std::min(n, i0 + kBlock); ++i)
            part += term(i);
          s += part;
        }
        return s;
      case Order::kFma:
        for (int64_t i = 0; i < n; ++i) s = std::fma(a(i), b(i), s);
        return s;
    }
    return s;
  }

  template <class F>
  static T pairwise(int64_t lo, int64_t hi, const F& term) {
    if (hi - lo == 1) return term(lo);
    if (hi - lo == 2) return term(lo) + term(lo + 1);
    const int64_t mid = lo + (hi - lo) / 2;
    return pairwise(lo, mid, term) + pairwise(mid, hi, term);
  }

  T dot(Sum kind, const T* a, const T* b, int64_t n) const {
    return sum_products(
        kind, n, [a](int64_t i) { return a[i]; },
        [b](int64_t i) { return b[i]; });
  }

  T nrm2(const T* x, int64_t n) const {
    T amax = 0;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0) return 0;
    auto scaled = [x, amax](int64_t i) { return x[i] / amax; };
    const T s = sum_products(Sum::kNorm, n, scaled, scaled);
    return amax * std::sqrt(s);
  }

  // u = x / max(||x||, eps) (or the bug's denominator); returns ||x||.
  T normalize(const T* x, int64_t n, T e, T* u) const {
    // The mutant: the one-element fast path takes the norm of x as x.
    const T nrm = on(Bug::kHeadDim1SignedNorm) && n == 1 ? x[0] : nrm2(x, n);
    const T den = on(Bug::kEpsInSquaredNorm) ? std::sqrt(nrm * nrm + e)
                                             : std::max(nrm, e);
    for (int64_t i = 0; i < n; ++i) u[i] = x[i] / den;
    return nrm;
  }

  // du -> dx in place.
  void normalize_backward(const T* u, T nrm, T e, int64_t n, T* du,
                          bool clamp_by_norm) const {
    if (nrm > e) {
      const T c =
          on(Bug::kMissingNormBackwardTerm) ? T(0) : dot(Sum::kProj, u, du, n);
      // The mutant: rows whose unscaled f32 sum of squares would overflow or
      // underflow (norm beyond 2^+-64) get 1 / ||x|| recomputed on a
      // rescaling fallback path that uses a 12-bit reciprocal square root
      // estimate (rsqrtps without its Newton step).
      const T far = static_cast<T>(0x1p64);
      if (on(Bug::kFarNormRsqrtEstimate) && (nrm > far || nrm < 1 / far)) {
        const T inv = round_significand(1 / nrm, 11);
        for (int64_t i = 0; i < n; ++i) du[i] = (du[i] - u[i] * c) * inv;
        return;
      }
      for (int64_t i = 0; i < n; ++i) du[i] = (du[i] - u[i] * c) / nrm;
    } else {
      const T clamp =
          on(Bug::kClampEpsBf16Backward) ? round_prec(Precision::kBF16, e) : e;
      for (int64_t i = 0; i < n; ++i)
        du[i] = du[i] / (clamp_by_norm ? nrm : clamp);
    }
  }

  struct Head {
    std::vector<T> qh, kh, vh, qn, kn;
    T scale = 1;
    // The row index the causal mask sees is row + mask_row (packed_rows).
    int64_t mask_row = 0;
  };

  // The MQA mutant: with one kv head, the kernel packs the H query heads
  // into one sequence of H * Nq rows against it (one GEMM instead of H) and
  // applies the causal mask to the packed row index, so query head hd's row
  // i is masked as row hd * Nq + i. Every other problem: 0.
  int64_t packed_rows(const AttentionProblem& p, int64_t hd) const {
    return on(Bug::kMqaPackedRowsCausal) && kv_heads_of(p) == 1 && p.heads > 1
               ? hd * p.q_len
               : 0;
  }

  void operands(const AttentionProblem& p, const T* q, const T* k, const T* v,
                Head* h) const {
    const int64_t D = p.head_dim;
    h->qh.assign(q, q + p.q_len * D);
    h->kh.assign(k, k + p.kv_len * D);
    h->vh.assign(v, v + p.kv_len * D);
    h->qn.assign(static_cast<size_t>(p.q_len), 0);
    h->kn.assign(static_cast<size_t>(p.kv_len), 0);
    if (p.variant == Variant::kQKNorm) {
      const T e = eps(p.eps);
      for (int64_t i = 0; i < p.q_len; ++i)
        h->qn[i] = normalize(q + i * D, D, e, h->qh.data() + i * D);
      for (int64_t j = 0; j < p.kv_len; ++j)
        h->kn[j] = normalize(k + j * D, D, e, h->kh.data() + j * D);
      if (on(Bug::kNormalizesV))
        for (int64_t j = 0; j < p.kv_len; ++j)
          normalize(v + j * D, D, e, h->vh.data() + j * D);
      const T g = on(Bug::kGBf16) ? round_prec(Precision::kBF16, T(p.g))
                                  : static_cast<T>(p.g);
      h->scale = on(Bug::kInvSqrtD) ? T(1) / std::sqrt(static_cast<T>(D))
                 : on(Bug::kGTwice) ? g * g
                                    : g;
    } else {
      h->scale = T(1) / std::sqrt(static_cast<T>(D));
    }
  }

  T logit(const AttentionProblem& p, const Head& h, int64_t i,
          int64_t j) const {
    const int64_t D = p.head_dim;
    return h.scale *
           dot(Sum::kLogit, h.qh.data() + i * D, h.kh.data() + j * D, D);
  }

  // Logits of row i into s; masked keys get -inf; returns the visible count.
  int64_t logits(const AttentionProblem& p, const Head& h, int64_t b, int64_t i,
                 T* s) const {
    int64_t m = 0;
    for (int64_t j = 0; j < p.kv_len; ++j) {
      if (!visible(p, b, i + h.mask_row, j)) {
        // -1e9 as the fill value, stored in f16 by the f16-mask bug: -inf.
        s[j] = on(Bug::kF16MaskToInf)
                   ? static_cast<T>(round_to(Precision::kF16, -1e9))
                   : -std::numeric_limits<T>::infinity();
        continue;
      }
      s[j] = logit(p, h, i, j);
      ++m;
    }
    return m;
  }

  // Key tile of the online softmax: the blocked variants use blocks of 16,
  // the pairwise control the whole row (two passes).
  int64_t tile(int64_t Nk) const {
    if (control_ == Control::kBlocked || on(Bug::kTailKeyBlockDrop))
      return kBlock;
    if (control_ == Control::kPairwise) return std::max<int64_t>(Nk, 1);
    return kTile;
  }

  void forward(const AttentionProblem& p, const T* q, const T* k, const T* v,
               T* o, T* lse) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const int64_t tl = tile(Nk), ntiles = (Nk + tl - 1) / tl;
    const bool reversed = control_ == Control::kReversed;
    Head h;
    std::vector<T> s(static_cast<size_t>(Nk)), e(static_cast<size_t>(Nk)),
        acc(static_cast<size_t>(D));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd, kvh = kv_slice(p, b, hd);
        operands(p, q + bh * Nq * D, k + kvh * Nk * D, v + kvh * Nk * D, &h);
        h.mask_row = packed_rows(p, hd);
        for (int64_t i = 0; i < Nq; ++i) {
          T* oi = o + (bh * Nq + i) * D;
          const int64_t m = logits(p, h, b, i, s.data());
          if (m == 0 && !on(Bug::kF16MaskToInf)) {
            std::fill(oi, oi + D, T(0));
            lse[bh * Nq + i] = -std::numeric_limits<T>::infinity();
            continue;
          }
          std::fill(acc.begin(), acc.end(), T(0));
          T mx = -std::numeric_limits<T>::infinity(), sum = 0;
          // Online softmax over key tiles (flash-attention style).
          for (int64_t step = 0; step < ntiles; ++step) {
            const int64_t t0 = (reversed ? ntiles - 1 - step : step) * tl;
            int64_t t1 = std::min(Nk, t0 + tl);
            // The mutant: the tail loop of a partial last block (after at
            // least one full one) stops one key short.
            if (on(Bug::kTailKeyBlockDrop) && t1 == Nk && Nk > tl &&
                Nk % tl != 0)
              --t1;
            T tmx = mx;
            for (int64_t j = t0; j < t1; ++j) tmx = std::max(tmx, s[j]);
            if (on(Bug::kNoMaxSubtraction)) tmx = 0;
            if (tmx > mx || on(Bug::kNoMaxSubtraction)) {
              const bool skip = on(Bug::kSkippedRescaleOneTile) && t0 == tl;
              if (!skip && sum > 0) {
                T r = ex(mx - tmx);
                if (on(Bug::kRescaleBf16)) r = round_prec(Precision::kBF16, r);
                sum = acc_round(Sum::kRowSum, sum * r);
                for (T& a : acc) a = acc_round(Sum::kPV, a * r);
              }
              mx = tmx;
            }
            for (int64_t j = t0; j < t1; ++j)
              e[j] =
                  !visible(p, b, i + h.mask_row, j) && !on(Bug::kF16MaskToInf)
                      ? T(0)
                      : ex(s[j] - mx);
            const T* et = e.data() + t0;
            const T* vt = h.vh.data() + t0 * D;
            sum = acc_round(Sum::kRowSum,
                            sum + sum_products(
                                      Sum::kRowSum, t1 - t0,
                                      [et](int64_t j) { return et[j]; },
                                      [](int64_t) { return T(1); }));
            for (int64_t d = 0; d < D; ++d)
              acc[d] = acc_round(
                  Sum::kPV,
                  acc[d] +
                      sum_products(
                          Sum::kPV, t1 - t0, [et](int64_t j) { return et[j]; },
                          [vt, d, D](int64_t j) { return vt[j * D + d]; }));
          }
          if (on(Bug::kLongMaskedRunNan) && masked_last_block(p, b, i)) {
            // The mutant's kernel walks key blocks of 128 from the last (the
            // masked blocks first) and has no check for a -inf running max:
            // its first block is fully masked, so its max is -inf and each
            // of its keys adds exp(-inf - (-inf)) = NaN to the row sum and
            // the accumulator (later rescales multiply NaN by 0).
            const T minf = -std::numeric_limits<T>::infinity();
            const T e0 = std::exp(minf - minf);
            sum += e0;
            for (T& a : acc) a += e0;
          }
          if (on(Bug::kSplitKvNoRescale) && Nq <= kDecodeMaxQ &&
              Nk > kSplitKvChunk)
            split_kv_no_rescale(p, h, b, i, s.data(), &mx, &sum, &acc);
          for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] / sum;
          T l = mx + std::log(sum);
          if (on(Bug::kLseBf16)) l = round_prec(Precision::kBF16, l);
          lse[bh * Nq + i] = l;
        }
      }
  }

  // The decode mutant's split-KV path (flash-decoding: q_len <= 16 against
  // kv_len > kSplitKvChunk): each key chunk's max m_c, sum l_c and
  // accumulator acc_c, combined as max_c m_c, sum_c l_c and sum_c acc_c
  // without the rescale by exp(m_c - max_c m_c): every chunk weighted as if
  // its own max were the row's. Replaces the row's *mx, *sum and *acc (from
  // row i's logits s, masked keys -inf).
  void split_kv_no_rescale(const AttentionProblem& p, const Head& h, int64_t b,
                           int64_t i, const T* s, T* mx, T* sum,
                           std::vector<T>* acc) const {
    const int64_t D = p.head_dim, Nk = p.kv_len;
    *mx = -std::numeric_limits<T>::infinity();
    *sum = 0;
    std::fill(acc->begin(), acc->end(), T(0));
    for (int64_t c0 = 0; c0 < Nk; c0 += kSplitKvChunk) {
      const int64_t c1 = std::min(Nk, c0 + kSplitKvChunk);
      T mc = -std::numeric_limits<T>::infinity();
      for (int64_t j = c0; j < c1; ++j)
        if (visible(p, b, i + h.mask_row, j)) mc = std::max(mc, s[j]);
      if (mc == -std::numeric_limits<T>::infinity()) continue;  // all masked
      *mx = std::max(*mx, mc);
      for (int64_t j = c0; j < c1; ++j) {
        if (!visible(p, b, i + h.mask_row, j)) continue;
        const T w = ex(s[j] - mc);
        *sum += w;
        for (int64_t d = 0; d < D; ++d) (*acc)[d] += w * h.vh[j * D + d];
      }
    }
  }

  // P = exp(S - lse) with this kernel's own lse (so a forward bug shows).
  void probabilities(const AttentionProblem& p, const T* q, const T* k,
                     T* probs) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const std::vector<T> zeros(static_cast<size_t>(p.batch * p.heads * Nk * D),
                               T(0));
    std::vector<T> o(static_cast<size_t>(p.batch * p.heads * Nq * D)),
        lse(static_cast<size_t>(p.batch * p.heads * Nq));
    forward(p, q, k, zeros.data(), o.data(), lse.data());
    Head h;
    std::vector<T> s(static_cast<size_t>(Nk));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd;
        operands(p, q + bh * Nq * D, k + kv_slice(p, b, hd) * Nk * D,
                 zeros.data(), &h);
        h.mask_row = packed_rows(p, hd);
        for (int64_t i = 0; i < Nq; ++i) {
          T* pr = probs + (bh * Nq + i) * Nk;
          const int64_t m = logits(p, h, b, i, s.data());
          for (int64_t j = 0; j < Nk; ++j)
            pr[j] = (m == 0 && !on(Bug::kF16MaskToInf)) ||
                            !visible(p, b, i + h.mask_row, j)
                        ? T(0)
                        : ex(s[j] - lse[bh * Nq + i]);
        }
      }
  }

  void backward(const AttentionProblem& p, const T* q, const T* k, const T* v,
                const T* o, const T* d_o, const T* lse, T* dq, T* dk, T* dv,
                T* dg) const {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const bool qk = p.variant == Variant::kQKNorm;
    Head h;
    const size_t nqk = static_cast<size_t>(Nq * Nk);
    std::vector<T> s(static_cast<size_t>(Nk)), pm(nqk), ds(nqk), cm(nqk);
    // The dK mutant: a last partial query block (after a full one) is left
    // out of dK's reduction.
    const int64_t dk_rows =
        on(Bug::kDkDropsTailQueryBlock) && Nq > kBlock && Nq % kBlock != 0
            ? Nq - Nq % kBlock
            : Nq;
    const bool transposed = on(Bug::kTransposedDk) && Nq == Nk;
    // GQA: the query heads of a group share one kv head, whose dK_hat and dV
    // sum theirs (first head assigns, the others add: without GQA the same
    // operations as one head alone), normalized after the group's last head.
    const int64_t group = p.heads / kv_heads_of(p);
    // The stale-dQ mutant: the upper half of dQ_hat's accumulator per (head,
    // row), never cleared between batch elements.
    const bool stale_dq = on(Bug::kStaleDqHeadDim256) && D >= kLargeHeadDim;
    std::vector<T> stale(stale_dq ? static_cast<size_t>(p.heads * Nq * D) : 0);
    // The half-block mutant: the first row of the last partial query block
    // of 128, if that block is exactly half a block.
    const int64_t tail_row =
        on(Bug::kHalfBlockTailDq) && Nq % kTailQueryBlock == kTailQueryBlock / 2
            ? Nq - kTailQueryBlock / 2
            : Nq;
    std::vector<T> ds_tail(static_cast<size_t>(Nk));
    T dg_sum = 0;
    // The batch mutant: the kernel deals batch elements to its workers
    // round-robin (b to worker b % workers) and each worker stores (=, not
    // +=) its dg partial per batch element, so a worker with two or more
    // keeps only its last one's share: dg is the sum of the last `workers`
    // batch elements' shares (batch_dg).
    const int64_t workers = threads_ > 0 ? threads_ : hardware_threads();
    const bool dg_overwrite = on(Bug::kBatchOverThreadsDg) && p.batch > workers;
    std::vector<T> batch_dg(dg_overwrite ? static_cast<size_t>(p.batch) : 0);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hd = 0; hd < p.heads; ++hd) {
        const int64_t bh = b * p.heads + hd, kvh = kv_slice(p, b, hd);
        const bool first = hd % group == 0, last = hd % group == group - 1;
        // The GQA mutant: only the group's first query head reaches dK, dV.
        const bool adds = first || !on(Bug::kGqaPaperNoGroupSum);
        operands(p, q + bh * Nq * D, k + kvh * Nk * D, v + kvh * Nk * D, &h);
        h.mask_row = packed_rows(p, hd);
        const T* ob = o + bh * Nq * D;
        const T* dob = d_o + bh * Nq * D;
        T* dqb = dq + bh * Nq * D;
        T* dkb = dk + kvh * Nk * D;
        T* dvb = dv + kvh * Nk * D;
        // P, dS = P (dP - delta) and C of this (batch, head).
        std::fill(pm.begin(), pm.end(), T(0));
        std::fill(ds.begin(), ds.end(), T(0));
        std::fill(cm.begin(), cm.end(), T(0));
        for (int64_t i = 0; i < Nq; ++i) {
          const T* doi = dob + i * D;
          if (logits(p, h, b, i, s.data()) == 0) continue;
          const T delta = dot(Sum::kDelta, doi, ob + i * D, D);
          for (int64_t j = 0; j < Nk; ++j) {
            if (!visible(p, b, i + h.mask_row, j)) {
              if (!on(Bug::kBackwardIgnoresMask)) continue;
              // The bug: P recomputed over every key in the backward.
              s[j] = logit(p, h, i, j);
            }
            const size_t ij = static_cast<size_t>(i * Nk + j);
            pm[ij] = ex(s[j] - lse[bh * Nq + i]);
            ds[ij] =
                pm[ij] * (dot(Sum::kDP, doi, h.vh.data() + j * D, D) - delta);
            if (qk)
              cm[ij] =
                  dot(Sum::kLogit, h.qh.data() + i * D, h.kh.data() + j * D, D);
          }
        }
        // dV = P^T dO.
        for (int64_t j = 0; j < Nk && adds; ++j)
          for (int64_t d = 0; d < D; ++d) {
            const T x = sum_products(
                Sum::kDV, Nq, [&](int64_t i) { return pm[i * Nk + j]; },
                [&](int64_t i) { return dob[i * D + d]; });
            dvb[j * D + d] = first ? x : dvb[j * D + d] + x;
          }
        // dQ_hat = g dS K_hat, then the normalization backward.
        const bool dq_off = on(Bug::kDqOneHead) && bh == p.batch * p.heads - 1;
        for (int64_t i = 0; i < Nq; ++i) {
          T* dqi = dqb + i * D;
          const T* dsi = ds.data() + i * Nk;
          if (i >= tail_row) {
            // The half-block mutant: the tail block's delta_i never loaded
            // (0), dS_ij = P_ij dP_ij.
            const T* doi = dob + i * D;
            for (int64_t j = 0; j < Nk; ++j)
              ds_tail[j] = pm[i * Nk + j] == 0
                               ? T(0)
                               : pm[i * Nk + j] *
                                     dot(Sum::kDP, doi, h.vh.data() + j * D, D);
            dsi = ds_tail.data();
          }
          for (int64_t d = 0; d < D; ++d)
            dqi[d] =
                h.scale * sum_products(
                              Sum::kDQ, Nk, [&](int64_t j) { return dsi[j]; },
                              [&](int64_t j) { return h.kh[j * D + d]; });
          if (stale_dq) {
            // The stale-dQ mutant (D >= 256): the upper half of the
            // accumulator still holds the earlier batch elements' dQ_hat.
            T* st = stale.data() + (hd * Nq + i) * D;
            for (int64_t d = D / 2; d < D; ++d) {
              st[d] = b == 0 ? dqi[d] : st[d] + dqi[d];
              dqi[d] = st[d];
            }
          }
          if (qk)
            normalize_backward(h.qh.data() + i * D, h.qn[i], eps(p.eps), D, dqi,
                               false);
          // The mutant: one (batch, head)'s dQ off by 2^-10 (~1e-3).
          if (dq_off)
            for (int64_t d = 0; d < D; ++d) dqi[d] *= T(1) + T(0x1p-10);
        }
        // dK_hat = g dS^T Q_hat (summed over the group), then the
        // normalization backward.
        for (int64_t j = 0; j < Nk; ++j) {
          T* dkj = dkb + j * D;
          for (int64_t d = 0; d < D && adds; ++d) {
            const T x =
                h.scale * sum_products(
                              Sum::kDK, dk_rows,
                              [&](int64_t i) {
                                return transposed ? ds[j * Nk + i]
                                                  : ds[i * Nk + j];
                              },
                              [&](int64_t i) { return h.qh[i * D + d]; });
            dkj[d] = first ? x : dkj[d] + x;
          }
          if (qk && last)
            normalize_backward(h.kh.data() + j * D, h.kn[j], eps(p.eps), D, dkj,
                               false);
        }
        // dg = sum_ij dS_ij C_ij.
        if (qk && !(on(Bug::kDgOneHead) && hd != 0))
          (dg_overwrite ? batch_dg[static_cast<size_t>(b)] : dg_sum) +=
              sum_products(
                  Sum::kDG, Nq * Nk, [&](int64_t x) { return ds[x]; },
                  [&](int64_t x) { return cm[x]; });
      }
    for (int64_t b = p.batch - workers; dg_overwrite && b < p.batch; ++b)
      dg_sum += batch_dg[static_cast<size_t>(b)];
    *dg = dg_sum;
  }

  void scalenorm_forward(const ScaleNormProblem& p, const T* x, T* y) const {
    const T g = static_cast<T>(p.g), e = eps(p.eps);
    for (int64_t r = 0; r < p.rows; ++r) {
      normalize(x + r * p.dim, p.dim, e, y + r * p.dim);
      for (int64_t i = 0; i < p.dim; ++i) y[r * p.dim + i] *= g;
    }
  }

  void scalenorm_backward(const ScaleNormProblem& p, const T* x, const T* dy,
                          T* dx, T* dg) const {
    const T g = static_cast<T>(p.g), e = eps(p.eps);
    std::vector<T> u(static_cast<size_t>(p.dim));
    T dg_sum = 0;
    for (int64_t r = 0; r < p.rows; ++r) {
      const T nrm = normalize(x + r * p.dim, p.dim, e, u.data());
      const T* dyr = dy + r * p.dim;
      T* dxr = dx + r * p.dim;
      dg_sum += dot(Sum::kDot, dyr, u.data(), p.dim);
      for (int64_t i = 0; i < p.dim; ++i) dxr[i] = g * dyr[i];
      normalize_backward(u.data(), nrm, e, p.dim, dxr,
                         on(Bug::kScaleNormClampByNorm));
    }
    *dg = dg_sum;
  }

 private:
  Bug bug_;
  bool active_;
  Control control_;
  int threads_;
};

template <class T>
class MutantBackend final : public Backend {
 public:
  // A mutant (active bug) or a control (no bug, `control` arithmetic).
  // gqa: the entry declares GQA for the paper's formulation (the default
  // supports() does not).
  MutantBackend(const char* family, const char* name, Precision precision,
                Bug bug, bool active, Control control, bool gqa)
      : Backend(family, name, precision),
        bug_(bug),
        active_(active),
        control_(control),
        gqa_(gqa) {}

  bool supports(const AttentionProblem& p) const override {
    if (!gqa_) return is_paper_formulation(p);
    AttentionProblem mha = p;
    mha.kv_heads = 0;
    return is_paper_formulation(mha);
  }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig& cfg) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
    auto q = gather<T>(s, a.q, B, H, p.q_len, D);
    auto k = gather<T>(s, a.k, B, Hk, p.kv_len, D);
    auto v = gather<T>(s, a.v, B, Hk, p.kv_len, D);
    std::vector<T> o(q.size()), lse(static_cast<size_t>(B * H * p.q_len));
    kernel(cfg).forward(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    scatter(s, o, a.o, B, H, p.q_len, D, truncates());
    for (size_t i = 0; i < lse.size(); ++i)
      a.lse[i] = static_cast<double>(lse[i]);
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig& cfg) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
    auto q = gather<T>(s, a.q, B, H, p.q_len, D);
    auto k = gather<T>(s, a.k, B, Hk, p.kv_len, D);
    auto v = gather<T>(s, a.v, B, Hk, p.kv_len, D);
    auto o = gather<T>(s, a.o, B, H, p.q_len, D);
    auto d_o = gather<T>(s, a.d_o, B, H, p.q_len, D);
    std::vector<T> lse(a.lse, a.lse + a.lse_size);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    T dg = 0;
    kernel(cfg).backward(p, q.data(), k.data(), v.data(), o.data(), d_o.data(),
                         lse.data(), dq.data(), dk.data(), dv.data(), &dg);
    scatter(s, dq, a.dq, B, H, p.q_len, D, truncates());
    scatter(s, dk, a.dk, B, Hk, p.kv_len, D, truncates());
    scatter(s, dv, a.dv, B, Hk, p.kv_len, D, truncates());
    *a.dg = static_cast<double>(dg);
  }

  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace*,
                         const ExecConfig& cfg) const override {
    const Precision s = precision();
    auto x = gather<T>(s, as4(a.x), 1, 1, p.rows, p.dim);
    std::vector<T> y(x.size());
    kernel(cfg).scalenorm_forward(p, x.data(), y.data());
    scatter(s, y, as4(a.y), 1, 1, p.rows, p.dim, truncates());
  }

  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace*,
                          const ExecConfig& cfg) const override {
    const Precision s = precision();
    auto x = gather<T>(s, as4(a.x), 1, 1, p.rows, p.dim);
    auto dy = gather<T>(s, as4(a.dy), 1, 1, p.rows, p.dim);
    std::vector<T> dx(x.size());
    T dg = 0;
    kernel(cfg).scalenorm_backward(p, x.data(), dy.data(), dx.data(), &dg);
    scatter(s, dx, as4(a.dx), 1, 1, p.rows, p.dim, truncates());
    *a.dg = static_cast<double>(dg);
  }

  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace*) const override {
    const Precision s = precision();
    auto q = gather<T>(s, a.q, p.batch, p.heads, p.q_len, p.head_dim);
    auto k = gather<T>(s, a.k, p.batch, kv_heads_of(p), p.kv_len, p.head_dim);
    std::vector<T> pr(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    kernel({}).probabilities(p, q.data(), k.data(), pr.data());
    for (size_t i = 0; i < pr.size(); ++i)
      probs[i] = static_cast<double>(pr[i]);
    return true;
  }

 private:
  Kernel<T> kernel(const ExecConfig& cfg) const {
    return Kernel<T>(bug_, active_, control_, cfg.threads);
  }
  bool truncates() const { return active_ && bug_ == Bug::kBf16Truncate; }

  Bug bug_;
  bool active_;
  Control control_;
  bool gqa_;
};

std::unique_ptr<Backend> make(const char* family, const char* name,
                              Precision precision, Bug bug, bool active,
                              Control control, bool gqa = false) {
  const bool formulation_bug =
      active &&
      (bug == Bug::kGqaNoGroupSum || bug == Bug::kRmsEpsOutsideRsqrt ||
       bug == Bug::kGemmaWNotOnePlusW || bug == Bug::kOlmo2NormPerHead ||
       bug == Bug::kQwen3WeightBeforeCast || bug == Bug::kFixedScaleInverted ||
       bug == Bug::kSoftcapDropped || bug == Bug::kWindowLeftOffByOne ||
       bug == Bug::kWindowRightOffByOne || bug == Bug::kRopeHeadZeroOnly ||
       bug == Bug::kRopePartialWrongDims || bug == Bug::kRopeNormSkipped ||
       bug == Bug::kRopePairingConfused || bug == Bug::kRopeDecodeFromZero ||
       bug == Bug::kSinkIndexFromRow);
  if (formulation_bug || control == Control::kFormulation)
    return make_formulation_entry(family, name, precision, bug, active);
  if (precision == Precision::kF64)
    return std::make_unique<MutantBackend<double>>(family, name, precision, bug,
                                                   active, control, gqa);
  return std::make_unique<MutantBackend<float>>(family, name, precision, bug,
                                                active, control, gqa);
}

}  // namespace

constexpr NamedValue<MutantKind> kMutantKindNames[] = {
    {MutantKind::kFormula, "formula"},
    {MutantKind::kPrecision, "precision"},
    {MutantKind::kDeterminism, "determinism"},
};

const char* name(MutantKind k) { return name_in(kMutantKindNames, k); }

const std::vector<MutantInfo>& mutant_list() {
  // The formula bugs of issue 5 (O(1) errors), then the precision bugs of
  // issue 15, each with the size of its error and the real kernels it
  // models. M is the magnitude of the terms a field sums (its scale before
  // cancellation), A = |g| the logit amplitude.
  static const std::vector<MutantInfo> list = {
      {Bug::kInvSqrtD, "inv_sqrt_d",
       "1/sqrt(D) instead of g (the sdpa scale kept after adding QKNorm)",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kGTwice, "g_twice",
       "g applied twice (once folded into q_hat, once on the logits)",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kEpsInSquaredNorm, "eps_in_squared_norm",
       "sqrt(||x||^2 + eps) instead of the clamp max(||x||, eps)",
       Precision::kF64, MutantKind::kFormula},
      {Bug::kCausalOffByOne, "causal_off_by_one",
       "causal mask j < i instead of j <= i (diagonal hidden)", Precision::kF32,
       MutantKind::kFormula},
      {Bug::kPaddingDropsLastKey, "padding_drops_last_key",
       "padding mask j >= len - 1 (last real key ignored)", Precision::kF32,
       MutantKind::kFormula},
      {Bug::kNoMaxSubtraction, "no_max_subtraction",
       "softmax without subtracting the row max (exp overflows)",
       Precision::kF32, MutantKind::kFormula,
       "every logit below exp's overflow threshold (88.7 in f32), e.g. "
       "qknorm with |g| < 44"},
      {Bug::kBf16Truncate, "bf16_truncate",
       "f32 -> bf16 outputs truncated (Highway 1.0.3 DemoteTo), not RNE",
       Precision::kBF16, MutantKind::kFormula},
      {Bug::kDgOneHead, "dg_one_head",
       "dg summed over head 0 only instead of all heads and batches",
       Precision::kF64, MutantKind::kFormula},
      {Bug::kMissingNormBackwardTerm, "missing_norm_backward_term",
       "normalization backward dx = du / ||x|| without - u (u . du)",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kTransposedDk, "transposed_dk",
       "dK_hat = g dS Q_hat instead of g dS^T Q_hat (square problems)",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kSkippedRescaleOneTile, "skipped_rescale_one_tile",
       "online softmax: running sum/acc not rescaled when tile 1 raises the "
       "max",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kThreadDependentOrder, "thread_dependent_order",
       "dK reduction order depends on the thread count", Precision::kF32,
       MutantKind::kDeterminism,
       "always: only the bits of dK change with the thread count (one "
       "thread: the plain copy's order, more: the reversed control's)"},
      {Bug::kF16MaskToInf, "f16_mask_to_inf",
       "masked logits filled with -1e9 in f16 (= -inf): fully masked rows NaN",
       Precision::kF16, MutantKind::kFormula},
      {Bug::kF16EpsUnderflow, "f16_eps_underflow",
       "eps stored in f16 (1e-12 -> 0): zero rows give 0/0", Precision::kF16,
       MutantKind::kFormula},
      {Bug::kScaleNormClampByNorm, "scalenorm_clamp_by_norm",
       "ScaleNorm backward divides by ||x|| instead of eps in the clamp region",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kBackwardIgnoresMask, "backward_ignores_mask",
       "backward recomputes P over every key: masked keys get gradient",
       Precision::kF32, MutantKind::kFormula},
      {Bug::kNormalizesV, "normalizes_v", "v rows normalized like q and k",
       Precision::kBF16, MutantKind::kFormula},
      // --- Precision bugs (issue 15) ---
      {Bug::kPvAccumBf16, "pv_accum_bf16",
       "P.V and the softmax row sum accumulated in a bf16 register (rounded "
       "after every add) instead of f32: the low-precision accumulator of "
       "GEMMs run with a 16-bit compute type (cuBLAS CUBLAS_COMPUTE_16F, "
       "Triton tl.dot(out_dtype=bf16)); O off by ~2^-8 M per add",
       Precision::kBF16, MutantKind::kPrecision},
      {Bug::kDvAccumBf16, "dv_accum_bf16",
       "dV = P^T dO accumulated in bf16 in the f32 mode (a dV accumulator "
       "declared in the input dtype, or atomicAdd into a bf16 dV buffer): dV "
       "off by ~2^-8 M per add",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kCheapExp, "cheap_exp",
       "exp(x) = 2^n p(f) with a minimax cubic p, relative error 7.5e-5 "
       "(a fast-math exp without the refinement terms, __expf-style): P, O, "
       "lse and every gradient off by ~1e-4",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kLseBf16, "lse_bf16",
       "lse rounded to bf16 in the f32 mode (softmax statistics saved in the "
       "activation dtype for the backward): lse off by up to 2^-9 |lse|, P in "
       "the backward by the same absolute amount",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kDqOneHead, "dq_one_head",
       "dQ of the last (batch, head) slice scaled by 1 + 2^-10 (a per-head "
       "epilogue that takes a separate path for the tail head of the launch "
       "grid with a wrong scale): dQ 9.8e-4 off in one head only",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kFarNormRsqrtEstimate, "far_norm_rsqrt_estimate",
       "the backward recomputes 1/||x|| for rows with norm above 2^64 (where "
       "an unscaled f32 sum of squares overflows; rows below 2^-64 are in the "
       "clamp region for every eps used) on a rescaling fallback path with a "
       "12-bit rsqrt estimate (rsqrtps without its Newton step): dQ, dK and "
       "ScaleNorm dx of those rows off by up to 2^-12, every other output "
       "exact",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kTailKeyBlockDrop, "tail_key_block_drop",
       "key loop in blocks of 16 whose tail loop over a partial last block "
       "stops one key short (kv_len > 16, kv_len % 16 != 0): the last key "
       "missing from O and lse",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kGBf16, "g_bf16",
       "g rounded to bf16 before the f32 kernel (the learned scalar cast to "
       "the autocast dtype): logits off by up to 2^-9 |S|",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kClampEpsBf16Backward, "clamp_eps_bf16_backward",
       "the backward of rows with ||x|| <= eps divides by eps rounded to bf16 "
       "(eps saved for the backward in the activation dtype; the forward used "
       "the f32 eps): zero and tiny rows' gradients du / eps off by 1.9e-3 "
       "(eps = 1e-12), every other row exact",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kDkDropsTailQueryBlock, "dk_drops_tail_query_block",
       "dK reduction over query blocks of 16 that leaves out a partial last "
       "block (q_len > 16, q_len % 16 != 0; dQ, dV, dg keep it): dK short by "
       "those queries' share",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kRescaleBf16, "rescale_bf16",
       "online softmax: the correction factor exp(m_old - m_new) rounded to "
       "bf16 before it rescales the f32 accumulator and row sum: O and lse "
       "off by up to 2^-9 of the earlier tiles' share, only on rows whose "
       "max rises after the first tile",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kTf32Matmul, "tf32_matmul",
       "every GEMM (QK^T, PV, dO V^T, P^T dO, dS K, dS^T Q) with operands "
       "rounded to TF32 (10-bit significand), f32 accumulation: PyTorch's "
       "allow_tf32 default for f32 matmuls on Ampere (1.7-1.11); products "
       "off by up to 2^-10",
       Precision::kF32, MutantKind::kPrecision},
      {Bug::kF64ExpInF32, "f64_exp_in_f32",
       "the f64 mode's exp evaluated in f32 (expf on a double argument, a "
       "single-precision exp polynomial in a double kernel): P off by ~6e-8",
       Precision::kF64, MutantKind::kPrecision},
      // --- Formulation bugs (issue 16; formulation_mutants.cc) ---
      {Bug::kGqaNoGroupSum, "gqa_no_group_sum",
       "GQA backward: each kv head's dK and dV taken from the first query "
       "head of its group instead of summed over the group's query heads (a "
       "backward written for one query head per kv head, run on a GQA "
       "layout): dK, dV short by the other heads' shares",
       Precision::kF32, MutantKind::kFormula, nullptr, "gqa"},
      {Bug::kRmsEpsOutsideRsqrt, "rms_eps_outside_rsqrt",
       "RMSNorm as x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) "
       "+ eps) (eps added to the rms, not under the root): relative error "
       "~eps / rms on every row, O(1) on rows with mean(x^2) near or below "
       "eps (x / eps instead of x / sqrt(eps) on tiny rows)",
       Precision::kF32, MutantKind::kFormula, nullptr, "qwen3"},
      {Bug::kGemmaWNotOnePlusW, "gemma_w_not_one_plus_w",
       "Gemma's x_hat (1 + w) computed as x_hat w (the checkpoint's "
       "zero-centred weight loaded into a plain RMSNorm): logits scaled by "
       "w^2 / (1 + w)^2",
       Precision::kF32, MutantKind::kFormula, nullptr, "gemma3"},
      {Bug::kOlmo2NormPerHead, "olmo2_norm_per_head",
       "OLMo2's RMSNorm over all heads of the projection (H_x D values) done "
       "per head (D values), with the same [H_x D] weight: every head "
       "rescaled to unit rms on its own",
       Precision::kF32, MutantKind::kFormula, nullptr, "olmo2"},
      // Caught on some cases only. round_s(x_hat w) and round_s(x_hat) w
      // differ by up to half a bf16 ulp of x_tilde per element, and the
      // verdict must allow logit changes of that kind wherever a correct
      // kernel's x_hat may round to the other bf16 neighbour (an element
      // within its own error of a midpoint: OracleAttention::logit_flip, a
      // per-case allowance). Measured on the 32 Qwen3 bf16 cases of
      // mutation_test.cc: 6 fail (lse margin up to 1.5e3; 1 case with no
      // ambiguous element, 5 whose allowance is smaller than the bug's logit
      // change), 26 pass with margins up to 0.984 (the control: up to 0.998,
      // the final bf16 rounding); the default suite's Qwen3 case (64 tokens
      // x 8 heads x D = 128) passes. Nothing is loosened or special-cased
      // for it; correct_when marks the regime in which it passes.
      {Bug::kQwen3WeightBeforeCast, "qwen3_weight_before_cast",
       "Qwen3's weight multiplied before the cast of x_hat to the storage "
       "format, round_s(x_hat w) instead of round_s(x_hat) w (HF's "
       "`weight * x.to(input_dtype)` reordered): x_tilde off by up to half a "
       "bf16 ulp per element",
       Precision::kBF16, MutantKind::kFormula,
       "the case's allowance for legitimate x_hat rounding flips "
       "(logit_flip: some x_hat element near a bf16 midpoint) exceeds the "
       "bug's logit change of about one storage ulp of x_tilde, e.g. the "
       "default suite's Qwen3 case; caught on 6 of 32 Qwen3 cases and by "
       "FormulationAgreement (mutation_test.cc)",
       "qwen3"},
      // Not one of issue 16's five: the bug FormulationNonSaturation exists
      // for (no other mutant makes the softmax more saturated than the
      // formulation's amplitude bound allows).
      {Bug::kFixedScaleInverted, "fixed_scale_inverted",
       "a fixed logit scale s applied as 1 / s (head_dim ** 0.5 written for "
       "head_dim ** -0.5): Qwen3's 1/sqrt(D) becomes sqrt(D), logits D times "
       "too large and the softmax saturated beyond the formulation's bound",
       Precision::kF32, MutantKind::kFormula, nullptr, "qwen3"},
      // Issue 34's first variant: its cases are the softcap's (mutation_test.cc
      // caps its formulations' cases; FormulationSoftcapAgreement draws caps).
      {Bug::kSoftcapDropped, "softcap_dropped",
       "the logit softcap not applied, forward and backward (sglang #33915: "
       "a backend silently dropped Gemma 2's logit softcap on one path): "
       "logits |S| instead of cap tanh(S / cap), the softmax sharper than the "
       "model's",
       Precision::kF32, MutantKind::kFormula, nullptr, "softcap"},
      // The sliding window's off-by-ones: their cases are windowed
      // (mutation_test.cc gives its formulations' cases windows;
      // FormulationWindowAgreement draws them).
      {Bug::kWindowLeftOffByOne, "window_left_off_by_one",
       "the sliding window one key too wide on the left, forward and "
       "backward (transformers #39408, Megatron-Bridge #2656: a model's "
       "sliding_window = w taken as FlashAttention's (w, 0) where its mask "
       "keeps i - j < w, which is (w - 1, 0)): each row sees one key more "
       "than the model",
       Precision::kF32, MutantKind::kFormula, nullptr, "window"},
      {Bug::kWindowRightOffByOne, "window_right_off_by_one",
       "the sliding window one key too wide on the right, forward and "
       "backward (the (w, w) versus (w - 1, 0) conventions of transformers "
       "#39408 on the look-ahead side): each row sees one later key than "
       "the model",
       Precision::kF32, MutantKind::kFormula, nullptr, "window"},
      // RoPE's field bugs (issue 34): their cases are rotated (partial
      // rotary, decode-aligned positions; mutation_test.cc,
      // FormulationRopeAgreement).
      {Bug::kRopeHeadZeroOnly, "rope_head_zero_only",
       "RoPE applied to head 0 only, the other heads' "
       "q and k left unrotated (vLLM #51049: fused_qk_norm_rope wrong for "
       "every head but the first of a warp chunk)",
       Precision::kF32, MutantKind::kFormula, nullptr, "rope"},
      {Bug::kRopePartialWrongDims, "rope_partial_wrong_dims",
       "partial rotary (rotary_dim < head_dim) paired as (e, e + head_dim / "
       "2) instead of (e, e + rotary_dim / 2): the wrong dims rotated (vLLM "
       "#51049's trigger, partial NeoX RoPE 64 of 128 dims)",
       Precision::kF32, MutantKind::kFormula, nullptr, "rope"},
      {Bug::kRopeNormSkipped, "rope_norm_skipped",
       "the QK-norm skipped where it is fused with RoPE: q and k rotated "
       "raw (tt-mlir #9042: a RoPE/QKV decode fusion skipped Qwen3's "
       "QK-norm)",
       Precision::kF32, MutantKind::kFormula, nullptr, "rope"},
      {Bug::kRopePairingConfused, "rope_pairing_confused",
       "half-split (NeoX, rotate_half) and interleaved (GPT-J) pairing "
       "swapped: each pair mixes the wrong two dims",
       Precision::kF32, MutantKind::kFormula, nullptr, "rope"},
      {Bug::kRopeDecodeFromZero, "rope_decode_from_zero",
       "decode positions from 0: query i rotated at i + offset instead of "
       "kv_len - q_len + i + offset, against keys at their cache positions",
       Precision::kF32, MutantKind::kFormula, nullptr, "rope"},
      // Attention sinks (issue 34): their cases have one sink per head
      // (mutation_test.cc, FormulationSinksAgreement).
      {Bug::kSinkIndexFromRow, "sink_index_from_row",
       "the attention sink of query row i of head h read at (h q_len + i) "
       "mod heads instead of h (modular #6591: the wrong per-head sink "
       "index when seq_q > 1): right at decode, wrong sinks in prefill",
       Precision::kF32, MutantKind::kFormula, nullptr, "sinks"},
      // --- Shape bugs (issue 33): wrong only in one region of the shape
      // model, the unmutated copy bit for bit elsewhere ---
      {Bug::kStaleDqHeadDim256, "stale_dq_head_dim_256",
       "head_dim >= 256 (the kernel splits dQ_hat's accumulator into two "
       "halves of D/2) clears only the lower half between batch elements: "
       "dQ of batch elements b >= 1 carries the earlier elements' dQ_hat in "
       "its upper half (TransformerEngine #3216: a backward wrong only at "
       "head_dim 256 with batch >= 2)",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "head_dim >= 256 with batch >= 2"},
      {Bug::kHalfBlockTailDq, "half_block_tail_dq",
       "query blocks of 128: when the last partial block is exactly half a "
       "block (q_len % 128 == 64), its rows' dQ is computed with delta_i = "
       "rowsum(dO_i * O_i) never loaded (0), dS = P dP (a cuDNN report: dQ "
       "NaN when seq_len % 128 == 64): dQ of those 64 rows off by g sum_j "
       "P_ij delta_i k_hat_j",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "q_len residue 64 mod 128 (half a block)"},
      {Bug::kLongMaskedRunNan, "long_masked_run_nan",
       "forward over key blocks of 128 from the last to the first "
       "(FlashAttention's order: masked blocks first) without the check for "
       "a -inf running max: a row whose last 128 keys are masked but which "
       "sees an earlier key adds exp(-inf - (-inf)) = NaN to its sum "
       "(pytorch #109517: NaN past a few hundred keys for some masks): O and "
       "lse NaN on rows with a masked run of 128 keys or more",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "mask: a long masked run (>= 128 keys) in a row that sees a key"},
      {Bug::kGqaPaperNoGroupSum, "gqa_paper_no_group_sum",
       "an entry of the paper's formulation that declares GQA (supports() "
       "with kv_heads < heads) whose backward takes each kv head's dK and dV "
       "from the first query head of its group instead of the group's sum "
       "(GQA backwards that miss the group sum): dK, dV short by the other "
       "heads' shares",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "heads: GQA (kv_heads < heads) on a paper-formulation entry"},
      {Bug::kHeadDim1SignedNorm, "head_dim_1_signed_norm",
       "the normalization's one-element fast path (head_dim 1: no "
       "reduction) returns x as ||x|| instead of |x|: rows with x < 0 fall "
       "in the clamp region, x_hat = x / eps instead of -1",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr, "head_dim 1"},
      {Bug::kPadZeroMeansUnpadded, "pad_zero_means_unpadded",
       "a key length of 0 read as \"not given\" (0 as the unset sentinel, "
       "as where a zero or None length means the whole sequence): a batch "
       "element whose every key is padding sees all of them; O and lse of "
       "its rows are those of no padding instead of 0 and -inf",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "mask: padding of kv_len keys (a key length of 0)"},
      {Bug::kMqaPackedRowsCausal, "mqa_packed_rows_causal",
       "an MQA fast path (kv_heads == 1 < heads) packs the H query heads into "
       "one sequence of H * q_len rows against the single kv head and "
       "applies the causal mask to the packed row index (FlashAttention "
       "packs GQA heads into the query length only where no causal mask "
       "applies): query head h >= 1 sees h * q_len future keys; O, lse and "
       "every gradient of those heads wrong under a causal mask",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "heads: MQA (kv_heads == 1 < heads)"},
      {Bug::kSplitKvNoRescale, "decode_split_kv_no_rescale",
       "a split-KV decode path (flash-decoding: q_len <= 16 against kv_len "
       "> 256, key chunks of 256 reduced separately) combines the chunks' "
       "sums and accumulators without rescaling each by exp(m_c - max m): "
       "every chunk weighted as if its own max were the row's; O and lse "
       "wrong wherever the chunks' maxima differ",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "decode: q_len 1..16 against kv_len > 256"},
      {Bug::kBatchOverThreadsDg, "batch_over_threads_dg",
       "the backward deals batch elements to its worker threads round-robin "
       "and each worker stores (=, not +=) its dg partial per batch element: "
       "with more batch elements than threads a worker keeps only its last "
       "element's share, and dg misses the others' (a per-thread reduction "
       "written for one batch element per thread)",
       Precision::kF32, MutantKind::kFormula, nullptr, nullptr,
       "batch > the entry's thread count (ExecConfig::threads)"},
  };
  return list;
}

const Registry& mutant_registry() {
  static const Registry* r = [] {
    auto* reg = new Registry;
    for (const MutantInfo& m : mutant_list())
      reg->add(make("mutant", m.name, m.precision, m.bug, true, Control::kPlain,
                    m.bug == Bug::kGqaPaperNoGroupSum ||
                        m.bug == Bug::kMqaPackedRowsCausal));
    return reg;
  }();
  return *r;
}

const Backend& unmutated(Precision p) {
  static const Registry* r = [] {
    auto* reg = new Registry;
    for (Precision q : kAllPrecisions)
      reg->add(make("mutant", "none", q, Bug::kInvSqrtD, false, Control::kPlain,
                    /*gqa=*/true));
    return reg;
  }();
  return *r->find("mutant:none:" + std::string(name(p)));
}

const std::vector<ControlInfo>& control_list() {
  static const std::vector<ControlInfo> list = {
      {Control::kPlain,
       "plain",
       "the unmutated copy: left-to-right sums, online softmax over key tiles "
       "of 4, no FMA",
       {Precision::kF64, Precision::kF32}},
      {Control::kReversed,
       "reversed",
       "every sum right to left, key tiles last to first",
       {Precision::kF64, Precision::kF32}},
      {Control::kPairwise,
       "pairwise",
       "every sum pairwise (recursive halves); the softmax of a row in two "
       "passes (one tile)",
       {Precision::kF64, Precision::kF32}},
      {Control::kBlocked,
       "blocked",
       "every sum as partial sums of blocks of 16 added in order; key tiles "
       "of 16 (flash-attention's block structure)",
       {Precision::kF64, Precision::kF32}},
      {Control::kFma,
       "fma",
       "every product-sum as std::fma (the plain copy is built with "
       "-ffp-contract=off: no FMA)",
       {Precision::kF64, Precision::kF32}},
      {Control::kExp2Ulp,
       "exp_2ulp",
       "std::exp moved 2 ulp up or down (by a hash of the argument): an exp "
       "with a 2.5 ulp error bound",
       {Precision::kF64, Precision::kF32}},
      {Control::kF32Accum,
       "f32_accum",
       "16-bit storage with f32 accumulators on the accumulator path of "
       "pv_accum_bf16 / dv_accum_bf16 (the correct counterpart of both)",
       {Precision::kBF16, Precision::kF16}},
      {Control::kFormulation,
       "formulation",
       "every formulation (issue 16) by the formulation mutants' wrapper "
       "with no bug: q and k normalized, weighted and shifted in test code, "
       "then the reference's loops on x_tilde with no normalization",
       {Precision::kF64, Precision::kF32, Precision::kBF16}},
  };
  return list;
}

const Registry& control_registry() {
  static const Registry* r = [] {
    auto* reg = new Registry;
    for (const ControlInfo& c : control_list())
      for (Precision p : c.precisions)
        reg->add(make("control", c.name, p, Bug::kInvSqrtD, false, c.control));
    return reg;
  }();
  return *r;
}

}  // namespace qknorm::property
