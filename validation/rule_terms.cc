#include "validation/rule_terms.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "validation/case.h"
#include "validation/operands.h"

namespace qknorm::validation {

double sum_units(double n) { return kSumLambda * std::sqrt(n) + kOpUnits; }

namespace {

// Sorts *x ascending, the same values in the same order as std::sort (the
// order of equal values aside, which no caller reads): an LSD radix sort on
// the order-preserving bit keys of doubles (11-bit digits, the passes whose
// digit every key shares skipped) from 256 values up. The sampled pass sorts
// every query row's probabilities (row_tie_excess), n log n comparisons that
// were 23% of issue 32's 32768-key run.
void sort_ascending(std::vector<double>* x) {
  const size_t n = x->size();
  if (n < 256) {
    std::sort(x->begin(), x->end());
    return;
  }
  constexpr int kBits = 11, kPasses = 6;  // 66 >= 64 bits
  constexpr size_t kBuckets = size_t{1} << kBits;
  thread_local std::vector<uint64_t> a, b;
  thread_local std::vector<size_t> count;
  a.resize(n);
  b.resize(n);
  count.assign(kPasses * kBuckets, 0);
  constexpr uint64_t kSign = uint64_t{1} << 63;
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits;
    std::memcpy(&bits, &(*x)[i], sizeof bits);
    a[i] = bits & kSign ? ~bits : bits | kSign;
    for (int p = 0; p < kPasses; ++p)
      ++count[p * kBuckets + ((a[i] >> (p * kBits)) & (kBuckets - 1))];
  }
  for (int p = 0; p < kPasses; ++p) {
    size_t* c = count.data() + p * kBuckets;
    if (c[(a[0] >> (p * kBits)) & (kBuckets - 1)] == n) continue;
    size_t sum = 0;
    for (size_t d = 0; d < kBuckets; ++d) {
      const size_t k = c[d];
      c[d] = sum;
      sum += k;
    }
    for (size_t i = 0; i < n; ++i)
      b[c[(a[i] >> (p * kBits)) & (kBuckets - 1)]++] = a[i];
    a.swap(b);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t key = a[i];
    const uint64_t bits = key & kSign ? key & ~kSign : ~key;
    std::memcpy(&(*x)[i], &bits, sizeof bits);
  }
}

}  // namespace

// The derivation is rule.h's ("Repeated summands"). Terms t_a <= t_b tie
// when t_b - t_a <= u (2 + term_units (t_a + t_b)): within the spacing of
// a partial sum of the normalized row (<= 2 u, the partial sums being at
// most 1), or within the two terms' own errors in a kernel (term_units u
// relatively each). Each tied ordered pair (a != b) counts w_a w_b, w =
// min(1, t / u): a term's rounding error is also at most the term itself
// (s is a candidate of fl(s + t)), so terms far below u round alike but
// weigh little. The tie limit of t_a is increasing in t_a: a sorted sweep
// with prefix sums of w, O(n log n).
double row_tie_excess(std::vector<double>* terms, double u, double term_units) {
  std::vector<double>& t = *terms;
  const size_t n = t.size();
  if (n < 2) return 0;
  sort_ascending(&t);
  const double cu = term_units * u;
  if (!(cu < 0.5)) {  // every term within every other's error: all tied
    double w = 0, w2 = 0;
    for (double x : t) {
      const double wa = std::min(1.0, x / u);
      w += wa, w2 += wa * wa;
    }
    return w * w - w2;
  }
  // prefix[a] = w_0 + ... + w_{a-1}; one buffer per thread (called for
  // every query row: no allocation per row).
  thread_local std::vector<double> prefix;
  prefix.assign(n + 1, 0);
  for (size_t a = 0; a < n; ++a)
    prefix[a + 1] = prefix[a] + std::min(1.0, t[a] / u);
  double x = 0;
  size_t hi = 0;  // one past the last term tied with t[a]
  for (size_t a = 0; a < n; ++a) {
    const double limit = (t[a] * (1 + cu) + 2 * u) / (1 - cu);
    hi = std::max(hi, a + 1);
    while (hi < n && t[hi] <= limit) ++hi;
    x += (prefix[a + 1] - prefix[a]) * (prefix[hi] - prefix[a + 1]);
  }
  return 2 * x;
}

