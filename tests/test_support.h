// What the foundation tests share: the f64 reference entry they run, the
// attention problem of a given shape, and the tally of finite-difference
// reports each gradient test prints.
#ifndef QKNORM_TESTS_TEST_SUPPORT_H_
#define QKNORM_TESTS_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "qknorm/backend.h"
#include "validation/gradcheck.h"

namespace qknorm::test_support {

inline const Backend& ref64() { return *all_backends().find("reference:f64"); }

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
