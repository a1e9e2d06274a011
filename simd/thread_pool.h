// A small fork-join thread pool for the SIMD kernels.
//
// Run(n, f) calls f(task, worker) once for every task in [0, n) and returns
// when all have finished. The caller is worker 0; workers 1..threads-1 are
// persistent std::threads. Tasks are handed out dynamically (an atomic
// counter), so WHICH worker runs a task varies between runs: callers get
// bitwise-reproducible results by making every task's output depend only on
// the task index (disjoint outputs, per-task partial sums reduced in task
// order afterwards), never on the worker index (which may only select
// scratch memory).
#ifndef QKNORM_SIMD_THREAD_POOL_H_
#define QKNORM_SIMD_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace qknorm::simd {

class ThreadPool {
 public:
  // threads >= 1 (values < 1 are treated as 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // f must be callable as f(int64_t task, int worker). Not reentrant: f must
  // not call Run on the same pool.
  template <class F>
  void Run(int64_t num_tasks, const F& f) {
    RunImpl(
        num_tasks,
        [](const void* ctx, int64_t task, int worker) {
          (*static_cast<const F*>(ctx))(task, worker);
        },
        &f);
  }

 private:
  using Trampoline = void (*)(const void* ctx, int64_t task, int worker);
  void RunImpl(int64_t num_tasks, Trampoline fn, const void* ctx);
  void Drain(int worker);
  void WorkerLoop(int worker);

  const int threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  int busy_ = 0;             // workers still inside the current job
  bool stop_ = false;
  Trampoline fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace qknorm::simd

#endif  // QKNORM_SIMD_THREAD_POOL_H_
