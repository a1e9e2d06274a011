#include "validation/npy.h"

#include <cstring>
#include <limits>
#include <optional>

#include "qknorm/error.h"

namespace qknorm::validation {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void fail(std::string_view source, const std::string& rule) {
  throw Error(std::string(source), {}, rule);
}

// A cursor over the header's Python dict literal. Every read is bounds
// checked; anything unexpected fails with the offset and what was expected.
class DictParser {
 public:
  DictParser(std::string_view text, std::string_view source)
      : s_(text), source_(source) {}

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' ||
                              s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool peek(char c) {
    skip_ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  void expect(char c) {
    if (!peek(c)) error(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal() {
    skip_ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"'))
      error("expected a quoted string");
    const char q = s_[i_++];
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) ++i_;
    if (i_ >= s_.size()) error("unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  bool boolean() {
    skip_ws();
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    error("expected True or False");
  }
  int64_t integer() {
    skip_ws();
    const size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const int digit = s_[i_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10)
        error("shape dimension too large");
      v = v * 10 + digit;
      ++i_;
    }
    // numpy writes Python ints, possibly with an 'L' suffix (Python 2).
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;
    if (i_ == start) error("expected a non-negative integer");
    return v;
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> v;
    while (!peek(')')) {
      v.push_back(integer());
      if (peek(',')) {
        ++i_;
      } else if (!peek(')')) {
        error("expected ',' or ')' in shape");
      }
    }
    ++i_;
    return v;
  }
  [[noreturn]] void error(const std::string& what) {
    fail(source_, "bad header: " + what + " at header offset " +
                      std::to_string(i_) +
                      " (header: " + std::string(s_.substr(0, 120)) + ")");
  }
  size_t pos() const { return i_; }
  size_t size() const { return s_.size(); }

 private:
  std::string_view s_;
  std::string_view source_;
  size_t i_ = 0;
};

struct Descr {
  Precision dtype;
  bool big_endian;
};

Descr parse_descr(const std::string& d, std::string_view source) {
  if (d.size() == 3 &&
      (d[0] == '<' || d[0] == '>' || d[0] == '=' || d[0] == '|') &&
      d[1] == 'f') {
    const bool be = d[0] == '>';
    if (d[2] == '8') return {Precision::kF64, be};
    if (d[2] == '4') return {Precision::kF32, be};
    if (d[2] == '2') return {Precision::kF16, be};
  }
  fail(source, "unsupported dtype '" + d +
                   "' (supported: '<f8' float64, '<f4' float32, '<f2' float16; "
                   "numpy has no "
                   "bfloat16: use .safetensors for BF16)");
}

}  // namespace

HostTensor parse_npy(std::string_view bytes, std::string_view source) {
  if (bytes.size() < kMagicLen + 2 ||
      std::memcmp(bytes.data(), kMagic, kMagicLen) != 0)
    fail(source, "not a .npy file (missing the \\x93NUMPY magic)");
  const unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t len_bytes;
  if (major == 1) {
    len_bytes = 2;
  } else if (major == 2 || major == 3) {
    len_bytes = 4;
  } else {
    fail(source, "unsupported .npy format version " + std::to_string(major) +
                     "." +
                     std::to_string(static_cast<unsigned char>(bytes[7])));
  }
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix)
    fail(source, "truncated: file ends inside the header length");
  size_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i)
    header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i]))
                  << (8 * i);
  if (header_len > bytes.size() - prefix)
    fail(source, "truncated: header claims " + std::to_string(header_len) +
                     " bytes but the file holds " +
                     std::to_string(bytes.size() - prefix) +
                     " after the prefix");
  DictParser p(bytes.substr(prefix, header_len), source);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  p.expect('{');
  while (!p.peek('}')) {
    const std::string key = p.string_literal();
    p.expect(':');
    if (key == "descr") {
      if (!p.peek('\'') && !p.peek('"'))
        p.error(
            "descr is not a simple dtype string (structured dtypes are not "
            "supported)");
      descr = p.string_literal();
    } else if (key == "fortran_order") {
      fortran = p.boolean();
    } else if (key == "shape") {
      shape = p.tuple();
    } else {
      p.error("unknown key '" + key + "'");
    }
    if (p.peek(',')) {
      p.expect(',');
    } else if (!p.peek('}')) {
      p.error("expected ',' or '}'");
    }
  }
  p.expect('}');
  if (!descr || !fortran || !shape)
    p.error("missing one of the keys descr, fortran_order, shape");
  const Descr d = parse_descr(*descr, source);
  if (*fortran)
    fail(source,
         "fortran_order=True is not supported (save np.ascontiguousarray(x))");
  HostTensor t;
  t.dtype = d.dtype;
  t.shape = *shape;
  const size_t eb = element_bytes(d.dtype);
  const int64_t n = checked_numel(t.shape, eb, source);
  const size_t data_at = prefix + header_len;
  const size_t have = bytes.size() - data_at;
  const size_t need = static_cast<size_t>(n) * eb;
  if (have < need)
    fail(source, "truncated data: header claims shape " + t.shape_text() +
                     " of " + std::string(name(d.dtype)) + " = " +
                     std::to_string(need) + " bytes but the file holds " +
                     std::to_string(have));
  if (have > need)
    fail(source, "the file holds " + std::to_string(have - need) +
                     " bytes after the data that shape " + t.shape_text() +
                     " claims");
  t.values = decode_elements(d.dtype, bytes.data() + data_at, n, d.big_endian);
  return t;
}

HostTensor read_npy_file(const std::string& path) {
  HostTensor t = parse_npy(read_file_bytes(path), path);
  std::string stem = path.substr(path.find_last_of('/') + 1);
  if (const size_t dot = stem.rfind('.'); dot != std::string::npos)
    stem.resize(dot);
  t.name = stem;
  return t;
}

std::string write_npy(const HostTensor& t) {
  const char* descr = nullptr;
  switch (t.dtype) {
    case Precision::kF64:
      descr = "<f8";
      break;
    case Precision::kF32:
      descr = "<f4";
      break;
    case Precision::kF16:
      descr = "<f2";
      break;
    case Precision::kBF16:
      throw Error(t.name, {},
                  "npy has no bfloat16 dtype: write .safetensors instead");
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape.size(); ++i)
    shape += std::to_string(t.shape[i]) +
             (t.shape.size() == 1 || i + 1 < t.shape.size() ? "," : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad so that the data starts at a multiple of 64 bytes, ending in '\n'.
  const size_t total = kMagicLen + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, kMagicLen);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  if (static_cast<int64_t>(t.values.size()) != t.numel())
    throw Error(t.name, {},
                "values hold " + std::to_string(t.values.size()) +
                    " elements, shape " + t.shape_text() + " needs " +
                    std::to_string(t.numel()));
  return out + encode_elements(t.dtype, t.values);
}

void write_npy_file(const std::string& path, const HostTensor& t) {
  write_file_bytes(path, write_npy(t));
}

}  // namespace qknorm::validation
