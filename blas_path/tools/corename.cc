// Prints the OpenBLAS kernel core this process runs (openblas_get_corename):
// run_under_core.sh checks with it that a forced OPENBLAS_CORETYPE took.
#include <cstdio>

extern "C" char* openblas_get_corename();

int main() {
  const char* core = openblas_get_corename();
  std::puts(core != nullptr ? core : "unknown");
  return 0;
}
