// Running a registry entry on a case: the inputs encoded to the entry's
// storage format (rows padded as the case says, outputs prefilled with NaN),
// forward then backward through the checked_* front doors, the outputs
// decoded to double. And the naive same-precision baseline.
#ifndef QKNORM_VALIDATION_RUN_H_
#define QKNORM_VALIDATION_RUN_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "qknorm/backend.h"
#include "validation/case.h"
#include "validation/field.h"

namespace qknorm::validation {

class AttentionBuffers;  // validation/buffers.h

// The o and lse an entry's backward read (issue 31: a failure is reported
// where it happens). A NaN or inf in the entry's forward O, or a NaN, +inf
// or -inf lse where a finite one is defined, is no valid backward input:
// the forward fields are judged as computed (they FAIL with their counts)
// and the backward reads the oracle's instead, or does not run.
enum class BackwardInput {
  kEntry,       // the entry's own forward outputs (always, when valid)
  kOracle,      // the oracle's O rounded to the entry's storage and lse to its
                // compute format: the backward fields are judged on them
  kNotRun,      // no oracle at hand (or its O overflows storage): the backward
                // did not run and its fields are "not judged"
  kRecomputes,  // the entry declares that its backward recomputes O and lse
                // (Backend::backward_recomputes): it was given o = 0 and
                // lse = 0, and its fields are judged (a backward that reads
                // them after all FAILs)
};

// The backward note of kRecomputes.
inline constexpr const char* kRecomputesNote =
    "the entry declares that its backward recomputes O and lse: it was "
    "given o = 0 and lse = 0";

// The backward note of a forward-only entry's results (its gradient fields
// read "not judged: forward only ...").
inline constexpr const char* kForwardOnlyNote =
    "forward only (the entry implements no attention backward)";

// A guard (or row-pad, or sequence-tail) element found changed after a call
// (validation/buffers.h lays the guards out).
struct GuardViolation {
  std::string tensor;
  // Offset from the view's first element, in elements: negative before it,
  // >= size after it, otherwise a row-pad gap or a sequence's tail rows.
  int64_t index = 0;
  std::string where;  // "1 past the view's last element o[0,0,5,7]", ...
  double value = 0;   // the element decoded to double
  uint64_t bits = 0;  // its bits
  Precision prec = Precision::kF64;
  // "o: guard element at index 48 (1 past the view's last element
  //  o[0,0,5,7]) was written: holds 0.5 (bits 0x3fe0000000000000), guard
  //  pattern 0x7ff800000000005a"
  std::string message() const;
};

// An output whose elements hold an input's poison: the entry read outside
// an input view and the NaN it read reached this output (IEEE 754
// arithmetic propagates a NaN operand's payload; none makes this one).
struct PoisonedOutput {
  std::string tensor;
  int64_t count = 0;  // elements holding the poison
  std::string first;  // the first of them in address order: "o[0,1,4,0]"
  uint64_t bits = 0;  // its bits
};

// What the guards and the poison showed about an entry's memory accesses
// (run_attention, run_scalenorm; validation/buffers.h). A written guard
// fails the case whatever the outputs (judge.h: AgreementReport::
// out_of_bounds); a poisoned output is the diagnosis of the failures it
// causes (validation/diagnose.h, out-of-bounds-read).
struct MemoryEvidence {
  // The first written guard of each tensor, and the call after which it
  // was found ("forward" / "backward"): the first call that wrote one
  // (after a forward that wrote a guard the backward does not run).
  std::vector<GuardViolation> writes;
  std::string write_call;
  std::vector<PoisonedOutput> poisoned;
};

// The backward note of a run whose forward wrote outside its views.
inline constexpr const char* kForwardWroteOutsideNote =
    "the forward wrote outside its views (the backward did not run)";

// Outputs decoded to double, dense.
struct AttentionResult {
  std::vector<double> o, lse, dq, dk, dv;
  double dg = 0;
  // The formulation's parameter gradients (empty when it has none).
  std::vector<double> dq_weight, dk_weight, dq_bias, dk_bias;
  // The sinks' gradient (empty without sinks).
  std::vector<double> d_sinks;
  // What the backward read; o and lse above are the entry's own whatever it
  // read.
  BackwardInput backward_input = BackwardInput::kEntry;
  // Why the entry's own o and lse were not fed to the backward ("o[1,0,0,0]:
  // element is NaN (finite input required)"); "" for kEntry.
  std::string backward_note;
  MemoryEvidence memory;
};
struct ScaleNormResult {
  std::vector<double> y, dx;
  double dg = 0;
  MemoryEvidence memory;
};
// One field of a result (dg: a span of one). Attention fields only; a
// ScaleNorm field of an AttentionResult is empty.
std::span<const double> field_values(const AttentionResult& r, Field f);
std::span<double> field_values(AttentionResult& r, Field f);

// Encodes the (already rounded) inputs to the entry's storage, runs forward
// then backward (fed the entry's own o and lse: see BackwardInput) through
// the checked_* front doors, decodes. Output buffers are prefilled with NaN
// so that an element a kernel forgets to write is caught. Throws
// qknorm::Error on invalid input. run_attention has no oracle: where the
// entry's forward output is no valid backward input, the backward does not
// run (kNotRun); run_attention_fed feeds it `oracle`'s O and lse then
// (kOracle), as every caller that judges the result does.
AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg = {},
                              Workspace* ws = nullptr);
