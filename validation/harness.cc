#include "validation/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "qknorm/error.h"
#include "reference/reference.h"

namespace qknorm::validation {
namespace {

using LD = long double;

const char* variant_name(Variant v) {
  return v == Variant::kQKNorm ? "qknorm" : "sdpa";
}

std::string mask_desc(const Mask& m) {
  std::string s = m.causal ? "causal" : "";
  if (!m.key_lengths.empty()) {
    if (!s.empty()) s += "+";
    s += "pad[";
    for (size_t i = 0; i < m.key_lengths.size(); ++i)
      s += (i ? "," : "") + std::to_string(m.key_lengths[i]);
    s += "]";
  }
  return s.empty() ? "none" : s;
}

// Fills `rows` rows of length D drawn from dist; `scale_rows` applies the
// per-row magnitude spread (q and k only) and zero rows.
// `v_operand` marks v (kMixedScaleV scales its rows).
void fill(Rng& rng, Distribution dist, int64_t rows, int64_t D, bool qk_operand,
          Precision range, std::vector<double>* out, bool v_operand = false) {
  out->resize(static_cast<size_t>(rows * D));
  // Exponent range of kWideMagnitude row scales, clamped to the format:
  // 8 sqrt(D) below max_finite leaves room for the row's norm (Gaussian
  // entries), and 4x more for apply_structure's multiples 2^e x src, e <= 2
  // (generators.cc). Without the 4x, f16 rows of dim 1 with a parallel-row
  // structure rounded to +-inf: invalid input, and a false alarm in the
  // property soak (issue 15's findings, property-soak-d7649ef.txt:
  // Determinism, Orthogonality, ZeroDO on simd f16 entries).
  const double hi = std::min(
      30.0, std::log10(max_finite(range) / (32 * std::sqrt(double(D)))));
  const double lo = std::max(-30.0, std::log10(min_normal(range) * 0x1p12));
  for (int64_t r = 0; r < rows; ++r) {
    double row_scale = 1;
    if (qk_operand && dist == Distribution::kWideMagnitude)
      row_scale = std::pow(10.0, rng.uniform(lo, hi));
    if (qk_operand && dist == Distribution::kOutlierRows &&
        rng.uniform() < 0.125)
      row_scale = std::pow(10.0, std::min(rng.uniform(3, 5), hi));
    if (v_operand && dist == Distribution::kMixedScaleV)
      row_scale =
          std::pow(10.0, rng.uniform(std::max(-3.0, lo), std::min(3.0, hi)));
    const bool zero =
        qk_operand && dist == Distribution::kZeroRows && rng.uniform() < 0.25;
    for (int64_t d = 0; d < D; ++d) {
      double x;
      switch (dist) {
        case Distribution::kUniform:
          x = rng.uniform(-1, 1);
          break;
        case Distribution::kHeavyTailed:
          x = rng.student_t3();
          break;
        default:
          x = rng.normal();
          break;
      }
      (*out)[static_cast<size_t>(r * D + d)] = zero ? 0.0 : x * row_scale;
    }
  }
}

std::vector<double> rounded(const std::vector<double>& x, Precision p) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = round_to(p, x[i]);
  return r;
}

// A storage buffer holding a [B,H,rows,D] tensor with `pad` extra elements
// after each row, prefilled with NaN (caught if an output is left unwritten).
struct Buffer {
  Precision prec;
  int64_t B, H, rows, D, pad;
  std::vector<unsigned char> bytes;
  Layout4 layout;
  Buffer(Precision p, int64_t B_, int64_t H_, int64_t rows_, int64_t D_,
         int64_t pad_)
      : prec(p), B(B_), H(H_), rows(rows_), D(D_), pad(pad_) {
    const int64_t rs = D + pad;
    layout = Layout4{H * rows * rs, rows * rs, rs};
    bytes.resize(static_cast<size_t>(B * H * rows * rs) * element_bytes(p));
    for (size_t i = 0; i < static_cast<size_t>(B * H * rows * rs); ++i)
      encode(p, std::numeric_limits<double>::quiet_NaN(), bytes.data(), i);
  }
  int64_t size() const { return B * H * rows * (D + pad); }
  size_t offset(int64_t idx) const {
    const int64_t d = idx % D, r = idx / D;
    return static_cast<size_t>(r * (D + pad) + d);
  }
  void store(const std::vector<double>& x) {
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      encode(prec, x[static_cast<size_t>(i)], bytes.data(), offset(i));
  }
  std::vector<double> load() const {
    std::vector<double> x(static_cast<size_t>(B * H * rows * D));
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      x[static_cast<size_t>(i)] = decode(prec, bytes.data(), offset(i));
    return x;
  }
  ConstTensor4 cview() const { return {bytes.data(), size(), layout}; }
  MutTensor4 view() { return {bytes.data(), size(), layout}; }
};

std::vector<LD> widen(const std::vector<double>& x) {
  return {x.begin(), x.end()};
}

}  // namespace

