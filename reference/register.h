#ifndef QKNORM_REFERENCE_REGISTER_H_
#define QKNORM_REFERENCE_REGISTER_H_
#include "qknorm/backend.h"
namespace qknorm::reference {
// Adds reference:f64, reference:f32, reference:bf16, reference:f16. The f32
// and 16-bit entries are the "naive same-precision" baselines of the
// tolerance rule: the reference algorithm in f32 math on the stored inputs,
// with every output rounded to the storage format.
void register_backends(Registry& r);
}  // namespace qknorm::reference
#endif  // QKNORM_REFERENCE_REGISTER_H_
