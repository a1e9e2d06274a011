#ifndef QKNORM_BLAS_PATH_REGISTER_H_
#define QKNORM_BLAS_PATH_REGISTER_H_
#include "qknorm/backend.h"
namespace qknorm::blas {
// Adds blas:f32 (cblas_sgemm, f32 storage and math) and blas:f64
// (cblas_dgemm). Both implement every Backend method, including the
// attention_probabilities hook.
void register_backends(qknorm::Registry& r);
// OpenBLAS's kernel name (openblas_get_corename(), e.g. "Zen") and its current
// thread count, for reports.
const char* blas_corename();
int blas_num_threads();
}  // namespace qknorm::blas
#endif  // QKNORM_BLAS_PATH_REGISTER_H_
