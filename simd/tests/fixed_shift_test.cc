// The forward's fixed-shift softmax for every formulation (issue 18;
// simd/attention-inl.h, "Bounded logits"): each query row whose data bound
// B_i (Cauchy-Schwarz on the f32 operand rows) is <= 43 uses the shift
// m = B_i instead of the running max. Observable: the probabilities hook
// records each row's shift in the workspace (SimdWorkspace::row_shift, -1
// for an online row). Checked on every runnable entry:
// - every preset (and sdpa) at generated data takes the fixed path on every
//   visible row, passes the verdict on both paths, and the outputs of the
//   two paths differ (the normal forward takes it too);
// - B_i bounds every logit the row sees, on data built to attain the bound
//   (q rows parallel to the largest k rows, q and k weights of different
//   sizes, B ~ 40): a bound from the q side only or too small by any factor
//   above the recovery tolerance fails here;
// - a bound above 43 keeps every row online (results bitwise those of the
//   forced online path), on data whose logits reach +-80 and +-113, where a
//   bound from the q side only (5.7: exp overflows, O is NaN, the verdict
//   fails) or half the true one (40) would take the fixed path;
// - a row with one visible key is exact on the fixed path (O = V, dq = 0,
//   lse = the online path's; one query over one visible key: dv = dO), and
//   threads 1 and 2 agree bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/formulation.h"
#include "simd/tests/test_util.h"
#include "simd/workspace.h"
#include "validation/check.h"

