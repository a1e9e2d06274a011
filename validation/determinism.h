// Determinism and races (issue 35, item 4): an entry runs N times at each
// of several thread counts (ExecConfig::threads) on one case; the runs are
// compared bitwise with each other and each run is judged by the verdict.
//
// Two field bugs a single clean run cannot show: a read-after-write race
// inside a fused kernel (a fraction of a percent of the elements wrong,
// different from run to run: pytorch/helion #3080, vLLM #48872) and a
// reduction whose order follows the thread count. ExecConfig asks every
// entry for bitwise identical results from run to run and for every thread
// count (Backend::deterministic(), true by default); an entry that declares
// otherwise (atomics in a reduction) is held to the verdict on every run and
// its run-to-run spread is reported beside the bound.
//
// The verdict of one (entry, case):
// - every run passes the componentwise verdict (judge_attention), or FAIL
//   naming the first failing run (its index and thread count);
// - a deterministic entry: every run bitwise equal to the first (run 1 at
//   the first thread count), or FAIL naming the first difference (run,
//   thread count, field, element, both values) and the likely cause:
//     runs at one thread count > 1 differ from each other, runs at 1 thread
//       agree: a data race between the entry's threads;
//     runs at 1 thread differ: state carried between calls (a stale
//       workspace, uninitialized memory);
//     each thread count repeats itself, two counts differ: the reduction
//       order follows the thread count.
// The spread: over every run and element, |x - x_first| / bound_e (the
// element's bound in the verdict's table, element_bound): how much of the
// bound the run-to-run differences use. NaN and inf compare by their bits.
#ifndef QKNORM_VALIDATION_DETERMINISM_H_
#define QKNORM_VALIDATION_DETERMINISM_H_

#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/case.h"
#include "validation/oracle.h"

namespace qknorm::validation {

// The runs: `runs` at each of `thread_counts`, in that order (run 1 at the
// first count is the reference the others are compared with).
struct DeterminismPlan {
  int runs = 3;
  std::vector<int> thread_counts = {1, 2};
};

struct DeterminismReport {
  std::string entry, case_desc;
  bool declared_deterministic = true;
  int runs_done = 0;
  // Every run bitwise equal to the first.
  bool identical = true;
  // Where runs differ: two runs at one thread count (per count), runs at
  // different counts.
  bool differs_within_one_thread = false, differs_within_threads = false,
       differs_across_counts = false;
  // The first run that differs from the first: "run 2 at 2 threads: dk 37
  // of 4608 elements differ from run 1 at 1 thread; first dk[0,1,3,5]:
  // 0.123 vs 0.124". "" when identical.
  std::string first_difference;
  // The fields that differ in some run ("dk", "dk, dv").
  std::string differing_fields;
  // max |x - x_first| / bound_e over runs and elements; the field and
  // element where.
  double spread = 0;
  std::string spread_where;
  // Runs whose verdict FAILs, and the first one's failure message.
  int runs_failed = 0;
  std::string run_failure;
  // "a data race between the entry's threads (...)"; "" when the runs
  // agree.
  std::string cause;
  bool pass = true;
};

// Runs `entry` plan.runs times at each thread count on round_inputs(c,
// entry precision) (forward and backward; forward only where the entry is)
// and judges as above; `oracle` is that rounded case's (oracle_attention).
// Throws qknorm::Error as run_attention does.
DeterminismReport check_determinism(const Backend& entry,
                                    const AttentionCase& rounded,
                                    const OracleAttention& oracle,
                                    const DeterminismPlan& plan = {});

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_DETERMINISM_H_
