// The guard regions of validation/buffers.h and the fluent testers of
// validation/tester.h: an entry that writes one element past an output view
// (O in the forward, dQ in the backward) is caught and named; an entry that
// reads outside its input view (it ignores the row stride) reads the NaN
// poison and fails the verdict; a correct entry passes, and the tester's
// verdict is check_attention's.
#include "validation/tester.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "qknorm/backend.h"
#include "qknorm/formulation.h"
#include "qknorm/precision.h"
#include "validation/buffers.h"
#include "validation/check.h"
#include "validation/forwarding_backend.h"

// ASan builds (the sanitizer stage) also check the pool's poisoning below.
#if defined(__SANITIZE_ADDRESS__)
#define QKNORM_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKNORM_TEST_ASAN 1
#endif
#endif

namespace qknorm::validation {
namespace {

enum class Fault { kNone, kWriteOnePastO, kWriteOnePastDq, kIgnoreRowStride };

// Offset of the last element of a [B, H, rows, D] view.
int64_t last_offset(const Layout4& l, int64_t B, int64_t H, int64_t rows,
                    int64_t D) {
  return (B - 1) * l.batch_stride + (H - 1) * l.head_stride +
         (rows - 1) * l.row_stride + D - 1;
}

// A registered entry, delegated to, with one fault injected.
class FaultyEntry final : public validation::ForwardingBackend {
 public:
  FaultyEntry(const Backend& inner, Fault f)
      : ForwardingBackend(inner, "-"), fault_(f) {}
  bool supports(const AttentionProblem& p) const override {
    return inner().supports(p);
  }
  std::unique_ptr<Workspace> make_workspace() const override {
    return inner().make_workspace();
  }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    if (fault_ != Fault::kIgnoreRowStride) {
      inner().attention_forward(p, a, ws, cfg);
    } else {
      // Reads q, k, v as if they were dense: every row but the first starts
      // inside the previous row's pad.
      ForwardArgs dense = a;
      dense.q.layout = contiguous_layout(p.heads, p.q_len, p.head_dim);
      dense.k.layout = contiguous_layout(kv_heads_of(p), p.kv_len, p.head_dim);
      dense.v.layout = dense.k.layout;
      inner().attention_forward(p, dense, ws, cfg);
    }
    if (fault_ == Fault::kWriteOnePastO)
      encode(precision(), 0.5, a.o.data,
             static_cast<size_t>(last_offset(a.o.layout, p.batch, p.heads,
                                             p.q_len, p.head_dim) +
                                 1));
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    inner().attention_backward(p, a, ws, cfg);
    if (fault_ == Fault::kWriteOnePastDq)
      encode(precision(), -2.0, a.dq.data,
             static_cast<size_t>(last_offset(a.dq.layout, p.batch, p.heads,
                                             p.q_len, p.head_dim) +
                                 1));
  }

