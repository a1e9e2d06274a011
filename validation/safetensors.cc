#include "validation/safetensors.h"

#include <nlohmann/json.hpp>
#include <set>

#include "qknorm/error.h"
#include "qknorm/name_table.h"

namespace qknorm::validation {
namespace {

[[noreturn]] void fail(std::string_view source, const std::string& rule) {
  throw Error(std::string(source), {}, rule);
}

// The safetensors dtype strings of the formats a tensor file may hold.
constexpr NamedValue<Precision> kDtypeNames[] = {
    {Precision::kF64, "F64"},
    {Precision::kF32, "F32"},
    {Precision::kF16, "F16"},
    {Precision::kBF16, "BF16"},
};

bool parse_dtype(const std::string& s, Precision* p) {
  return parse_in(kDtypeNames, s, p);
}

const char* dtype_name(Precision p) { return name_in(kDtypeNames, p); }

uint64_t as_u64(const nlohmann::json& v, std::string_view source,
                const std::string& what) {
  if (!v.is_number_unsigned() &&
      !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail(source,
         what + " must be a non-negative integer (got " + v.dump() + ")");
  return v.get<uint64_t>();
}

}  // namespace

std::vector<HostTensor> parse_safetensors(std::string_view bytes,
                                          std::string_view source) {
  if (bytes.size() < 8)
    fail(source, "truncated: shorter than the 8-byte header size");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8)
    fail(source,
         "header claims " + std::to_string(n) + " bytes but the file holds " +
             std::to_string(bytes.size() - 8) + " after the size field");
  if (n > kMaxSafetensorsHeader)
    fail(source, "header of " + std::to_string(n) +
                     " bytes exceeds the format's limit of " +
                     std::to_string(kMaxSafetensorsHeader));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const nlohmann::json::exception& e) {
    fail(source, std::string("bad header: not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(source, "bad header: not a JSON object");
  const std::string_view data = bytes.substr(8 + n);
  std::vector<HostTensor> out;
  for (const auto& [key, info] : header.items()) {
    if (key == "__metadata__") {
      if (!info.is_object())
        fail(source, "bad header: __metadata__ is not an object");
      continue;
    }
    const std::string where = "tensor '" + key + "': ";
    if (!info.is_object())
      fail(source, "bad header: " + where + "entry is not an object");
    if (!info.contains("dtype") || !info["dtype"].is_string())
      fail(source, "bad header: " + where + "missing string 'dtype'");
    if (!info.contains("shape") || !info["shape"].is_array())
      fail(source, "bad header: " + where + "missing list 'shape'");
    if (!info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      fail(source,
           "bad header: " + where + "'data_offsets' must be [begin, end]");
    HostTensor t;
    t.name = key;
    const std::string dtype = info["dtype"].get<std::string>();
    if (!parse_dtype(dtype, &t.dtype))
      fail(source, where + "unsupported dtype '" + dtype +
                       "' (supported: F64, F32, F16, BF16)");
    for (const auto& d : info["shape"]) {
      const uint64_t v = as_u64(d, source, where + "shape dimension");
      if (v > static_cast<uint64_t>(INT64_MAX))
        fail(source, where + "shape dimension too large");
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const size_t eb = element_bytes(t.dtype);
    const int64_t numel = checked_numel(t.shape, eb, source);
    const uint64_t begin =
        as_u64(info["data_offsets"][0], source, where + "data_offsets[0]");
    const uint64_t end =
        as_u64(info["data_offsets"][1], source, where + "data_offsets[1]");
    if (begin > end) fail(source, where + "data_offsets begin > end");
    if (end > data.size())
      fail(source, where + "data_offsets end " + std::to_string(end) +
                       " lies past the data block (" +
                       std::to_string(data.size()) +
                       " bytes): truncated file or bad offsets");
    const uint64_t need = static_cast<uint64_t>(numel) * eb;
    if (end - begin != need)
      fail(source, where + "shape " + t.shape_text() + " of " + dtype +
                       " needs " + std::to_string(need) +
                       " bytes but data_offsets span " +
                       std::to_string(end - begin));
    t.values = decode_elements(t.dtype, data.data() + begin, numel);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<HostTensor> read_safetensors_file(const std::string& path) {
  return parse_safetensors(read_file_bytes(path), path);
}

std::string write_safetensors(const std::vector<HostTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  std::set<std::string> names;
  for (const HostTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" ||
        !names.insert(t.name).second)
      throw Error(
          t.name, {},
          "safetensors names must be unique, non-empty, not __metadata__");
    if (static_cast<int64_t>(t.values.size()) != t.numel())
      throw Error(t.name, {},
                  "values hold " + std::to_string(t.values.size()) +
                      " elements, shape " + t.shape_text() + " needs " +
                      std::to_string(t.numel()));
    const size_t begin = data.size();
    data += encode_elements(t.dtype, t.values);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] =
        static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return out + h + data;
}

void write_safetensors_file(const std::string& path,
                            const std::vector<HostTensor>& tensors) {
  write_file_bytes(path, write_safetensors(tensors));
}

}  // namespace qknorm::validation
