// The sampled oracle's internal pieces, shared by its files: the plan
// (sampled_plan.cc), the pass in double (sampled_pass.cc) and the sub-case
// oracle (sampled.cc). Internal to the validation library.
#ifndef QKNORM_VALIDATION_SAMPLED_INTERNAL_H_
#define QKNORM_VALIDATION_SAMPLED_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "validation/case.h"
#include "validation/oracle.h"
#include "validation/rng.h"
#include "validation/sampled.h"

namespace qknorm::validation {

// The calling thread's CPU time in seconds (sampled.cc).
double thread_cpu_seconds();

// The first query row of batch b that sees key j (q_len: none does).
int64_t first_query(const AttentionProblem& p, int64_t b, int64_t j);

// The sample of query and key rows of case c (SampledOracle::query_rows,
// key_rows; validation/sampled.h), drawn from rng.
void plan_rows(const AttentionCase& c, const SampleOptions& opt, Rng& rng,
               SampledOracle* so);

// The pass: every query row's lse, delta, Del and sum |dS| / P in double,
// and dg with its channels, over the visible pairs.
struct Pass {
  GivenRows rows;      // [B, H, Nq]
  OracleAttention dg;  // dg and its channels only
  double logit_shift = 0;
  double flops = 0;
  double block_cpu_seconds = 0;  // the blocks' CPU time, every thread's
};

// p_del_i = sum_j |dO_i|.|v_j| over row i's visible keys, every query row
// [B, H, Nq] (sampled_pass.cc).
std::vector<long double> row_p_del(const AttentionCase& c);
// The pass over case c with the logit amplitude A, on `threads` threads.
// dot_units: the case's cosine_units (rule_terms.h).
Pass run_pass(const AttentionCase& c, double A, double dot_units,
              const std::vector<long double>& p_del, int threads);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_SAMPLED_INTERNAL_H_