// The exact forward outputs a backward reads where the entry's own are no
// valid backward input: an oracle's o and lse, dense, as OracleAttention
// holds them (validation/check.h, LazyOracle). Empty o: none at hand.
struct ExactForward {
  std::span<const long double> o, lse;
};
// Asked for only then, after the entry's forward validated the case: an
// oracle is made when first needed.
using OracleSource = std::function<ExactForward()>;
AttentionResult run_attention_fed(const Backend& b, const AttentionCase& c,
                                  const OracleSource& oracle,
                                  const ExecConfig& cfg = {},
                                  Workspace* ws = nullptr);

// Between a forward and a backward on `bufs` (run_attention, the tester's
// run_guarded): leaves the entry's o and lse where they are a valid
// backward input (kEntry); otherwise stores the oracle's there (kOracle),
// or returns kNotRun (the caller must not run the backward) with no oracle
// (null, or an empty o) or an oracle O that overflows the storage format.
// `forward` holds the entry's own o and lse, to judge. `oracle` is called
// only when needed.
struct BackwardFeed {
  BackwardInput input = BackwardInput::kEntry;
  std::string note;
  AttentionResult forward;
};
// The feed of a forward-only entry (Backend::has_attention_backward false):
// the backward does not run (kNotRun) and its fields are "not judged"
// (kForwardOnlyNote); the forward's outputs as `bufs` hold them.
BackwardFeed forward_only_feed(const AttentionBuffers& bufs);
// The feed of an entry that declares its backward recomputes O and lse
// (Backend::backward_recomputes): kRecomputes, o and lse in `bufs`
// overwritten with zeros (the forward's own kept in `forward`, to judge).
BackwardFeed recompute_feed(AttentionBuffers* bufs);
BackwardFeed feed_backward(const AttentionCase& c, const OracleSource& oracle,
                           AttentionBuffers* bufs);
// The decoded outputs after the backward (or, kNotRun, instead of it): the
// entry's own o and lse, the backward's outputs, the feed.
AttentionResult fed_result(const AttentionBuffers& bufs, BackwardFeed feed);
ScaleNormResult run_scalenorm(const Backend& b, const ScaleNormCase& c,
                              const ExecConfig& cfg = {},
                              Workspace* ws = nullptr);
// Forward only (no dO needed); returns o and lse in the result.
AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg = {},
                                      Workspace* ws = nullptr);
// run_attention (backward true) or run_attention_forward on buffers built
// once for the case: `fresh` holds what AttentionBuffers(c, b.precision())
// would (validation/buffers.h) and has not been handed to an entry; the run
// works on a copy of it, the same bytes (inputs, NaN outputs, poison),
// instead of encoding the case again. The fuzzers run every entry of a
// precision on one case and encode it once (issue 32). Throws
// std::invalid_argument if its precision or shapes are not the entry's and
// the case's.
AttentionResult run_attention_on(const Backend& b, const AttentionCase& c,
                                 const AttentionBuffers& fresh, bool backward,
                                 const ExecConfig& cfg = {},
                                 Workspace* ws = nullptr);

// The naive same-precision baseline for precision p: reference:<p>.
const Backend& naive_for(Precision p);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_RUN_H_
