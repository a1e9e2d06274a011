// The worker pool of qknorm-check's loops (issue 32): the sweeps, power and
// the tile sweep run their independent steps on `jobs` workers. Each step
// writes only its own slot of a result array, so what the caller assembles
// afterwards, in index order, does not depend on the job count.
#ifndef QKNORM_CLI_POOL_H_
#define QKNORM_CLI_POOL_H_

#include <cstddef>
#include <functional>

#include "qknorm/backend.h"

namespace qknorm::cli {

// `jobs` resolved: > 0 as given, 0: one per core.
int resolve_jobs(int jobs);

// Calls fn(i) for every i in [0, n) on min(jobs, n) workers (the calling
// thread is one of them), taking indices in increasing order; jobs <= 1:
// serially, in order. If calls throw, the remaining indices are not started
// and the exception of the smallest index that threw is rethrown.
void parallel_for(size_t n, int jobs, const std::function<void(size_t)>& fn);

// The ExecConfig of entries that run on a pool of `jobs` workers: one thread
// per call when jobs > 1 and exec.threads is 0 (every core), since the pool
// keeps the cores busy and OpenBLAS's thread count is global to the
// process; `exec` as given otherwise. (ExecConfig promises the same bits at
// any thread count.)
ExecConfig pooled_exec(ExecConfig exec, int jobs);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_POOL_H_
