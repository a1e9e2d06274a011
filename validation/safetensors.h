// .safetensors files (Hugging Face format): an 8-byte little-endian header
// size N, N bytes of JSON
//   {"q": {"dtype": "F32", "shape": [2, 8, 72, 64], "data_offsets": [0,
//   294912]},
//    ..., "__metadata__": {"key": "string", ...}}
// then the data block; offsets are relative to its start.
//
// Supported dtypes: F64, F32, F16, BF16. Checks: N fits the file and is at
// most kMaxSafetensorsHeader; the JSON parses and is an object of objects;
// every tensor's dtype is supported, its shape a list of non-negative
// integers, its data_offsets [begin, end] with begin <= end <= data size and
// end - begin = numel * element size. See validation/tensor_io.h for the
// error contract.
#ifndef QKNORM_VALIDATION_SAFETENSORS_H_
#define QKNORM_VALIDATION_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "validation/tensor_io.h"

namespace qknorm::validation {

// The reference implementation's own limit on the header (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Every tensor of the file, in header order.
std::vector<HostTensor> parse_safetensors(std::string_view bytes,
                                          std::string_view source);
std::vector<HostTensor> read_safetensors_file(const std::string& path);

// Bytes of a file holding `tensors` (names must be unique and non-empty),
// header padded with spaces to a multiple of 8 as the format recommends.
std::string write_safetensors(const std::vector<HostTensor>& tensors);
void write_safetensors_file(const std::string& path,
                            const std::vector<HostTensor>& tensors);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_SAFETENSORS_H_
