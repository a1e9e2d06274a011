// Scratch memory and threads of the SIMD entries. One SimdWorkspace serves
// every simd entry (any target, any precision); it only grows, so after the
// first call of a given shape and thread count no call allocates.
#ifndef QKNORM_SIMD_WORKSPACE_H_
#define QKNORM_SIMD_WORKSPACE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "qknorm/backend.h"
#include "simd/thread_pool.h"

namespace qknorm::simd {

// Grow-only, 64-byte-aligned (hwy::AllocateAligned) array of T. Contents are
// NOT preserved or initialized by Get().
template <class T>
class GrowBuffer {
 public:
  T* Get(size_t n) {
    if (n == 0) n = 1;
    if (n > capacity_) {
      data_ = hwy::AllocateAligned<T>(n);
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<T[]> data_;
  size_t capacity_ = 0;
};

// Per-row record of the unit normalization x -> u = x / max(||x||, eps):
// ||x|| in double (exact enough that every u element is a single f32
// rounding of x / ||x||); clamped: ||x|| <= eps, u = x / eps.
struct NormInfo {
  double norm = 0;
  int32_t clamped = 1;
};

// Per-row record of a generic normalization row (formulations, issue 16;
// formulation-inl.h): x_hat = (x - mu) * inv, all in f64; clamped: an l2 row
// with ||x|| <= eps (its backward is du * inv).
struct RowStat {
  double mu = 0, inv = 1;
  int32_t clamped = 0;
};

class SimdWorkspace final : public Workspace {
 public:
  // Returns a pool with exactly `threads` threads (recreated on change).
  ThreadPool& pool(int threads) {
    if (!pool_ || pool_->threads() != threads)
      pool_ = std::make_unique<ThreadPool>(threads);
    return *pool_;
  }
  // The thread count of the pool held, 0 before the first call.
  int pool_threads() const { return pool_ ? pool_->threads() : 0; }

  // Forces the online softmax: attention_forward sets it from its
  // ExecConfig::online_softmax on every call; attention_probabilities (whose
  // interface has no ExecConfig) leaves it as it is, so that a caller holding
  // the workspace chooses the path the hook reports (fixed_shift_test.cc
  // sets it). Either path is a correct forward.
  bool online_softmax = false;

  // Operand buffers (f32, rows padded to a multiple of the vector length).
  GrowBuffer<float> qh, kh, kt, v, vt, d_o, row_stats, dq_partial, scratch;
  GrowBuffer<NormInfo> q_info, k_info;
  // Per batch and query row: the end, then the start, of its visible keys.
  GrowBuffer<int64_t> limits;
  // Per (batch, kv head) and key j, for the fixed-shift softmax
  // (attention-inl.h, "Bounded logits"): over the keys [0, j], the largest
  // ||k_tilde|| and the largest shift their v allow.
  // With a window (key intervals): per key its own norm and min nonzero
  // |v| instead, and per thread a queue of key indices (RangeExtremes).
  GrowBuffer<double> k_norm;
  GrowBuffer<float> shift_cap;
  GrowBuffer<int64_t> key_queue;
  // Written by the probabilities hook's forward only (tests): per query row
  // [B][H][q_len], the fixed shift B_i the row used, -1 for an online row.
  GrowBuffer<float> row_shift;
  GrowBuffer<double> task_sums;
  // Formulations: dk_tilde (dense, padded), per-row statistics of q and k,
  // the parameters in f64 (padded) and the per-task parameter gradients.
  GrowBuffer<float> dkt, row_scratch;
  GrowBuffer<RowStat> q_stats, k_stats;
  GrowBuffer<double> params, param_partials;
  // RoPE (issue 34; rope-inl.h): the call's cos and sin table, and the
  // scratch that builds it.
  GrowBuffer<float> rope;
  GrowBuffer<double> rope_scratch;

 private:
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace qknorm::simd

#endif  // QKNORM_SIMD_WORKSPACE_H_
