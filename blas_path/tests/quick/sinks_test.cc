// Attention sinks (issue 34; attention.h, AttentionProblem::sinks) in the
// BLAS path: every blas entry (f32, f64), forward, backward (dsinks in
// BackwardArgs::d_sinks) and the probabilities hook, against the naive
// reference in double (reference::attention_forward<double>,
// attention_backward<double> with NormGrads::sinks, the oracle here: the
// project's verdict does not carry d_sinks yet) on sdpa and qknorm (the
// paper's l2 with a learned g, qwen3), GQA, causal masks and padding with
// fully masked rows (O = 0, lse = the sink exactly), sinks of +20 and -20
// and mixed ones, a softcap and a sliding window together with sinks.
// Bounds: the first-order analysis of test_util.h (f64_bound) at the
// entry's unit roundoff, with the sink's roundings added (below). Also:
// the same bits for 1 and 2 threads, sinks at the ends of f32's range,
// and the workspace formula with sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "blas_path/attention.h"
#include "blas_path/tests/test_util.h"
#include "qknorm/formulation.h"
#include "qknorm/precision.h"
#include "qknorm/validate.h"
#include "reference/reference.h"
#include "validation/buffers.h"
#include "validation/rule_terms.h"

namespace qknorm::blas::testing {
namespace {

constexpr Precision kPrecisions[] = {Precision::kF32, Precision::kF64};

// The problems, without sinks (with_sinks adds them).
std::vector<Named> problems() {
  std::vector<Named> v;
  {  // The paper's l2, causal with q_len > kv_len (the first 4 rows of
     // every head fully masked) and padding (batch 1: no key at all).
    AttentionProblem p = shape_problem(2, 2, 0, 24, 20, 32);
    p.g = 12.32;
    p.mask.causal = true;
    p.mask.key_lengths = {17, 0};
    v.push_back({"paper causal padding", p});
  }
  {  // The paper's l2 with a negative g (the shift from the smallest
     // cosine), no mask.
    AttentionProblem p = shape_problem(1, 2, 0, 9, 14, 8);
    p.g = -3;
    v.push_back({"paper g=-3", p});
  }
  {  // sdpa, GQA 4/2, padding
    AttentionProblem p = shape_problem(2, 4, 2, 13, 29, 16);
    p.variant = Variant::kSDPA;
    p.mask.key_lengths = {29, 5};
    v.push_back({"sdpa GQA padding", p});
  }
  {  // Qwen3 (rms, [D] weight, fixed 1/sqrt(D)), GQA, causal + padding
    AttentionProblem p = shape_problem(2, 4, 2, 33, 33, 64);
    apply_preset("qwen3", &p);
    p.mask.causal = true;
    p.mask.key_lengths = {33, 20};
    v.push_back({"qwen3 GQA causal padding", p});
  }
  {  // The paper's l2, softcap below g, causal window, padding: rows whose
     // window starts past batch 1's keys are fully masked
    AttentionProblem p = shape_problem(2, 2, 0, 40, 40, 16);
    p.g = 12.32;
    p.softcap = 5;
    p.mask.causal = true;
    p.mask.window_left = 6;
    p.mask.key_lengths = {40, 25};
    v.push_back({"paper softcap window padding", p});
  }
  {  // sdpa, GQA 4/1, softcap, two-sided window, Nq < Nk
    AttentionProblem p = shape_problem(1, 4, 1, 17, 40, 8);
    p.variant = Variant::kSDPA;
    p.softcap = 10;
    p.mask.window_left = 8, p.mask.window_right = 2;
    v.push_back({"sdpa GQA softcap window", p});
  }
  return v;
}

// Mixed sinks (around, above and below the logits), +20, -20.
enum class SinkSet { kMixed, kPlus20, kMinus20 };
constexpr SinkSet kSinkSets[] = {SinkSet::kMixed, SinkSet::kPlus20,
                                 SinkSet::kMinus20};
const char* sink_set_name(SinkSet s) {
  return s == SinkSet::kMixed ? "mixed" : s == SinkSet::kPlus20 ? "+20" : "-20";
}
AttentionProblem with_sinks(AttentionProblem p, SinkSet s) {
  static const double kMixed[] = {0.5, -1.5, 3.25, 20};
  p.sinks.clear();
  for (int64_t h = 0; h < p.heads; ++h)
    p.sinks.push_back(s == SinkSet::kMixed    ? kMixed[h % 4]
                      : s == SinkSet::kPlus20 ? 20.0
                                              : -20.0);
  return p;
}

// An entry's outputs, d_sinks included.
struct Out {
  validation::AttentionResult r;
  std::vector<double> dsinks;
};

// Forward then backward of entry e (through the validators, on guarded
// buffers) on the case (inputs rounded to the entry's storage).
Out run_entry(const Backend& e, const AttentionCase& c, const ExecConfig& cfg,
              Workspace* ws = nullptr) {
  const AttentionProblem& p = c.problem;
  validation::AttentionBuffers bufs(c, e.precision());
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) own = e.make_workspace(), ws = own.get();
  const ForwardArgs fa = bufs.forward_args();
  validate_forward(p, fa, e.precision());
  e.attention_forward(p, fa, ws, cfg);
  Out out;
  out.dsinks.assign(p.sinks.size(), std::nan(""));
  BackwardArgs ba = bufs.backward_args();
  ba.d_sinks = out.dsinks.empty() ? nullptr : out.dsinks.data();
  ba.d_sinks_size = static_cast<int64_t>(out.dsinks.size());
  validate_backward(p, ba, e.precision());
  e.attention_backward(p, ba, ws, cfg);
  for (const validation::GuardViolation& g : bufs.guard_violations())
    ADD_FAILURE() << g.message();
  out.r = bufs.result(true);
  return out;
}

// The reference in double on the (rounded) case: O, lse, P, the gradients,
// dS (of the logit before the cap) and dsinks.
struct Ref {
  std::vector<double> o, lse, probs, dq, dk, dv, ds, dsinks;
  std::vector<double> dqw, dkw, dqb, dkb;
  double dg = 0;
  std::vector<double> qt, kt;  // the logit operands x_tilde
};
Ref run_reference(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), D = p.head_dim;
  const auto nq = static_cast<size_t>(B * H * p.q_len * D),
             nk = static_cast<size_t>(B * Hk * p.kv_len * D),
             rows = static_cast<size_t>(B * H * p.q_len),
             pp = rows * static_cast<size_t>(p.kv_len);
  auto ptr = [](const std::vector<double>& x) {
    return x.empty() ? nullptr : x.data();
  };
  reference::NormArgs<double> w;
  w.q_weight = ptr(c.q_weight), w.k_weight = ptr(c.k_weight);
  w.q_bias = ptr(c.q_bias), w.k_bias = ptr(c.k_bias);
  w.storage = c.storage;
  Ref r;
  r.o.resize(nq), r.lse.resize(rows), r.probs.resize(pp);
  reference::attention_forward<double>(p, c.q.data(), c.k.data(), c.v.data(),
                                       r.o.data(), r.lse.data(), w);
  reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                             r.probs.data(), w);
  r.dq.resize(nq), r.dk.resize(nk), r.dv.resize(nk), r.ds.resize(pp);
  r.dsinks.resize(p.sinks.size());
  r.dqw.resize(c.q_weight.size()), r.dkw.resize(c.k_weight.size());
  r.dqb.resize(c.q_bias.size()), r.dkb.resize(c.k_bias.size());
  reference::NormGrads<double> dw;
  auto mptr = [](std::vector<double>& x) {
    return x.empty() ? nullptr : x.data();
  };
  dw.q_weight = mptr(r.dqw), dw.k_weight = mptr(r.dkw);
  dw.q_bias = mptr(r.dqb), dw.k_bias = mptr(r.dkb);
  dw.sinks = mptr(r.dsinks);
  reference::attention_backward<double>(p, c.q.data(), c.k.data(), c.v.data(),
                                        r.o.data(), c.d_o.data(), r.lse.data(),
                                        r.dq.data(), r.dk.data(), r.dv.data(),
                                        &r.dg, r.ds.data(), w, dw);
  r.qt.resize(nq), r.kt.resize(nk);
  reference::normalized_operand<double>(p, 0, c.q.data(), w, r.qt.data());
  reference::normalized_operand<double>(p, 1, c.k.data(), w, r.kt.data());
  return r;
}