double tie_sum_units(double n, double excess) {
  const double base = sum_units(n);
  if (!(excess > 0)) return base;
  return std::max(
      base, std::min(kSumLambda * std::sqrt(n + excess), n - 1) + kOpUnits);
}

double sink_logit_units(const AttentionProblem& p, double amplitude) {
  if (!has_sinks(p)) return 0;
  double m = 0;
  for (double x : p.sinks) m = std::max(m, std::fabs(x));
  return 3 * m + std::fabs(amplitude) + kSinkExpUnits;
}

double sink_shift_units(const AttentionProblem& p, double amplitude) {
  if (!has_sinks(p)) return 0;
  double m = 0;
  for (double x : p.sinks) m = std::max(m, std::fabs(x));
  return std::max(0.0, m - std::fabs(amplitude));
}

double softmax_units(double amplitude, double dot_units) {
  return 2 * dot_units * std::fabs(amplitude);
}

double rope_angle_error(const AttentionProblem& p) {
  if (!has_rope(p)) return 0;
  const Rope& r = p.rope;
  const int64_t lo = std::min<int64_t>(0, p.kv_len - p.q_len);
  const auto pos = static_cast<double>(
      std::max(std::llabs(lo + r.position_offset),
               std::llabs(p.kv_len - 1 + r.position_offset)));
  double worst = 0;
  for (int64_t e = 0; e < r.rotary_dim / 2; ++e) {
    const double x =
        static_cast<double>(2 * e) / static_cast<double>(r.rotary_dim);
    const double units = r.inv_freq.empty() ? std::log(r.theta) * x + 4 : 2.0;
    worst =
        std::max(worst, units * pos * std::fabs(rope_inv_freq<double>(r, e)));
  }
  return worst;
}

// The derivation (rule.h, "RoPE"): per side, a pair's error vector is at
// most sqrt 2 eps (|x_a| + |x_b|) <= 2 eps times the pair's norm, so the
// rotated row moves by 2 eps of its norm (after the normalization: of
// ||x_tilde|| <= ||x_a||; before it: of ||x||, which the l2 and rms
// normalizations carry to at most 2 eps ||x_hat||), the logit by 2 eps A
// per side. The gradients: see rule.h.
RopeUnits rope_units(const AttentionProblem& p, Precision storage, double uc,
                     double uo) {
  RopeUnits u;
  if (!has_rope(p)) return u;
  const Rope& r = p.rope;
  const double angle = rope_angle_error(p);
  const double u_angle = r.angle_f32 ? unit_roundoff(Precision::kF32)
                                     : unit_roundoff(Precision::kF64);
  const bool cs16 = r.cos_sin_storage &&
                    (storage == Precision::kBF16 || storage == Precision::kF16);
  u.eps = kRopeRotateUnits + kRopeCosSinUnits +
          (cs16 ? unit_roundoff(storage) / uc : 0.0) + u_angle * angle / uc +
          (kRopeRotateUnits + kRopeCosSinUnits + angle) * uo / uc;
  u.logit = 4 * u.eps;
  const bool before =
      p.variant == Variant::kQKNorm && r.order == RopeOrder::kBeforeNorm;
  u.grad = (before ? kRopeGradBefore : kRopeGradAfter) * u.eps;
  return u;
}

double softcap_slope_units(double logit_units, double cap) {
  return 2 * logit_units / cap + 20;
}