const char* name(Distribution d) {
  switch (d) {
    case Distribution::kGaussian:
      return "gaussian";
    case Distribution::kUniform:
      return "uniform";
    case Distribution::kHeavyTailed:
      return "heavy";
    case Distribution::kWideMagnitude:
      return "wide";
    case Distribution::kZeroRows:
      return "zerorows";
    case Distribution::kOutlierRows:
      return "outliers";
    case Distribution::kMixedScaleV:
      return "mixedv";
  }
  return "?";
}

bool parse_distribution(const std::string& s, Distribution* out) {
  for (Distribution d :
       {Distribution::kGaussian, Distribution::kUniform,
        Distribution::kHeavyTailed, Distribution::kWideMagnitude,
        Distribution::kZeroRows, Distribution::kOutlierRows,
        Distribution::kMixedScaleV}) {
    if (s == name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

std::string AttentionCase::describe() const {
  const AttentionProblem& p = problem;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "B=%lld H=%lld Nq=%lld Nk=%lld D=%lld %s g=%.17g eps=%.3g "
                "mask=%s dist=%s seed=%llu row_pad=%lld",
                (long long)p.batch, (long long)p.heads, (long long)p.q_len,
                (long long)p.kv_len, (long long)p.head_dim,
                variant_name(p.variant), p.g, p.eps, mask_desc(p.mask).c_str(),
                name(dist), (unsigned long long)seed, (long long)row_pad);
  return buf;
}

std::string ScaleNormCase::describe() const {
  char buf[192];
  std::snprintf(
      buf, sizeof buf,
      "scalenorm rows=%lld dim=%lld g=%.17g eps=%.3g dist=%s seed=%llu",
      (long long)problem.rows, (long long)problem.dim, problem.g, problem.eps,
      name(dist), (unsigned long long)seed);
  return buf;
}

AttentionCase make_attention_case(const AttentionProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range) {
  AttentionCase c;
  c.problem = problem;
  c.seed = seed;
  c.dist = dist;
  Rng rng(seed);
  const int64_t BH = problem.batch * problem.heads, D = problem.head_dim;
  fill(rng, dist, BH * problem.q_len, D, true, range, &c.q);
  fill(rng, dist, BH * problem.kv_len, D, true, range, &c.k);
  fill(rng, dist, BH * problem.kv_len, D, false, range, &c.v, true);
  fill(rng, dist, BH * problem.q_len, D, false, range, &c.d_o);
  return c;
}

ScaleNormCase make_scalenorm_case(const ScaleNormProblem& problem,
                                  Distribution dist, uint64_t seed,
                                  Precision range) {
  ScaleNormCase c;
  c.problem = problem;
  c.seed = seed;
  c.dist = dist;
  Rng rng(seed);
  fill(rng, dist, problem.rows, problem.dim, true, range, &c.x);
  fill(rng, dist, problem.rows, problem.dim, false, range, &c.dy);
  return c;
}

AttentionCase round_inputs(const AttentionCase& c, Precision prec) {
  AttentionCase r = c;
  r.q = rounded(c.q, prec);
  r.k = rounded(c.k, prec);
  r.v = rounded(c.v, prec);
  r.d_o = rounded(c.d_o, prec);
  return r;
}

ScaleNormCase round_inputs(const ScaleNormCase& c, Precision prec) {
  ScaleNormCase r = c;
  r.x = rounded(c.x, prec);
  r.dy = rounded(c.dy, prec);
  return r;
}

namespace {
AttentionResult run_impl(const Backend& b, const AttentionCase& c,
                         const ExecConfig& cfg, Workspace* ws, bool backward) {
  const AttentionProblem& p = c.problem;
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, pad = c.row_pad;
  Buffer q(s, B, H, p.q_len, D, pad), k(s, B, H, p.kv_len, D, pad),
      v(s, B, H, p.kv_len, D, pad), o(s, B, H, p.q_len, D, pad);
  q.store(c.q);
  k.store(c.k);
  v.store(c.v);
  AttentionResult r;
  r.lse.assign(static_cast<size_t>(B * H * p.q_len),
               std::numeric_limits<double>::quiet_NaN());
  ForwardArgs fa{q.cview(), k.cview(),    v.cview(),
                 o.view(),  r.lse.data(), static_cast<int64_t>(r.lse.size())};
  checked_attention_forward(b, p, fa, ws, cfg);
  r.o = o.load();
  if (!backward) return r;
  Buffer d_o(s, B, H, p.q_len, D, pad), dq(s, B, H, p.q_len, D, pad),
      dk(s, B, H, p.kv_len, D, pad), dv(s, B, H, p.kv_len, D, pad);
  d_o.store(c.d_o);
  r.dg = std::numeric_limits<double>::quiet_NaN();
  BackwardArgs ba{q.cview(),
                  k.cview(),
                  v.cview(),
                  o.cview(),
                  d_o.cview(),
                  r.lse.data(),
                  static_cast<int64_t>(r.lse.size()),
                  dq.view(),
                  dk.view(),
                  dv.view(),
                  &r.dg};
  checked_attention_backward(b, p, ba, ws, cfg);
  r.dq = dq.load();
  r.dk = dk.load();
  r.dv = dv.load();
  return r;
}
}  // namespace

AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, true);
}

AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, false);
}

ScaleNormResult run_scalenorm(const Backend& b, const ScaleNormCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  const ScaleNormProblem& p = c.problem;
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  Buffer x(s, 1, 1, p.rows, p.dim, 0), y(s, 1, 1, p.rows, p.dim, 0),
      dy(s, 1, 1, p.rows, p.dim, 0), dx(s, 1, 1, p.rows, p.dim, 0);
  x.store(c.x);
  dy.store(c.dy);
  ScaleNormResult r;
  ScaleNormForwardArgs fa{{x.bytes.data(), x.size(), p.dim},
                          {y.bytes.data(), y.size(), p.dim}};
  checked_scalenorm_forward(b, p, fa, ws, cfg);
  r.y = y.load();
  r.dg = std::numeric_limits<double>::quiet_NaN();
  ScaleNormBackwardArgs ba{{x.bytes.data(), x.size(), p.dim},
                           {dy.bytes.data(), dy.size(), p.dim},
                           {dx.bytes.data(), dx.size(), p.dim},
                           &r.dg};
  checked_scalenorm_backward(b, p, ba, ws, cfg);
  r.dx = dx.load();
  return r;
}

OracleAttention oracle_attention(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  OracleAttention r;
  auto q = widen(c.q), k = widen(c.k), v = widen(c.v), d_o = widen(c.d_o);
  r.o.resize(q.size());
  r.lse.resize(static_cast<size_t>(p.batch * p.heads * p.q_len));
  reference::attention_forward<LD>(p, q.data(), k.data(), v.data(), r.o.data(),
                                   r.lse.data());
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  std::vector<LD> ds(
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
  reference::attention_backward<LD>(p, q.data(), k.data(), v.data(), r.o.data(),
                                    d_o.data(), r.lse.data(), r.dq.data(),
                                    r.dk.data(), r.dv.data(), &r.dg, ds.data());
  // dg sums dS_ij C_ij with dS_ij = P_ij (dP_ij - delta_i): the rounding
  // error of those terms scales with P_ij (|dP_ij| + |delta_i|), not with
  // |dS_ij|, which cancels to ~0 when the visible v_j are alike (found by the
  // fuzzer, issue 7: v = 7e4 everywhere, sum |dS| = 0, correct kernels 1e-2
  // apart). dg_scale is that pre-cancellation magnitude (>= sum |dS|).
  //
  // dq, dk and dv are sums of the same kind of terms, and they too can cancel
  // to ~0 (head_dim 1, where the projection removes everything; symmetric
  // rows; saturated rows): their scales are the magnitudes of their terms
  // before cancellation, max over elements of
  //   |dv_jd|:  sum_i P_ij |dO_id|
  //   |du_id|:  s sum_j T_ij |k_hat_jd|, T_ij = P_ij (|dO_i|.|v_j| + Del_i),
  //             Del_i = sum_k P_ik |dO_i|.|v_k|,
  //             s = |g| (qknorm) or 1/sqrt(D) (sdpa); |du_jd| for keys with
  //             T^T and q_hat;
  //   |dx_d|:   (|du_d| + |u_d| sum_e |u_e| |du_e|) / max(||x||, eps) through
  //             the normalization backward (qknorm).
  // |x|.|y| = sum_d |x_d||y_d| is the magnitude a dot product's rounding
  // error scales with (Higham, Accuracy and Stability, 3.1), not |x . y|:
  // dP_ij = dO_i . v_j and delta_i = sum_k P_ik dP_ik = dO_i . O_i can both
  // cancel (found by the fuzzer, issue 7: sdpa, q = 0, P uniform over 7
  // keys, delta = 0.036 from terms of ~3; a correct blas:f64 dq was 17 ulp
  // of |dq| off where the old scale, built on |dP| and |delta|, allowed 4).
  // Del_i bounds both ways of computing delta (|dO_i|.|O_i| <= Del_i).
  //
  // The backward also reads the stored O (delta = dO . O), and each entry
  // stores its own: below the normal range the storage format resolves O
  // only to ulp_s(0), absolutely, so two correct entries' O differ by that
  // much whatever their relative accuracy. Its effect on a gradient is the
  // sensitivity *_o_sens times ulp_s(0) (verdict), with
  //   dS_ij per unit of O error: P_ij sum_d |dO_id|
  // carried through the same sums as T_ij (found by the fuzzer, issue 7:
  // f32, zero q rows, O ~ 1e-42 stored with 1.4e-45 resolution, dq = g dS
  // k_hat / eps with eps = 2.9e-36: a correct simd dq 4% off, the naive 0.6%).
  //
  // Likewise the compute format resolves its own intermediates only to
  // ulp_c(0) below the normal range: dP_ij and delta_i (D products and sums
  // each, <= D ulp_c(0)), dS_ij = P_ij (dP_ij - delta_i) (<= P_ij (2D + 1)
  // + 1), du = s sum_j dS_ij k_hat_j (+ Nk for its own sums) and the
  // normalization backward's u . du (+ D + 2). *_uf_sens is that count per
  // ulp_c(0), carried through the normalization backward (found by the
  // fuzzer, issue 7: f32, zero q rows, eps = 2.9e-36, dO ~ 4.6e-40: dP is a
  // subnormal with a few bits, a correct blas:f32 dq returned 0 for -3.9e-9,
  // the naive -5.7e-9). Outside subnormal intermediates both terms are far
  // below u * scale.
  {
    const int64_t D = p.head_dim, Nq = p.q_len, Nk = p.kv_len;
    const bool qk = p.variant == Variant::kQKNorm;
    std::vector<LD> probs(ds.size());
    reference::attention_probabilities<LD>(p, q.data(), k.data(), probs.data());
    // Unit rows (qknorm) or the raw rows (sdpa), and max(||x||, eps).
    auto unit_rows = [&](const std::vector<LD>& x, std::vector<LD>* u,
                         std::vector<LD>* den) {
      const int64_t rows = static_cast<int64_t>(x.size()) / D;
      u->assign(x.begin(), x.end());
      den->assign(static_cast<size_t>(rows), 1);
      if (!qk) return;
      for (int64_t r0 = 0; r0 < rows; ++r0) {
        const LD n = reference::nrm2<LD>(x.data() + r0 * D, D);
        (*den)[static_cast<size_t>(r0)] = std::max(n, static_cast<LD>(p.eps));
        for (int64_t d = 0; d < D; ++d)
          (*u)[static_cast<size_t>(r0 * D + d)] /=
              (*den)[static_cast<size_t>(r0)];
      }
    };
    std::vector<LD> qh, kh, qden, kden;
    unit_rows(q, &qh, &qden);
    unit_rows(k, &kh, &kden);
    const LD s = qk ? std::fabs(static_cast<LD>(p.g))
                    : 1 / std::sqrt(static_cast<LD>(D));
    // |dx| magnitude of one row from its |du| magnitude.
    auto norm_backward_mag = [&](const LD* u, LD den, std::vector<LD>* du) {
      if (!qk) return;
      LD c = 0;
      for (int64_t d = 0; d < D; ++d) c += std::fabs(u[d]) * (*du)[d];
      for (int64_t d = 0; d < D; ++d)
        (*du)[d] = ((*du)[d] + std::fabs(u[d]) * c) / den;
    };
    auto absdot = [D](const LD* a, const LD* b) {
      LD t = 0;
      for (int64_t d = 0; d < D; ++d) t += std::fabs(a[d]) * std::fabs(b[d]);
      return t;
    };
    // Six channels carried through the same sums: 0 the rounding scale
    // (weight T_ij), 1 the stored-O sensitivity (P_ij sum_d |dO_id|), 2 the
    // subnormal-intermediate count of dS_ij (P_ij (2D + 1) + 1; channel 2
    // adds its own sums' count to du before the normalization backward), 3
    // the stored-O relative sensitivity (P_ij |dO_i|.|O_i|), 4 |dS_ij| =
    // P_ij |dP_ij - delta_i| (exact), the size of the terms the softmax's
    // conditioning perturbs (tolerance.cc), 5 P_ij's own resolution
    // (|dP_ij - delta_i| for every visible P_ij).
    constexpr int kCh = 6;
    // The subnormal count of the sums forming du (Nk products and
    // additions, the normalization backward's D + 2), each of which the
    // scale s may multiply afterwards (found by the property suite: f32,
    // keys below eps, q_hat_d = 3.7e-39: g dS q_hat_d = 4.8e-43 formed as
    // (dS q_hat_d) g carries 13 half-ulps of 2^-149).
    const LD dq_add[kCh] = {0, 0, (1 + s) * static_cast<LD>(Nk + D + 2),
                            0, 0, 0};
    const LD dk_add[kCh] = {0, 0, (1 + s) * static_cast<LD>(Nq + D + 2),
                            0, 0, 0};
    LD dq_out[kCh] = {}, dk_out[kCh] = {}, dv_scale = 0;
    std::vector<LD> mag[kCh], dk_mag[kCh], row, av(static_cast<size_t>(Nk));
    // Per element: channel 0 -> *_mag, 1 -> *_o_sens_e, 2 -> *_uf_sens_e,
    // 3 -> *_o_rel_e, 4 -> *_ds_mag, 5 -> *_p_sens_e (see OracleAttention).
    std::vector<LD>* dq_dst[kCh] = {&r.dq_mag,       &r.dq_o_sens_e,
                                    &r.dq_uf_sens_e, &r.dq_o_rel_e,
                                    &r.dq_ds_mag,    &r.dq_p_sens_e};
    std::vector<LD>* dk_dst[kCh] = {&r.dk_mag,       &r.dk_o_sens_e,
                                    &r.dk_uf_sens_e, &r.dk_o_rel_e,
                                    &r.dk_ds_mag,    &r.dk_p_sens_e};
    for (int ch = 0; ch < kCh; ++ch) {
      dq_dst[ch]->assign(q.size(), 0);
      dk_dst[ch]->assign(k.size(), 0);
    }
    r.o_mag.assign(q.size(), 0);
    r.o_dev_mag.assign(q.size(), 0);
    r.o_p_sens_e.assign(q.size(), 0);
    r.dv_p_sens_e.assign(v.size(), 0);
    std::vector<LD> sdp(static_cast<size_t>(Nk));
    r.dv_mag.assign(v.size(), 0);
    // One row's |dx| magnitudes from m + add, stored at dst; returns the max.
    auto row_max = [&](const LD* u, LD den, LD add, std::vector<LD>* m,
                       LD* dst) {
      for (LD& e : *m) e += add;
      norm_backward_mag(u, den, m);
      LD x = 0;
      for (int64_t d = 0; d < D; ++d) {
        dst[d] = (*m)[static_cast<size_t>(d)];
        x = std::max(x, dst[d]);
      }
      return x;
    };
    // The unit rows' own absolute resolution ulp_c(0) (qknorm): x_hat_d of a
    // row whose components span many binades is subnormal, and the
    // normalization backward dx = (du - x_hat (x_hat . du)) / n multiplies
    // its error by |x_hat . du| / n; the other operand's unit rows enter du
    // = s sum dS x_hat' with weight s sum |dS| (found by the fuzzer, issue
    // 15: f64, q_hat_d below 2^-1022 beside |q_hat . du| ~ 1e45, a correct
    // dq 2400 u off). Per ulp_c(0), added to *_uf_sens_e:
    //   (a (1 + |x_hat_d| sum |x_hat|) + |x_hat . du| + |x_hat_d| sum |du|) / n
    // with a = s sum_j |dS_ij| and du the true du (signed).
    auto unit_resolution = [&](const LD* u, LD den, LD a, const LD* du,
                               LD* dst) {
      LD c = 0, l1 = 0, u1 = 0;
      for (int64_t d = 0; d < D; ++d) {
        c += u[d] * du[d];
        l1 += std::fabs(du[d]);
        u1 += std::fabs(u[d]);
      }
      for (int64_t d = 0; d < D; ++d)
        dst[d] += (a * (1 + std::fabs(u[d]) * u1) + std::fabs(c) +
                   std::fabs(u[d]) * l1) /
                  den;
    };
    std::vector<LD> du_q(static_cast<size_t>(D)), du_k, ds_col;
    for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
      du_k.assign(static_cast<size_t>(Nk * D), 0);
      ds_col.assign(static_cast<size_t>(Nk), 0);
      for (auto& m : dk_mag) m.assign(static_cast<size_t>(Nk * D), 0);
      LD* dv_mag = r.dv_mag.data() + bh * Nk * D;
      LD* dv_uf = r.dv_p_sens_e.data() + bh * Nk * D;
      for (int64_t i = 0; i < Nq; ++i) {
        const LD* doi = d_o.data() + (bh * Nq + i) * D;
        const LD* pi = probs.data() + (bh * Nq + i) * Nk;
        const LD* qhi = qh.data() + (bh * Nq + i) * D;
        LD* omag = r.o_mag.data() + (bh * Nq + i) * D;
        LD del = 0, do_l1 = 0, sdel = 0;
        for (int64_t k = 0; k < Nk; ++k) {
          const LD* vk = v.data() + (bh * Nk + k) * D;
          av[static_cast<size_t>(k)] = absdot(doi, vk);
          del += pi[k] * av[static_cast<size_t>(k)];
          LD t = 0;
          for (int64_t d = 0; d < D; ++d) t += doi[d] * vk[d];
          sdp[static_cast<size_t>(k)] = t;
          sdel += pi[k] * t;
        }
        // sum_k P_ik |dP_ik - delta_i|: delta_i's own perturbation by the
        // softmax's conditioning, per unit of |dS| perturbation.
        LD ds_l1 = 0;
        for (int64_t k = 0; k < Nk; ++k)
          ds_l1 += pi[k] * std::fabs(sdp[static_cast<size_t>(k)] - sdel);
        const LD* oi = r.o.data() + (bh * Nq + i) * D;
        LD* odev = r.o_dev_mag.data() + (bh * Nq + i) * D;
        LD* ouf = r.o_p_sens_e.data() + (bh * Nq + i) * D;
        for (int64_t d = 0; d < D; ++d) do_l1 += std::fabs(doi[d]);
        // |dO_i|.|O_i|: delta_i's error per relative error of the stored O.
        const LD o_abs_dot = absdot(doi, r.o.data() + (bh * Nq + i) * D);
        for (auto& m : mag) m.assign(static_cast<size_t>(D), 0);
        std::fill(du_q.begin(), du_q.end(), 0);
        for (int64_t j = 0; j < Nk; ++j) {
          const LD pij = pi[j];
          const LD w[kCh] = {
              pij * (av[static_cast<size_t>(j)] + del), pij * do_l1,
              pij * (2 * D + 1) + 1, pij * o_abs_dot,
              pij * (std::fabs(sdp[static_cast<size_t>(j)] - sdel) + ds_l1 / 2),
              // P_ij itself is resolved only to the compute format's
              // smallest normal (an exp may flush below it): that times
              // |dP_ij - delta_i| (found by the fuzzer, issue 15: sdpa, P =
              // e^-760 flushed to 0 in f64 beside a v row of 7e274).
              pij > 0 ? std::fabs(sdp[static_cast<size_t>(j)] - sdel) : 0};
          if (qk) {
            r.dg_scale += w[0];
            r.dg_o_sens += w[1];
            r.dg_o_rel_sens += w[3];
            r.dg_uf_sens += w[2] + 1;  // + the product dS_ij C_ij and its sum
            r.dg_p_sens += w[5];
          }
          const LD* khj = kh.data() + (bh * Nk + j) * D;
          const LD* vj = v.data() + (bh * Nk + j) * D;
          for (int64_t d = 0; d < D; ++d) {
            const auto jd = static_cast<size_t>(j * D + d);
            for (int ch = 0; ch < kCh; ++ch) {
              mag[ch][static_cast<size_t>(d)] += s * w[ch] * std::fabs(khj[d]);
              dk_mag[ch][jd] += s * w[ch] * std::fabs(qhi[d]);
            }
            const LD ds = pij * (sdp[static_cast<size_t>(j)] - sdel);
            du_q[static_cast<size_t>(d)] += s * ds * khj[d];
            du_k[jd] += s * ds * qhi[d];
            dv_mag[jd] += pij * std::fabs(doi[d]);
            omag[d] += pij * std::fabs(vj[d]);
            if (pij > 0) {  // P_ij's absolute resolution (smallest normal)
              ouf[d] += std::fabs(vj[d]);
              dv_uf[jd] += std::fabs(doi[d]);
            }
            odev[d] += pij * std::fabs(vj[d] - oi[d]);
          }
        }
        const LD qd = qden[static_cast<size_t>(bh * Nq + i)];
        for (int ch = 0; ch < kCh; ++ch)
          dq_out[ch] = std::max(
              dq_out[ch], row_max(qhi, qd, dq_add[ch], &mag[ch],
                                  dq_dst[ch]->data() + (bh * Nq + i) * D));
        LD ads = 0;
        for (int64_t j = 0; j < Nk; ++j) {
          const LD a = std::fabs(pi[j] * (sdp[static_cast<size_t>(j)] - sdel));
          ads += a;
          ds_col[static_cast<size_t>(j)] += s * a;
        }
        if (qk)
          unit_resolution(qhi, qd, s * ads, du_q.data(),
                          r.dq_uf_sens_e.data() + (bh * Nq + i) * D);
      }
      for (int64_t j = 0; j < Nk; ++j) {
        const LD* khj = kh.data() + (bh * Nk + j) * D;
        const LD kd = kden[static_cast<size_t>(bh * Nk + j)];
        for (int ch = 0; ch < kCh; ++ch) {
          row.assign(dk_mag[ch].begin() + j * D,
                     dk_mag[ch].begin() + (j + 1) * D);
          dk_out[ch] = std::max(
              dk_out[ch], row_max(khj, kd, dk_add[ch], &row,
                                  dk_dst[ch]->data() + (bh * Nk + j) * D));
        }
        if (qk)
          unit_resolution(khj, kd, ds_col[static_cast<size_t>(j)],
                          du_k.data() + j * D,
                          r.dk_uf_sens_e.data() + (bh * Nk + j) * D);
      }
      for (int64_t e = 0; e < Nk * D; ++e)
        dv_scale = std::max(dv_scale, dv_mag[e]);
    }
    r.dq_scale = dq_out[0];
    r.dk_scale = dk_out[0];
    r.dv_scale = dv_scale;
    r.dq_o_sens = dq_out[1];
    r.dk_o_sens = dk_out[1];
    r.dq_uf_sens = dq_out[2];
    r.dk_uf_sens = dk_out[2];
  }
  return r;
}

OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c) {
  const ScaleNormProblem& p = c.problem;
  OracleScaleNorm r;
  auto x = widen(c.x), dy = widen(c.dy);
  r.y.resize(x.size());
  r.dx.resize(x.size());
  reference::scalenorm_forward<LD>(p, x.data(), r.y.data());
  reference::scalenorm_backward<LD>(p, x.data(), dy.data(), r.dx.data(), &r.dg);
  // y / g = u; sum |dy_i u_i| is the magnitude of dg's terms.
  for (int64_t r0 = 0; r0 < p.rows; ++r0) {
    const LD* xr = x.data() + r0 * p.dim;
    LD n = reference::nrm2<LD>(xr, p.dim);
    LD den = std::max(n, static_cast<LD>(p.eps));
    for (int64_t i = 0; i < p.dim; ++i)
      r.dg_scale +=
          std::fabs(dy[static_cast<size_t>(r0 * p.dim + i)] * xr[i] / den);
  }
  return r;
}

const Backend& naive_for(Precision p) {
  const Backend* b = all_backends().find("reference:" + std::string(name(p)));
  if (b == nullptr)
    throw Error("registry", {},
                "no naive baseline reference:" + std::string(name(p)));
  return *b;
}

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
  if (p.variant == Variant::kQKNorm) return std::fabs(p.g);
  return static_cast<double>(max_row_norm(c.q, p.head_dim) *
                             max_row_norm(c.k, p.head_dim) /
                             std::sqrt(static_cast<LD>(p.head_dim)));
}

