// Shared helpers of the SIMD kernel tests: the simd entries this CPU can run,
// and GoogleTest parameter names that end in the target ("F32_AVX2"), so
// --gtest_filter='*_SSE4' selects one target.
#ifndef QKNORM_SIMD_TESTS_TEST_UTIL_H_
#define QKNORM_SIMD_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"

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

}  // namespace qknorm::simd::testing

#endif  // QKNORM_SIMD_TESTS_TEST_UTIL_H_
