// Linked into every GoogleTest executable of the project (the top-level
// CMakeLists.txt): applies validation/heap_policy.h before main() runs, so
// the first case's buffers already follow it. mallopt only sets two numbers
// of glibc's allocator, which a static initializer may do before any other.
#include "validation/heap_policy.h"

namespace {

[[maybe_unused]] const bool kHeapPolicyApplied = [] {
  qknorm::validation::keep_freed_heap();
  return true;
}();

}  // namespace
