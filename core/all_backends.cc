// Builds the registry of every production entry of this build, once.
#include "qknorm/backend.h"
#include "reference/register.h"
#if QKNORM_WITH_SIMD
#include "simd/register.h"
#endif
#if QKNORM_WITH_BLAS
#include "blas_path/register.h"
#endif

namespace qknorm {

const Registry& all_backends() {
  static const Registry* registry = [] {
    auto* r = new Registry;
    reference::register_backends(*r);
#if QKNORM_WITH_SIMD
    simd::register_backends(*r);
#endif
#if QKNORM_WITH_BLAS
    blas::register_backends(*r);
#endif
    return r;
  }();
  return *registry;
}

}  // namespace qknorm
