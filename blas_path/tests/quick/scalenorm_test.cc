// ScaleNorm on the BLAS path's entries: the tolerance rule over a sweep of
// shapes, g, distributions (zero rows, wide magnitudes), and strided rows.
#include <gtest/gtest.h>

#include "blas_path/tests/test_util.h"

namespace qknorm::blas::testing {
namespace {

TEST(BlasScaleNorm, Sweep) {
  int64_t index = 0;
  for (Precision prec : {Precision::kF32, Precision::kF64})
    for (int64_t rows : {1, 3, 17})
      for (int64_t dim : kHeadDims) {
        ScaleNormProblem p;
        p.rows = rows, p.dim = dim;
        p.g = kGs[index % 5];
        const Distribution dist = kDists[(index / 5) % 5];
        const auto c = validation::make_scalenorm_case(
            p, dist, static_cast<uint64_t>(500 + index));
        ++index;
        SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
        const auto rep = validation::check_scalenorm(entry(prec), c);
        EXPECT_TRUE(rep.pass) << rep.failure_message();
      }
}

}  // namespace
}  // namespace qknorm::blas::testing
