#include "simd/thread_pool.h"

namespace qknorm::simd {

ThreadPool::ThreadPool(int threads) : threads_(threads < 1 ? 1 : threads) {
  workers_.reserve(static_cast<size_t>(threads_ - 1));
  for (int w = 1; w < threads_; ++w)
    workers_.emplace_back([this, w] { WorkerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Drain(int worker) {
  for (;;) {
    const int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    fn_(ctx_, task, worker);
  }
}

void ThreadPool::RunImpl(int64_t num_tasks, Trampoline fn, const void* ctx) {
  if (num_tasks <= 0) return;
  if (threads_ == 1 || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_ = threads_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  Drain(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return busy_ == 0; });
}

void ThreadPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain(worker);
    std::lock_guard<std::mutex> lock(mu_);
    if (--busy_ == 0) done_cv_.notify_one();
  }
}

}  // namespace qknorm::simd
