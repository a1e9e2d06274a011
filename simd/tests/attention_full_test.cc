// The long attention sweep (label "full"): cases 24..263 of every runnable
// simd entry's sample (attention_sweep.h; cases 0..23 are the quick test).
#include <gtest/gtest.h>

#include "simd/tests/attention_sweep.h"
#include "simd/tests/test_util.h"

namespace qknorm::simd::testing {
namespace {

class SimdAttentionFullSweep : public ::testing::TestWithParam<const Backend*> {
};

TEST_P(SimdAttentionFullSweep, Cases24To263) {
  RunAttentionSweep(*GetParam(), 24, 240, SaltOf(*GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Entries, SimdAttentionFullSweep,
                         ::testing::ValuesIn(RunnableEntries()),
                         EntryParamName);

}  // namespace
}  // namespace qknorm::simd::testing
