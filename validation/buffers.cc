#include "validation/buffers.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>

#include "qknorm/error.h"
#include "qknorm/validate.h"

#if defined(__SANITIZE_ADDRESS__)
#define QKNORM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKNORM_ASAN 1
#endif
#endif
#ifdef QKNORM_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace qknorm::validation {
namespace {

// ASan's manual poisoning (no-ops in other builds).
void poison(const unsigned char* p, size_t n) {
#ifdef QKNORM_ASAN
  __asan_poison_memory_region(p, n);
#else
  (void)p, (void)n;
#endif
}
void unpoison(const unsigned char* p, size_t n) {
#ifdef QKNORM_ASAN
  __asan_unpoison_memory_region(p, n);
#else
  (void)p, (void)n;
#endif
}

// Free blocks by size class: class c holds blocks of 2^(c + 6) bytes. Only
// blocks up to kMaxPooledBytes are kept, at most kMaxPooledBlocks per class:
// the fuzzers' buffers are a few KiB, and a default run's large case must
// not leave its gigabytes pooled after it.
constexpr int kClasses = 15;  // 64 B .. 1 MiB
constexpr size_t kMaxPooledBytes = size_t{64} << (kClasses - 1);
constexpr size_t kMaxPooledBlocks = 64;

struct BlockPool {
  std::vector<unsigned char*> free[kClasses];
  ~BlockPool();
};
// Set when this thread's pool is destroyed (thread exit, or program exit
// for the main thread): a block freed later (a static buffer's) is deleted.
thread_local bool pool_gone = false;
BlockPool& pool() {
  thread_local BlockPool p;
  return p;
}
BlockPool::~BlockPool() {
  for (auto& list : free)
    for (unsigned char* b : list) {
      unpoison(b, 1);  // the allocator reads nothing, but stay symmetric
      delete[] b;
    }
  pool_gone = true;
}

int size_class(size_t n) {
  int c = 0;
  while ((size_t{64} << c) < n) ++c;
  return c;
}

}  // namespace

PooledBlock::PooledBlock(size_t n) : n_(n) {
  if (n == 0) return;
  if (n > kMaxPooledBytes) {
    cap_ = n;
    p_ = new unsigned char[n];
    return;
  }
  const int c = size_class(n);
  cap_ = size_t{64} << c;
  std::vector<unsigned char*>& list = pool().free[c];
  if (list.empty()) {
    p_ = new unsigned char[cap_];
  } else {
    p_ = list.back();
    list.pop_back();
  }
  unpoison(p_, n_);
  poison(p_ + n_, cap_ - n_);
}

void PooledBlock::release() {
  if (p_ == nullptr) return;
  const int c = cap_ <= kMaxPooledBytes ? size_class(cap_) : kClasses;
  if (c < kClasses && !pool_gone && pool().free[c].size() < kMaxPooledBlocks) {
    poison(p_, cap_);
    pool().free[c].push_back(p_);
  } else {
    unpoison(p_, cap_);
    delete[] p_;
  }
  p_ = nullptr;
  n_ = cap_ = 0;
}

PooledBlock::PooledBlock(const PooledBlock& o) : PooledBlock(o.n_) {
  if (n_ > 0) std::memcpy(p_, o.p_, n_);
}
PooledBlock& PooledBlock::operator=(const PooledBlock& o) {
  if (this != &o) *this = PooledBlock(o);
  return *this;
}
PooledBlock::PooledBlock(PooledBlock&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)),
      n_(std::exchange(o.n_, 0)),
      cap_(std::exchange(o.cap_, 0)) {}
PooledBlock& PooledBlock::operator=(PooledBlock&& o) noexcept {
  if (this != &o) {
    release();
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
    cap_ = std::exchange(o.cap_, 0);
  }
  return *this;
}

uint64_t poison_bits(Precision p) {
  switch (p) {
    case Precision::kF64:
      return 0x7ff800000000005aull;
    case Precision::kF32:
      return 0x7fc0005au;
    case Precision::kF16:
      return 0x7e5a;
    case Precision::kBF16:
      return 0x7fda;
  }
  return 0;
}

