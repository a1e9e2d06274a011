// A small persistent worker pool for the BLAS path (internal).
//
// Why the path threads itself instead of letting OpenBLAS do it: measured on
// this machine (OpenBLAS 0.3.21, SkylakeX kernels), cblas_sgemm with 2
// threads does not give the same bits as with 1 thread for the attention
// shapes (tests/quick/attention_test.cc, the threads test failed before this
// change), while ExecConfig requires results bitwise identical for every
// thread count. So every GEMM runs single-threaded in OpenBLAS, and the pool
// runs whole (batch, head) items in parallel: an item's arithmetic does not
// depend on which thread runs it, and cross-item sums (dg) are added in item
// order afterwards. The row kernels parallelize with the GEMMs for free.
//
// No allocation after warm-up: worker threads are created on the first call
// that needs them and then parked on a condition variable; the job is a plain
// function pointer + context (no std::function).
#ifndef QKNORM_BLAS_PATH_POOL_H_
#define QKNORM_BLAS_PATH_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace qknorm::blas {

class WorkerPool {
 public:
  using Fn = void (*)(void* ctx, int64_t item, int slot);
  WorkerPool() = default;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  // Calls fn(ctx, item, slot) once for every item in [0, n), on `threads`
  // threads (slot 0 is the caller, slots 1..threads-1 are workers); returns
  // when all are done. fn must not throw. Items are handed out dynamically.
  void run(int threads, int64_t n, Fn fn, void* ctx);

  template <class F>
  void run(int threads, int64_t n, F& f) {
    run(
        threads, n,
        [](void* c, int64_t i, int s) { (*static_cast<F*>(c))(i, s); }, &f);
  }

 private:
  void worker_loop(int slot, uint64_t seen);
  void drain(int slot);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;
  int active_ = 0;   // workers taking part in the current generation
  int running_ = 0;  // of those, not finished yet
  bool stop_ = false;
  std::atomic<int64_t> next_{0};
  int64_t n_ = 0;
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace qknorm::blas

#endif  // QKNORM_BLAS_PATH_POOL_H_
