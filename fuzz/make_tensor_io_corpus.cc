// Writes the seed corpus of tensor_io_fuzzer (fuzz/corpus/tensor_io_fuzzer/):
// valid .npy and .safetensors files from the project's own writers, then
// hand-made malformed variants. Each seed is a selector byte (0 .npy,
// 1 .safetensors) followed by the file.
//
//   fuzz_make_tensor_io_corpus OUT_DIR | --check DIR   (as fuzz_make_corpus)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/seed_files.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace {

using qknorm::Precision;
using qknorm::validation::HostTensor;

struct Seed {
  std::string name, bytes;
};

HostTensor tensor(const std::string& name, Precision dtype,
                  std::vector<int64_t> shape) {
  static const double specials[] = {0.0,
                                    -0.0,
                                    1.5,
                                    -2.25,
                                    65504.0,
                                    1e-7,
                                    std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN()};
  return qknorm::validation::make_host_tensor(
      name, dtype, std::move(shape), [](int64_t i) { return specials[i % 8]; });
}

// An npy file with a hand-written header (format 1.0, padded to 64 bytes).
std::string npy_raw(const std::string& dict, const std::string& data,
                    int major = 1) {
  std::string h = dict;
  const size_t len_bytes = major == 1 ? 2 : 4;
  while ((10 + (len_bytes - 2) + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string f = "\x93NUMPY";
  f += static_cast<char>(major);
  f += '\0';
  for (size_t i = 0; i < len_bytes; ++i)
    f += static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return f + h + data;
}

std::string u64le(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::vector<Seed> seeds() {
  using qknorm::validation::write_npy;
  using qknorm::validation::write_safetensors;
  std::vector<Seed> s;
  auto npy = [&](const std::string& n, const std::string& b) {
    s.push_back({"npy_" + n, std::string(1, '\0') + b});
  };
  auto st = [&](const std::string& n, const std::string& b) {
    s.push_back({"st_" + n, std::string(1, '\1') + b});
  };
  npy("f32_2x3", write_npy(tensor("", Precision::kF32, {2, 3})));
  npy("f64_4", write_npy(tensor("", Precision::kF64, {4})));
  npy("f16_2x2x2", write_npy(tensor("", Precision::kF16, {2, 2, 2})));
  npy("scalar", write_npy(tensor("", Precision::kF32, {})));
  npy("empty_0x3", write_npy(tensor("", Precision::kF32, {0, 3})));
  npy("v2_header", npy_raw("{'descr': '<f4', 'fortran_order': False, "
                           "'shape': (2,), }",
                           std::string(8, '\0'), 2));
  npy("big_endian_f8", npy_raw("{'descr': '>f8', 'fortran_order': False, "
                               "'shape': (1,), }",
                               std::string("\x3f\xf0\0\0\0\0\0\0", 8)));
  npy("fortran_order", npy_raw("{'descr': '<f4', 'fortran_order': True, "
                               "'shape': (1,), }",
                               std::string(4, '\0')));
  npy("int_dtype", npy_raw("{'descr': '<i4', 'fortran_order': False, "
                           "'shape': (1,), }",
                           std::string(4, '\0')));
  npy("truncated_data", npy_raw("{'descr': '<f4', 'fortran_order': False, "
                                "'shape': (3, 5), }",
                                std::string(7, '\0')));
  npy("huge_shape", npy_raw("{'descr': '<f8', 'fortran_order': False, "
                            "'shape': (4294967296, 4294967296), }",
                            ""));
  npy("header_len_past_end", std::string("\x93NUMPY\x01\x00\xff\xff{", 11));
  npy("bad_magic", std::string("\x93NUMPX\x01\x00\x00\x00", 10));
  std::vector<HostTensor> ts = {
      tensor("q", Precision::kF32, {2, 3}), tensor("k", Precision::kBF16, {3}),
      tensor("v", Precision::kF16, {1, 2}), tensor("g", Precision::kF64, {})};
  st("four_dtypes", write_safetensors(ts));
  st("empty", write_safetensors({}));
  const std::string meta =
      "{\"__metadata__\": {\"format\": \"pt\"}, \"x\": {\"dtype\": \"F32\", "
      "\"shape\": [1], \"data_offsets\": [0, 4]}}";
  st("metadata", u64le(meta.size()) + meta + std::string(4, '\0'));
  const std::string overlap =
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
      " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
  st("aliased_offsets", u64le(overlap.size()) + overlap + std::string(4, '\0'));
  const std::string bad_off =
      "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 0]}}";
  st("offsets_reversed",
     u64le(bad_off.size()) + bad_off + std::string(8, '\0'));
  const std::string neg =
      "{\"a\": {\"dtype\": \"F16\", \"shape\": [-1], \"data_offsets\": [0, "
      "0]}}";
  st("negative_shape", u64le(neg.size()) + neg);
  const std::string i8 =
      "{\"a\": {\"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [0, 1]}}";
  st("int_dtype", u64le(i8.size()) + i8 + std::string(1, '\0'));
  st("header_size_huge", u64le(0xffffffffffffull) + "{}");
  st("not_json", u64le(4) + "{\"a\"");
  st("truncated_size", std::string("\x10\0\0", 3));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const auto cmd = qknorm::fuzz::parse_seed_command(argc, argv);
  if (!cmd) return 2;
  const std::filesystem::path dir = cmd->dir / "tensor_io_fuzzer";
  int bad = 0;
  const std::vector<Seed> all = seeds();
  for (const Seed& s : all)
    if (!qknorm::fuzz::write_or_check_seed(dir / s.name, s.bytes, cmd->check))
      ++bad;
  std::fprintf(stderr, "%zu seeds %s %s\n", all.size(),
               cmd->check ? "checked in" : "written to", dir.c_str());
  return bad ? 1 : 0;
}
