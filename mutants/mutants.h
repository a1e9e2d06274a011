// Deliberately broken backends (mutants) and legitimate variants of the same
// loops (controls), in the static library qknorm_mutants (mutants/, outside
// the test directories: cli links it). They are never part of
// qknorm::all_backends(): the mutation test (property_tests/mutation_test.cc)
// and `qknorm-check mutants` (cli/mutants.h) run them to prove that the
// property suite and the default suite catch every bug and pass every control.
//
// The mutants are small, self-contained copies of reference-style loops
// (independent of reference/'s entries), templated on the arithmetic type
// (float for the f32/bf16/f16 storage modes, double for f64) and read and
// write strided storage exactly as a production entry does. Each carries one
// bug that real attention / normalization kernels have had:
// - formula bugs (issue 5): O(1) errors;
// - precision bugs (issue 15): small errors, relative 1e-7 .. 1e-2 of the
//   magnitude of the terms the field sums, far above what a correct kernel
//   of that precision loses (u_s |x| + (1 + 2A) u_c M, with M that
//   magnitude), so that a per-element rule must catch them.
// The controls are the same loops with no bug and another legitimate
// arithmetic (summation order, FMA, a 2-ulp exp, f32 accumulators for 16-bit
// storage): a correct kernel may do any of these, so each must pass.
#ifndef QKNORM_MUTANTS_MUTANTS_H_
#define QKNORM_MUTANTS_MUTANTS_H_

#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::property {

enum class Bug {
  kInvSqrtD,                 // 1/sqrt(D) used instead of g
  kGTwice,                   // g applied twice: S = g^2 C
  kEpsInSquaredNorm,         // sqrt(||x||^2 + eps) instead of max(||x||, eps)
  kCausalOffByOne,           // causal mask hides the diagonal (j < i, not <=)
  kPaddingDropsLastKey,      // keys j >= len - 1 treated as padding
  kNoMaxSubtraction,         // softmax as exp(S) / sum exp(S)
  kBf16Truncate,             // f32 -> bf16 outputs truncated, not RNE
  kDgOneHead,                // dg summed over head 0 only
  kMissingNormBackwardTerm,  // dx = du / ||x||, without - u (u . du)
  kTransposedDk,             // dK_hat = g dS Q_hat instead of g dS^T Q_hat
  kSkippedRescaleOneTile,    // online softmax: no rescale after tile 1
  kThreadDependentOrder,     // dK accumulated in reverse order on >1 thread
  kF16MaskToInf,             // masked logits -1e9 in f16 = -inf; NaN rows
  kF16EpsUnderflow,       // eps rounded to f16 (1e-12 -> 0): 0/0 on zero rows
  kScaleNormClampByNorm,  // ScaleNorm backward divides by ||x|| < eps
  kNormalizesV,           // v rows normalized too
  kBackwardIgnoresMask,   // mask applied in the forward only
  // Precision bugs (issue 15); mutant_list() has the details.
  kPvAccumBf16,            // O accumulator (P.V and row sum) kept in bf16
  kDvAccumBf16,            // dV accumulated in bf16 in the f32 mode
  kCheapExp,               // exp by a cubic 2^f, 7.5e-5 relative error
  kLseBf16,                // lse stored in bf16 in the f32 mode
  kDqOneHead,              // dQ of one (batch, head) off by 2^-10
  kFarNormRsqrtEstimate,   // backward 1/||x|| by 12-bit rsqrt if > 2^64
  kTailKeyBlockDrop,       // last partial key block of 16 drops one key
  kGBf16,                  // g rounded to bf16 in the f32 mode
  kClampEpsBf16Backward,   // backward divides clamp rows by bf16(eps)
  kDkDropsTailQueryBlock,  // dK misses the last partial query block of 16
  kRescaleBf16,            // online-softmax rescale factor rounded to bf16
  kTf32Matmul,             // GEMM operands rounded to TF32 in the f32 mode
  kF64ExpInF32,            // the f64 mode's exp evaluated in f32
  // Formulation bugs (issue 16; formulation_mutants.cc): each lives in one
  // formulation's own code, so only cases of that formulation trigger it.
  kGqaNoGroupSum,          // GQA dK, dV from the group's first query head only
  kRmsEpsOutsideRsqrt,     // RMSNorm x / (sqrt(mean(x^2)) + eps)
  kGemmaWNotOnePlusW,      // Gemma's x_hat (1 + w) computed as x_hat w
  kOlmo2NormPerHead,       // OLMo2's across-heads RMSNorm done per head
  kQwen3WeightBeforeCast,  // round_s(x_hat w) instead of round_s(x_hat) w
  kFixedScaleInverted,     // fixed logit scale s applied as 1 / s
  kSoftcapDropped,         // the logit softcap not applied (issue 34)
  kWindowLeftOffByOne,     // the window's left side one key too wide
  kWindowRightOffByOne,    // the window's right side one key too wide
  kRopeHeadZeroOnly,       // RoPE applied to head 0 only (vLLM #51049)
  kRopePartialWrongDims,   // partial rotary paired as (e, e + D/2)
  kRopeNormSkipped,        // the norm skipped where RoPE is fused
  kRopePairingConfused,    // half-split and interleaved swapped
  kRopeDecodeFromZero,     // q positions from 0, not kv_len - q_len
  kSinkIndexFromRow,       // sink of row (h, i) read at (h q_len + i) % H
  // Shape bugs (issue 33): each is wrong only in one region of the shape
  // model (validation/coverage.h) and bit for bit the unmutated copy
  // elsewhere; only the default run's covering array reaches them.
  kStaleDqHeadDim256,     // D >= 256, batch b >= 1: dQ half reads batch b-1's
  kHalfBlockTailDq,       // q_len % 128 == 64: tail block's dQ with delta 0
  kLongMaskedRunNan,      // last 128 keys of a seeing row masked: NaN
  kGqaPaperNoGroupSum,    // paper entry with GQA: dK, dV of the first head
  kHeadDim1SignedNorm,    // D == 1: ||x|| taken as x (negative rows clamped)
  kPadZeroMeansUnpadded,  // key length 0 read as no padding
  kMqaPackedRowsCausal,   // MQA: heads packed as rows, causal on packed row
  kSplitKvNoRescale,      // q_len <= 16, kv_len > 256: chunks not rescaled
  kBatchOverThreadsDg,    // batch > threads: a thread's dg share overwritten
};

