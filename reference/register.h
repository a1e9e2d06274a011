#ifndef QKNORM_REFERENCE_REGISTER_H_
#define QKNORM_REFERENCE_REGISTER_H_
#include "qknorm/backend.h"
namespace qknorm::reference {
// Adds reference:f64, reference:f32, reference:bf16, reference:f16. The f32
// and 16-bit entries are the "naive same-precision" baselines of the
// tolerance rule: the reference algorithm in f32 math on the stored inputs,
// with every output rounded to the storage format.
void register_backends(Registry& r);

// The reference entry at precision p, the naive same-precision baseline of
// the tolerance rule (validation's naive_for): the very object
// register_backends adds, so that a registry entry e is the baseline iff
// e == &naive_backend(e->precision()). Built once, never destroyed.
const Backend& naive_backend(Precision p);
}  // namespace qknorm::reference
#endif  // QKNORM_REFERENCE_REGISTER_H_
