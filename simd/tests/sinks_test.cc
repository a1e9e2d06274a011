// Attention sinks (issue 34; attention.h "sinks") in the simd kernels, every
// runnable entry (target x f32/bf16/f16 storage): forward and backward
// against the naive reference evaluated in double
// (reference::attention_forward<double> / attention_backward<double>, its
// dsinks through NormGrads::sinks), both softmax paths (the fixed shift and
// the online softmax, ExecConfig::online_softmax), on sdpa and qknorm (the
// paper's l2, Qwen3), GQA, causal with padding and q_len > kv_len (fully
// masked rows: O exactly 0, lse exactly the f32 sink), sinks far above the
// logits (+20: most of the mass; above the fixed shift's bound B ~ |g|) and
// far below (-20: none), a softcap and a window together with sinks. Also:
// the probabilities hook (P over the real keys: rows sum to 1 - e^{sink -
// lse}), the sinks matter (the same problem without them is far from the
// reference), and every output, d_sinks included, is bitwise the same for
// one and two threads.
//
// validation::run_attention carries no d_sinks yet, so the entry is driven
// here through validation::AttentionBuffers (guarded buffers; d_sinks in a
// guarded f64 buffer of its own).
//
// The comparison is normwise per field, as rope_test.cc's: err = max_i
// |simd_i - ref_i| / max_i |ref_i|; dg relative to max(|dg|, 1); d_sinks, a
// sum of terms of both signs, relative to the largest sum of its terms'
// magnitudes sum_{b, i} |exp(sink_h - lse) delta| over the heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "qknorm/precision.h"
#include "reference/reference.h"
#include "simd/tests/test_util.h"
#include "simd/workspace.h"
#include "validation/buffers.h"
#include "validation/case.h"
#include "validation/run.h"

