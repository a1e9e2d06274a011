// Shared helpers of the SIMD kernel tests: the simd entries this CPU can run,
// and GoogleTest parameter names that end in the target ("F32_AVX2"), so
// --gtest_filter='*_SSE4' selects one target.
#ifndef QKNORM_SIMD_TESTS_TEST_UTIL_H_
#define QKNORM_SIMD_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "validation/harness.h"

namespace qknorm::simd::testing {

// Every simd:* entry of the registry whose target this CPU supports.
inline std::vector<const Backend*> RunnableEntries() {
  std::vector<const Backend*> r;
  for (const Backend* b : all_backends().match("simd:*"))
    if (b->available()) r.push_back(b);
  return r;
}

inline std::string EntryParamName(
    const ::testing::TestParamInfo<const Backend*>& info) {
  std::string prec(name(info.param->precision()));
  for (char& c : prec)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return prec + "_" + info.param->target();
}

inline bool SameBits(const std::vector<double>& a,
                     const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Every output of two runs, bit for bit (the parameter gradients too).
inline void ExpectSame(const validation::AttentionResult& a,
                       const validation::AttentionResult& b,
                       const std::string& what) {
  EXPECT_TRUE(SameBits(a.o, b.o)) << what << ": o differs";
  EXPECT_TRUE(SameBits(a.lse, b.lse)) << what << ": lse differs";
  EXPECT_TRUE(SameBits(a.dq, b.dq)) << what << ": dq differs";
  EXPECT_TRUE(SameBits(a.dk, b.dk)) << what << ": dk differs";
  EXPECT_TRUE(SameBits(a.dv, b.dv)) << what << ": dv differs";
  EXPECT_EQ(std::memcmp(&a.dg, &b.dg, sizeof(double)), 0)
      << what << ": dg differs";
  EXPECT_TRUE(SameBits(a.dq_weight, b.dq_weight)) << what << ": dq_weight";
  EXPECT_TRUE(SameBits(a.dk_weight, b.dk_weight)) << what << ": dk_weight";
  EXPECT_TRUE(SameBits(a.dq_bias, b.dq_bias)) << what << ": dq_bias";
  EXPECT_TRUE(SameBits(a.dk_bias, b.dk_bias)) << what << ": dk_bias";
}

}  // namespace qknorm::simd::testing

#endif  // QKNORM_SIMD_TESTS_TEST_UTIL_H_