namespace {

uint64_t bits_at(Precision p, const unsigned char* bytes, int64_t i) {
  uint64_t b = 0;  // little endian: the low bytes hold the element
  const size_t eb = element_bytes(p);
  std::memcpy(&b, bytes + eb * static_cast<size_t>(i), eb);
  return b;
}

// Writes the pattern `bits` (its low element_bytes(p) bytes) into each of
// the n elements of `bytes`, or only into those where where[i] != 0. One
// typed store per element: a memcpy of a run-time size was a libc call per
// element, a fifth of building an entry's buffers.
template <class T>
void fill_as(unsigned char* bytes, uint64_t bits, int64_t n,
             const uint8_t* where) {
  const T v = static_cast<T>(bits);
  for (int64_t i = 0; i < n; ++i)
    if (where == nullptr || where[i] != 0)
      std::memcpy(bytes + sizeof(T) * static_cast<size_t>(i), &v, sizeof(T));
}
void fill(Precision p, unsigned char* bytes, uint64_t bits, int64_t n,
          const uint8_t* where = nullptr) {
  switch (element_bytes(p)) {
    case 2:
      return fill_as<uint16_t>(bytes, bits, n, where);
    case 4:
      return fill_as<uint32_t>(bytes, bits, n, where);
    default:
      return fill_as<uint64_t>(bytes, bits, n, where);
  }
}

}  // namespace

std::string GuardViolation::message() const {
  char buf[320];
  const int hex = static_cast<int>(2 * element_bytes(prec));
  std::snprintf(buf, sizeof buf,
                "%s: guard element at index %" PRId64
                " (%s) was written: holds %.17g (bits 0x%0*" PRIx64
                "), guard pattern 0x%0*" PRIx64,
                tensor.c_str(), index, where.c_str(), value, hex, bits, hex,
                poison_bits(prec));
  return buf;
}

TensorBuffer::TensorBuffer(std::string name, Precision p, Shape4 shape,
                           int64_t row_pad, int64_t tail_rows)
    : name_(std::move(name)), prec_(p), shape_(shape), tail_rows_(tail_rows) {
  const int64_t rs = shape.D + row_pad, hs = (shape.rows + tail_rows) * rs;
  layout_ = Layout4{shape.H * hs, hs, rs};
  size_ = shape.B * shape.H * hs;
  lead_ = kGuardElements;
  total_ = size_ + 2 * kGuardElements;
  dense_ = true;
  allocate();
  // The view starts as the canonical NaN: distinct from the poison, so that
  // an unwritten output is a NaN the verdict refuses and never mistaken for
  // a guard.
  // encode(NaN)'s bits, the same for every element.
  alignas(8) unsigned char one[8] = {};
  encode(p, std::numeric_limits<double>::quiet_NaN(), one, 0);
  fill(p, bytes_.data(), bits_at(p, one, 0), total_, addressed_.data());
}

TensorBuffer::TensorBuffer(std::string name, Precision p, Shape4 shape,
                           const Layout4& l, int64_t size, int64_t guard)
    : name_(std::move(name)),
      prec_(p),
      shape_(shape),
      layout_(l),
      size_(size),
      lead_(guard),
      total_(size + 2 * guard) {
  allocate();
}

void TensorBuffer::allocate() {
  const size_t eb = element_bytes(prec_);
  bytes_ = PooledBlock(static_cast<size_t>(total_) * eb);
  fill(prec_, bytes_.data(), poison_bits(prec_), total_);
  addressed_ = PooledBlock(static_cast<size_t>(total_));
  if (total_ > 0) std::memset(addressed_.data(), 0, addressed_.size());
  const Shape4& s = shape_;
  if (s.B < 1 || s.H < 1 || s.rows < 1 || s.D < 1) return;
  if (dense_) {  // each row's D elements, once each, all inside [0, size_)
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t n = 0; n < s.rows; ++n)
        std::memset(addressed_.data() + lead_ + bh * layout_.head_stride +
                        n * layout_.row_stride,
                    1, static_cast<size_t>(s.D));
    return;
  }
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t n = 0; n < s.rows; ++n)
        for (int64_t d = 0; d < s.D; ++d) {
          const int64_t o = offset(b, h, n, d);
          if (o < 0 || o >= size_) continue;
          unsigned char& a = addressed_.data()[lead_ + o];
          if (a < 255) ++a;
        }
}

void TensorBuffer::store(const std::vector<double>& dense) {
  const Shape4& s = shape_;
  if (static_cast<int64_t>(dense.size()) != s.count())
    throw Error("case " + name_, {},
                "length must be " + std::to_string(s.count()) + " (got " +
                    std::to_string(dense.size()) + ")");
  size_t i = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t n = 0; n < s.rows; ++n)
        for (int64_t d = 0; d < s.D; ++d, ++i) {
          const int64_t o = offset(b, h, n, d);
          if (o >= 0 && o < size_)
            encode(prec_, dense[i], data(), static_cast<size_t>(o));
        }
}

