// Entries that round their attention's intermediates where real kernels do
// and declare it (or not) as a compute contract (qknorm/contract.h, issue
// 31): the test entries of the contract rule (tests/contract_test.cc). Like
// the mutants (mutants.h) they are self-contained loops in double that round
// each intermediate explicitly (never reference/, simd/ or blas_path/
// code), read and write strided storage as a production entry does, and are
// never part of qknorm::all_backends().
#ifndef QKNORM_MUTANTS_CONTRACT_ENTRIES_H_
#define QKNORM_MUTANTS_CONTRACT_ENTRIES_H_

#include <memory>

#include "qknorm/backend.h"

namespace qknorm::property {

enum class ContractKernel {
  // Eager 16-bit PyTorch (forward and autograd backward): every elementwise
  // result rounded to the storage format, every reduction (the norm's sum
  // of squares, the matmuls, the softmax's row sum) accumulated in f32 and
  // its result rounded to storage. Honest under `storage`.
  kEagerStorage,
  // kEagerStorage with the softmax row sum accumulated in bf16 by chopping
  // (truncation instead of round to nearest, in a format narrower than f16):
  // worse than storage rounding. Run at f16, its sum of ~0.1-sized terms
  // stagnates once the spacing of bf16 passes the terms.
  kEagerRowSumBf16Chop,
  // f32 compute whose P.V accumulator is f16 (ggml's one-row flash kernel:
  // f32 products, an f16 running sum; the row sum in f32).
  kPvAccF16,
  // kPvAccF16 that also rounds P to f16 before its products (ggml's
  // non-flash path), declaring only the accumulator.
  kPvAccF16RoundsP,
};

// The entry "contract:<kernel>:<precision>" running `kernel` at storage
// `s`, declaring `declared` (Backend::contract()). Supports the paper's
// formulation (qknorm, l2 norm, one g; any mask; no GQA).
std::unique_ptr<Backend> make_contract_entry(ContractKernel kernel, Precision s,
                                             const ComputeContract& declared);

}  // namespace qknorm::property

#endif  // QKNORM_MUTANTS_CONTRACT_ENTRIES_H_
