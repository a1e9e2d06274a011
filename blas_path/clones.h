// Function multi-versioning for the BLAS path's loops (internal).
#ifndef QKNORM_BLAS_PATH_CLONES_H_
#define QKNORM_BLAS_PATH_CLONES_H_

// QKNORM_BLAS_CLONES compiles a function for x86-64-v4 (AVX-512), x86-64-v3
// (AVX2+FMA) and the baseline; an ifunc resolver picks one at load time.
// Sanitizer builds keep one version (ifunc resolvers run before the sanitizer
// runtime is initialized). So do Clang builds (the libFuzzer targets): Clang
// 14's target_clones, new in that release, gave the double exp_affine_row
// AVX-512 code (vpbroadcastq from a GPR) outside any clone, a SIGILL on AVX2
// machines (found by the fuzz build; Clang also does not define
// __SANITIZE_ADDRESS__). The explicit AVX-512 kernels of row_kernels.cc
// (target attribute plus a CPU check) are kept in every build.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define QKNORM_BLAS_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QKNORM_BLAS_CLONES
#endif
// Template bodies are forced inline into each clone, so they are compiled
// for the clone's instruction set.
#define QKNORM_BLAS_INLINE [[gnu::always_inline]] inline

#endif  // QKNORM_BLAS_PATH_CLONES_H_