 private:
  Fault fault_;
};

const Backend& registered(const char* name) {
  const Backend* b = all_backends().find(name);
  if (b == nullptr) throw std::runtime_error(std::string("no entry ") + name);
  return *b;
}

// B=2 H=2 Nq=6 Nk=9 D=8, causal, seed 42.
AttentionTester small_case() {
  return AttentionTester()
      .batch(2)
      .heads(2)
      .q_len(6)
      .kv_len(9)
      .head_dim(8)
      .g(3.5)
      .causal()
      .seed(42);
}

TEST(AttentionTester, CorrectEntryPasses) {
  for (const char* name : {"reference:f64", "reference:f32", "reference:bf16"})
    for (int64_t pad : {0, 3}) {
      const FaultyEntry e(registered(name), Fault::kNone);
      const AttentionTestReport r = small_case().row_pad(pad).Test(e);
      EXPECT_TRUE(r.ok()) << r.message();
      EXPECT_TRUE(r.judged);
      EXPECT_EQ(r.result.dq.size(), 2u * 2 * 6 * 8);
    }
}

TEST(AttentionTester, WriteOnePastOutputOIsCaught) {
  const FaultyEntry e(registered("reference:f64"), Fault::kWriteOnePastO);
  const AttentionTestReport r = small_case().Test(e);
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(r.guards.size(), 1u) << r.message();
  EXPECT_EQ(r.guards[0].tensor, "o");
  EXPECT_EQ(r.guards[0].index, 2 * 2 * 6 * 8);  // one past the dense view
  EXPECT_EQ(r.guards[0].value, 0.5);
  EXPECT_EQ(r.guard_call, "forward");
  EXPECT_FALSE(r.judged);
  const std::string m = r.message();
  EXPECT_NE(m.find("entry mutant:f64"), std::string::npos) << m;
  EXPECT_NE(m.find("seed=42"), std::string::npos) << m;
  EXPECT_NE(m.find("o: guard element at index 192 (1 past the view's last "
                   "element o[1,1,5,7]) was written: holds 0.5"),
            std::string::npos)
      << m;
}

TEST(AttentionTester, WriteOnePastDqIsCaughtInTheRowPad) {
  for (const char* name : {"reference:f32", "reference:f16"}) {
    const FaultyEntry e(registered(name), Fault::kWriteOnePastDq);
    const AttentionTestReport r = small_case().row_pad(2).Test(e);
    ASSERT_FALSE(r.ok());
    ASSERT_EQ(r.guards.size(), 1u) << r.message();
    EXPECT_EQ(r.guards[0].tensor, "dq");
    // One past dq[1,1,5,7] with rows of 8 + 2 elements.
    EXPECT_EQ(r.guards[0].index, ((1 * 2 + 1) * 6 + 5) * 10 + 8);
    EXPECT_EQ(r.guards[0].value, -2.0);
    EXPECT_EQ(r.guard_call, "backward");
    EXPECT_NE(r.message().find("dq: guard element at index 238"),
              std::string::npos)
        << r.message();
  }
}

// An entry that ignores its inputs' row stride reads the pads' NaN poison:
// its outputs are NaN and the verdict fails. With dense rows the same entry
// is correct, so the poison is what catches it.
TEST(AttentionTester, ReadingOutsideAnInputViewFails) {
  const FaultyEntry e(registered("reference:f64"), Fault::kIgnoreRowStride);
  const AttentionTestReport padded =
      small_case().row_pad(3).forward_only().Test(e);
  EXPECT_FALSE(padded.ok());
  EXPECT_TRUE(padded.guards.empty()) << padded.message();
  ASSERT_TRUE(padded.judged);
  EXPECT_FALSE(padded.verdict.pass);
  bool nan = false;
  for (double x : padded.result.o) nan = nan || std::isnan(x);
  EXPECT_TRUE(nan) << "the poison did not reach the output";
  EXPECT_NE(padded.message().find("field o"), std::string::npos)
      << padded.message();
  const AttentionTestReport dense =
      small_case().row_pad(0).forward_only().Test(e);
  EXPECT_TRUE(dense.ok()) << dense.message();
}

// The tester judges as check_attention does: same fields, same margins.
TEST(AttentionTester, VerdictIsCheckAttentions) {
  int judged = 0;
  for (const char* name : {"reference:f32", "reference:bf16"})
    for (const char* preset : {"paper", "qwen3", "timm"}) {
      const Backend& e = registered(name);
      if (!e.supports([&] {
            AttentionProblem p;
            p.heads = 4, p.kv_heads = 2;
            apply_preset(preset, &p);
            return p;
          }()))
        continue;
      const AttentionTester t = small_case()
                                    .heads(4)
                                    .kv_heads(2)
                                    .formulation(preset)
                                    .dist(Distribution::kOutlierRows)
                                    .row_pad(1)
                                    .with_naive();
      const AttentionTestReport r = t.Test(e);
      const AgreementReport want =
          check_attention(e, t.make_case(e.precision()));
      ASSERT_TRUE(r.judged) << r.message();
      ASSERT_EQ(r.verdict.fields.size(), want.fields.size());
      for (size_t i = 0; i < want.fields.size(); ++i) {
        EXPECT_EQ(r.verdict.fields[i].id, want.fields[i].id);
        EXPECT_EQ(r.verdict.fields[i].margin, want.fields[i].margin)
            << validation::name(want.fields[i].id);
        EXPECT_EQ(r.verdict.fields[i].naive_margin,
                  want.fields[i].naive_margin);
      }
      EXPECT_EQ(r.ok(), want.pass);
      ++judged;
    }
  EXPECT_EQ(judged, 6);
}

TEST(TensorBuffer, PoisonOutsideTheViewNanInside) {
  for (Precision p : kAllPrecisions) {
    TensorBuffer t("x", p, Shape4{1, 2, 3, 4}, 2);
    EXPECT_EQ(t.layout().row_stride, 6);
    EXPECT_EQ(t.size(), 2 * 3 * 6);
    EXPECT_TRUE(t.guards_intact());
    for (double x : t.load()) EXPECT_TRUE(std::isnan(x));
    const std::vector<double> vals = [] {
      std::vector<double> v(24);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) - 7;
      return v;
    }();
    t.store(vals);
    EXPECT_EQ(t.load(), vals);
    EXPECT_TRUE(t.guards_intact());
    // Every non-view element is the poison NaN, pads and guards alike.
    const auto* base = static_cast<const unsigned char*>(t.data());
    const auto eb = static_cast<int64_t>(element_bytes(p));
    for (int64_t i = -kGuardElements; i < t.size() + kGuardElements; ++i) {
      const bool in_view = i >= 0 && i < t.size() && i % 6 < 4;
      if (in_view) continue;
      EXPECT_TRUE(std::isnan(decode(p, base + i * eb, 0)))
          << name(p) << " element " << i;
    }
    // A write just before the view is named with its negative index.
    encode(p, 1.0, static_cast<unsigned char*>(t.data()) - element_bytes(p), 0);
    const GuardViolation v = t.first_violation();
    EXPECT_EQ(v.tensor, "x");
    EXPECT_EQ(v.index, -1);
    EXPECT_EQ(v.value, 1.0);
    EXPECT_NE(v.message().find("1 before the view's first element"),
              std::string::npos)
        << v.message();
  }
}