namespace {

// Above this many multiply-adds (B H Nq Nk D) cosine_units bounds every
// pair by the rows' shares alone instead of forming each pair's cosine (the
// sampled verdict's long cases): |C| <= 1 and T <= (s_q + s_k) / 2. A cost
// cap, not a tolerance: the fallback is looser, never tighter.
constexpr double kCosinePairWork = 1 << 27;

// One logit operand row x of length D (rule.h, the cosine units): its
// dominant channels, sorted descending by square the top m for the largest
// m <= D / 2 whose m-th square is at least kDominantRatio times the mean of
// the rest (order-free), into *dom; returns their share of the row's sum of
// squares (0: none). Then scales x to unit length (by *scaled_by; 0: a zero
// or non-finite row, not scaled).
LD dominant_channels(LD* x, int64_t D, std::vector<int64_t>* dom,
                     LD* scaled_by) {
  std::vector<int64_t> idx(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) idx[static_cast<size_t>(d)] = d;
  // Ties by index: the order of a stable sort, without its temporary
  // buffer (operator new(nothrow), which the allocation-counting tests of
  // blas_path/ do not replace: ASan's alloc-dealloc mismatch).
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const LD sa = x[a] * x[a], sb = x[b] * x[b];
    return sa != sb ? sa > sb : a < b;
  });
  LD total = 0;  // smallest first
  for (int64_t d = D - 1; d >= 0; --d) {
    const LD v = x[idx[static_cast<size_t>(d)]];
    total += v * v;
  }
  dom->clear();
  *scaled_by = 0;
  if (!(total > 0) || !std::isfinite(total)) return 0;
  LD rest = total, head = 0, share = 0;
  int64_t count = 0;
  for (int64_t m = 1; 2 * m <= D; ++m) {
    const LD v = x[idx[static_cast<size_t>(m - 1)]];
    head += v * v;
    rest -= v * v;
    if (v * v >=
        kDominantRatio * std::max<LD>(rest, 0) / static_cast<LD>(D - m))
      share = head, count = m;
  }
  dom->assign(idx.begin(), idx.begin() + count);
  const LD norm = std::sqrt(total);
  *scaled_by = norm;
  for (int64_t d = 0; d < D; ++d) x[d] /= norm;
  return std::min<LD>(share / total, 1);
}

}  // namespace

// The per-row facts of cosine_units (rule_terms.h, CosineRows): each
// logit operand row's dominant share and channels (the sort), its norms and
// its signed unit row in double; the rows scaled to unit length in long
// double are formed on demand (pairs with a dominant row only).
struct CosineRows::Impl {
  struct Side {
    const std::vector<double>* src = nullptr;  // paper, sdpa: c.q or c.k
    std::vector<LD> xa, xt;                    // formulations: |x| and x~
    std::vector<LD> share;
    std::vector<LD> xnorm;  // sqrt of the sorted sum of squares; 0: unscaled
    std::vector<LD> ynorm;  // the natural-order norm (the unit test, x~)
    std::vector<std::vector<int64_t>> dom;
    std::vector<unsigned char> unit;
    std::vector<double> sd;  // the signed unit rows in double
    // Row r of x scaled to unit length (dominant_channels' scaling).
    void scaled(size_t r, int64_t D, LD* out) const {
      const auto off = r * static_cast<size_t>(D);
      for (int64_t d = 0; d < D; ++d) {
        const LD x = src != nullptr ? static_cast<LD>((*src)[off + d])
                                    : xa[off + static_cast<size_t>(d)];
        out[d] = xnorm[r] > 0 ? x / xnorm[r] : x;
      }
    }
  };
  int64_t D = 0, B = 0, H = 0, Hk = 0, Nq = 0, Nk = 0;
  bool mags = false;
  // RoPE after the normalization: the rows are the rotated operands'
  // magnitudes (OperandMags::xar), whose norms exceed x_a's by up to sqrt 2
  // (A's scale): the units scale by the two sides' largest row-norm ratio
  // (units(), rule.h "RoPE"). 1 otherwise.
  double rope_ratio = 1;
  Side side[2];
};

