// The property suite's tooling on GQA problems (issue 33): the row
// structures of validation/generators.h and the non-saturation bound's
// amplitude (validation/nonsaturation.h). Both indexed k and v as if they had
// one head per query head: apply_structure wrote past k and v (heap
// corruption; ASan reports it, and the row checks below fail), and
// computed_logit_amplitude threw on every GQA draw of NonSaturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "property_tests/support.h"
#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "validation/case.h"
#include "validation/generators.h"
#include "validation/nonsaturation.h"
#include "validation/oracle.h"
#include "validation/rule_terms.h"
#include "validation/run.h"

namespace qknorm::validation {
namespace {

// GQA shapes: ratio 3 with two kv heads (a query head mapped to its own
// index as kv head lands in the wrong group) and MQA, batch 2.
struct Shape {
  int64_t heads, kv_heads;
};
constexpr Shape kGqaShapes[] = {{6, 2}, {4, 1}, {2, 1}};

AttentionProblem gqa_problem(const Shape& s) {
  AttentionProblem p;
  p.batch = 2;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.q_len = 5;
  p.kv_len = 16;
  p.head_dim = 8;
  p.g = 12;
  return p;
}

// Row r of slice sl of a dense [slices, n, D] tensor.
const double* row_of(const std::vector<double>& t, int64_t n, int64_t D,
                     int64_t sl, int64_t r) {
  return t.data() + (sl * n + r) * D;
}

bool rows_equal(const double* a, const double* b, int64_t D) {
  for (int64_t d = 0; d < D; ++d)
    if (a[d] != b[d]) return false;
  return true;
}

// b = sign 2^e a for some e in [-2, 2]: the structure's exact multiples.
bool is_multiple(const double* a, const double* b, int64_t D, double sign) {
  for (int e = -2; e <= 2; ++e) {
    bool all = true;
    for (int64_t d = 0; d < D && all; ++d)
      all = b[d] == sign * std::ldexp(a[d], e);
    if (all) return true;
  }
  return false;
}

// Every key row kParallelRows / kAntiParallelRows changed is an exact
// multiple of a query row of a query head that reads its kv head (b, hk):
// one of (b, hk * group .. hk * group + group - 1); every kv slice gets
// some; the tensors keep their sizes and q is untouched.
TEST(StructureGqa, ParallelKeyRowsComeFromTheirGroupsQueries) {
  for (const Shape& s : kGqaShapes)
    for (Structure st :
         {Structure::kParallelRows, Structure::kAntiParallelRows}) {
      const AttentionProblem p = gqa_problem(s);
      const AttentionCase drawn =
          make_attention_case(p, Distribution::kGaussian, 41);
      AttentionCase c = drawn;
      apply_structure(&c, st, 41, Precision::kF32);
      ASSERT_EQ(c.k.size(), drawn.k.size());
      ASSERT_EQ(c.v.size(), drawn.v.size());
      EXPECT_EQ(c.q, drawn.q);
      EXPECT_EQ(c.v, drawn.v);
      const int64_t D = p.head_dim, group = s.heads / s.kv_heads;
      const double sign = st == Structure::kParallelRows ? 1.0 : -1.0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t hk = 0; hk < s.kv_heads; ++hk) {
          const int64_t sk = b * s.kv_heads + hk;
          int changed = 0;
          for (int64_t j = 0; j < p.kv_len; ++j) {
            const double* kj = row_of(c.k, p.kv_len, D, sk, j);
            if (rows_equal(kj, row_of(drawn.k, p.kv_len, D, sk, j), D))
              continue;
            ++changed;
            bool found = false;
            for (int64_t h = hk * group; h < (hk + 1) * group && !found; ++h)
              for (int64_t i = 0; i < p.q_len && !found; ++i)
                found = is_multiple(row_of(c.q, p.q_len, D, b * s.heads + h, i),
                                    kj, D, sign);
            EXPECT_TRUE(found)
                << name(st) << " heads " << s.heads << " kv_heads "
                << s.kv_heads << ": key row (" << b << ", " << hk << ", " << j
                << ") is no multiple of a query row of its group";
          }
          EXPECT_GT(changed, 0)
              << name(st) << " left kv slice (" << b << ", " << hk << ") of "
              << s.heads << ":" << s.kv_heads << " without structure";
        }
    }
}

// kDuplicatedKeys copies key rows (and some value rows) within their own kv
// slice, every slice getting some.
TEST(StructureGqa, DuplicatedKeysStayInTheirKvSlice) {
  for (const Shape& s : kGqaShapes) {
    const AttentionProblem p = gqa_problem(s);
    const AttentionCase drawn =
        make_attention_case(p, Distribution::kGaussian, 7);
    AttentionCase c = drawn;
    apply_structure(&c, Structure::kDuplicatedKeys, 7, Precision::kF32);
    ASSERT_EQ(c.k.size(), drawn.k.size());
    ASSERT_EQ(c.v.size(), drawn.v.size());
    const int64_t D = p.head_dim;
    for (int64_t sk = 0; sk < p.batch * s.kv_heads; ++sk) {
      int changed = 0;
      for (int64_t j = 0; j < p.kv_len; ++j) {
        const double* kj = row_of(c.k, p.kv_len, D, sk, j);
        if (rows_equal(kj, row_of(drawn.k, p.kv_len, D, sk, j), D)) continue;
        ++changed;
        bool found = false;
        for (int64_t src = 0; src < j && !found; ++src)
          found = rows_equal(row_of(c.k, p.kv_len, D, sk, src), kj, D);
        EXPECT_TRUE(found) << "key row " << j << " of kv slice " << sk
                           << " copies no earlier row of its slice";
      }
      EXPECT_GT(changed, 0) << "kv slice " << sk << " has no duplicate";
    }
  }
}

// The element-wise structures act on every q and k row and nothing past
// them: each kv slice of k gets some, v is untouched.
TEST(StructureGqa, RowAndElementStructuresReachEveryKvSlice) {
  for (const Shape& s : kGqaShapes)
    for (Structure st :
         {Structure::kRowsBelowEps, Structure::kSubnormalEntries}) {
      AttentionProblem p = gqa_problem(s);
      p.eps = 1e-3;
      const AttentionCase drawn =
          make_attention_case(p, Distribution::kGaussian, 3);
      AttentionCase c = drawn;
      apply_structure(&c, st, 3, Precision::kF32);
      ASSERT_EQ(c.k.size(), drawn.k.size());
      EXPECT_EQ(c.v, drawn.v);
      const int64_t D = p.head_dim;
      for (int64_t sk = 0; sk < p.batch * s.kv_heads; ++sk) {
        int changed = 0;
        for (int64_t j = 0; j < p.kv_len; ++j)
          changed += rows_equal(row_of(c.k, p.kv_len, D, sk, j),
                                row_of(drawn.k, p.kv_len, D, sk, j), D)
                         ? 0
                         : 1;
        EXPECT_GT(changed, 0) << name(st) << ": kv slice " << sk;
      }
    }
}

// The case of problem p with k and v expanded to one kv head per query head
// (query head h reads kv head h / (heads / kv_heads)): the MHA problem whose
// logits are the GQA problem's.
AttentionCase expanded(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const int64_t H = p.heads, Hk = kv_heads_of(p), group = H / Hk;
  const auto n = static_cast<size_t>(p.kv_len * p.head_dim);
  AttentionCase e = c;
  e.problem.kv_heads = 0;
  e.k.clear();
  e.v.clear();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const size_t at = static_cast<size_t>(b * Hk + h / group) * n;
      e.k.insert(e.k.end(), c.k.begin() + at, c.k.begin() + at + n);
      e.v.insert(e.v.end(), c.v.begin() + at, c.v.begin() + at + n);
    }
  return e;
}