// The buffers' storage comes from a pool (buffers.h, PooledBlock): a block
// handed out again has room past the buffer's end, and a freed one stays
// mapped. Under ASan both must still be reported like the fresh heap block
// of exact size they replace: the fuzzers' LAYOUT buffers have no guard
// elements (guard 0), only ASan sees an entry write past them.
#ifdef QKNORM_TEST_ASAN
void write_f32(unsigned char* p) {
  const float one = 1.0f;
  std::memcpy(p, &one, sizeof one);
  asm volatile("" ::"r"(p) : "memory");
}
// A 17-element f32 buffer (68 bytes) in a block of the 128-byte class that a
// larger buffer of the same class (30 elements, 120 bytes) left in the pool.
TensorBuffer reused_block_buffer() {
  { TensorBuffer big("big", Precision::kF32, {1, 1, 1, 30}, {30, 30, 30}, 30); }
  return TensorBuffer("x", Precision::kF32, {1, 1, 1, 17}, {17, 17, 17}, 17);
}
TEST(TensorBufferDeathTest, WritePastAReusedPooledBlockIsReported) {
  TensorBuffer t = reused_block_buffer();
  auto* p = static_cast<unsigned char*>(t.data());
  write_f32(p + 16 * 4);  // the last element: fine
  EXPECT_DEATH(write_f32(p + 17 * 4), "use-after-poison");
}
TEST(TensorBufferDeathTest, WriteIntoAFreedPooledBlockIsReported) {
  unsigned char* stale = nullptr;
  {
    TensorBuffer t = reused_block_buffer();
    stale = static_cast<unsigned char*>(t.data());
  }
  EXPECT_DEATH(write_f32(stale), "use-after-poison");
}
#endif

TEST(ScaleNormTester, CorrectEntryPasses) {
  for (const char* name : {"reference:f64", "reference:bf16"}) {
    const ScaleNormTestReport r =
        ScaleNormTester().rows(5).dim(7).g(2.5).row_pad(3).seed(9).Test(
            registered(name));
    EXPECT_TRUE(r.ok()) << r.message();
    EXPECT_TRUE(r.judged);
  }
}

}  // namespace
}  // namespace qknorm::validation
