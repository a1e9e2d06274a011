// Owned, encoded tensor buffers with guard regions, and the ForwardArgs /
// BackwardArgs of an attention case built from them: the one place tests
// lay out an entry's tensors in memory (XNNPACK's testers keep guard bytes
// around every buffer for the same reason).
//
// A TensorBuffer holds one [B, H, rows, D] view in a storage precision. Every
// element of its allocation that the view does not address is poison: the
// row-pad gaps (row_stride > D) and kGuardElements guard elements before the
// view's first and after its last element. Poison is a quiet NaN with a
// fixed payload (poison_bits()), so
// - an entry that reads outside an input view computes NaN, which the
//   verdict refuses (no finite output is ever within a bound of NaN), and
// - an entry that writes outside an output view changes a recognizable bit
//   pattern that guards_intact() / first_violation() detect after the call:
//   no arithmetic produces that payload (IEEE 754 operations return a
//   default NaN or propagate an input's), so only a stray store or a copy
//   of the poison itself can put it elsewhere.
// The view itself starts as the canonical NaN (encode(NaN)): an output
// element the entry forgets to write decodes to NaN and fails the verdict.
#ifndef QKNORM_VALIDATION_BUFFERS_H_
#define QKNORM_VALIDATION_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/precision.h"
#include "qknorm/scalenorm.h"
#include "validation/run.h"

namespace qknorm::validation {

// Guard elements before and after every view. 32 elements keep the view's
// start 64-byte aligned relative to the allocation in every precision (2, 4
// and 8 byte elements), so a guard does not change the alignment a kernel
// sees, and cover a full vector of any Highway target (AVX-512: 8 f64, 16
// f32, 32 bf16) so that an over-wide tail store lands in the guard.
inline constexpr int64_t kGuardElements = 32;

// Rows of poison after each (batch, head) block of an attention tensor's
// rows (AttentionBuffers): the sequence's last row is followed by poison,
// as a sequence in a K/V cache is followed by the cache's unused capacity.
// An entry that reads one key (or query) past the sequence end reads NaN
// poison, which reaches its output (diagnosed as an out-of-bounds read,
// validation/diagnose.h); one that writes one element past its last row
// writes a guard. With none, the row after a head's last is the next head's
// first: a read past the end would see valid data and a write would be
// overwritten. One row: the head and batch strides are the only change an
// entry sees (rows stay dense within a head).
inline constexpr int64_t kSequenceTailRows = 1;

// The poison bit pattern of precision p (in the low element_bytes(p) bytes):
// a quiet NaN with payload 0x5a (f64 0x7ff800000000005a, f32 0x7fc0005a, f16
// 0x7e5a, bf16 0x7fda); the fuzzers' guard pattern since issue 7.
uint64_t poison_bits(Precision p);

// Bytes from a per-thread pool of blocks (buffers.cc), the storage of a
// TensorBuffer. The fuzzers build every entry's buffers for every input:
// fresh heap blocks cost the allocator, its stack depot and page faults
// (~30% of an attention_fuzzer execution under ASan, issue 32). A block
// goes back to the pool of the thread that frees it and is handed out again
// to the next buffer of its size class; its contents are unspecified (the
// TensorBuffer rewrites every byte). Under ASan the pool keeps what a fresh
// block guaranteed: a free pooled block is poisoned whole (a stale pointer
// into it is a use-after-poison report), and a block in use is poisoned
// from size() to its capacity (an overrun past the buffer's last element is
// reported as on a block of exactly size() bytes).
class PooledBlock {
 public:
  PooledBlock() = default;
  explicit PooledBlock(size_t n);
  PooledBlock(const PooledBlock& o);
  PooledBlock& operator=(const PooledBlock& o);
  PooledBlock(PooledBlock&& o) noexcept;
  PooledBlock& operator=(PooledBlock&& o) noexcept;
  ~PooledBlock() { release(); }

  unsigned char* data() { return p_; }
  const unsigned char* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release();
  unsigned char* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

struct Shape4 {
  int64_t B = 1, H = 1, rows = 1, D = 1;
  int64_t count() const { return B * H * rows * D; }
};

class TensorBuffer {
 public:
  // Row stride D + row_pad; head stride (rows + tail_rows) row strides,
  // batch stride H head strides (the layout run_attention hands entries:
  // tail_rows = kSequenceTailRows); size() = B H (rows + tail_rows) (D +
  // row_pad); kGuardElements of poison before and after. The view holds
  // NaN until store().
  TensorBuffer(std::string name, Precision p, Shape4 shape, int64_t row_pad = 0,
               int64_t tail_rows = 0);
  // The caller's layout and element count (the fuzzers' raw layouts, the
  // head-interleaved layout of a projection), with `guard` elements of
  // poison before and after [0, size) (the fuzzers: none); every element of
  // [0, size) the layout does not address is poison, the view too (until
  // store()). The layout may address an element twice (overlapping()) or
  // lie partly outside [0, size) (an invalid layout the validator must
  // refuse; store() and load() skip those elements).
  TensorBuffer(std::string name, Precision p, Shape4 shape, const Layout4& l,
               int64_t size, int64_t guard = 0);

