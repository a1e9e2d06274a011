// Builds the registry of every production entry of this build, once, plus
// the plug-ins named by QKNORM_PLUGIN (include/qknorm/plugin_loader.h).
#include <cstdlib>
#include <iostream>

#include "qknorm/backend.h"
#include "qknorm/error.h"
#include "qknorm/plugin_loader.h"
#include "reference/register.h"
#if QKNORM_WITH_SIMD
#include "simd/register.h"
#endif
#if QKNORM_WITH_BLAS
#include "blas_path/register.h"
#endif

namespace qknorm {
namespace {

Registry& registry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    reference::register_backends(*r);
#if QKNORM_WITH_SIMD
    simd::register_backends(*r);
#endif
#if QKNORM_WITH_BLAS
    blas::register_backends(*r);
#endif
    try {
      load_plugins_from_env(*r);
    } catch (const Error& e) {  // no tool can run with a half-loaded registry
      std::cerr << "QKNORM_PLUGIN: " << e.what() << "\n";
      std::exit(3);
    }
    return r;
  }();
  return *registry;
}

}  // namespace

const Registry& all_backends() { return registry(); }

void load_plugin(const std::string& path) {
  load_plugin_into(registry(), path);
}

}  // namespace qknorm
