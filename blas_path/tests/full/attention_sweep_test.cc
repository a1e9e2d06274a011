// The full deterministic sweep of issue 3 for blas:f32 and blas:f64: every
// head_dim x q_len x kv_len of the lists (1000 shapes, q_len != kv_len
// included), mask / g / variant / distribution rotating (test_util.h), B = 2
// (padding lengths differ per batch, one batch fully masked for kv_len <= 2),
// H = 2. One test per (precision, head_dim) so failures localize.
#include <gtest/gtest.h>

#include "blas_path/tests/test_util.h"

namespace qknorm::blas::testing {
namespace {

void sweep(Precision prec, int64_t D) {
  int64_t index = 0;
  for (int64_t d : kHeadDims)
    for (int64_t nq : kLengths)
      for (int64_t nk : kLengths) {
        const int64_t i = index++;
        if (d != D) continue;
        const AttentionCase c = sweep_case(i, D, nq, nk);
        SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
        expect_case(prec, c);
      }
}

#define QKNORM_BLAS_SWEEP(D)                                    \
  TEST(BlasSweepF32, HeadDim##D) { sweep(Precision::kF32, D); } \
  TEST(BlasSweepF64, HeadDim##D) { sweep(Precision::kF64, D); }
QKNORM_BLAS_SWEEP(1)
QKNORM_BLAS_SWEEP(3)
QKNORM_BLAS_SWEEP(7)
QKNORM_BLAS_SWEEP(8)
QKNORM_BLAS_SWEEP(9)
QKNORM_BLAS_SWEEP(16)
QKNORM_BLAS_SWEEP(31)
QKNORM_BLAS_SWEEP(64)
QKNORM_BLAS_SWEEP(65)
QKNORM_BLAS_SWEEP(128)
#undef QKNORM_BLAS_SWEEP

}  // namespace
}  // namespace qknorm::blas::testing