  const std::string& name() const { return name_; }
  Precision precision() const { return prec_; }
  const Shape4& shape() const { return shape_; }
  const Layout4& layout() const { return layout_; }
  int64_t size() const { return size_; }  // elements the view's data holds

  // Offset of element (b, h, n, d) from the view's first element.
  int64_t offset(int64_t b, int64_t h, int64_t n, int64_t d) const {
    return b * layout_.batch_stride + h * layout_.head_stride +
           n * layout_.row_stride + d;
  }
  // Stores dense [B,H,rows,D] values in (b, h, n, d) order, rounded to the
  // storage precision (later writes win where the layout overlaps). Throws
  // qknorm::Error naming the tensor if dense has the wrong length.
  void store(const std::vector<double>& dense);
  // The view decoded to double, dense.
  std::vector<double> load() const;

  void* data() { return bytes_.data() + lead_bytes(); }
  const void* data() const { return bytes_.data() + lead_bytes(); }
  ConstTensor4 cview() const { return {data(), size_, layout_}; }
  MutTensor4 view() { return {data(), size_, layout_}; }
  // A [rows, D] view for ScaleNorm (B = H = 1).
  ConstTensor2 cview2() const { return {data(), size_, layout_.row_stride}; }
  MutTensor2 view2() { return {data(), size_, layout_.row_stride}; }
  // f64 buffers as the double arrays of lse, dg and the parameters (null
  // when empty, as ParamRef expects).
  double* doubles();
  const double* doubles() const;

  bool overlapping() const;  // some element addressed twice
  bool guards_intact() const { return first_violation().tensor.empty(); }
  // The first changed poison element in address order; tensor empty if
  // none.
  GuardViolation first_violation() const;
  // The view's elements that hold an input's poison (an output an entry
  // computed from a read outside an input view): this buffer's own poison
  // pattern, or, in an f64 buffer (lse, dg), the poison of `input` widened
  // to f64 as a hardware conversion widens a NaN (its payload kept).
  // tensor empty if none.
  PoisonedOutput poisoned(Precision input) const;

 private:
  size_t lead_bytes() const {
    return static_cast<size_t>(lead_) * element_bytes(prec_);
  }
  // Sizes the allocation, fills it with poison and counts the elements the
  // layout addresses.
  void allocate();
  std::string element_name(int64_t off) const;

  std::string name_;
  Precision prec_;
  Shape4 shape_;
  Layout4 layout_;
  int64_t size_ = 0, lead_ = 0, total_ = 0;  // lead_: guards before the view
  int64_t tail_rows_ = 0;                    // dense: poison rows per head
  bool dense_ = false;                       // the first constructor's layout
  PooledBlock bytes_;
  PooledBlock addressed_;  // per allocation element, saturating
};

// An f64 buffer of n doubles (lse, dg, the parameters and their gradients)
// with guards.
TensorBuffer double_buffer(std::string name, int64_t n);

// Every tensor one forward and backward call of an attention entry reads or
// writes, owned, in the entry's storage precision, laid out as
// run_attention lays them out (row stride head_dim + c.row_pad,
// kSequenceTailRows of poison after each head's rows): q, k, v,
// d_o hold the case's inputs (already rounded: round_inputs), the learned
// parameters are f64 inputs; o, dq, dk, dv, lse, dg and the parameter
// gradients start as NaN. Throws qknorm::Error naming the tensor when a case
// tensor has the wrong length.
class AttentionBuffers {
 public:
  AttentionBuffers(const AttentionCase& c, Precision storage);

  // The forward's arguments (q, k, v, the parameters -> o, lse).
  ForwardArgs forward_args();
  // The backward's (q, k, v, o, dO, lse, the parameters -> dq, dk, dv, dg,
  // the parameter gradients): o and lse as the forward left them.
  BackwardArgs backward_args();

  // The first violation of every buffer whose guards were written (inputs
  // included: an entry must not write through a const view either).
  std::vector<GuardViolation> guard_violations() const;
  // The outputs that hold an input's poison (TensorBuffer::poisoned):
  // o and lse, and with backward the gradients.
  std::vector<PoisonedOutput> poisoned_outputs(bool backward) const;
  // The outputs decoded to double, dense (backward: dq ... and the
  // parameter gradients too).
  AttentionResult result(bool backward) const;

  const AttentionProblem& problem() const { return problem_; }
  TensorBuffer q, k, v, d_o, o, dq, dk, dv, lse, dg;
  TensorBuffer q_weight, k_weight, q_bias, k_bias;
  TensorBuffer dq_weight, dk_weight, dq_bias, dk_bias;
  TensorBuffer d_sinks;  // heads doubles with sinks, else none

 private:
  AttentionProblem problem_;
};

// The same for ScaleNorm (x, dy inputs; y, dx, dg outputs; dense rows plus
// row_pad).
class ScaleNormBuffers {
 public:
  ScaleNormBuffers(const ScaleNormCase& c, Precision storage,
                   int64_t row_pad = 0);
  ScaleNormForwardArgs forward_args();
  ScaleNormBackwardArgs backward_args();
  std::vector<GuardViolation> guard_violations() const;
  std::vector<PoisonedOutput> poisoned_outputs(bool backward) const;
  ScaleNormResult result(bool backward) const;
  TensorBuffer x, dy, y, dx, dg;
};

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_BUFFERS_H_
