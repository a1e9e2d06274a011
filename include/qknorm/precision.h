// Storage precisions and exact, round-to-nearest-even scalar conversions.
//
// Highway 1.0.3's scalar BF16FromF32 and its vector DemoteTo to bf16 truncate,
// and its f16 emulation on SSSE3/SSE4 truncates and mishandles Inf/NaN (see
// shared/NUMERICS.md). These conversions are ours: IEEE 754 round to nearest,
// ties to even, overflow to +-Inf, gradual underflow to subnormals, NaN kept
// NaN (quiet, sign preserved). They are used at harness boundaries (encoding
// test inputs, decoding outputs) and by the reference; SIMD kernels carry their
// own vector conversions.
#ifndef QKNORM_PRECISION_H_
#define QKNORM_PRECISION_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qknorm {

// Element storage format of every tensor an entry reads or writes.
// kF64/kF32 compute in their own format; kBF16/kF16 store 16-bit values and
// compute and accumulate in f32 (the "storage mode" of the SIMD issue).
enum class Precision { kF64, kF32, kBF16, kF16 };

inline constexpr Precision kAllPrecisions[] = {
    Precision::kF64, Precision::kF32, Precision::kBF16, Precision::kF16};

std::string_view name(Precision p);  // "f64", "f32", "bf16", "f16"
// Parses a name(); returns false if unknown.
bool parse_precision(std::string_view s, Precision* out);
size_t element_bytes(Precision p);  // 8, 4, 2, 2
// Unit roundoff u = 2^-p of the storage format (p = significand bits incl.
// the implicit one): f64 2^-53, f32 2^-24, bf16 2^-8, f16 2^-11.
double unit_roundoff(Precision p);
// The format the mode computes in: f64 for kF64, f32 for the others (the
// 16-bit modes store in 16 bits and compute in f32). The one definition of
// that choice: every entry, bound and check that needs it calls this.
Precision compute_format(Precision p);
// Unit roundoff of the arithmetic the mode computes in:
// unit_roundoff(compute_format(p)).
double compute_roundoff(Precision p);
// Largest finite and smallest positive normal value of the storage format.
double max_finite(Precision p);
double min_normal(Precision p);
// Spacing of the storage format at |x| (its ulp), including the subnormal
// range; ulp(0) is the smallest subnormal. x must be finite.
double ulp(Precision p, double x);

uint16_t bf16_from_f32(float x);
float f32_from_bf16(uint16_t h);
uint16_t f16_from_f32(float x);
float f32_from_f16(uint16_t h);

// Rounds x to the nearest value representable in p (ties to even) and returns
// it as a double. For bf16/f16 the rounding is done directly from double (no
// double rounding through f32).
double round_to(Precision p, double x);

// Encodes/decodes one element of a storage buffer. encode rounds as round_to.
void encode(Precision p, double x, void* dst, size_t index);
double decode(Precision p, const void* src, size_t index);

}  // namespace qknorm

#endif  // QKNORM_PRECISION_H_
