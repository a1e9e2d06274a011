// See row_kernels.h. Compiled with -ffp-contract=off (CMakeLists.txt): a*b+c
// is two roundings in every clone and build, so the vector kernels match
// their scalar formulas bit for bit (tests/quick/row_kernels_test.cc).
#include "blas_path/row_kernels.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "blas_path/clones.h"

namespace qknorm::blas {
namespace {

// Two instantiations of the kernel bodies. 32-byte vectors: one AVX2
// register, two SSE registers (the x86-64-v3 and baseline clones). 64-byte
// vectors: one AVX-512 register (the x86-64-v4 version; with AVX2 GCC 12
// lowers 64-byte comparisons and selects lane by lane, 18 instructions per
// exp element instead of ~3, measured with callgrind). The lane count fixes
// the summation order, so an AVX-512 machine and an AVX2 machine differ in
// the last bits; on one machine every run gives the same bits.
namespace w32 {
#define QKNORM_BLAS_VBYTES 32
#include "blas_path/row_kernels-inl.h"
#undef QKNORM_BLAS_VBYTES
}  // namespace w32
namespace w64 {
#define QKNORM_BLAS_VBYTES 64
#include "blas_path/row_kernels-inl.h"
#undef QKNORM_BLAS_VBYTES
}  // namespace w64
using namespace w32;  // exp2_f32 and the double kernels

#if defined(__x86_64__) && defined(__GNUC__)
#define QKNORM_BLAS_V4 __attribute__((target("arch=x86-64-v4")))
inline bool has_v4() {
  // The x86-64-v4 feature set, spelled so Clang 14 and GCC 12 both accept
  // it (Clang 14 rejects the level name "x86-64-v4" here).
  static const bool v4 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma");
  return v4;
}
#else
#define QKNORM_BLAS_V4
inline bool has_v4() { return false; }
#endif

}  // namespace

// Through the row kernel (x * 1 - 0 == x exactly, so the bits are expbv's):
// Clang refuses a 32-byte vector passed by value into a function without
// AVX ("AVX vector ... changes the ABI"), which expbv(splat(x)) is here.
QKNORM_BLAS_CLONES float exp2_f32(float x) {
  exp_affine_row_impl(&x, 1, 1, 1.0f, 0.0f);
  return x;
}

// Float kernels: an x86-64-v4 version on 64-byte vectors, v3/baseline clones
// on 32-byte vectors, and a dispatcher (one cached CPU check).
namespace detail {
#define QKNORM_BLAS_FLOAT_KERNEL(ret, name, impl, params, args)   \
  QKNORM_BLAS_V4 ret name##_w64 params { return w64::impl args; } \
  QKNORM_BLAS_CLONES ret name##_w32 params { return w32::impl args; }
QKNORM_BLAS_FLOAT_KERNEL(float, row_max, row_extreme_impl<true>,
                         (const float* s, int64_t m), (s, m))
QKNORM_BLAS_FLOAT_KERNEL(float, row_min, row_extreme_impl<false>,
                         (const float* s, int64_t m), (s, m))
QKNORM_BLAS_FLOAT_KERNEL(float, exp_affine_row, exp_affine_row_impl,
                         (float* s, int64_t m, int64_t ncols, float alpha,
                          float shift),
                         (s, m, ncols, alpha, shift))
QKNORM_BLAS_FLOAT_KERNEL(float, softmax_backward_row, softmax_backward_row_impl,
                         (float* c, float* dp, int64_t m, int64_t ncols,
                          float alpha2, float scale, float sink,
                          float* sink_delta),
                         (c, dp, m, ncols, alpha2, scale, sink, sink_delta))
#undef QKNORM_BLAS_FLOAT_KERNEL
bool v4_supported() { return has_v4(); }
}  // namespace detail

float row_max(const float* s, int64_t m) {
  return has_v4() ? detail::row_max_w64(s, m) : detail::row_max_w32(s, m);
}
float row_min(const float* s, int64_t m) {
  return has_v4() ? detail::row_min_w64(s, m) : detail::row_min_w32(s, m);
}
float exp_affine_row(float* s, int64_t m, int64_t ncols, float alpha,
                     float shift) {
  return has_v4() ? detail::exp_affine_row_w64(s, m, ncols, alpha, shift)
                  : detail::exp_affine_row_w32(s, m, ncols, alpha, shift);
}
float softmax_backward_row(float* c, float* dp, int64_t m, int64_t ncols,
                           float alpha2, float scale, float sink,
                           float* sink_delta) {
  return has_v4() ? detail::softmax_backward_row_w64(c, dp, m, ncols, alpha2,
                                                     scale, sink, sink_delta)
                  : detail::softmax_backward_row_w32(c, dp, m, ncols, alpha2,
                                                     scale, sink, sink_delta);
}

// Double kernels (std::exp lane by lane dominates): 32-byte vectors, clones.
QKNORM_BLAS_CLONES double row_max(const double* s, int64_t m) {
  return row_extreme_impl<true>(s, m);
}
QKNORM_BLAS_CLONES double row_min(const double* s, int64_t m) {
  return row_extreme_impl<false>(s, m);
}
QKNORM_BLAS_CLONES double exp_affine_row(double* s, int64_t m, int64_t ncols,
                                         double alpha, double shift) {
  return exp_affine_row_impl(s, m, ncols, alpha, shift);
}
QKNORM_BLAS_CLONES double softmax_backward_row(double* c, double* dp, int64_t m,
                                               int64_t ncols, double alpha2,
                                               double scale, double sink,
                                               double* sink_delta) {
  return softmax_backward_row_impl(c, dp, m, ncols, alpha2, scale, sink,
                                   sink_delta);
}
QKNORM_BLAS_CLONES void divide_row(float* x, int64_t n, float a) {
  divide_row_impl(x, n, a);
}
QKNORM_BLAS_CLONES void divide_row(double* x, int64_t n, double a) {
  divide_row_impl(x, n, a);
}

}  // namespace qknorm::blas