std::vector<double> TensorBuffer::load() const {
  const Shape4& s = shape_;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(0, s.count())));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t n = 0; n < s.rows; ++n)
        for (int64_t d = 0; d < s.D; ++d) {
          const int64_t o = offset(b, h, n, d);
          out.push_back(o >= 0 && o < size_
                            ? decode(prec_, data(), static_cast<size_t>(o))
                            : std::numeric_limits<double>::quiet_NaN());
        }
  return out;
}

double* TensorBuffer::doubles() {
  return prec_ == Precision::kF64 && shape_.count() > 0
             ? static_cast<double*>(data())
             : nullptr;
}
const double* TensorBuffer::doubles() const {
  return const_cast<TensorBuffer*>(this)->doubles();
}

bool TensorBuffer::overlapping() const {
  for (size_t i = 0; i < addressed_.size(); ++i)
    if (addressed_.data()[i] > 1) return true;
  return false;
}

// "o[b,h,n,d]" of the view element at offset off (dense mode: batch and head
// strides are multiples of the row stride; an offset in a head's tail rows
// is named as the head's last row).
std::string TensorBuffer::element_name(int64_t off) const {
  const int64_t rs = layout_.row_stride, D = shape_.D;
  const int64_t block = shape_.rows + tail_rows_;
  const int64_t row = rs > 0 ? off / rs : 0, d = rs > 0 ? off % rs : off;
  const int64_t n = std::min(row % block, shape_.rows - 1), bh = row / block;
  // double_buffer's (lse, dg, the parameters and their gradients): one
  // index. (An attention tensor has tail rows; a one-row f64 ScaleNorm
  // tensor is named so too.)
  if (prec_ == Precision::kF64 && tail_rows_ == 0 && shape_.B == 1 &&
      shape_.H == 1 && shape_.rows == 1)
    return name_ + "[" + std::to_string(std::min(d, D - 1)) + "]";
  return name_ + "[" + std::to_string(bh / shape_.H) + "," +
         std::to_string(bh % shape_.H) + "," + std::to_string(n) + "," +
         std::to_string(std::min(d, D - 1)) + "]";
}

GuardViolation TensorBuffer::first_violation() const {
  const uint64_t poison = poison_bits(prec_);
  int64_t last = -1;  // the view's last addressed offset
  for (int64_t i = total_ - 1; i >= 0 && last < 0; --i)
    if (addressed_.data()[i] != 0) last = i - lead_;
  for (int64_t i = 0; i < total_; ++i) {
    if (addressed_.data()[i] != 0 || bits_at(prec_, bytes_.data(), i) == poison)
      continue;
    GuardViolation v;
    v.tensor = name_;
    v.prec = prec_;
    v.index = i - lead_;
    v.bits = bits_at(prec_, bytes_.data(), i);
    v.value = decode(prec_, bytes_.data(), static_cast<size_t>(i));
    const bool dense = dense_;
    // Built by appending: GCC 12 warns (-Wrestrict, a known false
    // positive) on chains of std::string operator+ here.
    std::string& w = v.where;
    const int64_t rs = layout_.row_stride;
    const int64_t block = shape_.rows + tail_rows_;
    const bool tail = dense && tail_rows_ > 0 && v.index >= 0 &&
                      v.index < size_ && (v.index / rs) % block >= shape_.rows;
    if (v.index < 0) {
      w = std::to_string(-v.index);
      w += " before the view's first element";
    } else if (tail) {
      // A head's tail rows: name the distance from its last element.
      const int64_t row = v.index / rs, in_block = row % block;
      const int64_t last_el =
          (row - in_block + shape_.rows - 1) * rs + shape_.D - 1;
      w = "past the sequence end, ";
      w += std::to_string(v.index - last_el);
      w += " past ";
      w += element_name(last_el);
    } else if (last >= 0 && v.index > last) {
      w = std::to_string(v.index - last);
      w += " past the view's last element";
      if (dense) {
        w += " ";
        w += element_name(last);
      }
    } else if (dense) {
      const int64_t row_end = (v.index / rs) * rs + shape_.D - 1;
      w = "row pad, ";
      w += std::to_string(v.index - row_end);
      w += " past ";
      w += element_name(row_end);
    } else {
      w = "a gap inside the view";
    }
    return v;
  }
  return {};
}

