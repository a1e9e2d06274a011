// A small persistent worker pool for the BLAS path (internal).
//
// Why the path threads itself instead of letting OpenBLAS do it: ExecConfig
// requires results bitwise identical for every thread count, and OpenBLAS
// 0.3.21 does not give that. Measured on this machine (SkylakeX kernels,
// 1 vs 2 threads, same inputs): cblas_dgemm with M = 300, N = 280, K = 64
// (a Q K^T of the tests) differs in 930 of 84000 elements, by up to 1.8e-13
// relative (elements that cancel; the differences are a few roundoffs of the
// dot products' terms); N = 100 and 137 and the NN shape likewise, while
// cblas_sgemm gave identical bits on every shape tried (12 shapes up to
// 2048 x 64 x 2048), which OpenBLAS does not promise either. With OpenBLAS
// threading the blas entries' threads test (tests/quick/attention_test.cc)
// fails. So every GEMM runs single-threaded in OpenBLAS, and the pool runs
// whole (batch, head) items in parallel: an item's arithmetic does not
// depend on which thread runs it, and cross-item sums (dg) are added in item
// order afterwards. The row kernels parallelize with the GEMMs for free.
// Cost: B H = 1 runs on one thread.
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