// The derivation is rule.h's (the cosine units dot): the logit operand rows
// are the paper's q and k (q_hat has q's shares and cosines), the
// formulations' x_a = |x_hat| |w| + |beta| (their cosine of magnitudes
// bounds |C|) and sdpa's q and k, per head row of D; every pair of a q row
// and a k row of the same head (masked pairs too: a maximum over more pairs
// bounds the visible ones'). The coherent excess reads the signed cosine:
// the same rows, and for the formulations x_tilde over the x_a row's norm.
CosineRows::CosineRows(const AttentionCase& c)
    : impl(std::make_unique<Impl>()) {
  const AttentionProblem& p = c.problem;
  Impl& m = *impl;
  m.D = p.head_dim;
  m.B = p.batch;
  m.H = p.heads;
  m.Hk = kv_heads_of(p);
  m.Nq = p.q_len;
  m.Nk = p.kv_len;
  const int64_t D = m.D;
  if (D <= 1) return;
  m.mags = (p.variant == Variant::kQKNorm && !is_paper_formulation(p)) ||
           has_rope(p);
  std::vector<LD> row(static_cast<size_t>(D));
  for (int s = 0; s < 2; ++s) {
    Impl::Side& sd = m.side[s];
    size_t len = 0;
    if (m.mags) {
      OperandMags o = operand_mags(c, s);
      if (!o.xar.empty()) {
        auto max_norm = [D](const std::vector<LD>& x) {
          LD mx = 0;
          for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
               r += static_cast<size_t>(D)) {
            LD t = 0;
            for (int64_t d = 0; d < D; ++d)
              t +=
                  x[r + static_cast<size_t>(d)] * x[r + static_cast<size_t>(d)];
            mx = std::max(mx, std::sqrt(t));
          }
          return mx;
        };
        const LD a = max_norm(o.xa), ar = max_norm(o.xar);
        if (a > 0 && std::isfinite(ar))
          m.rope_ratio *= static_cast<double>(ar / a);
        o.xa = std::move(o.xar);
      }
      sd.xa = std::move(o.xa);
      sd.xt = std::move(o.xt);
      len = sd.xa.size();
    } else {
      sd.src = s == 0 ? &c.q : &c.k;
      len = sd.src->size();
    }
    const size_t n = len / static_cast<size_t>(D);
    sd.share.assign(n, 0);
    sd.xnorm.assign(n, 0);
    sd.ynorm.assign(n, 0);
    sd.dom.assign(n, {});
    sd.unit.assign(n, 0);
    sd.sd.resize(len);
    for (size_t r = 0; r < n; ++r) {
      const auto off = r * static_cast<size_t>(D);
      for (int64_t d = 0; d < D; ++d)
        row[static_cast<size_t>(d)] = sd.src != nullptr
                                          ? static_cast<LD>((*sd.src)[off + d])
                                          : sd.xa[off + static_cast<size_t>(d)];
      LD norm = 0;
      for (int64_t d = 0; d < D; ++d) norm += row[d] * row[d];
      norm = std::sqrt(norm);
      sd.unit[r] = norm > 0 && std::isfinite(norm);
      sd.ynorm[r] = norm;
      sd.share[r] = dominant_channels(row.data(), D, &sd.dom[r], &sd.xnorm[r]);
      // The signed unit row: x scaled (paper, sdpa) or x~ over x_a's norm.
      for (int64_t d = 0; d < D; ++d) {
        const size_t e = off + static_cast<size_t>(d);
        sd.sd[e] = static_cast<double>(
            m.mags ? (sd.unit[r] ? sd.xt[e] / norm : 0) : row[d]);
      }
    }
  }
}
CosineRows::~CosineRows() = default;

double CosineRows::units() const {
  const Impl& m = *impl;
  return units({m.B, m.H, m.Hk, m.Nq, m.Nk});
}

double CosineRows::units(const Pairs& r) const {
  return impl->rope_ratio * unscaled_units(r);
}