namespace qknorm::simd::testing {
namespace {

using validation::AttentionCase;
using validation::Distribution;

// f32's unit roundoff: every simd entry computes in f32.
constexpr double kU = 0x1p-24;

// Normwise tolerance of the f32 compute, in units of u (rope_test.cc's
// 1e-4, the bound for f32 against the reference in double: 1678 u).
// First order, a field's error relative to its largest element is the
// logit's f32 dot product (head_dim <= 128 terms) amplified in P by the
// logit's size (|g| = 12.32 here: ~1600 u at the worst), the weighted sums
// over kv_len <= 300 keys and a few exp and divisions; the sink adds one
// exp and one term per row (its share's error exp(x) (1 + u) with x formed
// in f32 from lse <= ~30 in magnitude: ~30 u). Measured on these cases: see
// the commit message (printed per entry).
constexpr double kComputeUnits = 1678;

// A 16-bit entry's storage adds twice u_s (StoredTolerance, as
// rope_test.cc).
double Tolerance(Precision p) { return StoredTolerance(p, kComputeUnits * kU); }

// f16 stores values below its smallest normal 2^-14 with the absolute
// spacing 2^-24 (RNE: error <= 2^-25), which no relative bound covers; a
// sink far above the logits (+20 against |S| <= 12.32) puts O, dQ, dK and
// dV there (P ~ e^-20). A stored field's tolerance adds that floor relative
// to the field's largest element (bf16 and f32 reach it only at 2^-134).
double StorageFloor(Precision p) { return p == Precision::kF16 ? 0x1p-25 : 0; }

// Without the sinks, the outputs must be far outside the f32 tolerance
// (checked on the f32 entries: the 16-bit storage terms exceed a small
// sink's share of O).
constexpr double kSinksVisible = 10;

struct SinkCase {
  std::string what;
  AttentionProblem p;
};

AttentionProblem Base(int64_t B, int64_t H, int64_t Hk, int64_t Nq, int64_t Nk,
                      int64_t D, std::vector<double> sinks) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.kv_heads = Hk, p.q_len = Nq, p.kv_len = Nk;
  p.head_dim = D, p.g = 12.32;
  p.sinks = std::move(sinks);
  return p;
}

std::vector<SinkCase> SinkCases() {
  std::vector<SinkCase> out;
  {
    // Batch 1's padding leaves no key (every row fully masked); batch 0's
    // last rows see 100 keys.
    AttentionProblem p = Base(2, 2, 2, 70, 131, 31, {0.75, -2.5});
    p.mask.causal = true, p.mask.key_lengths = {100, 0};
    out.push_back({"paper causal padded (batch 1 empty) 70x131 D31", p});
  }
  {
    // q_len > kv_len, causal: the first 20 rows see no key.
    AttentionProblem p = Base(1, 2, 2, 40, 20, 64, {1.5, 11.0});
    p.mask.causal = true;
    out.push_back({"paper causal 40x20 (first rows masked) D64", p});
  }
  {
    AttentionProblem p = Base(1, 4, 2, 65, 130, 64, {20, 20, 20, 20});
    p.mask.causal = true;
    out.push_back({"paper sinks +20 causal GQA 65x130 D64", p});
  }
  {
    AttentionProblem p = Base(1, 2, 2, 33, 90, 64, {-20, -20});
    out.push_back({"paper sinks -20 33x90 D64", p});
  }
  {
    AttentionProblem p = Base(2, 4, 2, 70, 90, 64, {0.5, -1, 20, -20});
    apply_preset("qwen3", &p);
    p.mask.causal = true, p.mask.key_lengths = {90, 50};
    out.push_back({"qwen3 causal padded GQA 70x90 D64 sinks mixed", p});
  }
  {
    AttentionProblem p = Base(1, 4, 1, 3, 300, 128, {2, -3, 20, -20});
    p.variant = Variant::kSDPA, p.mask.causal = true;
    out.push_back({"sdpa GQA 4:1 decode 3x300 D128", p});
  }
  {
    // Softcap 5 and a window (20, 3) with sinks (in capped units: within
    // the cap, above it, below it); padding empties batch 1's last rows.
    AttentionProblem p = Base(2, 2, 1, 130, 130, 32, {3, 12});
    p.variant = Variant::kSDPA, p.softcap = 5;
    p.mask.window_left = 20, p.mask.window_right = 3;
    p.mask.key_lengths = {130, 60};
    out.push_back({"sdpa softcap 5 window (20, 3) padded GQA 130x130", p});
  }
  {
    AttentionProblem p = Base(1, 2, 2, 66, 100, 24, {-7, 25});
    apply_preset("qwen3", &p);
    p.softcap = 8, p.mask.window_left = 40, p.mask.window_right = 0;
    out.push_back({"qwen3 softcap 8 window (40, 0) 66x100 D24", p});
  }
  {
    // Sinks near the ends of f32's range (exact in f32): all the mass (O
    // 0, lse the sink) and none, every output finite.
    AttentionProblem p = Base(1, 2, 2, 10, 20, 8, {0x1p127, -0x1p127});
    p.mask.causal = true;
    out.push_back({"paper sinks +-2^127 causal 10x20 D8", p});
  }
  return out;
}

// What one run of an entry returns: attention outputs and d_sinks.
struct SinkResult : validation::AttentionResult {
  std::vector<double> d_sinks;
};

// Forward, then backward fed the entry's own o and lse, in guarded buffers
// (a write outside any view fails the test).
SinkResult RunSinks(const Backend& entry, const AttentionCase& c,
                    const ExecConfig& cfg) {
  const AttentionProblem& p = c.problem;
  validation::AttentionBuffers bufs(c, entry.precision());
  validation::TensorBuffer ds = validation::double_buffer("d_sinks", p.heads);
  const std::unique_ptr<Workspace> ws = entry.make_workspace();
  checked_attention_forward(entry, p, bufs.forward_args(), ws.get(), cfg);
  BackwardArgs ba = bufs.backward_args();
  ba.d_sinks = ds.doubles(), ba.d_sinks_size = p.heads;
  checked_attention_backward(entry, p, ba, ws.get(), cfg);
  for (const validation::GuardViolation& g : bufs.guard_violations())
    ADD_FAILURE() << entry.name() << " " << c.describe() << ": " << g.message();
  if (!ds.guards_intact())
    ADD_FAILURE() << entry.name() << " " << c.describe() << ": "
                  << ds.first_violation().message();
  SinkResult s;
  static_cast<validation::AttentionResult&>(s) = bufs.result(true);
  s.d_sinks = ds.load();
  return s;
}

reference::NormArgs<double> Weights(const AttentionCase& c, Precision prec) {
  auto ptr = [](const std::vector<double>& x) {
    return x.empty() ? nullptr : x.data();
  };
  reference::NormArgs<double> w;
  w.q_weight = ptr(c.q_weight), w.k_weight = ptr(c.k_weight);
  w.q_bias = ptr(c.q_bias), w.k_bias = ptr(c.k_bias);
  w.storage = prec;  // Qwen3: x_hat rounded to the entry's storage
  return w;
}

// The reference in double (test_util.h), its dsinks too.
SinkResult Reference(const AttentionCase& c, Precision prec,
                     const std::vector<double>& o,
                     const std::vector<double>& lse) {
  SinkResult r;
  static_cast<validation::AttentionResult&>(r) =
      ReferenceInDouble(c, prec, o, lse, &r.d_sinks);
  return r;
}

// The largest over heads of sum_{b, i} |exp(sink_h - lse) delta| (delta =
// dO . O), from the o and lse the backward read, in double: the scale of
// d_sinks' error (its terms have both signs).
double DSinksScale(const AttentionCase& c, const std::vector<double>& o,
                   const std::vector<double>& lse) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim;
  double scale = 0;
  for (int64_t h = 0; h < p.heads; ++h) {
    double sum = 0;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.q_len; ++i) {
        const int64_t r = (b * p.heads + h) * p.q_len + i;
        double delta = 0;
        for (int64_t d = 0; d < D; ++d)
          delta += c.d_o[static_cast<size_t>(r * D + d)] *
                   o[static_cast<size_t>(r * D + d)];
        sum += std::exp(p.sinks[static_cast<size_t>(h)] -
                        lse[static_cast<size_t>(r)]) *
               std::fabs(delta);
      }
    scale = std::max(scale, sum);
  }
  return scale;
}

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