enum class MutantKind {
  kFormula,    // issue 5: a wrong formula, O(1) errors
  kPrecision,  // issue 15: small errors that an accuracy verdict must catch
  // Correct values whose bits depend on the thread count: no accuracy
  // verdict can see it (its results are those of the reversed control);
  // only the Determinism property catches it.
  kDeterminism,
};
const char* name(MutantKind k);  // "formula", "precision", "determinism"

struct MutantInfo {
  Bug bug;
  const char* name;         // the registry target, e.g. "inv_sqrt_d"
  const char* description;  // what the bug is and where real kernels had it
  Precision precision;      // the storage mode it is registered at
  MutantKind kind;
  // Where the mutant's outputs are correct values (any accuracy verdict must
  // pass them there), or nullptr: it is wrong on every input that triggers
  // it. Two of issue 5's bugs are regime bugs: a softmax without max
  // subtraction is exact until exp overflows, and a thread-dependent
  // summation order only changes bits.
  const char* correct_when = nullptr;
  // Formulation mutants (issue 16): the formulation whose cases exercise the
  // bug (a preset name, or "gqa"); nullptr for the paper-formulation mutants.
  // These entries implement every formulation (the formulation control's
  // wrapper with one bug); the property table's paper-formulation
  // properties cannot see their bugs, so the mutation test proves them on
  // the formulation's own cases (mutation_test.cc, FormulationMutants).
  const char* formulation = nullptr;
  // Shape mutants (issue 33): the region of the shape model where the bug
  // lives, named by its dimension (e.g. "head_dim >= 256 with batch >= 2"),
  // or nullptr. Wrong only there, and bit for bit the unmutated copy on
  // every other problem: the default run catches them on its covering
  // array's cases (cli/tests/shape_mutants_test.cc); the property table's
  // generators need not reach their regions (mutation_test.cc reports them
  // without requiring a kill).
  const char* region = nullptr;
};
const std::vector<MutantInfo>& mutant_list();

// Every mutant as an entry "mutant:<name>:<precision>", in mutant_list()
// order.
const Registry& mutant_registry();

// The unmutated copy (Control::kPlain) at any precision, "mutant:none:<p>",
// outside both registries: `qknorm-check mutants` compares a surviving
// mutant's outputs with it bit for bit, which tells a bug the suite's inputs
// never trigger (identical outputs) from one its verdict misses. It declares
// GQA for the paper's formulation, as gqa_paper_no_group_sum does (the
// copies' GQA loops sum dK, dV over each group): the shape tests judge it on
// the GQA cases that mutant fails.
const Backend& unmutated(Precision p);

// Legitimate arithmetic variants of the unmutated copy.
enum class Control {
  kPlain,     // the copy as written: left-to-right sums, no FMA
  kReversed,  // every sum right to left (key tiles last to first)
  kPairwise,  // every sum pairwise (the forward over a whole row at once)
  kBlocked,   // every sum in blocks of 16 (key tiles of 16), partial sums added
  kFma,       // every product-sum as std::fma
  kExp2Ulp,   // std::exp moved 2 ulp up or down (deterministic)
  kF32Accum,  // 16-bit storage: P.V, row sums and dV accumulated in f32
  // Every formulation (issue 16) by the wrapper of formulation_mutants.cc
  // with no bug: the formulation mutants' copy, shown correct.
  kFormulation,
};

struct ControlInfo {
  Control control;
  const char* name;  // the registry target, e.g. "pairwise"
  const char* description;
  std::vector<Precision> precisions;  // where it is registered
};
const std::vector<ControlInfo>& control_list();

// Every control as an entry "control:<name>:<precision>", in control_list()
// order: each must pass every property and the default suite, so that the
// mutants are caught for their bug and not for a flaw of the copy, and so
// that the verdict is shown to accept legitimate arithmetic.
const Registry& control_registry();

// The wrapper of formulation_mutants.cc as an entry "<family>:<name>:<p>":
// `bug` active (one of the formulation bugs) or none (the control).
std::unique_ptr<Backend> make_formulation_entry(const char* family,
                                                const char* name,
                                                Precision precision, Bug bug,
                                                bool active);

}  // namespace qknorm::property

#endif  // QKNORM_MUTANTS_MUTANTS_H_