double CosineRows::unscaled_units(const Pairs& r) const {
  const Impl& m = *impl;
  const int64_t D = m.D;
  if (D <= 1) return kDotUnits;
  const Impl::Side &qs = m.side[0], &ks = m.side[1];
  const int64_t group = m.H / m.Hk;
  for (int64_t h = r.q_head; h < r.q_head + r.heads; ++h)
    if (h / group < r.k_head || h / group >= r.k_head + r.kv_heads)
      throw Error("cosine_units", {},
                  "query head " + std::to_string(h) + " reads kv head " +
                      std::to_string(h / group) +
                      ", outside the pairs' kv "
                      "heads [" +
                      std::to_string(r.k_head) + ", " +
                      std::to_string(r.k_head + r.kv_heads) + ")");
  // The whole case's rows of the pairs' query and key rows.
  auto qrow = [&](int64_t b, int64_t h, int64_t i) {
    return static_cast<size_t>(((r.b + b) * m.H + r.q_head + h) * m.Nq +
                               r.q_row + i);
  };
  auto krow = [&](int64_t b, int64_t hk, int64_t j) {
    return static_cast<size_t>(((r.b + b) * m.Hk + r.k_head + hk) * m.Nk +
                               r.k_row + j);
  };
  LD smax[2] = {0, 0};
  for (int64_t b = 0; b < r.batch; ++b) {
    for (int64_t h = 0; h < r.heads; ++h)
      for (int64_t i = 0; i < r.q_len; ++i)
        smax[0] = std::max(smax[0], qs.share[qrow(b, h, i)]);
    for (int64_t h = 0; h < r.kv_heads; ++h)
      for (int64_t j = 0; j < r.kv_len; ++j)
        smax[1] = std::max(smax[1], ks.share[krow(b, h, j)]);
  }
  const auto dd = static_cast<double>(D);
  // Random-sign pairs' cosines stay within kChanceCosine / sqrt(D)
  // (rule.h): below kChanceCosine^2 channels no cosine exceeds it.
  const double chance = kChanceCosine / std::sqrt(dd);
  const bool coherent = chance < 1;
  if (smax[0] == 0 && smax[1] == 0 && !coherent) return kDotUnits;
  const double lambda_d = std::min(kSumLambda * std::sqrt(dd), dd - 1);
  LD worst = 0;
  if (static_cast<double>(r.batch * r.heads) * static_cast<double>(r.q_len) *
          static_cast<double>(r.kv_len) * dd >
      kCosinePairWork) {
    worst = std::max<LD>(smax[0] + smax[1], coherent ? 2 * (1 - chance) : 0);
    return kDotUnits + lambda_d * static_cast<double>(worst);
  }
  const bool mags = m.mags;
  const auto Du = static_cast<size_t>(D);
  // The rows in long double (unit x, and for the formulations x~ over the
  // x_a row's norm), formed once per row on demand (the pairs with a
  // dominant row): one query row at a time, the key rows cached.
  const size_t kw = mags ? 2 * Du : Du;  // a key row's cache slot
  thread_local std::vector<LD> qbuf, kbuf;
  thread_local std::vector<unsigned char> kdone;
  qbuf.resize(kw);
  const auto nk_rows = static_cast<size_t>(r.batch * r.kv_heads * r.kv_len);
  if (kbuf.size() < nk_rows * kw) kbuf.resize(nk_rows * kw);
  kdone.assign(nk_rows, 0);
  auto form = [&](const Impl::Side& s, size_t row, LD* out) {
    s.scaled(row, D, out);
    if (mags)
      for (size_t d = 0; d < Du; ++d)
        out[Du + d] = s.unit[row] ? s.xt[row * Du + d] / s.ynorm[row] : 0;
  };
  std::vector<unsigned char> in_q(Du);
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t h = 0; h < r.heads; ++h) {
      const int64_t hk = (r.q_head + h) / group - r.k_head;
      for (int64_t i = 0; i < r.q_len; ++i) {
        const size_t rq = qrow(b, h, i);
        bool q_formed = false;
        const double* qd = qs.sd.data() + rq * Du;
        std::fill(in_q.begin(), in_q.end(), 0);
        for (int64_t d : qs.dom[rq]) in_q[static_cast<size_t>(d)] = 1;
        for (int64_t j = 0; j < r.kv_len; ++j) {
          const size_t rk = krow(b, hk, j);
          const LD s = qs.share[rq] + ks.share[rk];
          if (s == 0) {
            if (!coherent || !qs.unit[rq] || !ks.unit[rk]) continue;
            const double* kd = ks.sd.data() + rk * Du;
            double sc = 0;
            for (int64_t d = 0; d < D; ++d) sc += qd[d] * kd[d];
            worst =
                std::max<LD>(worst, 2 * std::max(0.0, std::fabs(sc) - chance));
            continue;
          }
          if (!q_formed) {
            form(qs, rq, qbuf.data());
            q_formed = true;
          }
          const auto slot =
              static_cast<size_t>((b * r.kv_heads + hk) * r.kv_len + j);
          LD* kr = kbuf.data() + slot * kw;
          if (!kdone[slot]) {
            form(ks, rk, kr);
            kdone[slot] = 1;
          }
          const LD* qr = qbuf.data();
          LD cos = 0, t = 0;
          for (int64_t d = 0; d < D; ++d) cos += qr[d] * kr[d];
          for (int64_t d : qs.dom[rq]) t += std::fabs(qr[d] * kr[d]);
          for (int64_t d : ks.dom[rk])
            if (!in_q[static_cast<size_t>(d)]) t += std::fabs(qr[d] * kr[d]);
          LD e = 0;  // the coherent excess of the signed cosine
          if (coherent && qs.unit[rq] && ks.unit[rk]) {
            LD sc = cos;
            if (mags) {
              sc = 0;
              for (size_t d = 0; d < Du; ++d) sc += qr[Du + d] * kr[Du + d];
            }
            e = std::max<LD>(0, std::fabs(sc) - chance);
          }
          // Two bounds of the same partial sums' full-size part (rule.h):
          // the larger holds.
          worst = std::max({worst, std::fabs(cos) * s / 2 + t, 2 * e});
        }
      }
    }
  return kDotUnits + lambda_d * static_cast<double>(worst);
}

