// The heap policy of the processes that run the oracle: qknorm-check
// (cli/main.cc) and every GoogleTest executable of the project (the
// top-level CMakeLists.txt links tests/heap_policy_init.cc into each).
//
// Why. Every case allocates the oracle's long-double buffers (a few
// B * H * q_len * kv_len arrays, 128 KiB to tens of MiB) and frees them when
// the case ends. glibc's malloc serves a chunk at or above its mmap threshold
// (128 KiB at first, then raised to each freed mmapped chunk's size) with a
// fresh mmap, and returns the heap's free top to the kernel once it exceeds
// the trim threshold; either way the next case's buffers are new pages, and
// the kernel zero-fills each on its first touch. perf on
// BlasSweepF32.HeadDim128 (GCC Release, fourteenth session): 742,587 page
// faults and ~25% of its cycles in the fault handler, 13.8 s wall (4.9 s
// of it system time). With the thresholds below: 39,832 faults, 4.5 s. The
// whole GCC ctest stage went from 569 to 414 s wall on 2 cores.
//
// What. The mmap threshold at glibc's maximum (32 MiB on 64-bit; setting it
// also stops glibc from moving it), so the buffers come from the heap, and a
// trim threshold of 1 GiB, so freed heap stays with the process for the
// next case. Memory is never returned below a process's peak heap (the
// largest case's buffers, plus per-thread arenas under --jobs); chunks above
// 32 MiB are still mmapped and returned. Results do not change: only where
// the memory comes from. Not glibc (and under ASan, whose allocator ignores
// mallopt): nothing happens.
#ifndef QKNORM_VALIDATION_HEAP_POLICY_H_
#define QKNORM_VALIDATION_HEAP_POLICY_H_

#if __has_include(<malloc.h>)
#include <malloc.h>  // defines __GLIBC__ (through features.h) on glibc
#endif

namespace qknorm::validation {

inline constexpr int kHeapMmapThreshold = 32 << 20;  // glibc's 64-bit maximum
inline constexpr int kHeapTrimThreshold = 1 << 30;

// Applies the policy above to this process (call before the first case).
inline void keep_freed_heap() {
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD)
  mallopt(M_MMAP_THRESHOLD, kHeapMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, kHeapTrimThreshold);
#endif
}

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_HEAP_POLICY_H_