namespace qknorm::simd::testing {
namespace {

using validation::AttentionCase;
using validation::Distribution;

// The recovered logit lse_i + log p_ij of a fixed row (p = exp(S - B) / l,
// lse = B + log l, the same f32 l) differs from the kernel's S by the f32
// rounding of S - B (<= 2^-24 2B), exp's 1 ulp (2^-23), the division's half
// ulp (2^-24) and f64 roundings: <= 2^-23 (B + 2) for a normal p; 4x that.
double RecoveryTolerance(double B) { return 0x1p-21 * (B + 2); }

struct Shifts {
  std::vector<double> probs, lse;
  std::vector<float> shift;  // per query row, -1: online
};

// The hook's forward of case c (inputs in the entry's storage) with each
// row's shift.
Shifts RunHook(const Backend& entry, const AttentionCase& c, bool online) {
  SimdWorkspace ws;
  ws.online_softmax = online;
  Shifts r;
  r.probs = Probabilities(entry, c, &ws, &r.lse);
  const size_t rows = r.lse.size();
  const float* s = ws.row_shift.Get(rows);
  r.shift.assign(s, s + rows);
  return r;
}

// Visible keys of query i, batch b (attention-inl.h's prefix limits).
int64_t Visible(const AttentionProblem& p, int64_t b, int64_t i) {
  int64_t L = p.kv_len;
  if (p.mask.causal) L = std::min(L, i + 1 + p.kv_len - p.q_len);
  if (!p.mask.key_lengths.empty())
    L = std::min(L, p.mask.key_lengths[static_cast<size_t>(b)]);
  return std::max<int64_t>(L, 0);
}

// Rows on the fixed path, and the largest excess of a recovered logit over
// its row's bound (or below minus the bound), beyond the tolerance.
struct BoundCheck {
  int64_t fixed = 0, visible = 0;
  double worst_excess = -INFINITY;  // max |S| - B - tolerance
  double closest = -INFINITY;       // max |S| - B
};
BoundCheck CheckBounds(const AttentionProblem& p, const Shifts& s) {
  BoundCheck bc;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const size_t row = static_cast<size_t>((b * p.heads + h) * p.q_len + i);
        const int64_t L = Visible(p, b, i);
        if (L == 0) continue;
        ++bc.visible;
        const double B = s.shift[row];
        if (B < 0) continue;
        ++bc.fixed;
        for (int64_t j = 0; j < L; ++j) {
          const double pij = s.probs[row * static_cast<size_t>(p.kv_len) +
                                     static_cast<size_t>(j)];
          if (!(pij >= FLT_MIN)) continue;  // log of a subnormal p is loose
          const double S = s.lse[row] + std::log(pij);
          bc.closest = std::max(bc.closest, std::fabs(S) - B);
          bc.worst_excess = std::max(bc.worst_excess,
                                     std::fabs(S) - B - RecoveryTolerance(B));
        }
      }
  return bc;
}

std::string Where(const Backend& e, const std::string& what) {
  return e.name() + " " + what;
}

class SimdFixedShift : public ::testing::TestWithParam<const Backend*> {};

// Every preset and sdpa at Gaussian data: the bound permits the fixed path
// (B <= ~20 here) on every visible row, and it bounds every logit.
TEST_P(SimdFixedShift, EveryFormulationTakesItWhereBounded) {
  const Backend& entry = *GetParam();
  std::vector<std::string> names;
  for (const Preset& s : presets()) names.push_back(s.name);
  names.push_back("sdpa");
  uint64_t seed = 40;
  for (const std::string& name : names) {
    AttentionProblem p;
    p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 70, p.kv_len = 75;
    p.head_dim = 32;
    if (name == "sdpa") {
      p.variant = Variant::kSDPA;
      p.kv_heads = 0;
    } else {
      apply_preset(name, &p);
      if (!find_preset(name)->gqa) p.kv_heads = 0;
    }
    p.g = 12.32;
    p.mask.causal = true;
    p.mask.key_lengths = {75, 40};
    const AttentionCase c = validation::round_inputs(
        validation::make_attention_case(p, Distribution::kGaussian, seed++,
                                        entry.precision()),
        entry.precision());
    const BoundCheck bc = CheckBounds(p, RunHook(entry, c, false));
    EXPECT_EQ(bc.fixed, bc.visible) << Where(entry, name);
    EXPECT_LE(bc.worst_excess, 0) << Where(entry, name);
    // Both paths, judged against one oracle (what check_attention does
    // for each, without the naive baseline: its ratio is not looked at).
    const auto rf = validation::run_attention(entry, c, ExecConfig{2, false});
    const auto ro = validation::run_attention(entry, c, ExecConfig{2, true});
    const validation::OracleAttention orc = validation::oracle_attention(c);
    for (bool online : {false, true}) {
      const auto rep = validation::judge_attention(c, entry.precision(), orc,
                                                   online ? ro : rf, nullptr,
                                                   false, entry.name(), "");
      EXPECT_TRUE(rep.pass) << Where(entry, name) << " online " << online
                            << ": " << rep.failure_message();
    }
    EXPECT_FALSE(SameBits(rf.lse, ro.lse))
        << Where(entry, name) << ": the forward did not take the fixed path";
  }
}

// Qwen3's formulation (rms, weight [D], scale 1/sqrt(D); f32 storage: no
// rounding before the weight matters) on built data: raw row e, and query
// rows +e, -e or Gaussian, key rows e or Gaussian; every weight a (q) or c
// (k). Rms rows have ||x_hat|| ~ sqrt(D) whatever their scale, so a q row
// +e meets a key e at S = a c sqrt(D) = the bound (Cauchy-Schwarz with
// equality), and -e at -a c sqrt(D). |v| in [1, 3]: the v cap is 43.
AttentionCase BuiltCase(const Backend& entry, double a, double c) {
  AttentionProblem p;
  p.heads = 2, p.kv_heads = 2, p.q_len = 70, p.kv_len = 70, p.head_dim = 32;
  apply_preset("qwen3", &p);
  p.mask.causal = true;
  AttentionCase ac = validation::make_attention_case(p, Distribution::kGaussian,
                                                     91, entry.precision());
  const size_t D = 32;
  for (size_t r = 0; r < 2 * 70; ++r)
    for (size_t d = 0; d < D; ++d) {
      const double e = static_cast<double>(d % 5) - 1.5;
      if (r % 3 != 2) ac.q[r * D + d] = r % 3 == 0 ? e : -e;
      if (r % 2 == 0) ac.k[r * D + d] = e;
      double& v = ac.v[r * D + d];
      v = std::copysign(1 + std::fmin(std::fabs(v), 2.0), v);
    }
  ac.q_weight.assign(ac.q_weight.size(), a);
  ac.k_weight.assign(ac.k_weight.size(), c);
  return validation::round_inputs(ac, entry.precision());
}

// B ~ 1.5 * 4.7 * sqrt(32) = 39.9: fixed, and attained.
TEST_P(SimdFixedShift, BoundHoldsWhereAttained) {
  const Backend& entry = *GetParam();
  const AttentionCase c = BuiltCase(entry, 1.5, 4.7);
  const AttentionProblem& p = c.problem;
  const BoundCheck bc = CheckBounds(p, RunHook(entry, c, false));
  EXPECT_EQ(bc.fixed, bc.visible) << entry.name();
  EXPECT_LE(bc.worst_excess, 0) << entry.name();
  // Attained: some recovered logit is within 1e-4 of its row's bound (the
  // k rows' norms differ by eps / mean square ~ 1e-6 relative); bf16 rounds
  // x_hat to 8 bits before the weight, so its rows' norms differ by up to
  // ~2^-8 relative (0.16 at B = 40): within 0.5.
  const double attained = entry.precision() == Precision::kBF16 ? 0.5 : 1e-4;
  EXPECT_GT(bc.closest, -attained) << entry.name();
  for (bool online : {false, true}) {
    const auto rep =
        validation::check_attention(entry, c, ExecConfig{2, online});
    EXPECT_TRUE(rep.pass) << entry.name() << " online " << online << ": "
                          << rep.failure_message();
  }
  const auto one = validation::run_attention(entry, c, ExecConfig{1});
  const auto two = validation::run_attention(entry, c, ExecConfig{2});
  ExpectSame(one, two, entry.name() + " fixed shift, threads 1 vs 2");
}

// True bounds 1 * 20 * sqrt(32) = 113 (q-only: 5.7) and 3.76^2 sqrt(32) =
// 80 (half: 40): every row online, bitwise the forced online path, and
// correct.
TEST_P(SimdFixedShift, LargeBoundStaysOnline) {
  const Backend& entry = *GetParam();
  for (const auto& [a, c] : {std::pair{1.0, 20.0}, std::pair{3.76, 3.76}}) {
    const AttentionCase ac = BuiltCase(entry, a, c);
    const std::string what =
        entry.name() + " a " + std::to_string(a) + " c " + std::to_string(c);
    const BoundCheck bc = CheckBounds(ac.problem, RunHook(entry, ac, false));
    EXPECT_EQ(bc.fixed, 0) << what;
    const auto rf =
        validation::run_attention_forward(entry, ac, ExecConfig{2, false});
    const auto ro =
        validation::run_attention_forward(entry, ac, ExecConfig{2, true});
    EXPECT_TRUE(SameBits(rf.o, ro.o) && SameBits(rf.lse, ro.lse)) << what;
    // Saturated rows: the forward's verdict (their gradients are
    // cancellations, judged elsewhere).
    const auto rep =
        validation::check_attention(entry, ac, ExecConfig{2}, true);
    EXPECT_TRUE(rep.pass) << what << ": " << rep.failure_message();
  }
}

// One visible key on the fixed path (qwen3 and rms across heads, OLMo2):
// causal row 0 gives O = v_0, dq = 0 and the online path's lse; one query
// over a padded key length of 1 gives dv_0 = dO exactly.
TEST_P(SimdFixedShift, SingleKeyRowsStayExact) {
  const Backend& entry = *GetParam();
  for (const char* name : {"qwen3", "olmo2"})
    for (bool one_query : {false, true}) {
      AttentionProblem p;
      p.heads = 2, p.kv_heads = 2, p.head_dim = 32;
      p.q_len = one_query ? 1 : 70, p.kv_len = 70;
      apply_preset(name, &p);
      if (one_query)
        p.mask.key_lengths = {1};
      else
        p.mask.causal = true;
      const AttentionCase c = validation::round_inputs(
          validation::make_attention_case(p, Distribution::kGaussian, 17,
                                          entry.precision()),
          entry.precision());
      const std::string what = Where(entry, name) + (one_query ? " 1q" : "");
      const Shifts s = RunHook(entry, c, false);
      const auto rf = validation::run_attention(entry, c, ExecConfig{2, false});
      const auto ro = validation::run_attention(entry, c, ExecConfig{2, true});
      const size_t D = 32;
      for (size_t h = 0; h < 2; ++h) {
        const size_t row = h * static_cast<size_t>(p.q_len);
        EXPECT_GE(s.shift[row], 0) << what << ": row 0 not fixed";
        EXPECT_EQ(rf.lse[row], ro.lse[row]) << what;
        for (size_t d = 0; d < D; ++d) {
          const size_t kv0 = h * 70 * D + d;
          EXPECT_EQ(rf.o[row * D + d], c.v[kv0]) << what << " h " << h;
          EXPECT_EQ(rf.dq[row * D + d], 0.0) << what << " h " << h;
          if (one_query) {
            EXPECT_EQ(rf.dv[kv0], c.d_o[h * D + d]) << what;
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdFixedShift,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
