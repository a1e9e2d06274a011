// The per-target kernel table of the SIMD path. kernels.cc compiles the
// kernels once per Highway target (foreach_target.h with
// HWY_COMPILE_ALL_ATTAINABLE) and lists every compiled target here; an entry
// dispatches ONCE, by picking its target's table, and everything below that
// call is target-local code calling target-local code.
#ifndef QKNORM_SIMD_KERNELS_H_
#define QKNORM_SIMD_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"
#include "simd/workspace.h"

namespace qknorm::simd {

// Contracts (shared by all targets; see attention-inl.h / scalenorm-inl.h):
// - inputs validated as by qknorm::validate_*; storage element type given by
//   `prec` (kF32, kBF16 or kF16; math and accumulation are f32);
// - threads >= 1; results are bitwise identical for every thread count;
// - probs (forward only, may be null): additionally receives P as the
//   kernel computes it, dense [B,H,q_len,kv_len], 0 where masked.
struct TargetKernels {
  void (*attention_forward)(const AttentionProblem& p, const ForwardArgs& a,
                            Precision prec, SimdWorkspace& ws, int threads,
                            double* probs);
  void (*attention_backward)(const AttentionProblem& p, const BackwardArgs& a,
                             Precision prec, SimdWorkspace& ws, int threads);
  void (*scalenorm_forward)(const ScaleNormProblem& p,
                            const ScaleNormForwardArgs& a, Precision prec,
                            SimdWorkspace& ws, int threads);
  void (*scalenorm_backward)(const ScaleNormProblem& p,
                             const ScaleNormBackwardArgs& a, Precision prec,
                             SimdWorkspace& ws, int threads);
  // The vector RNE conversions the kernels use, over n elements (any n),
  // exposed for the conversion tests.
  void (*bf16_from_f32)(const float* in, uint16_t* out, size_t n);
  void (*f32_from_bf16)(const uint16_t* in, float* out, size_t n);
  void (*f16_from_f32)(const float* in, uint16_t* out, size_t n);
  void (*f32_from_f16)(const uint16_t* in, float* out, size_t n);
};

struct CompiledTarget {
  int64_t bit;       // HWY_AVX2 etc.
  const char* name;  // hwy::TargetName(bit): "AVX2", "SSE4", "SCALAR", ...
  TargetKernels kernels;
};

// Every compiled target, best first. Built once.
const std::vector<CompiledTarget>& compiled_targets();

}  // namespace qknorm::simd

#endif  // QKNORM_SIMD_KERNELS_H_