std::span<const double> field_values(const AttentionResult& r, Field f) {
  switch (f) {
    case Field::kO:
      return r.o;
    case Field::kLse:
      return r.lse;
    case Field::kDq:
      return r.dq;
    case Field::kDk:
      return r.dk;
    case Field::kDv:
      return r.dv;
    case Field::kDg:
      return {&r.dg, 1};
    default:
      return {};
  }
}

std::span<double> field_values(AttentionResult& r, Field f) {
  const std::span<const double> c = field_values(std::as_const(r), f);
  return {const_cast<double*>(c.data()), c.size()};
}

AgreementReport check_attention(const Backend& entry, const AttentionCase& c0,
                                const ExecConfig& cfg, bool forward_only,
                                bool with_naive) {
  const Precision s = entry.precision();
  const AttentionCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const AttentionResult er = forward_only ? run_attention_forward(entry, c, cfg)
                                          : run_attention(entry, c, cfg);
  AttentionResult nr;
  if (with_naive)
    nr = forward_only ? run_attention_forward(nb, c) : run_attention(nb, c);
  return judge_attention(c, s, oracle_attention(c), er,
                         with_naive ? &nr : nullptr, forward_only, entry.name(),
                         nb.name());
}

namespace {
void finish(AgreementReport* rep) {
  rep->pass = true;
  rep->margin = 0;
  for (const auto& f : rep->fields) {
    rep->pass = rep->pass && f.pass;
    if (f.margin > rep->margin || rep->worst_field.empty()) {
      rep->margin = std::max(rep->margin, f.margin);
      rep->worst_field = f.field;
    }
  }
}
}  // namespace

