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

enum class Fault {
  kNone,
  kWriteOnePastO,
  kWriteOnePastDq,
  kIgnoreRowStride,
  kReadOneKeyPastEnd,
  kWriteOnePastY,
};

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
    if (fault_ == Fault::kReadOneKeyPastEnd) {
      // An off-by-one key loop: the inner entry is told of one more key,
      // and reads row kv_len of each head's k and v.
      AttentionProblem longer = p;
      longer.kv_len = p.kv_len + 1;
      inner().attention_forward(longer, a, ws, cfg);
    } else if (fault_ != Fault::kIgnoreRowStride) {
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
  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace* ws,
                         const ExecConfig& cfg) const override {
    inner().scalenorm_forward(p, a, ws, cfg);
    if (fault_ == Fault::kWriteOnePastY)
      encode(precision(), 1.0, a.y.data,
             static_cast<size_t>((p.rows - 1) * a.y.row_stride + p.dim));
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
  // One past o[1,1,5,7]: rows of 8, heads of 6 + kSequenceTailRows rows.
  const int64_t head = (6 + kSequenceTailRows) * 8;
  EXPECT_EQ(r.guards[0].index, 3 * head + 5 * 8 + 8);
  EXPECT_EQ(r.guards[0].value, 0.5);
  EXPECT_EQ(r.guard_call, "forward");
  EXPECT_FALSE(r.judged);
  const std::string m = r.message();
  EXPECT_NE(m.find("entry mutant:f64"), std::string::npos) << m;
  EXPECT_NE(m.find("seed=42"), std::string::npos) << m;
  EXPECT_NE(
      m.find("o: guard element at index " + std::to_string(3 * head + 48) +
             " (past the sequence end, 1 past o[1,1,5,7]) was "
             "written: holds 0.5"),
      std::string::npos)
      << m;
}

