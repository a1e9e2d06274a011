// The vector RNE conversions of every compiled target (kernels.h table; the
// same code the kernels run) against the scalar reference conversions of
// include/qknorm/precision.h, bitwise:
// - 16-bit -> f32: all 65536 patterns;
// - f32 -> 16-bit: special values, every pattern in windows around each
//   rounding boundary (ties, overflow, subnormal thresholds), and a strided
//   sweep over all 2^32 patterns.
// Odd array lengths exercise the tail path (stack buffer) as well.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "qknorm/precision.h"
#include "simd/kernels.h"

namespace qknorm::simd::testing {
namespace {

// The f32 bit patterns to test (see file comment).
std::vector<float> F32Patterns() {
  std::vector<uint32_t> bits;
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::signaling_NaN(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            65504.0f,
                            65520.0f,
                            65536.0f,
                            0x1p-14f,
                            0x1p-24f,
                            0x1p-25f,
                            0x1.8p-25f,
                            3.3895314e38f};
  for (float f : specials) bits.push_back(std::bit_cast<uint32_t>(f));
  // Windows of +-4096 patterns around boundaries, both signs.
  const uint32_t centers[] = {
      0x00000000u, 0x00800000u,  // f32 subnormal / normal edge
      0x33000000u, 0x33800000u,  // 2^-25, 2^-24: f16 smallest subnormal tie
      0x38800000u, 0x387fe000u,  // 2^-14: f16 subnormal / normal edge
      0x477fe000u, 0x477ff000u, 0x47800000u,  // 65504, 65520, 65536
      0x3f800000u, 0x3f808000u,               // 1 and a bf16 tie above it
      0x7f7f8000u, 0x7f7fffffu,               // bf16 overflow to Inf
      0x7f800000u, 0x7fc00000u};              // Inf, NaN
  for (uint32_t c : centers)
    for (uint32_t d = 0; d < 8192; ++d)
      for (uint32_t sign : {0u, 0x80000000u})
        bits.push_back(((c - 4096u) + d) ^ sign);
  // Strided sweep: an odd stride visits patterns of every exponent.
  for (uint64_t u = 0; u < (1ull << 32); u += 4099)
    bits.push_back(static_cast<uint32_t>(u));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = std::bit_cast<float>(bits[i]);
  // Odd length: the vector tail path runs too.
  if (out.size() % 2 == 0) out.push_back(1.5f);
  return out;
}

class SimdConvert : public ::testing::TestWithParam<CompiledTarget> {
 protected:
  void SetUp() override {
    if ((hwy::SupportedTargets() & GetParam().bit) == 0)
      GTEST_SKIP() << GetParam().name << " not supported by this CPU";
  }
};

TEST_P(SimdConvert, ToF32AllPatterns) {
  const TargetKernels& k = GetParam().kernels;
  std::vector<uint16_t> in(65536 + 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> bf(in.size()), hf(in.size());
  k.f32_from_bf16(in.data(), bf.data(), in.size());
  k.f32_from_f16(in.data(), hf.data(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 10; ++i) {
    const uint32_t want_b = std::bit_cast<uint32_t>(f32_from_bf16(in[i])),
                   got_b = std::bit_cast<uint32_t>(bf[i]);
    const uint32_t want_h = std::bit_cast<uint32_t>(f32_from_f16(in[i])),
                   got_h = std::bit_cast<uint32_t>(hf[i]);
    if (want_b != got_b) {
      ADD_FAILURE() << GetParam().name << " bf16 0x" << std::hex << in[i]
                    << " -> 0x" << got_b << ", expected 0x" << want_b;
      ++bad;
    }
    if (want_h != got_h) {
      ADD_FAILURE() << GetParam().name << " f16 0x" << std::hex << in[i]
                    << " -> 0x" << got_h << ", expected 0x" << want_h;
      ++bad;
    }
  }
}

TEST_P(SimdConvert, FromF32MatchesScalarRne) {
  const TargetKernels& k = GetParam().kernels;
  const std::vector<float> in = F32Patterns();
  std::vector<uint16_t> bf(in.size()), hf(in.size());
  k.bf16_from_f32(in.data(), bf.data(), in.size());
  k.f16_from_f32(in.data(), hf.data(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 10; ++i) {
    const uint16_t want_b = bf16_from_f32(in[i]), want_h = f16_from_f32(in[i]);
    if (bf[i] != want_b) {
      ADD_FAILURE() << GetParam().name << " bf16_from_f32(bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(in[i]) << ") = 0x" << bf[i]
                    << ", expected 0x" << want_b;
      ++bad;
    }
    if (hf[i] != want_h) {
      ADD_FAILURE() << GetParam().name << " f16_from_f32(bits 0x" << std::hex
                    << std::bit_cast<uint32_t>(in[i]) << ") = 0x" << hf[i]
                    << ", expected 0x" << want_h;
      ++bad;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Targets, SimdConvert, ::testing::ValuesIn(compiled_targets()),
    [](const ::testing::TestParamInfo<CompiledTarget>& info) {
      return std::string(info.param.name);
    });

}  // namespace
}  // namespace qknorm::simd::testing