namespace {
// The poison of precision p as a hardware conversion widens it to f64: the
// sign, a quiet NaN, the payload shifted to f64's mantissa top.
uint64_t widened_poison(Precision p) {
  const uint64_t bits = poison_bits(p);
  int mant = 0;
  switch (p) {
    case Precision::kF64:
      return bits;
    case Precision::kF32:
      mant = 23;
      break;
    case Precision::kF16:
      mant = 10;
      break;
    case Precision::kBF16:
      mant = 7;
      break;
  }
  const uint64_t payload = bits & ((uint64_t{1} << mant) - 1);
  return uint64_t{0x7ff} << 52 | payload << (52 - mant);
}
}  // namespace

PoisonedOutput TensorBuffer::poisoned(Precision input) const {
  PoisonedOutput r;
  const uint64_t own = poison_bits(prec_);
  const uint64_t wide = prec_ == Precision::kF64 ? widened_poison(input) : own;
  for (int64_t i = 0; i < total_; ++i) {
    if (addressed_.data()[i] == 0) continue;
    const uint64_t b = bits_at(prec_, bytes_.data(), i);
    if (b != own && b != wide) continue;
    if (r.count++ == 0) {
      r.tensor = name_;
      r.bits = b;
      r.first = dense_ ? element_name(i - lead_)
                       : name_ + " element " + std::to_string(i - lead_);
    }
  }
  return r;
}

TensorBuffer double_buffer(std::string name, int64_t n) {
  return TensorBuffer(std::move(name), Precision::kF64, Shape4{1, 1, 1, n});
}

namespace {

// The case's tensor stored in a new buffer of its shape (left NaN when the
// case leaves it empty, as a forward-only case may leave d_o).
TensorBuffer input(const char* name, Precision s, Shape4 shape, int64_t pad,
                   int64_t tail, const std::vector<double>& x, bool required) {
  TensorBuffer t(name, s, shape, pad, tail);
  if (required || !x.empty()) t.store(x);
  return t;
}
TensorBuffer param(const char* name, const std::vector<double>& x) {
  TensorBuffer t = double_buffer(name, static_cast<int64_t>(x.size()));
  t.store(x);
  return t;
}
// The problem validated before any buffer is sized from it (a negative or
// overflowing dimension is bad input, not an allocation).
const AttentionProblem& valid(const AttentionProblem& p) {
  validate_problem(p);
  return p;
}
const ScaleNormProblem& valid(const ScaleNormProblem& p) {
  validate_problem(p);
  return p;
}
std::vector<GuardViolation> first_violations(
    std::initializer_list<const TensorBuffer*> buffers) {
  std::vector<GuardViolation> r;
  for (const TensorBuffer* t : buffers) {
    GuardViolation v = t->first_violation();
    if (!v.tensor.empty()) r.push_back(std::move(v));
  }
  return r;
}
ParamRef ref(const TensorBuffer& t) { return {t.doubles(), t.size()}; }
MutParamRef mref(TensorBuffer& t) { return {t.doubles(), t.size()}; }

}  // namespace

AttentionBuffers::AttentionBuffers(const AttentionCase& c, Precision s)
    : q(input("q", s,
              {valid(c.problem).batch, c.problem.heads, c.problem.q_len,
               c.problem.head_dim},
              c.row_pad, kSequenceTailRows, c.q, true)),
      k(input("k", s,
              {c.problem.batch, kv_heads_of(c.problem), c.problem.kv_len,
               c.problem.head_dim},
              c.row_pad, kSequenceTailRows, c.k, true)),
      v(input("v", s, k.shape(), c.row_pad, kSequenceTailRows, c.v, true)),
      d_o(input("d_o", s, q.shape(), c.row_pad, kSequenceTailRows, c.d_o,
                false)),
      o("o", s, q.shape(), c.row_pad, kSequenceTailRows),
      dq("dq", s, q.shape(), c.row_pad, kSequenceTailRows),
      dk("dk", s, k.shape(), c.row_pad, kSequenceTailRows),
      dv("dv", s, k.shape(), c.row_pad, kSequenceTailRows),
      lse(double_buffer("lse",
                        c.problem.batch * c.problem.heads * c.problem.q_len)),
      dg(double_buffer("dg", 1)),
      q_weight(param("q_weight", c.q_weight)),
      k_weight(param("k_weight", c.k_weight)),
      q_bias(param("q_bias", c.q_bias)),
      k_bias(param("k_bias", c.k_bias)),
      dq_weight(double_buffer("dq_weight", q_weight.size())),
      dk_weight(double_buffer("dk_weight", k_weight.size())),
      dq_bias(double_buffer("dq_bias", q_bias.size())),
      dk_bias(double_buffer("dk_bias", k_bias.size())),
      d_sinks(
          double_buffer("d_sinks", has_sinks(c.problem) ? c.problem.heads : 0)),
      problem_(c.problem) {}

