// Registration of the Highway SIMD entries: one per compiled Highway target
// and storage precision, named "simd:<TARGET>:<prec>" (e.g. simd:AVX2:bf16).
#ifndef QKNORM_SIMD_REGISTER_H_
#define QKNORM_SIMD_REGISTER_H_

#include "qknorm/backend.h"

namespace qknorm::simd {

// Adds simd:<T>:f32, simd:<T>:bf16 and simd:<T>:f16 for every target T this
// build compiled (every attainable target: on x86-64 with GCC 12 that is
// AVX3, AVX2, SSE4, SSSE3 and SCALAR). Entries whose target the CPU lacks
// report available() == false and must not be run.
void register_backends(Registry& r);

}  // namespace qknorm::simd

#endif  // QKNORM_SIMD_REGISTER_H_
