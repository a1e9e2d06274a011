// ScaleNorm (Nguyen & Salazar 2019): y = g * x / max(||x||_2, eps) per row.
//
// Backward (shared/NUMERICS.md): with u = x / max(||x||, eps),
//   ||x|| > eps:  dx = (g / ||x||) (dy - u (u . dy))
//   ||x|| <= eps: dx = g dy / eps
//   dg = sum over rows of dy . u.
// A zero row gives y = 0 and dx = g dy / eps. Norms are scaled, so no finite
// input overflows or underflows.
#ifndef QKNORM_SCALENORM_H_
#define QKNORM_SCALENORM_H_

#include <cmath>
#include <cstdint>

namespace qknorm {

// eps of the ScaleNorm paper's code, a clamp on the norm.
inline constexpr double kDefaultScaleNormEps = 1e-5;

struct ScaleNormProblem {
  int64_t rows = 1, dim = 1;
  double g = 1.0;
  double eps = kDefaultScaleNormEps;
};

// The paper's initialization g = sqrt(d_model) (a known re-implementation bug
// used 1.0).
inline double scalenorm_g_init(int64_t dim) {
  return std::sqrt(static_cast<double>(dim));
}

// Non-owning [rows, dim] view, dim contiguous; `size` = elements in buffer.
template <class Ptr>
struct TensorRef2 {
  Ptr data = nullptr;
  int64_t size = 0;
  int64_t row_stride = 0;
};
using ConstTensor2 = TensorRef2<const void*>;
using MutTensor2 = TensorRef2<void*>;

struct ScaleNormForwardArgs {
  ConstTensor2 x;
  MutTensor2 y;
};

struct ScaleNormBackwardArgs {
  ConstTensor2 x, dy;
  MutTensor2 dx;
  double* dg = nullptr;
};

}  // namespace qknorm

#endif  // QKNORM_SCALENORM_H_
