// What the foundation tests share: the f64 reference entry they run, the
// attention problem of a given shape, and the tally of finite-difference
// reports each gradient test prints.
#ifndef QKNORM_TESTS_TEST_SUPPORT_H_
#define QKNORM_TESTS_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "tests/sanitize_subset.h"
#include "validation/case.h"
#include "validation/check.h"
#include "validation/gradcheck.h"

namespace qknorm::test_support {

// The sub-case of batch b's query rows [i0, i0 + nq) of heads [h0, h0 + nh)
// and key rows [j0, j0 + nk) of kv heads [hk0, hk0 + nhk), unmasked, as the
// sampled verdict forms its sub-cases (written here independently of
// validation/sampled.cc): the rows copied, [heads, head_dim] weights and
// biases restricted to the heads (other shapes, and across-heads norms,
// kept whole).
inline validation::AttentionCase block_of(const validation::AttentionCase& c,
                                          int64_t b, int64_t h0, int64_t nh,
                                          int64_t i0, int64_t nq, int64_t hk0,
                                          int64_t nhk, int64_t j0, int64_t nk) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim, Hk = kv_heads_of(p);
  validation::AttentionCase s = c;
  s.problem.batch = 1;
  s.problem.heads = nh;
  s.problem.kv_heads = nhk;
  s.problem.q_len = nq;
  s.problem.kv_len = nk;
  s.problem.mask = Mask{};
  auto rows = [&](const std::vector<double>& x, int64_t H, int64_t N,
                  int64_t first, int64_t heads, int64_t n0, int64_t n) {
    std::vector<double> out;
    for (int64_t h = first; h < first + heads; ++h) {
      const double* src = x.data() + ((b * H + h) * N + n0) * D;
      out.insert(out.end(), src, src + n * D);
    }
    return out;
  };
  s.q = rows(c.q, p.heads, p.q_len, h0, nh, i0, nq);
  s.d_o = rows(c.d_o, p.heads, p.q_len, h0, nh, i0, nq);
  s.k = rows(c.k, Hk, p.kv_len, hk0, nhk, j0, nk);
  s.v = rows(c.v, Hk, p.kv_len, hk0, nhk, j0, nk);
  auto heads_of = [&](const std::vector<double>& w, int64_t first,
                      int64_t count) {
    if (w.empty() || p.norm.weight != ParamShape::kHeadDim ||
        p.norm.axis == NormAxis::kAllHeads)
      return w;
    return std::vector<double>(w.begin() + first * D,
                               w.begin() + (first + count) * D);
  };
  s.q_weight = heads_of(c.q_weight, h0, nh);
  s.q_bias = heads_of(c.q_bias, h0, nh);
  s.k_weight = heads_of(c.k_weight, hk0, nhk);
  s.k_bias = heads_of(c.k_bias, hk0, nhk);
  return s;
}

// The message of the Error f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline const Backend& ref64() { return *all_backends().find("reference:f64"); }

// validation::check_attention(*b, c, {}, false, /*with_naive=*/false) for
// every b of `entries` (each of precision prec), the same reports in the
// same order, but the long-double oracle of round_inputs(c, prec) is made
// once for all of them instead of once per entry (it is a function of that
// case alone; made when first needed, as check_attention makes it). The
// oracle was most of the "every entry" tests' time (perf: ~30% of
// Rope.EveryEntryWithItPassesTheVerdict in the GCC build, plus its
// allocations), once per entry of the precision.
template <class OnReport>
void check_entries(const std::vector<const Backend*>& entries,
                   const validation::AttentionCase& c, Precision prec,
                   const OnReport& on_report) {
  if (entries.empty()) return;
  const validation::AttentionCase rc = validation::round_inputs(c, prec);
  validation::LazyOracle oracle(rc);
  const std::string naive = validation::naive_for(prec).name();
  for (const Backend* b : entries) {
    const validation::AttentionResult er =
        validation::run_attention_fed(*b, rc, oracle.source());
    const validation::OracleAttention& orc = oracle.get();
    validation::AgreementReport rep =
        validation::judge_attention(rc, prec, orc, er, nullptr, false,
                                    b->name(), naive, nullptr, b->contract());
    validation::diagnose_with_entry_blocks(*b, rc, orc, er, false, &rep);
    on_report(*b, rep);
  }
}

// The variants' "every entry passes" tests (softcap, window, rope): each
// case judged on every runnable registry entry of its precision that
// implements its problem (the case made for precision prec), every verdict
// expected PASS, the worst margin
// kept per entry.
struct EveryEntry {
  int cases = 0, judged = 0;
  std::map<std::string, double> worst;
  void judge(const validation::AttentionCase& c, Precision prec) {
    ++cases;
    std::vector<const Backend*> entries;
    for (const Backend* b : all_backends().entries())
      if (b->precision() == prec && b->available() && b->supports(c.problem))
        entries.push_back(b);
    check_entries(entries, c, prec, [&](const Backend& b, const auto& rep) {
      EXPECT_TRUE(rep.pass) << rep.failure_message();
      double& w = worst[b.name()];
      w = std::max(w, rep.margin);
      ++judged;
    });
  }
  bool has_simd() const {
    return std::any_of(worst.begin(), worst.end(), [](const auto& w) {
      return w.first.rfind("simd:", 0) == 0;
    });
  }
  void print(const char* what) const {
    std::printf("%s verdict: %d cases, %d judgements, worst margin:", what,
                cases, judged);
    for (const auto& [name, w] : worst)
      std::printf(" %s %.3f", name.c_str(), w);
    std::printf("\n");
  }
};

// batch B, H query heads (Hk kv heads, 0: as many as H), q_len Nq, kv_len
// Nk, head_dim D; everything else as AttentionProblem's defaults.
inline AttentionProblem shape(int64_t B, int64_t H, int64_t Nq, int64_t Nk,
                              int64_t D, int64_t Hk = 0) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
  p.kv_heads = Hk;
  return p;
}

// The finite-difference reports of one test's cases: each must pass, and
// the worst relative disagreement is printed (the figure kFdTol's
// derivation in gradcheck.h quotes).
class FdTally {
 public:
  void expect_pass(const validation::GradCheckReport& rep,
                   const std::string& on) {
    EXPECT_TRUE(rep.pass) << rep.message() << " on " << on;
    worst_ = std::max(worst_, rep.worst_rel);
    ++n_;
  }
  void print(const char* what) const {
    std::printf("%s: %d reports, worst relative disagreement %.3e\n", what, n_,
                worst_);
  }

 private:
  double worst_ = 0;
  int n_ = 0;
};

}  // namespace qknorm::test_support

#endif  // QKNORM_TESTS_TEST_SUPPORT_H_
