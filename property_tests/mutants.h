// Deliberately broken backends, registered only in the test binaries: each
// carries one bug that real attention / normalization kernels have had. The
// mutation test (mutation_test.cc) runs the property table on every mutant
// and requires that each is caught.
//
// The mutants are small, self-contained copies of reference-style loops
// (test code, independent of reference/), templated on the arithmetic type
// (float for the f32/bf16/f16 storage modes, double for f64) and read and
// write strided storage exactly as a production entry does.
#ifndef QKNORM_PROPERTY_TESTS_MUTANTS_H_
#define QKNORM_PROPERTY_TESTS_MUTANTS_H_

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
};

struct MutantInfo {
  Bug bug;
  const char* name;         // the registry target, e.g. "inv_sqrt_d"
  const char* description;  // what the bug is and where real kernels had it
  Precision precision;      // the storage mode it is registered at
};
const std::vector<MutantInfo>& mutant_list();

// Every mutant as an entry "mutant:<name>:<precision>", in mutant_list()
// order. Never part of qknorm::all_backends().
const Registry& mutant_registry();
// The same loops with the bug switched off, at every precision
// ("mutant:control:<prec>"): must pass every property, so that each mutant is
// caught for its bug and not for a flaw of the copy.
const Registry& control_registry();

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_MUTANTS_H_
