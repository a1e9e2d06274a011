// Shared helpers of the SIMD kernel tests: the simd entries this CPU can run,
// and GoogleTest parameter names that end in the target ("F32_AVX2"), so
// --gtest_filter='*_SSE4' selects one target.
#ifndef QKNORM_SIMD_TESTS_TEST_UTIL_H_
#define QKNORM_SIMD_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "qknorm/precision.h"
#include "validation/run.h"

namespace qknorm::simd::testing {

// Every simd:* entry of the registry whose target this CPU supports.
inline std::vector<const Backend*> RunnableEntries() {
  std::vector<const Backend*> r;
  for (const Backend* b : all_backends().match("simd:*"))
    if (b->available()) r.push_back(b);
  return r;
}

inline std::string EntryParamName(
    const ::testing::TestParamInfo<const Backend*>& info) {
  std::string prec(name(info.param->precision()));
  for (char& c : prec)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return prec + "_" + info.param->target();
}

inline bool SameBits(const std::vector<double>& a,
                     const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Every output of two runs, bit for bit (the parameter gradients too).
inline void ExpectSame(const validation::AttentionResult& a,
                       const validation::AttentionResult& b,
                       const std::string& what) {
  EXPECT_TRUE(SameBits(a.o, b.o)) << what << ": o differs";
  EXPECT_TRUE(SameBits(a.lse, b.lse)) << what << ": lse differs";
  EXPECT_TRUE(SameBits(a.dq, b.dq)) << what << ": dq differs";
  EXPECT_TRUE(SameBits(a.dk, b.dk)) << what << ": dk differs";
  EXPECT_TRUE(SameBits(a.dv, b.dv)) << what << ": dv differs";
  EXPECT_EQ(std::memcmp(&a.dg, &b.dg, sizeof(double)), 0)
      << what << ": dg differs";
  EXPECT_TRUE(SameBits(a.dq_weight, b.dq_weight)) << what << ": dq_weight";
  EXPECT_TRUE(SameBits(a.dk_weight, b.dk_weight)) << what << ": dk_weight";
  EXPECT_TRUE(SameBits(a.dq_bias, b.dq_bias)) << what << ": dq_bias";
  EXPECT_TRUE(SameBits(a.dk_bias, b.dk_bias)) << what << ": dk_bias";
}

// The probabilities `entry`'s hook reports for case c (inputs in its
// storage; empty if the entry has no hook); with `ws` and `lse_out`, in that
// workspace and with the forward's lse.
inline std::vector<double> Probabilities(
    const Backend& entry, const validation::AttentionCase& c,
    Workspace* ws = nullptr, std::vector<double>* lse_out = nullptr) {
  const AttentionProblem& p = c.problem;
  const Precision prec = entry.precision();
  auto encode_all = [&](const std::vector<double>& x) {
    std::vector<unsigned char> buf(x.size() * element_bytes(prec));
    for (size_t i = 0; i < x.size(); ++i) encode(prec, x[i], buf.data(), i);
    return buf;
  };
  auto q = encode_all(c.q), k = encode_all(c.k), v = encode_all(c.v);
  std::vector<unsigned char> o(q.size());
  std::vector<double> lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
  const Layout4 lq = contiguous_layout(p.heads, p.q_len, p.head_dim);
  const Layout4 lk = contiguous_layout(kv_heads_of(p), p.kv_len, p.head_dim);
  auto ref = [](const std::vector<double>& w) {
    return ParamRef{w.data(), static_cast<int64_t>(w.size())};
  };
  const int64_t nq = static_cast<int64_t>(c.q.size()),
                nk = static_cast<int64_t>(c.k.size());
  ForwardArgs fa{
      {q.data(), nq, lq},
      {k.data(), nk, lk},
      {v.data(), nk, lk},
      {o.data(), nq, lq},
      lse.data(),
      static_cast<int64_t>(lse.size()),
      {ref(c.q_weight), ref(c.k_weight), ref(c.q_bias), ref(c.k_bias)}};
  std::vector<double> probs(
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len), -1);
  if (!entry.attention_probabilities(p, fa, probs.data(), ws)) probs.clear();
  if (lse_out != nullptr) *lse_out = lse;
  return probs;
}

}  // namespace qknorm::simd::testing

#endif  // QKNORM_SIMD_TESTS_TEST_UTIL_H_