double amax(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// The bounds, at the entry's unit roundoff u (test_util.h's f64_bound, its
// terms per u): the error of each exponential's argument in natural units
//   E = A (3D + 15) + 2 cap + 4 S
// with A the logit amplitude (validation::logit_amplitude), cap the softcap
// (its roundings: the tanh and the product, at most cap in magnitude) and
// S = max_h |sink_h| (the sink rounded to T, scaled to the exponential's
// base (f32), subtracted from the shift, and taken as the shift);
//   gamma_fwd = 2E + 2N + 8          (the row's sum has one term more)
//   gamma_bwd = gamma_fwd + 3D + 2N + 8.
// O componentwise: |dO_id| <= gamma_fwd u sum_j P_ij |v_jd| (P the
// reference's; plus N max|v| times T's smallest normal for the
// exponentials that underflow), lse: gamma_fwd u (1 + |lse|); dq, dk, dv
// and the parameter gradients: gamma_bwd u max|reference field| (as
// f64_bound); dg: gamma_bwd u sum |dS_ij C_ij|; dsinks_h: p_sink and delta
// each within gamma_bwd u of their scale, the B Nq terms summed in double:
// (2 gamma_bwd + B Nq) u sum_{b,i} p_sink,i sum_j P_ij sum_d |dO_id v_jd|.
struct Bounds {
  double u, fwd, bwd;
};
Bounds bounds(const AttentionCase& c, Precision prec) {
  const AttentionProblem& p = c.problem;
  const double D = static_cast<double>(p.head_dim);
  const double N = static_cast<double>(std::max(p.q_len, p.kv_len));
  double S = 0;
  for (double s : p.sinks) S = std::max(S, std::fabs(s));
  const double E =
      validation::logit_amplitude(c) * (3 * D + 15) + 2 * p.softcap + 4 * S;
  const double gf = 2 * E + 2 * N + 8;
  return {compute_roundoff(prec), gf, gf + 3 * D + 2 * N + 8};
}

struct Worst {
  double fwd = 0, bwd = 0, dsinks = 0;              // error / bound
  double fwd_rel = 0, bwd_rel = 0, dsinks_rel = 0;  // error / field scale
};

// Compares one entry's run with the reference; records the worst ratios.
void compare(Precision prec, const AttentionCase& c, const Out& got,
             const Ref& ref, Worst* w) {
  const AttentionProblem& p = c.problem;
  const Bounds bd = bounds(c, prec);
  const double u = bd.u;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), D = p.head_dim;
  const int64_t Nq = p.q_len, Nk = p.kv_len, group = H / Hk;
  const double tiny = prec == Precision::kF32
                          ? std::numeric_limits<float>::min()
                          : std::numeric_limits<double>::min();
  const double vmax = amax(c.v);
  double dsink_scale_max = 0;
  std::vector<double> dsink_scale(static_cast<size_t>(H), 0.0);
  const double ofield = std::max(amax(ref.o), 1e-300);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t bh = b * H + h, bk = b * Hk + h / group;
        const size_t row = static_cast<size_t>(bh * Nq + i);
        const KeyRange kr = visible_keys(p.mask, b, i, Nq, Nk);
        const double* prow = ref.probs.data() + row * static_cast<size_t>(Nk);
        const double* vb = c.v.data() + bk * Nk * D;
        const double* dob = c.d_o.data() + (bh * Nq + i) * D;
        const double sink = p.sinks[static_cast<size_t>(h)];
        if (kr.begin >= kr.end) {
          // Fully masked: the sink alone, exactly (in the compute format).
          const double s_t = prec == Precision::kF32
                                 ? static_cast<double>(static_cast<float>(sink))
                                 : sink;
          EXPECT_EQ(got.r.lse[row], s_t)
              << "masked row lse " << b << "," << h << "," << i;
          for (int64_t d = 0; d < D; ++d)
            EXPECT_EQ(got.r.o[row * static_cast<size_t>(D) + d], 0.0)
                << "masked row o " << b << "," << h << "," << i;
          continue;
        }
        for (int64_t d = 0; d < D; ++d) {
          double sc = 0;
          for (int64_t j = kr.begin; j < kr.end; ++j)
            sc += prow[j] * std::fabs(vb[j * D + d]);
          const double tol = bd.fwd * u * sc + Nk * vmax * tiny;
          const size_t at = row * static_cast<size_t>(D) + d;
          const double e = std::fabs(got.r.o[at] - ref.o[at]);
          EXPECT_LE(e, tol) << "o " << b << "," << h << "," << i << "," << d;
          w->fwd = std::max(w->fwd, e / tol);
          w->fwd_rel = std::max(w->fwd_rel, e / ofield);
        }
        {
          const double tol = bd.fwd * u * (1 + std::fabs(ref.lse[row]));
          const double e = std::fabs(got.r.lse[row] - ref.lse[row]);
          EXPECT_LE(e, tol) << "lse " << b << "," << h << "," << i;
          w->fwd = std::max(w->fwd, e / tol);
          w->fwd_rel =
              std::max(w->fwd_rel, e / std::max(1.0, std::fabs(ref.lse[row])));
        }
        // dsinks' scale: p_sink sum_j P_ij sum_d |dO_id v_jd|.
        double dsc = 0;
        for (int64_t j = kr.begin; j < kr.end; ++j) {
          double t = 0;
          for (int64_t d = 0; d < D; ++d)
            t += std::fabs(dob[d] * vb[j * D + d]);
          dsc += prow[j] * t;
        }
        dsink_scale[static_cast<size_t>(h)] +=
            std::exp(sink - ref.lse[row]) * dsc;
      }
  auto field = [&](const char* f, const std::vector<double>& a,
                   const std::vector<double>& r) {
    ASSERT_EQ(a.size(), r.size()) << f;
    const double scale = amax(r), tol = bd.bwd * u * scale;
    for (size_t x = 0; x < a.size(); ++x) {
      const double e = std::fabs(a[x] - r[x]);
      EXPECT_LE(e, tol) << f << " element " << x;
      if (tol > 0) w->bwd = std::max(w->bwd, e / tol);
      if (scale > 0) w->bwd_rel = std::max(w->bwd_rel, e / scale);
    }
  };
  field("dq", got.r.dq, ref.dq);
  field("dk", got.r.dk, ref.dk);
  field("dv", got.r.dv, ref.dv);
  field("dq_weight", got.r.dq_weight, ref.dqw);
  field("dk_weight", got.r.dk_weight, ref.dkw);
  field("dq_bias", got.r.dq_bias, ref.dqb);
  field("dk_bias", got.r.dk_bias, ref.dkb);
  {  // dg: sum |dS_ij C_ij|, C = q_tilde . k_tilde
    double sc = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t j = 0; j < Nk; ++j) {
            const double ds =
                ref.ds[static_cast<size_t>(((b * H + h) * Nq + i) * Nk + j)];
            if (ds == 0) continue;
            const double* qi = ref.qt.data() + ((b * H + h) * Nq + i) * D;
            const double* kj =
                ref.kt.data() + ((b * Hk + h / group) * Nk + j) * D;
            double cij = 0;
            for (int64_t d = 0; d < D; ++d) cij += qi[d] * kj[d];
            sc += std::fabs(ds * cij);
          }
    const double e = std::fabs(got.r.dg - ref.dg), tol = bd.bwd * u * sc;
    EXPECT_LE(e, tol) << "dg " << got.r.dg << " vs " << ref.dg;
    if (tol > 0) w->bwd = std::max(w->bwd, e / tol);
  }
  ASSERT_EQ(got.dsinks.size(), ref.dsinks.size());
  for (int64_t h = 0; h < H; ++h) {
    const size_t x = static_cast<size_t>(h);
    dsink_scale_max = std::max(dsink_scale_max, dsink_scale[x]);
    const double tol =
        (2 * bd.bwd + static_cast<double>(B * Nq)) * u * dsink_scale[x];
    const double e = std::fabs(got.dsinks[x] - ref.dsinks[x]);
    EXPECT_LE(e, tol) << "dsinks[" << h << "] " << got.dsinks[x] << " vs "
                      << ref.dsinks[x];
    if (tol > 0) w->dsinks = std::max(w->dsinks, e / tol);
    if (ref.dsinks[x] != 0)
      w->dsinks_rel = std::max(w->dsinks_rel, e / std::fabs(ref.dsinks[x]));
  }
}