// qknorm-check's runs (run_attention, check_attention) check the same
// guards: a written guard FAILs the case whatever the outputs, with the
// out-of-bounds-write diagnosis first, and the backward does not run.
TEST(AttentionTester, CheckAttentionFailsAWrittenGuard) {
  const FaultyEntry e(registered("reference:f32"), Fault::kWriteOnePastO);
  const AttentionCase c = small_case().make_case(Precision::kF32);
  const AttentionResult res = run_attention(e, c);
  ASSERT_EQ(res.memory.writes.size(), 1u);
  EXPECT_EQ(res.memory.write_call, "forward");
  EXPECT_EQ(res.backward_input, BackwardInput::kNotRun);
  const AgreementReport rep = check_attention(e, c);
  EXPECT_FALSE(rep.pass);
  // The values themselves are right: every field judged passes.
  for (const FieldVerdict& f : rep.fields) EXPECT_TRUE(f.pass) << label(f);
  ASSERT_FALSE(rep.diagnoses.empty());
  EXPECT_EQ(rep.diagnoses[0].kind, DiagnosisKind::kOutOfBoundsWrite);
  const std::string m = rep.failure_message();
  EXPECT_NE(m.find("wrote outside its views during the forward: o: guard "
                   "element at index"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("likely cause: out-of-bounds write"), std::string::npos)
      << m;
  // The correct entry: no evidence, passes.
  const FaultyEntry ok(registered("reference:f32"), Fault::kNone);
  const AttentionResult good = run_attention(ok, c);
  EXPECT_TRUE(good.memory.writes.empty());
  EXPECT_TRUE(good.memory.poisoned.empty());
  EXPECT_TRUE(check_attention(ok, c).pass);
}

// A forward that reads one key past the sequence end reads the poison of
// the head's tail rows (kSequenceTailRows): o and lse hold it, the case
// FAILs, diagnosed as an out-of-bounds read naming o. Without a mask the
// extra key is visible to every query.
TEST(AttentionTester, ReadingOneKeyPastTheSequenceEndIsDiagnosed) {
  for (const char* name : {"reference:f64", "reference:f32"}) {
    const FaultyEntry e(registered(name), Fault::kReadOneKeyPastEnd);
    const AttentionTestReport r =
        small_case().causal(false).forward_only().Test(e);
    ASSERT_TRUE(r.judged) << r.message();
    EXPECT_FALSE(r.ok());
    ASSERT_FALSE(r.result.memory.poisoned.empty()) << name;
    EXPECT_EQ(r.result.memory.poisoned[0].tensor, "o");
    // Every head read poison, the first head too: the tail row after each
    // head's sequence (without it only the last head would, from the guard
    // after the view, and the first head's o would be merely wrong).
    EXPECT_EQ(r.result.memory.poisoned[0].first, "o[0,0,0,0]");
    EXPECT_EQ(r.result.memory.poisoned[0].count,
              static_cast<int64_t>(r.result.o.size()));
    ASSERT_FALSE(r.verdict.diagnoses.empty()) << r.message();
    EXPECT_EQ(r.verdict.diagnoses[0].kind, DiagnosisKind::kOutOfBoundsRead)
        << r.message();
    EXPECT_NE(r.message().find("likely cause: out-of-bounds read"),
              std::string::npos)
        << r.message();
  }
}

// ScaleNorm's runs check the guards too.
TEST(ScaleNormTester, CheckScaleNormFailsAWrittenGuard) {
  const FaultyEntry e(registered("reference:f32"), Fault::kWriteOnePastY);
  ScaleNormCase c;
  c.problem.rows = 5, c.problem.dim = 16, c.problem.g = 2;
  c.x.assign(80, 0.25), c.dy.assign(80, -0.5);
  for (size_t i = 0; i < c.x.size(); ++i)
    c.x[i] += 0.01 * static_cast<double>(i);
  const AgreementReport rep = check_scalenorm(e, c);
  EXPECT_FALSE(rep.pass);
  ASSERT_FALSE(rep.diagnoses.empty());
  EXPECT_EQ(rep.diagnoses[0].kind, DiagnosisKind::kOutOfBoundsWrite);
  EXPECT_NE(rep.failure_message().find("during the forward: y: guard element"),
            std::string::npos)
      << rep.failure_message();
}

TEST(AttentionTester, WriteOnePastDqIsCaughtInTheRowPad) {
  for (const char* name : {"reference:f32", "reference:f16"}) {
    const FaultyEntry e(registered(name), Fault::kWriteOnePastDq);
    const AttentionTestReport r = small_case().row_pad(2).Test(e);
    ASSERT_FALSE(r.ok());
    ASSERT_EQ(r.guards.size(), 1u) << r.message();
    EXPECT_EQ(r.guards[0].tensor, "dq");
    // One past dq[1,1,5,7] with rows of 8 + 2 elements, heads of 6 +
    // kSequenceTailRows rows: in the last row's pad, past the view's last
    // element.
    const int64_t index = 3 * (6 + kSequenceTailRows) * 10 + 5 * 10 + 8;
    EXPECT_EQ(r.guards[0].index, index);
    EXPECT_EQ(r.guards[0].value, -2.0);
    EXPECT_EQ(r.guard_call, "backward");
    EXPECT_NE(
        r.message().find("dq: guard element at index " + std::to_string(index) +
                         " (1 past the view's last element "
                         "dq[1,1,5,7])"),
        std::string::npos)
        << r.message();
  }
}

// An entry that ignores its inputs' strides reads the pads' NaN poison:
// its outputs are NaN and the verdict fails, diagnosed as an out-of-bounds
// read. With one dense (batch, head) the same entry is correct, so the
// poison is what catches it.
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
  // ... and the poison it read is named: an out-of-bounds read.
  ASSERT_FALSE(padded.verdict.diagnoses.empty()) << padded.message();
  EXPECT_EQ(padded.verdict.diagnoses[0].kind, DiagnosisKind::kOutOfBoundsRead)
      << padded.message();
  EXPECT_NE(padded.message().find("field o"), std::string::npos)
      << padded.message();
  // Dense rows: the entry still ignores the head and batch strides, and
  // reads the poison row after each head's sequence (kSequenceTailRows).
  const AttentionTestReport dense =
      small_case().row_pad(0).forward_only().Test(e);
  EXPECT_FALSE(dense.ok());
  ASSERT_FALSE(dense.verdict.diagnoses.empty()) << dense.message();
  EXPECT_EQ(dense.verdict.diagnoses[0].kind, DiagnosisKind::kOutOfBoundsRead);
  // One (batch, head) with dense rows: ignoring the strides is harmless,
  // and the same entry passes (the poison is what caught it above).
  const AttentionTestReport one =
      small_case().batch(1).heads(1).row_pad(0).forward_only().Test(e);
  EXPECT_TRUE(one.ok()) << one.message();
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
