#include "qknorm/contract.h"

namespace qknorm {
namespace {

constexpr std::string_view kKeys[kRoundingPoints] = {
    "q", "kv", "logits", "p", "pv_acc", "out", "compute"};

std::string_view format_name(PointFormat f) {
  switch (f) {
    case PointFormat::kCompute:
      return "compute";
    case PointFormat::kStorage:
      return "storage";
    case PointFormat::kF64:
      return "f64";
    case PointFormat::kF32:
      return "f32";
    case PointFormat::kBF16:
      return "bf16";
    case PointFormat::kF16:
      return "f16";
  }
  return "?";
}

bool parse_format(std::string_view s, PointFormat* out) {
  for (PointFormat f :
       {PointFormat::kCompute, PointFormat::kStorage, PointFormat::kF64,
        PointFormat::kF32, PointFormat::kBF16, PointFormat::kF16})
    if (s == format_name(f)) {
      *out = f;
      return true;
    }
  return false;
}

// *error = quoted + what (appended: GCC 12 warns -Wrestrict on "'" + s).
bool fail(std::string* error, std::string_view quoted, std::string_view what) {
  if (error != nullptr) {
    std::string m(1, '\'');
    m.append(quoted);
    m.push_back('\'');
    m.append(what);
    error->swap(m);
  }
  return false;
}

}  // namespace

std::string_view key(RoundingPoint r) { return kKeys[static_cast<int>(r)]; }

ComputeContract ComputeContract::storage() {
  ComputeContract c;
  c.at.fill(PointFormat::kStorage);
  return c;
}

Precision ComputeContract::format(RoundingPoint r, Precision s) const {
  switch ((*this)[r]) {
    case PointFormat::kCompute:
      return compute_format(s);
    case PointFormat::kStorage:
      return s;
    case PointFormat::kF64:
      return Precision::kF64;
    case PointFormat::kF32:
      return Precision::kF32;
    case PointFormat::kBF16:
      return Precision::kBF16;
    case PointFormat::kF16:
      return Precision::kF16;
  }
  return compute_format(s);
}

std::string ComputeContract::describe() const {
  if (is_default()) return "f32-accumulate";
  if (*this == storage()) return "storage";
  std::string s;
  for (int i = 0; i < kRoundingPoints; ++i) {
    if (at[static_cast<size_t>(i)] == PointFormat::kCompute) continue;
    if (!s.empty()) s += ",";
    s.append(kKeys[i]);
    s += '=';
    s.append(format_name(at[static_cast<size_t>(i)]));
  }
  return s;
}

bool parse_contract(std::string_view spec, ComputeContract* out,
                    std::string* error) {
  ComputeContract c;
  bool first = true;
  if (spec.empty()) return fail(error, "", ": empty contract");
  while (true) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (!first)
        return fail(error, item,
                    ": a preset must come first; items are key=format");
      if (item == "f32-accumulate") {
        c = ComputeContract::f32_accumulate();
      } else if (item == "storage") {
        c = ComputeContract::storage();
      } else {
        return fail(error, item,
                    ": unknown preset (f32-accumulate, storage, or "
                    "key=format items: q, kv, logits, p, pv_acc, out, "
                    "compute)");
      }
    } else {
      const std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
      int idx = -1;
      for (int i = 0; i < kRoundingPoints; ++i)
        if (k == kKeys[i]) idx = i;
      if (idx < 0)
        return fail(error, k,
                    ": unknown rounding point (q, kv, logits, p, pv_acc, "
                    "out, compute)");
      PointFormat f;
      if (!parse_format(v, &f))
        return fail(error, item,
                    ": the format must be f64, f32, bf16, f16, storage or "
                    "compute");
      c.at[static_cast<size_t>(idx)] = f;
    }
    first = false;
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  *out = c;
  return true;
}

}  // namespace qknorm