double cosine_units(const AttentionCase& c) { return CosineRows(c).units(); }

// x_hat's absolute resolution per ulp_c(0) in one normalization row of
// length L and divisor den (exact: m.den), below the compute format's
// normal range. The one place it is derived; the row's own x_hat reads it
// (the normalization backward and the weight gradient) and, through
// operand_resolution, the other side's gradients:
//   l2: 1 (u = x / n rounds once; tiny rows are scaled exactly first);
//   rms, layer: kOpUnits (sqrt(L) + 1 / den). (a) x_hat = y f from the
//     scaled row y (its subnormal elements resolved to ulp_c(0), each
//     rounding) and f <= sqrt(L): (f + 1) / 2 ulp_c(0) per rounding,
//     kOpUnits sqrt(L) bounds it (found by the fuzzer, issue 16: qwen3,
//     f64, a q row spanning 7e240 to 1e-80, reference:f64's dq 12 bounds
//     off where x_hat was subnormal). (b) The operations a kernel performs
//     on the row at the input's own scale before it divides by den (x_e / 2
//     and mu / 2 against overflow, x_e - mu) round a subnormal result to
//     ulp_c(0) / 2 each, and the division by den (as low as sqrt(eps))
//     multiplies that: two such roundings (x_e / 2 and mu / 2, each at half
//     scale) cost 2 ulp_c(0) / den, kOpUnits / den bounds them (found by
//     the CI's fuzz run with formulations on: qwen3, f64, x_e = ulp(0) in a
//     q row of max|x| = 1e-12, den = sqrt(eps) = 1e-3: reference:f64's x_e /
//     2 rounds to 0, x_hat_e = 4.9e-321 (1000 ulp(0)) becomes 0, and dq_e =
//     -x_hat_e c / den = 1.3e-282 is returned as 0; margin 1.28);
//   none: 0 (x_hat = x).
// scaled_row_resolution is part (a) alone (l2 1, rms and layer kOpUnits
// sqrt(L)): the resolution at the scaled row's magnitude, where the
// normalization backward forms du (oracle_attention's `side`).
LD scaled_row_resolution(const AttentionProblem& p, int64_t L) {
  if (p.variant != Variant::kQKNorm) return 0;
  switch (p.norm.kind) {
    case NormKind::kNone:
      return 0;
    case NormKind::kL2:
      return 1;
    case NormKind::kRms:
    case NormKind::kLayer:
      break;
  }
  return kOpUnits * std::sqrt(static_cast<LD>(L));
}

LD x_hat_resolution(const AttentionProblem& p, int64_t L, LD den) {
  const bool by_den =
      p.variant == Variant::kQKNorm &&
      (p.norm.kind == NormKind::kRms || p.norm.kind == NormKind::kLayer);
  return by_den ? kOpUnits * (std::sqrt(static_cast<LD>(L)) + 1 / den)
                : scaled_row_resolution(p, L);
}