AgreementReport judge_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const AttentionResult& er, const AttentionResult* nr, bool forward_only,
    const std::string& entry_name, const std::string& naive_name,
    const std::vector<Field>* only, double compute_unit) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = nr != nullptr ? naive_name : "";
  rep.case_desc = c.describe();
  const double A = logit_amplitude(c);
  for (const ToleranceTable& t :
       attention_tolerances(c, s, orc, forward_only, compute_unit)) {
    if (only != nullptr &&
        std::find(only->begin(), only->end(), t.field) == only->end())
      continue;
    auto pick = [&](const AttentionResult& r) {
      const std::span<const double> x = field_values(r, t.field);
      return std::vector<double>(x.begin(), x.end());
    };
    const std::vector<double> naive =
        nr != nullptr ? pick(*nr) : std::vector<double>{};
    rep.fields.push_back(
        judge_field(t, pick(er), nr != nullptr ? &naive : nullptr));
    rep.fields.back().amplitude = A;
  }
  finish(&rep);
  return rep;
}

AgreementReport check_scalenorm(const Backend& entry, const ScaleNormCase& c0,
                                const ExecConfig& cfg, bool with_naive) {
  const Precision s = entry.precision();
  const ScaleNormCase c = round_inputs(c0, s);
  const Backend& nb = naive_for(s);
  const ScaleNormResult er = run_scalenorm(entry, c, cfg);
  ScaleNormResult nr;
  if (with_naive) nr = run_scalenorm(nb, c);
  return judge_scalenorm(c, s, oracle_scalenorm(c), er,
                         with_naive ? &nr : nullptr, entry.name(), nb.name());
}

AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& orc,
                                const ScaleNormResult& er,
                                const ScaleNormResult* nr,
                                const std::string& entry_name,
                                const std::string& naive_name) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = nr != nullptr ? naive_name : "";
  rep.case_desc = c.describe();
  for (const ToleranceTable& t : scalenorm_tolerances(c, s, orc)) {
    auto pick = [&](const ScaleNormResult& r) -> std::vector<double> {
      if (t.field == Field::kY) return r.y;
      if (t.field == Field::kDx) return r.dx;
      return {r.dg};
    };
    const std::vector<double> naive =
        nr != nullptr ? pick(*nr) : std::vector<double>{};
    rep.fields.push_back(
        judge_field(t, pick(er), nr != nullptr ? &naive : nullptr));
  }
  finish(&rep);
  return rep;
}

std::string AgreementReport::failure_message() const {
  std::string m;
  for (const auto& f : fields) {
    if (f.pass) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "  field %s: %lld of %lld elements fail; worst %s%s: "
                  "expected %.17g, actual %.17g, bound %.6e (margin %.3g; "
                  "logit amplitude A=%.6g)\n    first failure: %s\n",
                  f.field.c_str(), (long long)f.failures, (long long)f.count,
                  f.field.c_str(), f.worst_where.c_str(), f.worst_expected,
                  f.worst_actual, f.worst_bound, f.margin, f.amplitude,
                  f.diagnosis.c_str());
    m += buf;
    m += "    entry: " + describe(f.entry) + "\n";
    if (f.has_naive) {
      std::snprintf(buf, sizeof buf, "    naive margin %.3g: ", f.naive_margin);
      m += buf + describe(f.naive) + "\n";
    }
  }
  if (m.empty()) return "";
  return "entry " + entry_name + " vs oracle" +
         (naive_name.empty() ? "" : " (naive " + naive_name + ")") + " on " +
         case_desc + "\n" + m;
}

}  // namespace qknorm::validation