// Every problem x sink set x entry against the reference; the same bits for
// 1 and 2 threads; prints the worst errors (relative to each field's scale,
// and as a fraction of the bound).
TEST(BlasSinks, EveryEntryMatchesTheReference) {
  std::map<Precision, Worst> worst;
  int n = 0;
  for (Precision prec : kPrecisions)
    for (const Named& np : problems())
      for (SinkSet s : kSinkSets) {
        const AttentionProblem p = with_sinks(np.p, s);
        const AttentionCase c =
            validation::round_inputs(validation::make_attention_case(
                                         p, Distribution::kGaussian,
                                         31 + static_cast<uint64_t>(n), prec),
                                     prec);
        SCOPED_TRACE(np.name + " sinks " + sink_set_name(s) + " " +
                     std::string(name(prec)) + " " + c.describe());
        ASSERT_TRUE(entry(prec).supports(p));
        ExecConfig one, two;
        one.threads = 1, two.threads = 2;
        const Out got = run_entry(entry(prec), c, two);
        compare(prec, c, got, run_reference(c), &worst[prec]);
        const Out got1 = run_entry(entry(prec), c, one);
        expect_same_bits(got.r, got1.r, "threads 2 vs 1");
        EXPECT_EQ(got.dsinks, got1.dsinks) << "threads 2 vs 1: dsinks";
        ++n;
      }
  std::printf("blas sinks vs reference<double>: %d cases\n", n);
  for (const auto& [prec, w] : worst)
    std::printf(
        "  %s: worst error relative to the field: forward %.3g, backward "
        "%.3g, dsinks %.3g (of |dsinks|); of the bound: %.3g, %.3g, %.3g\n",
        std::string(name(prec)).c_str(), w.fwd_rel, w.bwd_rel, w.dsinks_rel,
        w.fwd, w.bwd, w.dsinks);
}

