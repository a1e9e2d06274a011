// A measured FMA peak: independent chains of fused multiply-adds, one
// instruction stream per thread, to anchor "fraction of peak" (issue 8).
//
// Each chain is a = a * m + c with |m| < 1, so values stay normal and finite
// for any number of steps. kChains independent accumulators hide the FMA
// latency (4 cycles on Zen 3 and on Intel since Skylake) across two FMA
// pipes: at least latency x pipes = 8 chains are needed, 12 leave margin
// while fitting in the 16 vector registers AVX2 has.
#ifndef QKNORM_BENCH_FMA_PEAK_H_
#define QKNORM_BENCH_FMA_PEAK_H_

#include <cstdint>
#include <string>
#include <vector>

namespace qknorm::bench {

inline constexpr int kFmaChains = 12;

struct FmaIsa {
  std::string name;  // "avx2" (256-bit FMA3), "avx512" (512-bit)
  int lanes_f32;     // 8 or 16
  bool supported;    // the CPU (as the process sees it) has it
};

// The ISAs this binary can measure, widest last.
std::vector<FmaIsa> fma_isas();

// Runs `steps` steps of every chain on `threads` threads at once (each its
// own chains) and returns the fp32 FLOPs done in total: 2 per lane per FMA.
double run_fma_chains(const std::string& isa, int64_t steps, int threads);

}  // namespace qknorm::bench

#endif  // QKNORM_BENCH_FMA_PEAK_H_