// Per field: its error and its tolerance (Tolerance, plus StorageFloor
// relative to the field's largest element for the fields stored in the
// entry's format: o, dq, dk, dv).
struct FieldError {
  double err, tol;
};
std::map<std::string, FieldError> Errors(const SinkResult& a,
                                         const SinkResult& ref, bool learned,
                                         double dsinks_scale, Precision prec) {
  const double tol = Tolerance(prec);
  auto stored = [&](const std::vector<double>& x,
                    const std::vector<double>& y) {
    const double m = MaxAbs(y);
    return FieldError{NormwiseError(x, y),
                      tol + (m > 0 ? StorageFloor(prec) / m : 0.0)};
  };
  std::map<std::string, FieldError> e;
  e["o"] = stored(a.o, ref.o);
  e["lse"] = {NormwiseError(a.lse, ref.lse), tol};
  e["dq"] = stored(a.dq, ref.dq);
  e["dk"] = stored(a.dk, ref.dk);
  e["dv"] = stored(a.dv, ref.dv);
  if (learned)
    e["dg"] = {std::fabs(a.dg - ref.dg) / std::max(std::fabs(ref.dg), 1.0),
               tol};
  if (!ref.dq_weight.empty())
    e["dq_weight"] = {NormwiseError(a.dq_weight, ref.dq_weight), tol};
  if (!ref.dk_weight.empty())
    e["dk_weight"] = {NormwiseError(a.dk_weight, ref.dk_weight), tol};
  double num = 0;
  for (size_t h = 0; h < ref.d_sinks.size(); ++h)
    if (const double d = std::fabs(a.d_sinks[h] - ref.d_sinks[h]); !(d <= num))
      num = d;  // NaN too
  e["d_sinks"] = {num == 0 ? 0 : num / dsinks_scale, tol};
  return e;
}

AttentionCase MakeCase(const AttentionProblem& p, uint64_t seed,
                       Precision prec) {
  return validation::round_inputs(
      validation::make_attention_case(p, Distribution::kGaussian, seed, prec),
      prec);
}

class SimdSinks : public ::testing::TestWithParam<const Backend*> {};