ForwardArgs AttentionBuffers::forward_args() {
  return ForwardArgs{q.cview(),
                     k.cview(),
                     v.cview(),
                     o.view(),
                     lse.doubles(),
                     lse.size(),
                     {ref(q_weight), ref(k_weight), ref(q_bias), ref(k_bias)}};
}

BackwardArgs AttentionBuffers::backward_args() {
  return BackwardArgs{
      q.cview(),
      k.cview(),
      v.cview(),
      o.cview(),
      d_o.cview(),
      lse.doubles(),
      lse.size(),
      dq.view(),
      dk.view(),
      dv.view(),
      dg.doubles(),
      {ref(q_weight), ref(k_weight), ref(q_bias), ref(k_bias)},
      {mref(dq_weight), mref(dk_weight), mref(dq_bias), mref(dk_bias)},
      d_sinks.size() > 0 ? d_sinks.doubles() : nullptr,
      d_sinks.size()};
}

std::vector<GuardViolation> AttentionBuffers::guard_violations() const {
  return first_violations({&q, &k, &v, &d_o, &o, &dq, &dk, &dv, &lse, &dg,
                           &q_weight, &k_weight, &q_bias, &k_bias, &dq_weight,
                           &dk_weight, &dq_bias, &dk_bias, &d_sinks});
}

namespace {
std::vector<PoisonedOutput> poisoned_in(
    Precision input, std::initializer_list<const TensorBuffer*> outputs) {
  std::vector<PoisonedOutput> r;
  for (const TensorBuffer* t : outputs) {
    PoisonedOutput p = t->poisoned(input);
    if (p.count > 0) r.push_back(std::move(p));
  }
  return r;
}
}  // namespace

std::vector<PoisonedOutput> AttentionBuffers::poisoned_outputs(
    bool backward) const {
  const Precision in = q.precision();
  if (!backward) return poisoned_in(in, {&o, &lse});
  return poisoned_in(in, {&o, &lse, &dq, &dk, &dv, &dg, &dq_weight, &dk_weight,
                          &dq_bias, &dk_bias, &d_sinks});
}

AttentionResult AttentionBuffers::result(bool backward) const {
  AttentionResult r;
  r.o = o.load();
  r.lse = lse.load();
  if (!backward) return r;
  r.dq = dq.load();
  r.dk = dk.load();
  r.dv = dv.load();
  r.dg = dg.load()[0];
  r.dq_weight = dq_weight.load();
  r.dk_weight = dk_weight.load();
  r.dq_bias = dq_bias.load();
  r.dk_bias = dk_bias.load();
  r.d_sinks = d_sinks.load();
  return r;
}

ScaleNormBuffers::ScaleNormBuffers(const ScaleNormCase& c, Precision s,
                                   int64_t row_pad)
    : x(input("x", s, {1, 1, valid(c.problem).rows, c.problem.dim}, row_pad, 0,
              c.x, true)),
      dy(input("dy", s, x.shape(), row_pad, 0, c.dy, false)),
      y("y", s, x.shape(), row_pad),
      dx("dx", s, x.shape(), row_pad),
      dg(double_buffer("dg", 1)) {}

ScaleNormForwardArgs ScaleNormBuffers::forward_args() {
  return {x.cview2(), y.view2()};
}

ScaleNormBackwardArgs ScaleNormBuffers::backward_args() {
  return {x.cview2(), dy.cview2(), dx.view2(), dg.doubles()};
}

std::vector<GuardViolation> ScaleNormBuffers::guard_violations() const {
  return first_violations({&x, &dy, &y, &dx, &dg});
}

std::vector<PoisonedOutput> ScaleNormBuffers::poisoned_outputs(
    bool backward) const {
  if (!backward) return poisoned_in(x.precision(), {&y});
  return poisoned_in(x.precision(), {&y, &dx, &dg});
}

ScaleNormResult ScaleNormBuffers::result(bool backward) const {
  ScaleNormResult r;
  r.y = y.load();
  if (!backward) return r;
  r.dx = dx.load();
  r.dg = dg.load()[0];
  return r;
}

}  // namespace qknorm::validation
