// The BLAS path on every QK-norm formulation (issue 16): each preset (GQA
// where the model ships it) in f32 and f64 on Gaussian, zero-row, outlier
// and wide-magnitude inputs under every mask passes the componentwise
// verdict, parameter gradients included; results are bitwise identical for
// 1 and 2 threads; the normalization across heads with two batches; free
// combinations no preset has; the probabilities hook under GQA; the
// workspace formula of the general path.
#include "qknorm/formulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "blas_path/attention.h"
#include "blas_path/tests/test_util.h"
#include "qknorm/precision.h"
#include "validation/buffers.h"

namespace qknorm::blas::testing {
namespace {

constexpr Precision kPrecisions[] = {Precision::kF32, Precision::kF64};
constexpr Distribution kFormDists[] = {
    Distribution::kGaussian, Distribution::kZeroRows,
    Distribution::kOutlierRows, Distribution::kWideMagnitude};
enum class FormMask { kNone, kCausal, kPadding };
constexpr FormMask kFormMasks[] = {FormMask::kNone, FormMask::kCausal,
                                   FormMask::kPadding};
const char* mask_name(FormMask m) {
  return m == FormMask::kNone     ? "none"
         : m == FormMask::kCausal ? "causal"
                                  : "padding";
}

// The preset on a small shape: 4 query heads over 2 kv heads where the
// model ships GQA, else 2 heads (kv_heads 0). Padding keeps Nk - 2 keys of
// batch 0 and (B = 2) 3 keys of batch 1.
AttentionProblem preset_problem(const Preset& s, int64_t B, int64_t Nq,
                                int64_t Nk, int64_t D, FormMask mask) {
  AttentionProblem p;
  p.batch = B, p.heads = s.gqa ? 4 : 2, p.kv_heads = s.gqa ? 2 : 0;
  p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  apply_preset(s.name, &p);
  p.g = 3.5;  // used by the learned-g preset only
  p.mask.causal = mask == FormMask::kCausal;
  if (mask == FormMask::kPadding) {
    p.mask.key_lengths = {Nk - 2};
    if (B == 2) p.mask.key_lengths.push_back(3);
  }
  return p;
}

// The verdict (parameter gradients included) and the thread-count
// determinism on one case; returns the verdict's margin.
double check_case(Precision prec, const AttentionCase& c) {
  SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
  ExecConfig one, two;
  one.threads = 1, two.threads = 2;
  const auto rep = validation::check_attention(entry(prec), c, two, false,
                                               /*with_naive=*/true);
  EXPECT_TRUE(rep.pass) << rep.failure_message();
  const AttentionCase rc = validation::round_inputs(c, prec);
  expect_same_bits(validation::run_attention(entry(prec), rc, one),
                   validation::run_attention(entry(prec), rc, two),
                   "threads 1 vs 2");
  return rep.margin;
}

// check_case over precision x distribution x mask on the problems
// make(mask) gives (seeds from `seed` on); returns the worst margin and
// counts the cases in *n. raw_logits: skip kWideMagnitude, whose q.k of
// 1e60 is no f32 logit (sdpa, no normalization).
template <class Make>
double check_grid(const Make& make, uint64_t seed, int* n,
                  bool raw_logits = false) {
  double worst = 0;
  for (Precision prec : kPrecisions)
    for (Distribution d : kFormDists)
      for (FormMask m : kFormMasks) {
        if (raw_logits && d == Distribution::kWideMagnitude) continue;
        SCOPED_TRACE(std::string("mask=") + mask_name(m));
        const AttentionCase c = validation::make_attention_case(
            make(m), d, seed + static_cast<uint64_t>(*n), prec);
        worst = std::max(worst, check_case(prec, c));
        ++*n;
      }
  return worst;
}

// Every preset x precision x distribution x mask.
TEST(BlasFormulation, EveryPresetPassesTheVerdict) {
  std::map<std::string, double> worst;
  int n = 0;
  for (const Preset& s : presets()) {
    SCOPED_TRACE(s.name);
    worst[s.name] = check_grid(
        [&](FormMask m) { return preset_problem(s, 1, 9, 11, 16, m); }, 500,
        &n);
  }
  std::printf("blas formulations: %d preset cases\n", n);
  for (const Preset& s : presets())
    std::printf("  %-10s worst margin %.3f\n", s.name, worst[s.name]);
}

// Normalization across heads (OLMo2) with two batches (per-batch padding).
TEST(BlasFormulation, AllHeadsTwoBatches) {
  const Preset& s = *find_preset("olmo2");
  int n = 0;
  const double worst = check_grid(
      [&](FormMask m) { return preset_problem(s, 2, 13, 10, 8, m); }, 700, &n);
  std::printf("olmo2 B=2: %d cases, worst margin %.3f\n", n, worst);
}

// Combinations no preset has.
TEST(BlasFormulation, FreeCombinations) {
  std::vector<AttentionProblem> problems;
  AttentionProblem base;
  base.batch = 2, base.heads = 4, base.kv_heads = 2;
  base.q_len = 7, base.kv_len = 9, base.head_dim = 8;
  base.eps = 1e-5;
  {  // LayerNorm across heads, Gemma's 1 + w, bias, fixed scale
    AttentionProblem p = base;
    p.norm.kind = NormKind::kLayer;
    p.norm.axis = NormAxis::kAllHeads;
    p.norm.weight = ParamShape::kHeadDim;
    p.norm.one_plus_weight = true;
    p.norm.bias = true;
    p.fixed_scale = true, p.scale = 0.7;
    problems.push_back(p);
  }
  {  // l2 with a [D] weight, learned g, GQA
    AttentionProblem p = base;
    p.eps = 1e-12, p.g = 6;
    p.norm.weight = ParamShape::kDim;
    problems.push_back(p);
  }
  {  // no normalization, [H_x, D] weight and bias, fixed scale
    AttentionProblem p = base;
    p.norm.kind = NormKind::kNone;
    p.norm.weight = ParamShape::kHeadDim;
    p.norm.bias = true;
    p.fixed_scale = true, p.scale = 0.25;
    problems.push_back(p);
  }
  {  // rms across heads without weight, learned negative g, 4 heads on 1
    AttentionProblem p = base;
    p.kv_heads = 1, p.g = -2;
    p.norm.kind = NormKind::kRms;
    p.norm.axis = NormAxis::kAllHeads;
    problems.push_back(p);
  }
  {  // sdpa with GQA
    AttentionProblem p = base;
    p.variant = Variant::kSDPA;
    problems.push_back(p);
  }
  {  // the paper's l2 with GQA
    AttentionProblem p = base;
    p.eps = 1e-12, p.g = 12.32;
    problems.push_back(p);
  }
  double worst = 0;
  int n = 0;
  for (const AttentionProblem& p0 : problems) {
    SCOPED_TRACE(describe_formulation(p0));
    auto make = [&](FormMask m) {
      AttentionProblem p = p0;
      p.mask.causal = m == FormMask::kCausal;
      if (m == FormMask::kPadding) p.mask.key_lengths = {7, 0};
      return p;
    };
    worst = std::max(worst, check_grid(make, 800, &n,
                                       p0.variant == Variant::kSDPA ||
                                           p0.norm.kind == NormKind::kNone));
  }
  std::printf("free combinations: %d cases, worst margin %.3f\n", n, worst);
}

// Rows at the edges of the storage format: near its largest finite value
// (alternating signs, all equal, one huge element among small ones), made of
// subnormals, and constant (layer: x_hat = 0). Every normalization kind
// keeps them finite and within the verdict.
template <class T>
void set_extreme_rows(std::vector<double>* x, int64_t D) {
  using L = std::numeric_limits<T>;
  const double big = 0.75 * static_cast<double>(L::max());
  const double sub = static_cast<double>(L::denorm_min());
  auto row = [&](int64_t r) { return x->data() + r * D; };
  for (int64_t d = 0; d < D; ++d) {
    row(0)[d] = d % 2 ? -big : big;
    row(1)[d] = big;
    row(2)[d] = static_cast<double>((d % 5) - 2) * 3 * sub;
    row(3)[d] = 3.0;
    row(4)[d] = d == 0 ? big : 1e-3 * static_cast<double>(d);
  }
}

TEST(BlasFormulation, ExtremeRowsStayFiniteAndPass) {
  double worst = 0;
  int n = 0;
  for (const char* preset :
       {"paper", "qwen3", "gemma3", "olmo2", "timm", "chameleon", "ngpt"})
    for (Precision prec : kPrecisions) {
      const AttentionProblem p =
          preset_problem(*find_preset(preset), 1, 6, 7, 8, FormMask::kNone);
      AttentionCase c = validation::make_attention_case(
          p, Distribution::kGaussian, static_cast<uint64_t>(900 + n), prec);
      for (std::vector<double>* x : {&c.q, &c.k}) {
        if (prec == Precision::kF32)
          set_extreme_rows<float>(x, p.head_dim);
        else
          set_extreme_rows<double>(x, p.head_dim);
      }
      SCOPED_TRACE(std::string(preset) + " " + c.describe());
      const auto r = validation::run_attention(
          entry(prec), validation::round_inputs(c, prec));
      for (const auto* f : {&r.o, &r.dq, &r.dk, &r.dv, &r.dq_weight,
                            &r.dk_weight, &r.dq_bias, &r.dk_bias})
        for (double v : *f) ASSERT_TRUE(std::isfinite(v));
      worst = std::max(worst, check_case(prec, c));
      ++n;
    }
  std::printf("extreme rows: %d cases, worst margin %.3f\n", n, worst);
}

// fuzz/corpus/attention_fuzzer/crash-blas-f64-rms-scale0-huge-do-dk-nan
// (issue 32, the CI mode with the formulation mode on, -seed=1, exec 14305):
// rms with a [D] weight, fixed scale 0, f64, q_tilde up to 1.45e38 and
// |dO| up to 1.96e289, so dS reached 3e287. The GEMM dk_tilde = s dS^T
// q_tilde with alpha = s formed dS^T q_tilde first, which overflowed (4e325),
// and OpenBLAS applied alpha = 0 to inf: NaN for a whole kv head's dk and
// one dk_weight where the exact values are 0. The kernel now scales dS
// before it meets the other side's operand (the s dS the fuzzer's domain
// bounds). The same shape here: k weights 0 (logits 0, P uniform), one q
// weight huge, dO huge on one row, at s = 0 (every q/k gradient exactly 0)
// and at a tiny s whose unscaled dS^T q_tilde overflows while s dS^T q_tilde
// does not; both must stay finite and pass the verdict.
template <class T>
void check_scaled_ds_first(Precision prec, double scale) {
  // |dS| <= 2 D |dO| |v| ~ 2^-22 of T's largest value and q_tilde_2 ~
  // `weight`: dS^T q_tilde overflows T; s dS^T q_tilde does not (s > 0).
  const double big_do =
                   0x1p-28 * static_cast<double>(std::numeric_limits<T>::max()),
               weight = prec == Precision::kF32 ? 1e10 : 1e30;
  AttentionProblem p;
  p.batch = 1, p.heads = 4, p.kv_heads = 2;
  p.q_len = p.kv_len = 4, p.head_dim = 8;
  p.eps = 1e-6;
  p.norm.kind = NormKind::kRms;
  p.norm.weight = ParamShape::kDim;
  p.fixed_scale = true, p.scale = scale;
  AttentionCase c =
      validation::make_attention_case(p, Distribution::kGaussian, 32, prec);
  std::fill(c.k_weight.begin(), c.k_weight.end(), 0.0);
  std::fill(c.q_weight.begin(), c.q_weight.end(), 1.0);
  c.q_weight[2] = weight;
  for (int64_t d = 0; d < p.head_dim; ++d)  // head 1, query 2 (kv head 0)
    c.d_o[static_cast<size_t>((1 * p.q_len + 2) * p.head_dim + d)] =
        d % 2 ? -big_do : big_do;
  SCOPED_TRACE(c.describe());
  const auto r =
      validation::run_attention(entry(prec), validation::round_inputs(c, prec));
  for (const auto* f : {&r.dq, &r.dk, &r.dv, &r.dq_weight, &r.dk_weight})
    for (double v : *f) ASSERT_TRUE(std::isfinite(v));
  if (scale == 0) {
    for (const auto* f : {&r.dq, &r.dk, &r.dq_weight, &r.dk_weight})
      for (double v : *f) EXPECT_EQ(v, 0.0);
  }
  check_case(prec, c);
}

TEST(BlasFormulation, CrashBlasF64RmsScale0HugeDoDkNan) {
  for (double s : {0.0, 1e-30})
    check_scaled_ds_first<double>(Precision::kF64, s);
  for (double s : {0.0, 1e-10})
    check_scaled_ds_first<float>(Precision::kF32, s);
}

// The probabilities hook honours the formulation and GQA: it matches the
// reference's hook and its rows sum to 1.
void check_probabilities(Precision prec) {
  for (const char* name : {"qwen3", "olmo2", "chameleon", "ngpt"}) {
    const Preset& s = *find_preset(name);
    const AttentionProblem p = preset_problem(s, 2, 6, 8, 8, FormMask::kCausal);
    const AttentionCase c = validation::round_inputs(
        validation::make_attention_case(p, Distribution::kGaussian, 11), prec);
    SCOPED_TRACE(c.describe());
    validation::AttentionBuffers bufs(c, prec);  // guarded
    const ForwardArgs fa = bufs.forward_args();
    const size_t np =
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len);
    std::vector<double> mine(np, NAN), ref(np, NAN);
    std::string ref_name = "reference:";
    ref_name += qknorm::name(prec);
    const Backend& ref_entry = *all_backends().find(ref_name);
    auto ws = entry(prec).make_workspace();
    ASSERT_TRUE(
        entry(prec).attention_probabilities(p, fa, mine.data(), ws.get()));
    auto rws = ref_entry.make_workspace();
    ASSERT_TRUE(
        ref_entry.attention_probabilities(p, fa, ref.data(), rws.get()));
    for (const validation::GuardViolation& g : bufs.guard_violations())
      ADD_FAILURE() << g.message();
    const double tol = prec == Precision::kF32 ? 1e-5 : 1e-13;
    for (size_t i = 0; i < np; ++i)
      ASSERT_NEAR(mine[i], ref[i], tol) << "element " << i;
    for (size_t r = 0; r < np / static_cast<size_t>(p.kv_len); ++r) {
      double sum = 0;
      for (int64_t j = 0; j < p.kv_len; ++j)
        sum += mine[r * static_cast<size_t>(p.kv_len) + static_cast<size_t>(j)];
      if (sum != 0) {
        EXPECT_NEAR(sum, 1.0, 8 * tol) << "row " << r;
      }
    }
  }
}

TEST(BlasFormulation, ProbabilitiesHookHonoursFormulationAndGqa) {
  check_probabilities(Precision::kF32);
  check_probabilities(Precision::kF64);
}

// A fresh workspace holds exactly workspace_bytes() after a forward, then
// after a backward, on the general path (GQA and a normalization across
// heads with parameters), and a rerun does not grow it.
TEST(BlasFormulation, WorkspaceBytesOfTheGeneralPath) {
  for (Precision prec : kPrecisions)
    for (const char* name : {"olmo2", "chameleon", "ngpt"}) {
      const Preset& s = *find_preset(name);
      const AttentionProblem p =
          preset_problem(s, 2, 40, 33, 16, FormMask::kCausal);
      const AttentionCase c = validation::round_inputs(
          validation::make_attention_case(p, Distribution::kGaussian, 5), prec);
      SCOPED_TRACE(c.describe());
      const Backend& b = entry(prec);
      auto ws = b.make_workspace();
      const size_t eb = element_bytes(prec);
      validation::run_attention_forward(b, c, {}, ws.get());
      EXPECT_EQ(workspace_bytes_of(prec, *ws),
                workspace_bytes(p, eb, false, 0));
      validation::run_attention(b, c, {}, ws.get());
      EXPECT_EQ(workspace_bytes_of(prec, *ws), workspace_bytes(p, eb, true, 0));
      validation::run_attention(b, c, {}, ws.get());
      EXPECT_EQ(workspace_bytes_of(prec, *ws), workspace_bytes(p, eb, true, 0));
    }
}

}  // namespace
}  // namespace qknorm::blas::testing