// The logit operand x_tilde_e = x_hat_e w_e + beta_e of one side, per
// element, resolved per ulp_c(0) to its x_hat's resolution (the row's
// x_hat_resolution) times |w_e|, plus one ulp_c(0) for the product and one
// for the bias addition where the formulation has them. The other side's
// gradients read it through dx_tilde = s sum dS x_tilde' (found by the CI's
// fuzz run with formulations on: olmo2, f64, a k element of 4 ulp(0) in a
// row whose max is 1.7e38: k_hat_e = 1.3 ulp(0) returns as 0 and k_tilde_e =
// -2 k_hat_e is 2.6 ulp(0) off, times s dS = 2.9e24 in dq_tilde; dq_weight
// 2.8e-299 returned as 0 where one ulp(0) per key was counted, margin 1.32;
// and a k row of rms 0.31 whose k_hat_e = 9.6 ulp(0) is 6.4 ulp(0) off,
// times w_e = 1.5, margin 2.34).
// Into *out (resized; a workspace array, not a fresh n x D allocation per
// sampled sub-case).
template <class T>
void operand_resolution(const AttentionProblem& p, const OperandMagsT<T>& m,
                        std::vector<T>* out_v) {
  const NormRows& nr = m.rows;
  const int64_t L = nr.len();
  const bool qk = p.variant == Variant::kQKNorm;
  const T ops = (qk && p.norm.weight != ParamShape::kNone ? 1 : 0) +
                (qk && p.norm.bias ? 1 : 0);
  std::vector<T>& out = *out_v;
  out.resize(m.wv.size());
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    const auto res =
        static_cast<T>(x_hat_resolution(p, L, m.den[static_cast<size_t>(r0)]));
    for (int64_t e = 0; e < L; ++e) {
      const auto o = static_cast<size_t>(nr.at(r0, e));
      out[o] = res * std::fabs(m.wv[o]) + ops;
    }
  }
}

// An element of x_hat is ambiguous when its distance to the storage
// format's rounding midpoint is within a correct kernel's error of x_hat,
// (sum_units(L) / 2 + 2) u_c |x_hat| (an L-term sum of squares, its square
// root, the product) plus ulp_c(0); a correct kernel may then round it to
// either neighbour: a flip moves the rounded x_hat by ulp_s(x_hat), x_tilde
// by that times |w|.
bool flips_x_hat(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const Precision st = c.storage;
  return p.variant == Variant::kQKNorm && p.norm.round_before_weight &&
         (st == Precision::kBF16 || st == Precision::kF16);
}

namespace {
// x's flip (ulp_s(x) where ambiguous, else 0) in a row of length L.
double flip_of(Precision st, double x, int64_t L) {
  const double rel =
      (sum_units(static_cast<double>(L)) / 2 + 2) * compute_roundoff(st);
  const double sp = ulp(st, std::fabs(x));
  const double rd = round_to(st, x);
  const double to_mid = std::fabs(sp / 2 - std::fabs(x - rd));
  return to_mid <= rel * std::fabs(x) + ulp(Precision::kF32, 0) ? sp : 0;
}
}  // namespace

template <class T>
void rounding_flips(const AttentionCase& c, const OperandMagsT<T>& m,
                    std::vector<T>* out) {
  out->clear();
  if (!flips_x_hat(c)) return;
  out->resize(m.xh.size());
  for (size_t o = 0; o < m.xh.size(); ++o)
    (*out)[o] = static_cast<T>(
        flip_of(c.storage, static_cast<double>(m.xh[o]), m.rows.len()));
}

// OracleAttention::logit_flip: the logit moves by at most s times (the
// row's flips times |w|) times the other side's largest operand element,
// per side.
template <class T>
LD logit_flip(const AttentionCase& c, const OperandMagsT<T>& qm,
              const OperandMagsT<T>& km, T s) {
  if (!flips_x_hat(c)) return 0;
  auto side_flip = [&](const OperandMagsT<T>& m) {
    const NormRows& nr = m.rows;
    LD worst = 0;
    for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
      LD f = 0;
      for (int64_t e = 0; e < nr.len(); ++e) {
        const size_t o = static_cast<size_t>(nr.at(r0, e));
        const double sp =
            flip_of(c.storage, static_cast<double>(m.xh[o]), nr.len());
        if (sp != 0) f += static_cast<LD>(sp) * std::fabs(m.wv[o]);
      }
      worst = std::max(worst, f);
    }
    return worst;
  };
  auto max_abs = [](const std::vector<T>& x) {
    LD a = 0;
    for (T e : x) a = std::max<LD>(a, std::fabs(e));
    return a;
  };
  // RoPE after the normalization: the flips' l1 grows by up to sqrt 2 in
  // the rotated coordinates; the other side's rotated magnitude bounds its
  // elements there (OperandMags::logit_mag).
  const LD rot = qm.xar.empty() ? 1 : std::sqrt(static_cast<LD>(2));
  return s * rot *
         (side_flip(qm) * max_abs(km.logit_mag()) +
          side_flip(km) * max_abs(qm.logit_mag()));
}
#define QKNORM_RULE_TERMS_INSTANTIATE(T)                                  \
  template void operand_resolution<T>(                                    \
      const AttentionProblem&, const OperandMagsT<T>&, std::vector<T>*);  \
  template LD logit_flip<T>(const AttentionCase&, const OperandMagsT<T>&, \
                            const OperandMagsT<T>&, T);                   \
  template void rounding_flips<T>(const AttentionCase&,                   \
                                  const OperandMagsT<T>&, std::vector<T>*);
