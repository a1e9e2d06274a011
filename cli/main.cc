// qknorm-check: the precision-mode comparison tool (issue 6). See
// cli/README.md and `qknorm-check --help`.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "validation/heap_policy.h"

int main(int argc, char** argv) {
  // Each case's oracle buffers reuse the last one's heap (heap_policy.h).
  qknorm::validation::keep_freed_heap();
  std::vector<std::string> args(argv, argv + argc);
  return qknorm::cli::run_cli(args, std::cout, std::cerr, isatty(2) != 0);
}
