#include "validation/tensor_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "qknorm/error.h"

namespace qknorm::validation {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostTensor make_host_tensor(std::string name, Precision dtype,
                            std::vector<int64_t> shape,
                            const std::function<double(int64_t)>& value) {
  HostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  const int64_t n = t.numel();
  t.values.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t.values.push_back(value(i));
  return t;
}

std::string HostTensor::shape_text() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw Error(path, {}, std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) throw Error(path, {}, "read failed");
  return std::move(s).str();
}

void write_file_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary);
  if (!f)
    throw Error(
        path, {},
        std::string("cannot open for writing: ") + std::strerror(errno));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(path, {}, "write failed");
}

int64_t checked_numel(const std::vector<int64_t>& shape, size_t elem_bytes,
                      std::string_view source) {
  const int64_t limit =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(elem_bytes);
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw Error(std::string(source), {},
                  "shape dimension " + std::to_string(i) + " is negative (" +
                      std::to_string(shape[i]) + ")");
    if (shape[i] != 0 && n > limit / shape[i])
      throw Error(std::string(source), {}, "shape's element count overflows");
    n *= shape[i];
  }
  return n;
}

std::vector<double> decode_elements(Precision dtype, const char* raw, int64_t n,
                                    bool big_endian) {
  const size_t eb = element_bytes(dtype);
  std::vector<double> out(static_cast<size_t>(n));
  alignas(8) unsigned char elem[8];
  for (size_t i = 0; i < out.size(); ++i) {
    std::memcpy(elem, raw + i * eb, eb);  // raw may be unaligned
    if (big_endian)
      for (size_t a = 0, b = eb - 1; a < b; ++a, --b)
        std::swap(elem[a], elem[b]);
    out[i] = decode(dtype, elem, 0);
  }
  return out;
}

std::string encode_elements(Precision dtype, const std::vector<double>& v) {
  const size_t eb = element_bytes(dtype);
  std::string out(v.size() * eb, '\0');
  alignas(8) unsigned char elem[8];
  for (size_t i = 0; i < v.size(); ++i) {
    encode(dtype, v[i], elem, 0);
    std::memcpy(out.data() + i * eb, elem, eb);
  }
  return out;
}

}  // namespace qknorm::validation
