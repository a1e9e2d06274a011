// What the report records about the machine it ran on.
#ifndef QKNORM_CLI_MACHINE_H_
#define QKNORM_CLI_MACHINE_H_

#include <string>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::cli {

struct MachineInfo {
  std::string cpu;  // "model name" of /proc/cpuinfo
  int cores = 0;    // std::thread::hardware_concurrency
  // Highway targets of the registry's available simd entries, in registry
  // order (the targets this build compiled and this CPU runs).
  std::vector<std::string> hwy_targets;
  std::string openblas_core;  // openblas_get_corename()
  // OPENBLAS_CORETYPE as set in the environment (empty: OpenBLAS picked the
  // core for this CPU).
  std::string openblas_coretype;
  int openblas_threads = 0;  // openblas_get_num_threads()
};

MachineInfo machine_info(const Registry& registry);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_MACHINE_H_
