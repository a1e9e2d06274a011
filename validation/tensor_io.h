// Host tensors read from and written to other frameworks' files (.npy,
// .safetensors): the common value type and the byte-level helpers the
// format readers share.
//
// Contract of every reader in validation/npy.h and validation/safetensors.h:
// it parses a byte buffer it never reads past, and any malformed input (bad
// magic, truncated or unparsable header, unsupported dtype, bad shape, data
// shorter or longer than the header claims) throws qknorm::Error whose
// tensor() is the source name given (the file name) and whose rule() says
// what is wrong. No input makes it crash, over-read or allocate more than the
// buffer's size plus the decoded doubles (which the header's element count
// can only claim once that count is checked against the bytes present).
#ifndef QKNORM_VALIDATION_TENSOR_IO_H_
#define QKNORM_VALIDATION_TENSOR_IO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "qknorm/precision.h"

namespace qknorm::validation {

struct HostTensor {
  std::string name;                   // safetensors key, or the .npy file stem
  Precision dtype = Precision::kF32;  // storage type in the file
  std::vector<int64_t> shape;         // row-major (C order); {} is a scalar
  std::vector<double> values;  // decoded exactly (every dtype fits double)

  int64_t numel() const;
  // "[2, 8, 72, 64]"
  std::string shape_text() const;
};

// A tensor `name` of `dtype` and `shape` whose element i (row-major) is
// value(i), as written (no rounding): the files tests and the corpus
// generator write.
HostTensor make_host_tensor(std::string name, Precision dtype,
                            std::vector<int64_t> shape,
                            const std::function<double(int64_t)>& value);

// Whole file as bytes; throws Error(path, "cannot open ...") on failure.
std::string read_file_bytes(const std::string& path);
void write_file_bytes(const std::string& path, std::string_view bytes);

// Element count of `shape`, throwing Error(source, ...) on a negative
// dimension or an int64 / byte-size overflow for `elem_bytes`-byte elements.
int64_t checked_numel(const std::vector<int64_t>& shape, size_t elem_bytes,
                      std::string_view source);

// Decodes n little-endian elements of `dtype` from `raw` (no alignment
// needed). `big_endian` swaps bytes first (npy '>' descriptors).
std::vector<double> decode_elements(Precision dtype, const char* raw, int64_t n,
                                    bool big_endian = false);
// Encodes (rounding to nearest even) to little-endian bytes.
std::string encode_elements(Precision dtype, const std::vector<double>& v);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_TENSOR_IO_H_
