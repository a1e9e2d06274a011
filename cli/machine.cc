#include "cli/machine.h"

// OpenBLAS's own declarations (libopenblas-dev's cblas.h, on the include path
// of PkgConfig::OPENBLAS): openblas_get_corename, openblas_get_num_threads.
// The report asks the library itself, never blas_path/.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace qknorm::cli {

MachineInfo machine_info(const Registry& registry) {
  MachineInfo m;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        m.cpu = line.substr(colon + 1);
        m.cpu.erase(0, m.cpu.find_first_not_of(" \t"));
      }
      break;
    }
  }
  if (m.cpu.empty()) m.cpu = "unknown";
  m.cores = static_cast<int>(std::thread::hardware_concurrency());
  for (const Backend* b : registry.entries()) {
    if (b->family() != "simd" || !b->available()) continue;
    if (std::find(m.hwy_targets.begin(), m.hwy_targets.end(), b->target()) ==
        m.hwy_targets.end())
      m.hwy_targets.push_back(b->target());
  }
  const char* core = openblas_get_corename();
  m.openblas_core = core != nullptr ? core : "unknown";
  // The core decides the blas entries' GEMM arithmetic: the report says
  // whether the user forced it (OPENBLAS_CORETYPE) or OpenBLAS picked it.
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr) m.openblas_coretype = forced;
  m.openblas_threads = openblas_get_num_threads();
  return m;
}

}  // namespace qknorm::cli