TEST_P(SimdSinks, MatchesTheReferenceInDouble) {
  const Backend& entry = *GetParam();
  const Precision prec = entry.precision();
  const double tol = Tolerance(prec);
  double worst = 0, worst_floor = 0, worst_dsinks = 0;
  std::string worst_at, floor_at;
  uint64_t seed = 3600;
  for (const SinkCase& sc : SinkCases()) {
    ASSERT_TRUE(entry.supports(sc.p)) << sc.what;
    const AttentionCase c = MakeCase(sc.p, seed++, prec);
    const AttentionProblem& p = c.problem;
    for (bool online : {false, true}) {
      ExecConfig cfg{2};
      cfg.online_softmax = online;
      const std::string what =
          sc.what + (online ? " (online)" : " (fixed shift)");
      const SinkResult r = RunSinks(entry, c, cfg);
      const SinkResult ref = Reference(c, prec, r.o, r.lse);
      const bool learned = p.variant == Variant::kQKNorm && !p.fixed_scale;
      for (const auto& [field, fe] :
           Errors(r, ref, learned, DSinksScale(c, r.o, r.lse), prec)) {
        EXPECT_LE(fe.err, fe.tol) << entry.name() << " " << what << " ["
                                  << c.describe() << "]: " << field << " error "
                                  << fe.err << " > tolerance " << fe.tol;
        // The worst error where the f16 floor is no more than 1% of the
        // tolerance (normal-range values), and apart the worst where it is.
        if (field == "d_sinks") worst_dsinks = std::max(worst_dsinks, fe.err);
        if (fe.tol <= 1.01 * tol && fe.err > worst)
          worst = fe.err, worst_at = what + " " + field;
        if (fe.tol > 1.01 * tol && fe.err > worst_floor)
          worst_floor = fe.err, floor_at = what + " " + field;
      }
      // Fully masked rows: the sink alone, exactly (O = 0, lse = the f32
      // sink), and no gradient.
      int masked = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t i = 0; i < p.q_len; ++i) {
          const KeyRange kr = visible_keys(p.mask, b, i, p.q_len, p.kv_len);
          if (kr.begin < kr.end) continue;
          for (int64_t h = 0; h < p.heads; ++h) {
            const int64_t row = (b * p.heads + h) * p.q_len + i;
            const double sink = static_cast<double>(
                static_cast<float>(p.sinks[static_cast<size_t>(h)]));
            EXPECT_EQ(r.lse[static_cast<size_t>(row)], sink)
                << entry.name() << " " << what << ": lse of masked row " << i;
            for (int64_t d = 0; d < p.head_dim; ++d) {
              const size_t x = static_cast<size_t>(row * p.head_dim + d);
              EXPECT_EQ(r.o[x], 0.0) << entry.name() << " " << what;
              EXPECT_EQ(r.dq[x], 0.0) << entry.name() << " " << what;
            }
            ++masked;
          }
        }
      if (p.batch == 2 && p.mask.key_lengths == std::vector<int64_t>{100, 0}) {
        EXPECT_GT(masked, 0) << what;
      }
    }
    // The same problem without sinks is far from the reference with them
    // (unless every sink is far below the logits: -20 takes no mass).
    if (prec != Precision::kF32 ||
        *std::max_element(p.sinks.begin(), p.sinks.end()) < -10)
      continue;
    AttentionCase off = c;
    off.problem.sinks.clear();
    const validation::AttentionResult r0 =
        validation::run_attention(entry, off, ExecConfig{2});
    const SinkResult ref = Reference(c, prec, r0.o, r0.lse);
    EXPECT_GT(NormwiseError(r0.o, ref.o), kSinksVisible * tol)
        << entry.name() << " " << sc.what << ": o does not depend on sinks";
  }
  std::printf(
      "%s worst normwise error %.3g = %.0f u = %.3g u_s (tolerance %.0f u) "
      "at %s\n",
      entry.name().c_str(), worst, worst / kU,
      worst / StorageUnitRoundoff(prec), tol / kU, worst_at.c_str());
  std::printf("%s   d_sinks worst %.3g = %.1f u\n", entry.name().c_str(),
              worst_dsinks, worst_dsinks / kU);
  if (worst_floor > 0)
    std::printf(
        "%s   where f16's subnormal floor dominates: worst %.3g at %s\n",
        entry.name().c_str(), worst_floor, floor_at.c_str());
}

// The probabilities hook: P over the real keys, against the reference's
// (attention_probabilities<double>, whose rows sum to 1 - e^{sink - lse}),
// on both softmax paths (the fixed shift with a sink above its bound, where
// the row's shift becomes the sink); masked keys and rows exactly 0.
TEST_P(SimdSinks, ProbabilitiesHookOverTheRealKeys) {
  const Backend& entry = *GetParam();
  const Precision prec = entry.precision();
  const double tol = Tolerance(prec);
  double worst = 0;
  uint64_t seed = 3700;
  for (const SinkCase& sc : SinkCases()) {
    const AttentionCase c = MakeCase(sc.p, seed++, prec);
    const AttentionProblem& p = c.problem;
    std::vector<double> ref(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    reference::attention_probabilities<double>(p, c.q.data(), c.k.data(),
                                               ref.data(), Weights(c, prec));
    for (bool online : {false, true}) {
      const std::unique_ptr<Workspace> ws = entry.make_workspace();
      static_cast<SimdWorkspace*>(ws.get())->online_softmax = online;
      const std::vector<double> probs = Probabilities(entry, c, ws.get());
      ASSERT_EQ(probs.size(), ref.size()) << entry.name();
      const double err = NormwiseError(probs, ref);
      EXPECT_LE(err, tol) << entry.name() << " " << sc.what
                          << (online ? " (online)" : " (fixed shift)");
      worst = std::max(worst, err);
      for (size_t x = 0; x < ref.size(); ++x)
        if (ref[x] == 0) {
          EXPECT_EQ(probs[x], 0.0) << entry.name() << " " << x;
        }
    }
  }
  std::printf("%s hook worst normwise error %.3g = %.0f u\n",
              entry.name().c_str(), worst, worst / kU);
}

TEST_P(SimdSinks, ThreadsOneAndTwoAgreeBitwise) {
  const Backend& entry = *GetParam();
  for (const SinkCase& sc : SinkCases()) {
    const AttentionCase c = MakeCase(sc.p, 77, entry.precision());
    const SinkResult one = RunSinks(entry, c, ExecConfig{1});
    const SinkResult two = RunSinks(entry, c, ExecConfig{2});
    const std::string what = entry.name() + " " + sc.what + " threads 1 vs 2";
    ExpectSame(one, two, what);
    EXPECT_TRUE(SameBits(one.d_sinks, two.d_sinks)) << what << ": d_sinks";
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdSinks,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
