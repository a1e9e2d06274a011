// The sampled oracle (issue 19): the componentwise verdict on problems too
// long for the full long-double oracle (O(B H Nq Nk D) in x87 extended).
//
// Every entry still computes the whole problem. The oracle computes a sample
// of rows exactly, in long double, with every channel of the rule:
//   - query rows (b, h, i): O_i, lse_i, dQ_i. Row i reads only q_i, the keys
//     it sees (a prefix: causal and padding masks both cut the key range) and
//     its own dO_i, so it is exactly a one-row problem over those keys (the
//     sub-case: B = 1, q_len = 1, kv_len = the visible count, the row's head
//     and its kv head; every head of the token when the norm spans heads).
//     oracle_attention() on it gives the row's values and channels;
//   - key rows (b, hk, j): dK_j, dV_j. They read P_ij and dS_ij of every
//     query row i that sees key j, and those need the whole row's lse_i and
//     delta_i = dO_i . O_i. One pass over the whole problem in double (the
//     pass, O(B H Nq Nk D): two D-term dots and a D-term axpy per visible
//     pair, both cores)
//     gives lse_i, delta_i and the magnitudes Del_i, sum_k P_ik |dP_ik -
//     delta_i| of every row (GivenRows); the key row's sub-case (the queries
//     that see it, one key) runs the oracle with those given;
//   - dg (a sum over every pair) and its channels come from the pass.
// Its error per f64 unit roundoff (GivenRows::units, derived at
// pass_units() in rule_terms.cc) joins the bounds of dK, dV and dg: invisible
// in f32, bf16, f16 (2^-29 below their u_c), about +15% on f64 entries.
// Each sampled row's tables are the full verdict's (the rule's counts and
// logit amplitude are the whole case's: OracleAttention::count_*,
// amplitude), so a sampled row passes or fails exactly as in the full
// verdict, bar the pass's channel.
//
// The sample (seeded; SampledOracle::describe prints it): the first and last
// rows, the rows on both sides of every tile boundary k * block of every
// block size (the entries' declared ones plus 16, 32, 64, 128 and 256),
// always including the first two and the last full block's and the last
// partial block's first row, the rest at random when there are more than
// half the budget; fully masked query rows and keys no query sees; rows
// that are exactly zero; then random rows up to `rows` of each kind.
//
// Everything else is judged by properties that cost O(n D) (judge_sampled):
// every value finite; a fully masked row's O = 0, lse = -inf, dQ = 0
// exactly; lse_i within the non-saturation bound log(n_i) +- A (every logit
// lies in [-A, A]); O_id within the range of the visible v_jd (O is a convex
// combination), each with the rule's own slack.
//
// Not judged in sampled mode: the formulations' parameter gradients
// (dq_weight, ...), which sum every row (finiteness only).
//
// Cost: O(s Nk D) long-double work for s sampled query rows, O(s Nq D) for
// s key rows, plus the pass's 6 B H Nq Nk D flops in double (causal: the
// visible pairs only).
#ifndef QKNORM_VALIDATION_SAMPLED_H_
#define QKNORM_VALIDATION_SAMPLED_H_

#include <cstdint>
#include <string>
#include <vector>

#include "validation/judge.h"

namespace qknorm::validation {

struct SampleOptions {
  int64_t rows = 256;  // query rows and key rows (each), at least
  uint64_t seed = 1;
  // Tile sizes whose boundary rows are sampled, besides 16 ... 256.
  std::vector<int64_t> blocks;
  int threads = 2;  // the pass
  // The judged entry's compute contract: the sampled elements' tables are
  // the rule's for it (qknorm/contract.h; rule.h).
  ComputeContract contract;
};

struct SampledRow {
  int64_t b = 0, h = 0, n = 0;  // h: the q head (query rows), kv head (keys)
  const char* why = "random";   // "first", "last", "tile boundary", ...
};

struct SampledOracle {
  SampleOptions options;
  Precision storage = Precision::kF64;
  std::vector<SampledRow> query_rows, key_rows;
  // The gathered tables (o, lse, dq of the query rows; dk, dv of the key
  // rows; dg): ToleranceTable::index_of maps each element to the whole
  // tensor.
  std::vector<ToleranceTable> tables;
  // For the O(n D) properties: the logit amplitude A and the slack of the
  // lse range per row, uc * lse_units + lse_abs (the rule's lse bound).
  double amplitude = 0, lse_units = 0, lse_abs = 0;
  double given_units = 0;  // the pass's error channel (GivenRows::units)
  double pass_seconds = 0, rows_seconds = 0;
  // The sampled rows' CPU time, summed over their threads: unlike the wall
  // time it does not grow with other processes' share of the cores.
  double rows_cpu_seconds = 0;
  double pass_flops = 0;  // 6 D per visible (query, key) pair and head
  // "sample seed 7: 262 query rows (first/last 8, tile boundary 38, fully
  // masked 2, zero 3, random 211), 259 key rows (...); pass 1.2e12 flops in
  // 41 s, rows in 12 s"
  std::string describe() const;
};

// The sampled oracle of case `c` (inputs already rounded to storage `s`).
SampledOracle sampled_oracle(const AttentionCase& c, Precision s,
                             const SampleOptions& opt);

// The verdict on an entry's whole result: the sampled elements by the rule,
// the rest by the O(n D) properties (fields named "o[all rows]" etc.).
AgreementReport judge_sampled(const AttentionCase& c, const SampledOracle& so,
                              const AttentionResult& entry,
                              const std::string& entry_name);

// What the sampled oracle's pass costs on case c with `threads` threads
// (the cost estimate's calibration, cli/cost.h): the CPU seconds of its
// O(n D) preparation (one thread) and of its O(n^2 D) blocks (every thread's).
struct PassCost {
  double prep_cpu_seconds = 0, block_cpu_seconds = 0;
};
PassCost pass_cost(const AttentionCase& c, int threads);

// The number of visible keys of query row i of batch b (a prefix [0, n)
// without a window, which the sampled pass requires; with one, the size of
// the interval: what cli/cost.cc counts).
int64_t visible_keys(const AttentionProblem& p, int64_t b, int64_t i);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_SAMPLED_H_
