// The BLAS path's masked tiling (issue 18, part 3; attention.cc, BlockTiles):
// under a causal mask the GEMMs run over each query block's visible key
// prefix only, in tiles. These cases span several query blocks and several
// tiles per block, with fully masked leading rows (kv_len < q_len), a wide
// always-visible prefix (kv_len > q_len), key padding that caps the prefix
// inside a block, sdpa and a GQA formulation (the general path). Every field
// is judged by the componentwise verdict against the oracle. The harness
// prefills the outputs with NaN, and the workspace's block, accumulator and
// dq buffers are filled with NaN before the call, so a score, probability,
// output row or gradient row the tiles forget to write, or to zero where a
// later GEMM reads it, cannot pass on the zeros of fresh pages (checked: the
// forward leaving the masked tail of its leaves unzeroed fails
// SquareAcrossBlocks and Sdpa with margins of 1e5 to 1e15). Label full: the
// long-double oracle at n = 1100 takes ~25 s of CPU for the six cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "blas_path/attention.h"
#include "blas_path/tests/test_util.h"
#include "qknorm/formulation.h"

namespace qknorm::blas::testing {
namespace {

template <class T>
void poison(Buffer<T>& b, size_t n) {
  T* p = b.get(n);
  std::fill(p, p + n, std::numeric_limits<T>::quiet_NaN());
}

// A workspace whose buffers hold NaN wherever the call below will look.
template <class T>
void poison_workspace(BlasWorkspace<T>& ws, const AttentionProblem& p) {
  const auto bq =
      static_cast<size_t>(std::min(query_block(p.kv_len, sizeof(T)), p.q_len));
  const auto ld = static_cast<size_t>(block_ld(p.kv_len));
  const auto D = static_cast<size_t>(p.head_dim);
  const auto nq = static_cast<size_t>(p.q_len),
             nk = static_cast<size_t>(p.kv_len);
  Scratch<T>& s = ws.slot(0);
  poison(s.blk0, bq * ld);
  poison(s.blk1, bq * ld);
  poison(s.qh, nq * D);
  poison(s.kh, nk * D);
  poison(s.dkh, nk * D);
  poison(s.dqh, bq * D);
  const auto bh = static_cast<size_t>(p.batch * p.heads),
             bhk = static_cast<size_t>(p.batch * kv_heads_of(p));
  poison(ws.qt, bh * nq * D);
  poison(ws.kt, bhk * nk * D);
  poison(ws.dqt, bh * nq * D);
  poison(ws.dkt, bhk * nk * D);
}

template <class T>
void expect_tiled_case(const AttentionCase& c) {
  const Precision prec =
      std::is_same_v<T, float> ? Precision::kF32 : Precision::kF64;
  SCOPED_TRACE(std::string(name(prec)) + " " + c.describe());
  const AttentionCase rc = validation::round_inputs(c, prec);
  BlasWorkspace<T> ws;
  poison_workspace(ws, rc.problem);
  ExecConfig cfg;
  cfg.threads = 1;  // slot 0 only: the poisoned one
  const Backend& e = entry(prec);
  const validation::AttentionResult r =
      validation::run_attention(e, rc, cfg, &ws);
  const validation::OracleAttention orc = validation::oracle_attention(rc);
  const validation::AgreementReport rep = validation::judge_attention(
      rc, prec, orc, r, nullptr, false, e.name(), "");
  EXPECT_TRUE(rep.pass) << rep.failure_message();
}

AttentionCase make_case(int64_t B, int64_t H, int64_t nq, int64_t nk, int64_t D,
                        Variant variant, uint64_t seed,
                        std::vector<int64_t> key_lengths = {}) {
  AttentionProblem p;
  p.batch = B, p.heads = H, p.q_len = nq, p.kv_len = nk, p.head_dim = D;
  p.variant = variant;
  p.g = 12.32;
  p.mask.causal = true;
  p.mask.key_lengths = std::move(key_lengths);
  return validation::make_attention_case(p, Distribution::kGaussian, seed);
}

void expect_both(const AttentionCase& c) {
  expect_tiled_case<float>(c);
  expect_tiled_case<double>(c);
}

// q_len = kv_len across blocks (f32: 474-row blocks, f64: 237).
TEST(BlasCausalTiles, SquareAcrossBlocks) {
  expect_both(make_case(1, 2, 1100, 1100, 8, Variant::kQKNorm, 1));
}

// kv_len < q_len: the first 399 rows see no key, the block holding the
// first visible row starts with masked rows.
TEST(BlasCausalTiles, LeadingMaskedRows) {
  expect_both(make_case(1, 2, 1000, 600, 8, Variant::kQKNorm, 2));
}

// kv_len > q_len: every row sees a wide prefix.
TEST(BlasCausalTiles, WidePrefix) {
  expect_both(make_case(1, 2, 300, 1100, 8, Variant::kQKNorm, 3));
}

// Padding caps the prefix inside a block (batch 0) and makes most keys
// invisible (batch 1: their dk and dv are exactly 0, checked by the rule).
TEST(BlasCausalTiles, CausalAndPadding) {
  expect_both(make_case(2, 1, 1100, 1100, 8, Variant::kQKNorm, 4, {700, 37}));
}

TEST(BlasCausalTiles, Sdpa) {
  expect_both(make_case(1, 2, 700, 700, 8, Variant::kSDPA, 5));
}

// The general path: qwen3 with GQA (dk, dv sum over the group's heads over
// the tiles of each head).
TEST(BlasCausalTiles, GqaFormulation) {
  AttentionProblem p;
  p.batch = 1, p.heads = 4, p.kv_heads = 2;
  p.q_len = 600, p.kv_len = 600, p.head_dim = 8;
  apply_preset("qwen3", &p);
  p.mask.causal = true;
  expect_both(validation::make_attention_case(p, Distribution::kGaussian, 6));
}

}  // namespace
}  // namespace qknorm::blas::testing
