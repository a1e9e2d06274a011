// The sanitizer stage's subsets (scripts/sanitize.sh exports
// QKNORM_SANITIZE_SUBSET=1): what the foundation tests (test_support.h) and
// the property suite (property_tests/support.cc) share. Only <cstdlib>, so
// the property support library can include it.
#ifndef QKNORM_TESTS_SANITIZE_SUBSET_H_
#define QKNORM_TESTS_SANITIZE_SUBSET_H_

#include <cstdint>
#include <cstdlib>

namespace qknorm::test_support {

// True in the sanitizer stage (scripts/sanitize.sh exports
// QKNORM_SANITIZE_SUBSET=1; QKNORM_SANITIZE_SUBSET=0 there runs everything):
// that stage is for memory safety and UB on every code path, not for the
// verdicts' statistics, and a few statistical verdict sweeps judge a
// deterministic subset of their cases there, never none, each test saying
// which and which test runs the same code on the rest. The GCC stage
// (ctest) runs every case. README.md, "What ./test.sh runs", lists them.
inline bool sanitize_subset() {
  const char* s = std::getenv("QKNORM_SANITIZE_SUBSET");
  return s != nullptr && s[0] == '1' && s[1] == '\0';
}

// Whether a sweep judges its case number `index` (counted by the caller
// over every case it would judge): under the sanitizer subset every
// `stride`-th, index 0 included (never none); every case elsewhere.
inline bool sanitize_keeps(int64_t index, int64_t stride) {
  return !sanitize_subset() || index % stride == 0;
}

}  // namespace qknorm::test_support

#endif  // QKNORM_TESTS_SANITIZE_SUBSET_H_
