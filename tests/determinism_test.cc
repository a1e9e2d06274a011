// validation/determinism.h: N runs at 1 and 2 threads, compared bitwise
// and judged. Each cause is provoked by an entry that perturbs one dk
// element the way the bug would (a data race: differently on every call at
// 2 threads; a reduction order that follows the thread count: the same way
// on every call at 2 threads; state carried between calls: differently on
// every call, at 1 thread too), and named; a correct entry is bitwise
// identical and passes; a declared nondeterministic entry whose runs
// differ within the bound passes with its spread reported.
#include "validation/determinism.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>

#include "qknorm/backend.h"
#include "validation/buffers.h"
#include "validation/case.h"
#include "validation/forwarding_backend.h"
#include "validation/oracle.h"

namespace qknorm::validation {
namespace {

enum class Bug { kNone, kRace, kThreadOrder, kState, kDeclaredSpread };

// reference:f32 with one dk element nudged after its backward.
class Nudged final : public ForwardingBackend {
 public:
  Nudged(const Backend& inner, Bug bug)
      : ForwardingBackend(inner, "-"), bug_(bug) {}
  bool supports(const AttentionProblem& p) const override {
    return inner().supports(p);
  }
  bool deterministic() const override { return bug_ != Bug::kDeclaredSpread; }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    inner().attention_backward(p, a, ws, cfg);
    const int call = calls_++;
    double factor = 1;
    switch (bug_) {
      case Bug::kNone:
        return;
      case Bug::kRace:  // a different loss on every call at 2 threads
        if (cfg.threads < 2) return;
        factor = 1 + 1e-3 * (call + 1);
        break;
      case Bug::kThreadOrder:  // the same change on every 2-thread call
        if (cfg.threads < 2) return;
        factor = 1 + 0x1p-20;
        break;
      case Bug::kState:  // drifts from call to call, at any thread count
        factor = 1 + 1e-3 * call;
        break;
      case Bug::kDeclaredSpread:  // a last-bit difference from call to call
        factor = 1 + (call % 2) * 0x1p-23;
        break;
    }
    const double x = decode(precision(), a.dk.data, 0);
    encode(precision(), x * factor, a.dk.data, 0);
  }

 private:
  Bug bug_;
  mutable std::atomic<int> calls_{0};
};

struct Fixture {
  AttentionCase c;
  OracleAttention orc;
};

Fixture small_case() {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 12, p.kv_len = 12, p.head_dim = 8;
  p.g = 3;
  Fixture f;
  f.c = round_inputs(
      make_attention_case(p, Distribution::kGaussian, 7, Precision::kF32),
      Precision::kF32);
  f.orc = oracle_attention(f.c);
  return f;
}

const Backend& reference_f32() { return *all_backends().find("reference:f32"); }

TEST(Determinism, CorrectEntryIsIdenticalAndPasses) {
  const Fixture f = small_case();
  const Nudged e(reference_f32(), Bug::kNone);
  const DeterminismReport r = check_determinism(e, f.c, f.orc);
  EXPECT_EQ(r.runs_done, 6);
  EXPECT_TRUE(r.identical) << r.first_difference;
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.cause, "");
}

TEST(Determinism, EachCauseIsNamed) {
  const Fixture f = small_case();
  struct Want {
    Bug bug;
    const char* cause;
  };
  for (const Want w :
       {Want{Bug::kRace, "a data race between the entry's threads"},
        Want{Bug::kThreadOrder, "the reduction order follows the thread count"},
        Want{Bug::kState, "state carried between calls"}}) {
    const Nudged e(reference_f32(), w.bug);
    const DeterminismReport r = check_determinism(e, f.c, f.orc);
    EXPECT_FALSE(r.identical);
    EXPECT_FALSE(r.pass);
    EXPECT_EQ(r.cause.rfind(w.cause, 0), 0u) << r.cause;
    EXPECT_EQ(r.differing_fields, "dk");
    EXPECT_NE(r.first_difference.find("dk 1 of "), std::string::npos)
        << r.first_difference;
  }
}

// Declared nondeterministic: the runs differ by one f32 ulp of one element,
// well inside its bound; the case passes and the spread says how much of
// the bound the difference used.
TEST(Determinism, DeclaredNondeterministicReportsTheSpread) {
  const Fixture f = small_case();
  const Nudged e(reference_f32(), Bug::kDeclaredSpread);
  const DeterminismReport r = check_determinism(e, f.c, f.orc);
  EXPECT_FALSE(r.declared_deterministic);
  EXPECT_FALSE(r.identical);
  EXPECT_TRUE(r.pass) << r.run_failure;
  EXPECT_GT(r.spread, 0);
  EXPECT_LT(r.spread, 1);
  EXPECT_NE(r.spread_where.find("dk[0,0,0,0]"), std::string::npos)
      << r.spread_where;
}

}  // namespace
}  // namespace qknorm::validation