QKNORM_RULE_TERMS_INSTANTIATE(float)
QKNORM_RULE_TERMS_INSTANTIATE(double)
QKNORM_RULE_TERMS_INSTANTIATE(long double)
#undef QKNORM_RULE_TERMS_INSTANTIATE

namespace {
// In long double: a row norm (or the product of two) near DBL_MAX overflows
// double and made A = 0 * inf = NaN (found by the fuzzer, issue 7).
long double max_row_norm(const std::vector<double>& x, int64_t D) {
  long double m = 0;
  for (size_t r = 0; r + static_cast<size_t>(D) <= x.size();
       r += static_cast<size_t>(D)) {
    long double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<LD>(x[r + static_cast<size_t>(d)]) *
           x[r + static_cast<size_t>(d)];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}
}  // namespace

double logit_amplitude(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  if (p.variant == Variant::kQKNorm && is_paper_formulation(p))
    return std::fabs(p.g);
  if (p.variant == Variant::kQKNorm) {
    // |scale| max ||q_a|| max ||k_a|| over the per-head operand rows, with
    // x_a = |x_hat| |w| + |beta| (rms: at most sqrt(D) max|w_q| max|w_k|
    // scale without bias).
    auto max_norm = [&](const std::vector<LD>& xa) {
      LD m = 0;
      const auto D = static_cast<size_t>(p.head_dim);
      for (size_t r = 0; r + D <= xa.size(); r += D) {
        LD t = 0;
        for (size_t d = 0; d < D; ++d) t += xa[r + d] * xa[r + d];
        m = std::max(m, std::sqrt(t));
      }
      return m;
    };
    const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
    return static_cast<double>(sc * max_norm(operand_mags(c, 0).xa) *
                               max_norm(operand_mags(c, 1).xa));
  }
  return static_cast<double>(max_row_norm(c.q, p.head_dim) *
                             max_row_norm(c.k, p.head_dim) /
                             std::sqrt(static_cast<LD>(p.head_dim)));
}

// The pass's error, per f64 unit roundoff u (the derivation the header
// promises). The pass computes each logit as a correct f64 kernel does, to
// dS_ik = dot u A in the rule's model (dot: the case's cosine_units; it reads
// x_tilde rounded once from long double, so no divisor term), and l_i in
// chunked sums: lse_i is off by at most e = dot A + sum_units(kChunk) +
// 2 kOpUnits units (exp, log). A sampled key row's oracle forms S_ij exactly
// and P_ij = exp(S_ij - lse_i): every P_ij of row i scales by the same (1 - d
// lse_i), so dV_jd = sum_i P_ij dO_id moves by e u dv_mag. delta_i = sum_k P_ik
// dP_ik moves by sum_k P_ik (dS_ik - d lse_i) dP_ik = sum_k P_ik dS_ik (dP_ik -
// delta_i) - d lse_i delta_i, plus its own dots and chunked sums, u
// (sum_units(D) + sum_units(kChunk)) Del_i. So dS_ij = P_ij (dP_ij -
// delta_i) moves by at most
//   u e P_ij (|dP_ij - delta_i| + sum_k P_ik |dP_ik - delta_i|) + ...
// <= 2 e u (the softmax terms ds_mag: P_ij (|dP_ij - delta_i| + ds_l1 / 2))
//  + u (sum_units(D) + sum_units(kChunk)) (the magnitudes P_ij Del_i).
// soft_units = 2 e (also bounding dV's e), units = sum_units(D) +
// sum_units(kChunk); dg sums both over dg_scale.
void pass_units(double A, double dot_units, int64_t D, double* units,
                double* soft_units) {
  const double e =
      dot_units * std::fabs(A) + sum_units(kPassChunk) + 2 * kOpUnits;
  *soft_units = 2 * e;
  *units = sum_units(static_cast<double>(D)) + sum_units(kPassChunk);
}

}  // namespace qknorm::validation
