// libFuzzer target for the file readers of validation/ (.npy and
// .safetensors, validation/tensor_io.h).
//
// Input: first byte & 1 selects the format (0 .npy, 1 .safetensors); the
// remaining bytes are the file. Checks (the error contract of tensor_io.h):
// - parsing either returns tensors or throws qknorm::Error whose tensor() is
//   the source name; no other exception, no crash, over-read (ASan sees the
//   exactly sized input) or leak, and no allocation beyond what libFuzzer's
//   -malloc_limit_mb allows;
// - every tensor returned is consistent: values.size() == numel(), and its
//   data fit in the file (numel * element size <= input size);
// - writing what was read and reading it back gives the same names, dtypes,
//   shapes and values (NaN matches NaN; payloads may be requieted).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "qknorm/error.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::fuzz {
namespace {

using validation::HostTensor;

constexpr char kSource[] = "fuzz-input";

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;  // also tells -0 from +0
}

void check_consistent(const HostTensor& t, size_t input_size) {
  if (static_cast<int64_t>(t.values.size()) != t.numel())
    fail("tensor values do not match its shape",
         t.name + " " + t.shape_text() + " holds " +
             std::to_string(t.values.size()) + " values");
  if (t.values.size() * element_bytes(t.dtype) > input_size)
    fail("tensor holds more data than the file",
         t.name + " " + t.shape_text() + " from " + std::to_string(input_size) +
             " bytes");
}

void check_same(const HostTensor& a, const HostTensor& b, bool names) {
  if ((names && a.name != b.name) || a.dtype != b.dtype || a.shape != b.shape ||
      a.values.size() != b.values.size())
    fail(
        "round trip changed a tensor's name, dtype or shape",
        a.name + " " + a.shape_text() + " -> " + b.name + " " + b.shape_text());
  for (size_t i = 0; i < a.values.size(); ++i)
    if (!same_value(a.values[i], b.values[i]))
      fail("round trip changed a value",
           a.name + "[" + std::to_string(i) +
               "]: " + std::to_string(a.values[i]) + " -> " +
               std::to_string(b.values[i]));
}

// Parses with `parse`, which must return or throw qknorm::Error(kSource).
template <class F>
bool parse_checked(F&& parse, const char* what) {
  try {
    parse();
    return true;
  } catch (const Error& e) {
    if (e.tensor() != kSource)
      fail(std::string(what) + ": Error names the wrong source",
           std::string("what(): ") + e.what());
    return false;
  } catch (const std::exception& e) {
    fail(std::string(what) + ": exception other than qknorm::Error",
         std::string("what(): ") + e.what());
  }
}

void fuzz_npy(std::string_view file) {
  HostTensor t;
  if (!parse_checked([&] { t = validation::parse_npy(file, kSource); }, "npy"))
    return;
  check_consistent(t, file.size());
  const std::string again = validation::write_npy(t);
  HostTensor u;
  if (!parse_checked([&] { u = validation::parse_npy(again, kSource); },
                     "npy re-read"))
    fail("write_npy output does not parse", t.shape_text());
  check_same(t, u, false);
}

bool writable_names(const std::vector<HostTensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].name.empty() || ts[i].name == "__metadata__") return false;
    for (size_t j = 0; j < i; ++j)
      if (ts[i].name == ts[j].name) return false;
  }
  return true;
}

void fuzz_safetensors(std::string_view file) {
  std::vector<HostTensor> ts;
  if (!parse_checked([&] { ts = validation::parse_safetensors(file, kSource); },
                     "safetensors"))
    return;
  for (const HostTensor& t : ts) check_consistent(t, file.size());
  if (!writable_names(ts)) return;
  std::string again;
  try {
    again = validation::write_safetensors(ts);
  } catch (const std::exception& e) {
    fail("write_safetensors refused tensors it had read",
         std::string("what(): ") + e.what());
  }
  std::vector<HostTensor> us;
  if (!parse_checked(
          [&] { us = validation::parse_safetensors(again, kSource); },
          "safetensors re-read"))
    fail("write_safetensors output does not parse");
  if (us.size() != ts.size()) fail("round trip changed the tensor count");
  // The writer may order tensors differently: match by name.
  for (const HostTensor& t : ts) {
    const HostTensor* m = nullptr;
    for (const HostTensor& u : us)
      if (u.name == t.name) m = &u;
    if (m == nullptr) fail("round trip lost a tensor", t.name);
    check_same(t, *m, true);
  }
}

}  // namespace
}  // namespace qknorm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // A copy without the selector byte, in an exactly sized heap block, so an
  // over-read past the end of the file is an ASan report.
  // (std::string would keep short inputs inline, out of ASan's sight.)
  const std::vector<char> copy(data + 1, data + size);
  const std::string_view file(copy.data(), copy.size());
  if (data[0] & 1)
    qknorm::fuzz::fuzz_safetensors(file);
  else
    qknorm::fuzz::fuzz_npy(file);
  return 0;
}
