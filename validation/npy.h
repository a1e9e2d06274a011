// NumPy .npy files (format versions 1.0, 2.0, 3.0), as written by
// numpy.save and torch.Tensor.numpy(): the magic "\x93NUMPY", a version, a
// little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0), then a Python
// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), }
// and the raw C-order data.
//
// Supported descr: '<f8' '<f4' '<f2' (also '=', '|' and big-endian '>'):
// f64, f32 and f16 (numpy has no bf16: use safetensors for that).
// fortran_order True is refused (save np.ascontiguousarray(x)).
// See validation/tensor_io.h for the error contract.
#ifndef QKNORM_VALIDATION_NPY_H_
#define QKNORM_VALIDATION_NPY_H_

#include <string>
#include <string_view>

#include "validation/tensor_io.h"

namespace qknorm::validation {

// Parses a whole .npy file held in `bytes`; `source` names it in errors.
// The result's name is empty (read_npy_file sets the file stem).
HostTensor parse_npy(std::string_view bytes, std::string_view source);
HostTensor read_npy_file(const std::string& path);

// Format 1.0 bytes of t (dtype f64/f32/f16; bf16 throws Error).
std::string write_npy(const HostTensor& t);
void write_npy_file(const std::string& path, const HostTensor& t);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_NPY_H_
