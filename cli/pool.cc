#include "cli/pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qknorm::cli {

int resolve_jobs(int jobs) {
  if (jobs > 0) return jobs;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void parallel_for(size_t n, int jobs, const std::function<void(size_t)>& fn) {
  const size_t workers = std::min(n, static_cast<size_t>(resolve_jobs(jobs)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;  // guards first_error, error_index
  std::exception_ptr first_error;
  size_t error_index = n;
  auto work = [&] {
    for (size_t i = next++; i < n && !failed; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < error_index) {
          error_index = i;
          first_error = std::current_exception();
        }
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

ExecConfig pooled_exec(ExecConfig exec, int jobs) {
  if (resolve_jobs(jobs) > 1 && exec.threads == 0) exec.threads = 1;
  return exec;
}

}  // namespace qknorm::cli
