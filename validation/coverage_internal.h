// coverage.cc's tables, shared with coverage_array.cc (not an API).
#ifndef QKNORM_VALIDATION_COVERAGE_INTERNAL_H_
#define QKNORM_VALIDATION_COVERAGE_INTERNAL_H_

#include <bitset>
#include <cstdint>
#include <utility>
#include <vector>

#include "validation/coverage.h"

namespace qknorm::validation::coverage {

// Cells of one model, at most (the model with 48 declared blocks).
inline constexpr int kMaxCells = 448;
using Bits = std::bitset<kMaxCells>;

struct Model::Impl {
  // Cell indices (-1: none).
  std::vector<std::pair<int64_t, int>> head_dim;  // (value, cell)
  int hd_one = -1, hd_odd = -1;
  int b_one = -1, b_two = -1, b_many = -1;
  int64_t many_from = 3;  // batch >= this reaches b_many
  int h_mha = -1, h_r2 = -1, h_r3_7 = -1, h_r4 = -1, h_r8 = -1, h_mqa = -1;
  struct Residue {
    int64_t b, r;
    int q, kv;  // cells "r mod b" of q_len and kv_len
  };
  std::vector<Residue> residues;
  int q_one = -1, q_small = -1, kv_long = -1;
  int m_none = -1, m_lt = -1, m_gt = -1, m_eq = -1, m_pad0 = -1, m_pad1 = -1,
      m_padall = -1, m_rows = -1, m_run = -1;

  // (q_len, kv_len, mask) choices of the candidates that realize a problem,
  // cheapest first, with the q_len, kv_len and mask cells they reach at
  // batch 1 and at batch >= 2 (padding: element 1 pads nothing).
  struct Triple {
    int64_t q, kv;
    MaskKind mask;
    Bits bits1, bits2;
    unsigned needs;
  };
  std::vector<Triple> triples;

  Bits single_ok;             // feasible singles
  std::vector<Bits> pair_ok;  // feasible pairs, symmetric
  std::vector<std::pair<int, int>> feasible, infeasible;

  // The cells of each dimension's value.
  Bits head_dim_bits(int64_t d) const;
  Bits batch_bits(int64_t b) const;
  Bits heads_bits(int64_t h, int64_t kv) const;
  Bits length_bits(int64_t len, bool kv) const;
  Bits mask_bits(const AttentionProblem& p) const;
  Bits bits(const AttentionProblem& p) const;
};

// The needs of a dimension's candidate.
inline unsigned heads_needs(int64_t h, int64_t kv) {
  return h == kv ? kNeedNothing : kNeedGqa;
}
inline unsigned mask_needs(MaskKind k) {
  return k == MaskKind::kNone ? kNeedNothing : kNeedMask;
}

}  // namespace qknorm::validation::coverage

#endif  // QKNORM_VALIDATION_COVERAGE_INTERNAL_H_
