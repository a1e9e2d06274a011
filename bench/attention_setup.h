// Shared setup of the benchmark binary and the callgrind driver: FLOP counts,
// inputs encoded once to an entry's storage, one warm workspace per entry, and
// the bare OpenBLAS GEMMs an attention head performs (the anchor).
//
// Nothing here is timed: callers time (or count) only the calls
// AttentionRun::forward / backward and GemmAnchor::run make.
#ifndef QKNORM_BENCH_ATTENTION_SETUP_H_
#define QKNORM_BENCH_ATTENTION_SETUP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::bench {

// One benchmarked problem: fp32 B = 1 self-attention (q_len = kv_len = n).
struct Shape {
  int64_t heads = 8, n = 128, d = 64;
  bool causal = false;
  // A formulation preset (include/qknorm/formulation.h; empty: the paper's,
  // as the main grid) and its kv heads (0: = heads).
  std::string formulation;
  int64_t kv_heads = 0;
  // >= 0: a sliding window (window_left, 0) (issue 34; attention.h), with
  // the causal mask: query i sees keys [i - window_left, i].
  int64_t window_left = -1;
  // > 0: RoPE on q and k (issue 34; attention.h Rope) over the first
  // rope_dim dims of each head: half-split pairs, after the normalization,
  // theta 10^6 (Qwen3's). It adds no FLOPs to issue 8's model.
  int64_t rope_dim = 0;
  // "H8 n512 d64 causal", "... window127", "... rope128"
  std::string describe() const;
};

// The paper's g0 for L = 72 (shared/NUMERICS.md); the rate does not depend on
// g, but a realistic value keeps the softmax in its usual regime.
inline constexpr double kBenchG = 12.3197;
inline constexpr uint64_t kBenchSeed = 20201005;

// Query-key pairs a head evaluates: n^2, or n (n + 1) / 2 with the causal
// mask (only the visible half is counted, issue 8); with a window, the
// pairs it leaves visible (sum over rows of min(i + 1, window_left + 1)).
double visible_pairs(const Shape& s);
// Issue 8's FLOP model per call (all heads): forward 4 d per visible pair
// (QK^T and PV, 2 d each), backward 10 d per pair (issue 3's 2.5x).
double forward_flops(const Shape& s);
double backward_flops(const Shape& s);

// The RoPE the rope rows use (Shape::rope_dim): rotary_dim dims (0: none),
// half-split, after the normalization, theta 10^6.
Rope bench_rope(int64_t rotary_dim);

// Inputs and outputs of one shape in one storage precision. Inputs are drawn
// once (Gaussian, fixed seed) and encoded to storage; outputs are allocated
// and touched once, so no timed call pays for fresh pages.
class AttentionBuffers {
 public:
  AttentionBuffers(const Shape& s, Precision prec);
  AttentionProblem problem(bool causal, int64_t window_left = -1,
                           int64_t rope_dim = 0) const;
  ForwardArgs forward_args();
  BackwardArgs backward_args();
  const Shape& shape() const { return shape_; }
  Precision precision() const { return prec_; }

 private:
  Shape shape_;
  Precision prec_;
  int64_t elems_, kv_elems_;
  std::vector<unsigned char> q_, k_, v_, d_o_, o_, dq_, dk_, dv_;
  std::vector<double> lse_;
  double dg_ = 0;
  // The formulation's parameters and their gradients (empty for the paper).
  std::vector<double> qw_, kw_, qb_, kb_, dqw_, dkw_, dqb_, dkb_;
};

// An entry bound to its workspace. Construction creates the workspace; the
// first call through a checked_* front door validates the arguments and
// sizes (warms) it.
class AttentionRun {
 public:
  explicit AttentionRun(const Backend& entry);
  const Backend& entry() const { return *entry_; }
  Workspace* workspace() { return ws_.get(); }

  // Untimed: validate and warm the workspace with one call. Backward reads
  // o and lse from `buf`: a forward of the same mask must have written them.
  // window_left >= 0: the causal window (window_left, 0); rope_dim > 0:
  // RoPE (bench_rope) (Shape).
  void prepare_forward(AttentionBuffers& buf, bool causal, int threads,
                       int64_t window_left = -1, int64_t rope_dim = 0);
  void prepare_backward(AttentionBuffers& buf, bool causal, int threads,
                        int64_t window_left = -1, int64_t rope_dim = 0);
  // The timed calls: straight to the virtual kernels, no validation.
  void forward(AttentionBuffers& buf, bool causal, int threads,
               int64_t window_left = -1, int64_t rope_dim = 0);
  void backward(AttentionBuffers& buf, bool causal, int threads,
                int64_t window_left = -1, int64_t rope_dim = 0);

 private:
  const Backend* entry_;
  std::unique_ptr<Workspace> ws_;
};

// The bare GEMMs of one attention head, on dense f32 buffers, every head in
// turn. Forward: S = Q K^T (n x n x d; cblas_sgemm NoTrans x Trans) and
// O = P V (n x d x n). Backward, the four GEMMs the backward's own shapes
// need: dV = P^T dO (n x d x n, Trans x NoTrans), dP = dO V^T (n x n x d,
// NoTrans x Trans), dQ = dS K (n x d x n, NoTrans x NoTrans) and
// dK = dS^T Q (n x d x n, Trans x NoTrans). Two n x n buffers (P, dS) serve
// every head, as a head-by-head BLAS path would.
enum class GemmOp { kQK, kPV, kDV, kDP, kDQ, kDK };
// "qk", "pv", "dv", "dp", "dq", "dk" (the benchmark names gemm/<op>/...).
const char* gemm_op_name(GemmOp op);
class GemmAnchor {
 public:
  explicit GemmAnchor(const Shape& s);
  void run(GemmOp op);  // all heads
  void qk() { run(GemmOp::kQK); }
  void pv() { run(GemmOp::kPV); }
  double flops_per_gemm() const;  // 2 n^2 d per head, all heads (every op)
 private:
  Shape shape_;
  std::vector<float> q_, k_, v_, d_o_, s_, ds_, o_, dq_, dk_, dv_;
};

// OpenBLAS thread control for the anchors (openblas_set_num_threads).
void set_openblas_threads(int threads);
const char* openblas_corename();

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_list(const std::string& s);

// Entries matching any of the comma-separated globs, in registry order.
std::vector<const Backend*> match_entries(const std::string& globs);

}  // namespace qknorm::bench

#endif  // QKNORM_BENCH_ATTENTION_SETUP_H_
