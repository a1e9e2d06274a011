#include "bench/fma_peak.h"

#include <immintrin.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace qknorm::bench {
namespace {

// Keeps the chains' results alive so the compiler cannot drop the loop.
std::atomic<float> g_sink{0.0f};

// Arrays of accumulators, fully unrolled, so that GCC keeps every chain in a
// register (checked in the disassembly: 12 vfmadd231ps per loop trip). No
// -ffast-math anywhere, so the compiler may not reassociate the chains into
// fewer, longer ones.
__attribute__((target("avx2,fma"))) float chains_avx2(int64_t steps) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a[kFmaChains];
#pragma GCC unroll 16
  for (int k = 0; k < kFmaChains; ++k) a[k] = _mm256_set1_ps(1.0f + 0.1f * k);
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kFmaChains; ++k) a[k] = _mm256_fmadd_ps(a[k], m, c);
  }
  __m256 s = a[0];
  for (int k = 1; k < kFmaChains; ++k) s = _mm256_add_ps(s, a[k]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) float chains_avx512(int64_t steps) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a[kFmaChains];
#pragma GCC unroll 16
  for (int k = 0; k < kFmaChains; ++k) a[k] = _mm512_set1_ps(1.0f + 0.1f * k);
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kFmaChains; ++k) a[k] = _mm512_fmadd_ps(a[k], m, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < kFmaChains; ++k) s = _mm512_add_ps(s, a[k]);
  return _mm512_cvtss_f32(s);
}

}  // namespace

std::vector<FmaIsa> fma_isas() {
  __builtin_cpu_init();
  return {
      {"avx2", 8,
       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
      {"avx512", 16, static_cast<bool>(__builtin_cpu_supports("avx512f"))},
  };
}

double run_fma_chains(const std::string& isa, int64_t steps, int threads) {
  int lanes = 0;
  float (*chains)(int64_t) = nullptr;
  if (isa == "avx2") {
    lanes = 8;
    chains = chains_avx2;
  } else if (isa == "avx512") {
    lanes = 16;
    chains = chains_avx512;
  } else {
    throw std::invalid_argument("run_fma_chains: unknown isa " + isa);
  }
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t)
    workers.emplace_back([&] { g_sink.store(chains(steps)); });
  g_sink.store(chains(steps));
  for (std::thread& w : workers) w.join();
  return 2.0 * lanes * kFmaChains * static_cast<double>(steps) * threads;
}

}  // namespace qknorm::bench