// The probabilities hook: P over the real keys, each within the forward's
// bound of the reference's, 0 where masked; a row sums to 1 - p_sink.
TEST(BlasSinks, ProbabilitiesExcludeTheSink) {
  for (Precision prec : kPrecisions)
    for (const Named& np : problems()) {
      const AttentionProblem p = with_sinks(np.p, SinkSet::kMixed);
      const AttentionCase c = validation::round_inputs(
          validation::make_attention_case(p, Distribution::kGaussian, 7, prec),
          prec);
      SCOPED_TRACE(np.name + " " + std::string(name(prec)));
      validation::AttentionBuffers bufs(c, prec);
      const size_t np_ =
          static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len);
      std::vector<double> pb(np_, std::nan(""));
      ASSERT_TRUE(entry(prec).attention_probabilities(p, bufs.forward_args(),
                                                      pb.data(), nullptr));
      const Ref ref = run_reference(c);
      const Bounds bd = bounds(c, prec);
      for (int64_t bh = 0; bh < p.batch * p.heads; ++bh)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const int64_t b = bh / p.heads, h = bh % p.heads;
          const size_t row = static_cast<size_t>(bh * p.q_len + i);
          double sum = 0;
          bool any = false;
          for (int64_t j = 0; j < p.kv_len; ++j) {
            const size_t at = row * static_cast<size_t>(p.kv_len) + j;
            if (!visible(p.mask, b, i, j, p.q_len, p.kv_len)) {
              EXPECT_EQ(pb[at], 0.0);
              continue;
            }
            any = true;
            sum += pb[at];
            EXPECT_NEAR(pb[at], ref.probs[at], bd.fwd * bd.u * ref.probs[at])
                << "row " << row << " key " << j;
          }
          if (!any) continue;
          const double share =
              std::exp(p.sinks[static_cast<size_t>(h)] - ref.lse[row]);
          EXPECT_NEAR(sum, 1 - share, 2 * bd.fwd * bd.u) << "row " << row;
        }
    }
}

