// Compiles the SIMD kernels once per attainable Highway target and builds the
// per-target tables of kernels.h.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/kernels.cc"
#include "simd/kernels.h"

#include <type_traits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/attention-inl.h"
#include "simd/convert-inl.h"
#include "simd/scalenorm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qknorm::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The one switch of the public entry points: the precision is resolved here,
// then everything below is target-local and precision-specialized. Calls
// f(std::integral_constant<Precision, P>()) for the storage precision P.
template <class F>
void WithStoragePrecision(Precision prec, const F& f) {
  switch (prec) {
    case Precision::kF32:
      return f(std::integral_constant<Precision, Precision::kF32>());
    case Precision::kBF16:
      return f(std::integral_constant<Precision, Precision::kBF16>());
    case Precision::kF16:
      return f(std::integral_constant<Precision, Precision::kF16>());
    case Precision::kF64:
      break;
  }
  HWY_ABORT("simd: unsupported precision");
}

void AttentionForwardEntry(const AttentionProblem& p, const ForwardArgs& a,
                           Precision prec, SimdWorkspace& ws, int threads,
                           double* probs) {
  WithStoragePrecision(prec, [&](auto P) {
    AttentionForward<decltype(P)::value>(p, a, ws, threads, probs);
  });
}

void AttentionBackwardEntry(const AttentionProblem& p, const BackwardArgs& a,
                            Precision prec, SimdWorkspace& ws, int threads) {
  WithStoragePrecision(prec, [&](auto P) {
    AttentionBackward<decltype(P)::value>(p, a, ws, threads);
  });
}

void ScaleNormForwardEntry(const ScaleNormProblem& p,
                           const ScaleNormForwardArgs& a, Precision prec,
                           SimdWorkspace& ws, int threads) {
  WithStoragePrecision(prec, [&](auto P) {
    ScaleNormForward<decltype(P)::value>(p, a, ws, threads);
  });
}

void ScaleNormBackwardEntry(const ScaleNormProblem& p,
                            const ScaleNormBackwardArgs& a, Precision prec,
                            SimdWorkspace& ws, int threads) {
  WithStoragePrecision(prec, [&](auto P) {
    ScaleNormBackward<decltype(P)::value>(p, a, ws, threads);
  });
}

// Array conversions through the same vector code the kernels use (LoadRow /
// StoreRow handle the tail through a stack buffer, as in the kernels).
template <Precision P>
void ToStorage(const float* in, uint16_t* out, size_t n) {
  StoreRow<P>(in, n, out);
}
template <Precision P>
void FromStorage(const uint16_t* in, float* out, size_t n) {
  const size_t N = hn::Lanes(DF());
  const size_t full = n / N * N;
  LoadRow<P>(in, full, out, full);
  if (full < n) {
    float tail[kMaxLanesF32];
    LoadRow<P>(in + full, n - full, tail, N);
    std::copy(tail, tail + (n - full), out + full);
  }
}

TargetKernels GetKernels() {
  TargetKernels k;
  k.attention_forward = &AttentionForwardEntry;
  k.attention_backward = &AttentionBackwardEntry;
  k.scalenorm_forward = &ScaleNormForwardEntry;
  k.scalenorm_backward = &ScaleNormBackwardEntry;
  k.bf16_from_f32 = &ToStorage<Precision::kBF16>;
  k.f32_from_bf16 = &FromStorage<Precision::kBF16>;
  k.f16_from_f32 = &ToStorage<Precision::kF16>;
  k.f32_from_f16 = &FromStorage<Precision::kF16>;
  return k;
}

}  // namespace qknorm::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qknorm::simd {

// The per-target function table, built here, outside every target's
// attribute region: calling a per-target GetKernels() would run code GCC
// compiled for that target (it stores the table with AVX-512 moves for
// AVX3), i.e. SIGILL on a CPU without it before available() is ever asked.
// Taking the addresses executes nothing; GetKernels() above instantiates
// the templates inside each target's region.
#define QKNORM_SIMD_KERNELS(NS)                                               \
  TargetKernels {                                                             \
    &NS::AttentionForwardEntry, &NS::AttentionBackwardEntry,                  \
        &NS::ScaleNormForwardEntry, &NS::ScaleNormBackwardEntry,              \
        &NS::ToStorage<Precision::kBF16>, &NS::FromStorage<Precision::kBF16>, \
        &NS::ToStorage<Precision::kF16>, &NS::FromStorage<Precision::kF16>    \
  }

const std::vector<CompiledTarget>& compiled_targets() {
  static const std::vector<CompiledTarget>* targets = [] {
    auto* v = new std::vector<CompiledTarget>;
    auto add = [v](int64_t bit, const TargetKernels& k) {
      v->push_back(CompiledTarget{bit, hwy::TargetName(bit), k});
    };
    (void)add;
    // Best first, as hwy/targets.h orders them (lower bit = better).
#if HWY_TARGETS & HWY_AVX3_DL
    add(HWY_AVX3_DL, QKNORM_SIMD_KERNELS(N_AVX3_DL));
#endif
#if HWY_TARGETS & HWY_AVX3
    add(HWY_AVX3, QKNORM_SIMD_KERNELS(N_AVX3));
#endif
#if HWY_TARGETS & HWY_AVX2
    add(HWY_AVX2, QKNORM_SIMD_KERNELS(N_AVX2));
#endif
#if HWY_TARGETS & HWY_SSE4
    add(HWY_SSE4, QKNORM_SIMD_KERNELS(N_SSE4));
#endif
#if HWY_TARGETS & HWY_SSSE3
    add(HWY_SSSE3, QKNORM_SIMD_KERNELS(N_SSSE3));
#endif
#if HWY_TARGETS & HWY_EMU128
    add(HWY_EMU128, QKNORM_SIMD_KERNELS(N_EMU128));
#endif
#if HWY_TARGETS & HWY_SCALAR
    add(HWY_SCALAR, QKNORM_SIMD_KERNELS(N_SCALAR));
#endif
    return v;
  }();
  return *targets;
}

}  // namespace qknorm::simd
#endif  // HWY_ONCE
