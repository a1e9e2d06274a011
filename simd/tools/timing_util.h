// What the local timing drivers share: the entry lookup, their inputs, the
// attention buffers and arguments, and the wall clock.
#ifndef QKNORM_SIMD_TOOLS_TIMING_UTIL_H_
#define QKNORM_SIMD_TOOLS_TIMING_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::simd::tools {

// The entry the driver's first argument names (default simd:AVX2:f32) if it
// runs on this machine; else nullptr, said on stderr.
inline const Backend* EntryArgument(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "simd:AVX2:f32";
  const Backend* b = all_backends().find(name);
  if (b == nullptr || !b->available()) {
    std::fprintf(stderr, "no runnable entry %s\n", name.c_str());
    return nullptr;
  }
  return b;
}

// The drivers' inputs: a 32-bit linear congruential generator (Numerical
// Recipes' constants), 24 bits per value, uniform in [lo, lo + width).
class Lcg {
 public:
  explicit Lcg(uint32_t seed) : s_(seed) {}
  void Fill(std::vector<float>* v, float lo = -0.5f, float width = 1.0f) {
    for (float& x : *v) {
      s_ = s_ * 1664525u + 1013904223u;
      x = lo + width * (static_cast<float>(s_ >> 8) * 0x1p-24f);
    }
  }

 private:
  uint32_t s_;
};

// The f32 tensors of one attention problem, contiguous (q, o, d_o, dq:
// [B, H, q_len, D]; k, v, dk, dv: [B, kv_heads, kv_len, D]), zero until the
// driver fills them, and the forward and backward arguments over them.
struct F32Attention {
  explicit F32Attention(const AttentionProblem& p)
      : lq(contiguous_layout(p.heads, p.q_len, p.head_dim)),
        lk(contiguous_layout(kv_heads_of(p), p.kv_len, p.head_dim)),
        q(Size(p.batch, lq)),
        k(Size(p.batch, lk)),
        v(k.size()),
        o(q.size()),
        d_o(q.size()),
        dq(q.size()),
        dk(k.size()),
        dv(k.size()),
        lse(static_cast<size_t>(p.batch * p.heads * p.q_len)) {}

  ForwardArgs Forward(const NormParams& params = {}) {
    return {In(q, lq),  In(k, lk),  In(v, lk),
            Out(o, lq), lse.data(), static_cast<int64_t>(lse.size()),
            params};
  }
  BackwardArgs Backward(const NormParams& params = {},
                        const NormParamGrads& d_params = {}) {
    return {In(q, lq),
            In(k, lk),
            In(v, lk),
            In(o, lq),
            In(d_o, lq),
            lse.data(),
            static_cast<int64_t>(lse.size()),
            Out(dq, lq),
            Out(dk, lk),
            Out(dv, lk),
            &dg,
            params,
            d_params};
  }

  Layout4 lq, lk;
  std::vector<float> q, k, v, o, d_o, dq, dk, dv;
  std::vector<double> lse;
  double dg = 0;

 private:
  static size_t Size(int64_t batch, const Layout4& l) {
    return static_cast<size_t>(batch * l.batch_stride);
  }
  static ConstTensor4 In(const std::vector<float>& t, const Layout4& l) {
    return {t.data(), static_cast<int64_t>(t.size()), l};
  }
  static MutTensor4 Out(std::vector<float>& t, const Layout4& l) {
    return {t.data(), static_cast<int64_t>(t.size()), l};
  }
};

inline double Seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The fastest of `reps` runs of f, in seconds.
template <class F>
double BestOf(int reps, const F& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Seconds();
    f();
    best = std::min(best, Seconds() - t0);
  }
  return best;
}

}  // namespace qknorm::simd::tools

#endif  // QKNORM_SIMD_TOOLS_TIMING_UTIL_H_