// Sinks at the ends of f32's range (validate's limit): +3e38 takes every
// row (O = 0, lse = the sink, no gradient); -3e38 takes nothing (the run
// without sinks, bit for bit; dsinks 0). qwen3, so that both runs take the
// general path.
TEST(BlasSinks, ExtremeSinks) {
  for (Precision prec : kPrecisions) {
    AttentionProblem p = shape_problem(1, 4, 2, 11, 15, 16);
    apply_preset("qwen3", &p);
    p.mask.causal = true;
    const AttentionCase c0 = validation::round_inputs(
        validation::make_attention_case(p, Distribution::kGaussian, 3, prec),
        prec);
    const Out none = run_entry(entry(prec), c0, {});
    for (double s : {3e38, -3e38}) {
      SCOPED_TRACE(std::string(name(prec)) + " sink " + std::to_string(s));
      AttentionCase c = c0;
      c.problem.sinks.assign(4, s);
      const Out got = run_entry(entry(prec), c, {});
      const double s_t = prec == Precision::kF32
                             ? static_cast<double>(static_cast<float>(s))
                             : s;
      for (double d : got.dsinks) EXPECT_EQ(d, 0.0);
      if (s < 0) {
        expect_same_bits(got.r, none.r, "sink -3e38 vs none");
        continue;
      }
      for (double x : got.r.lse) EXPECT_EQ(x, s_t);
      for (const auto* f : {&got.r.o, &got.r.dq, &got.r.dk, &got.r.dv})
        for (double x : *f) EXPECT_EQ(x, 0.0);
    }
  }
}

// A fresh workspace holds exactly workspace_bytes() after a forward, then
// after a backward, with sinks.
TEST(BlasSinks, WorkspaceBytes) {
  for (Precision prec : kPrecisions)
    for (const Named& np : problems()) {
      SCOPED_TRACE(np.name + " " + std::string(name(prec)));
      const AttentionProblem p = with_sinks(np.p, SinkSet::kMixed);
      const AttentionCase c = validation::round_inputs(
          validation::make_attention_case(p, Distribution::kGaussian, 5), prec);
      const Backend& b = entry(prec);
      auto ws = b.make_workspace();
      const size_t eb = element_bytes(prec);
      validation::AttentionBuffers bufs(c, prec);
      b.attention_forward(p, bufs.forward_args(), ws.get(), {});
      EXPECT_EQ(workspace_bytes_of(prec, *ws),
                workspace_bytes(p, eb, false, 0));
      run_entry(b, c, {}, ws.get());
      EXPECT_EQ(workspace_bytes_of(prec, *ws), workspace_bytes(p, eb, true, 0));
    }
}

}  // namespace
}  // namespace qknorm::blas::testing
