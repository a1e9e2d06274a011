// One table of {value, "name"} per small enum, read both ways: name() for
// printing and parse for options and files. Each enum's names are then
// listed once, so the printed name and the accepted spelling cannot drift.
// Header-only (constexpr), part of the shared interface: core/, mutants/,
// validation/, cli/ and bench/ use it without linking one another.
#ifndef QKNORM_NAME_TABLE_H_
#define QKNORM_NAME_TABLE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace qknorm {

template <typename E>
struct NamedValue {
  E value;
  const char* name;
};

// The name of `v` in `table`, `absent` for a value the table does not list.
template <typename E, size_t N>
constexpr const char* name_in(const NamedValue<E> (&table)[N], E v,
                              const char* absent = "?") {
  for (const NamedValue<E>& row : table)
    if (row.value == v) return row.name;
  return absent;
}

// Sets *out to the value named `s`; false (and *out untouched) if none is.
template <typename E, size_t N>
bool parse_in(const NamedValue<E> (&table)[N], std::string_view s, E* out) {
  for (const NamedValue<E>& row : table) {
    if (s == row.name) {
      *out = row.value;
      return true;
    }
  }
  return false;
}

// "a, b, c": the accepted names, for an error message.
template <typename E, size_t N>
std::string names_in(const NamedValue<E> (&table)[N]) {
  std::string s;
  for (const NamedValue<E>& row : table) {
    if (!s.empty()) s += ", ";
    s += row.name;
  }
  return s;
}

}  // namespace qknorm

#endif  // QKNORM_NAME_TABLE_H_
