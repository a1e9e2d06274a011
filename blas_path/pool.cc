#include "blas_path/pool.h"

namespace qknorm::blas {

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::drain(int slot) {
  for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;)
    fn_(ctx_, i, slot);
}

void WorkerPool::run(int threads, int64_t n, Fn fn, void* ctx) {
  const int want = std::min<int64_t>(threads, n) - 1;  // workers needed
  if (want <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (static_cast<int>(workers_.size()) < want) {
      const int slot = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back(&WorkerPool::worker_loop, this, slot, generation_);
    }
    fn_ = fn, ctx_ = ctx, n_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_ = want, running_ = want;
    ++generation_;
  }
  start_cv_.notify_all();
  drain(0);
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return running_ == 0; });
}

void WorkerPool::worker_loop(int slot, uint64_t seen) {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (slot > active_) continue;
    }
    drain(slot);
    std::lock_guard<std::mutex> lk(mu_);
    if (--running_ == 0) done_cv_.notify_one();
  }
}

}  // namespace qknorm::blas