// The paper's normalization under GQA has no rounding flips and no mean
// shift, so the amplitude needs no oracle: without one it is the value the
// oracle gives, bit for bit, and it contains the amplitude of the expanded
// MHA problem (the same logits), at the rule's A and at an a-priori bound.
TEST(NonSaturationGqa, PaperNormalizationNeedsNoOracle) {
  for (const Shape& s : kGqaShapes)
    for (Precision prec : {Precision::kF64, Precision::kF32, Precision::kBF16,
                           Precision::kF16}) {
      AttentionCase c =
          round_inputs(make_attention_case(gqa_problem(s),
                                           Distribution::kGaussian, 11, prec),
                       prec);
      ASSERT_FALSE(is_paper_formulation(c.problem));
      const OracleAttention orc = oracle_attention(c);
      const double A = logit_amplitude(c);
      double without = 0;
      ASSERT_NO_THROW(without = computed_logit_amplitude(c, nullptr, prec, A))
          << s.heads << ":" << s.kv_heads << " " << name(prec);
      EXPECT_EQ(without, computed_logit_amplitude(c, &orc, prec, A));
      const AttentionCase mha = expanded(c);
      ASSERT_TRUE(is_paper_formulation(mha.problem));
      EXPECT_GE(without, computed_logit_amplitude(mha, nullptr, prec,
                                                  logit_amplitude(mha)));
      EXPECT_GE(computed_logit_amplitude(c, nullptr, prec, 30.0),
                computed_logit_amplitude(mha, nullptr, prec, 30.0));
    }
}

// A formulation with rounding flips (Qwen3's round-before-weight) or a mean
// shift (Chameleon's LayerNorm) still needs its oracle, GQA or not.
TEST(NonSaturationGqa, FlipsAndShiftsStillNeedTheOracle) {
  for (const char* preset : {"qwen3", "chameleon"}) {
    AttentionProblem p = gqa_problem({4, 2});
    apply_preset(preset, &p);
    p.kv_heads = 2;
    const AttentionCase c = round_inputs(
        make_attention_case(p, Distribution::kGaussian, 5, Precision::kBF16),
        Precision::kBF16);
    EXPECT_THROW(computed_logit_amplitude(c, nullptr, Precision::kBF16, 30.0),
                 Error)
        << preset;
  }
}

// The bound holds on the probabilities of every registry entry (each
// declares GQA for the paper's normalization) on a GQA case, as the
// NonSaturation property judges them.
TEST(NonSaturationGqa, EntriesProbabilitiesHoldOnGqaCases) {
  int judged = 0;
  for (const Backend* b : all_backends().entries()) {
    if (!b->available()) continue;
    for (const Shape& s : kGqaShapes) {
      AttentionProblem p = gqa_problem(s);
      p.mask.causal = true;
      if (!b->supports(p)) continue;
      const Precision prec = b->precision();
      const AttentionCase c = round_inputs(
          make_attention_case(p, Distribution::kGaussian, 13, prec), prec);
      std::vector<double> probs;
      if (!property::hook_probabilities(*b, c, &probs)) continue;
      const auto fwd = run_attention_forward(*b, c);
      EXPECT_EQ(check_nonsaturation(p, probs, &fwd.lse,
                                    computed_logit_amplitude(
                                        c, nullptr, prec, logit_amplitude(c)),
                                    prec),
                "")
          << b->name() << " " << s.heads << ":" << s.kv_heads;
      ++judged;
    }
  }
  EXPECT_GT(judged, 0);
}

}  // namespace
}  // namespace qknorm::validation
