// Internal to the diagnoses (diagnose.cc: the entry points, the masked
// rows, 16-bit arithmetic and the parameter gradients; diagnose_rows.cc: the
// row patterns, norm range, GQA and the tail block): the judged fields and
// their failing rows, shared by both.
#ifndef QKNORM_VALIDATION_DIAGNOSE_INTERNAL_H_
#define QKNORM_VALIDATION_DIAGNOSE_INTERNAL_H_

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "validation/diagnose.h"
#include "validation/judge.h"
#include "validation/operands.h"

namespace qknorm::validation::diag {

// Share of the failing elements (or rows) a pattern must explain: "all or
// nearly all". A few elements of another cause (the tail of a distribution
// near the bound) must not hide the main one.
constexpr double kMost = 0.9;

template <class... Args>
std::string format(const char* f, Args... args) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

// One judged field: its table, the entry's values and the failing elements
// (as the verdict judges them: judge_element).
struct Judged {
  const ToleranceTable* t = nullptr;
  std::vector<double> actual;
  std::vector<size_t> failing;
  // Row (b, h, n) of element i as ((b H + h) rows + n) over the whole
  // tensor (a sampled table's index_of gives the element's place).
  int64_t row(size_t i) const {
    const int64_t flat =
        t->index_of.empty() ? static_cast<int64_t>(i) : t->index_of[i];
    return flat / t->cols;
  }
  // "[b,h,n]" of a row.
  std::string row_text(int64_t r) const {
    const int64_t n = r % t->rows, bh = r / t->rows;
    return format("[%lld,%lld,%lld]", (long long)(bh / t->H),
                  (long long)(bh % t->H), (long long)n);
  }
};

struct Fields {
  std::vector<Judged> all;
  const Judged* find(Field f) const {
    for (const Judged& j : all)
      if (j.t->field == f) return &j;
    return nullptr;
  }
  bool fails(Field f) const {
    const Judged* j = find(f);
    return j != nullptr && !j->failing.empty();
  }
  // Judged, and no element fails.
  bool passes(Field f) const {
    const Judged* j = find(f);
    return j != nullptr && j->failing.empty();
  }
  bool passes_if_judged(Field f) const { return !fails(f); }
  // "dk, dv" of the failing fields among fs.
  std::string failing_names(std::initializer_list<Field> fs) const {
    std::string s;
    for (Field f : fs)
      if (fails(f)) s += (s.empty() ? "" : ", ") + std::string(name(f));
    return s;
  }
  std::string judged_passing_names(std::initializer_list<Field> fs) const {
    std::string s;
    for (Field f : fs)
      if (passes(f)) s += (s.empty() ? "" : ", ") + std::string(name(f));
    return s;
  }
  int64_t failing_count(std::initializer_list<Field> fs) const {
    int64_t n = 0;
    for (Field f : fs)
      if (const Judged* j = find(f))
        n += static_cast<int64_t>(j->failing.size());
    return n;
  }
};

template <class Pick>
Fields collect(const std::vector<ToleranceTable>& tables, Pick pick) {
  Fields fs;
  for (const ToleranceTable& t : tables) {
    Judged j;
    j.t = &t;
    j.actual = pick(t.field);
    for (size_t i = 0; i < t.expected.size(); ++i) {
      const double a = i < j.actual.size() ? j.actual[i] : NAN;
      if (!passes(judge_element(t, i, a).cls)) j.failing.push_back(i);
    }
    fs.all.push_back(std::move(j));
  }
  return fs;
}
inline double value(const Judged& j, size_t i) {
  return i < j.actual.size() ? j.actual[i] : NAN;
}

// Elements of `fields` failing in fs whose value is within its bound of
// `alt` (the same field's values of a modified oracle): {matched, total}.
std::pair<int64_t, int64_t> matches(
    const Fields& fs, std::initializer_list<Field> fields,
    const std::function<const std::vector<LD>*(Field)>& alt);

inline bool q_side(Field f) {
  return f == Field::kO || f == Field::kLse || f == Field::kDq;
}
inline bool k_side(Field f) { return f == Field::kDk || f == Field::kDv; }

// The failing rows of one side (query: o, lse, dq; key: dk, dv), marked
// over the side's rows, and the first failing element's text.
struct FailingRows {
  std::vector<char> mark;
  int64_t count = 0;
  std::string first;
};
FailingRows failing_rows(const Fields& fs, bool query, int64_t rows);

struct RangeRows {
  std::vector<char> far;  // per tensor row (b, h, n) of the side
  int64_t over = 0, under = 0;
  int64_t first = -1;
};

// The rows out of range on both sides, and the rows that are one or read
// one through the softmax (a query row attending to such a key or being
// one; a key row seen by such a query row or being one).
struct RangeInfo {
  RangeRows qr, kr;
  std::vector<char> q_read, k_read;
  bool any() const { return qr.over + qr.under + kr.over + kr.under > 0; }
};
RangeInfo range_info(const AttentionCase& c, Precision s);
std::string range_text(const RangeRows& qr, const RangeRows& kr, Precision cf);

// The row patterns (diagnose_rows.cc; diagnose.h states each trigger).
void diagnose_norm_range(const AttentionCase& c, Precision s,
                         const RangeInfo& ri, const Fields& fs,
                         std::vector<Diagnosis>* out);
void diagnose_gqa(const AttentionCase& c, const Fields& fs,
                  std::vector<Diagnosis>* out);
void diagnose_tail_block(const AttentionCase& c, const Fields& fs,
                         const std::vector<int64_t>& declared,
                         std::vector<Diagnosis>* out);

}  // namespace qknorm::validation::diag

#endif  // QKNORM_VALIDATION_DIAGNOSE_INTERNAL_H_
