#include "validation/diagnose.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "qknorm/name_table.h"
#include "reference/reference.h"
#include "validation/judge.h"
#include "validation/operands.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {
namespace {

// Share of the failing elements (or rows) a pattern must explain: "all or
// nearly all". A few elements of another cause (the tail of a distribution
// near the bound) must not hide the main one.
constexpr double kMost = 0.9;

constexpr NamedValue<DiagnosisKind> kKindNames[] = {
    {DiagnosisKind::kNormRange, "norm-range"},
    {DiagnosisKind::kMaskedRowNonFinite, "masked-row-nonfinite"},
    {DiagnosisKind::kSixteenBit, "16-bit"},
    {DiagnosisKind::kGqaGroupSum, "gqa-group-sum"},
    {DiagnosisKind::kTailBlock, "tail-block"},
    {DiagnosisKind::kParameterGradient, "parameter-gradient"},
};

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

double value(const Judged& j, size_t i) {
  return i < j.actual.size() ? j.actual[i] : NAN;
}

// Elements of `fields` failing in fs whose value is within its bound of
// `alt` (the same field's values of a modified oracle): {matched, total}.
std::pair<int64_t, int64_t> matches(
    const Fields& fs, std::initializer_list<Field> fields,
    const std::function<const std::vector<LD>*(Field)>& alt) {
  int64_t m = 0, n = 0;
  for (Field f : fields) {
    const Judged* j = fs.find(f);
    if (j == nullptr) continue;
    const std::vector<LD>* x = alt(f);
    for (size_t i : j->failing) {
      ++n;
      if (x == nullptr || i >= x->size() || !j->t->index_of.empty()) continue;
      const double a = value(*j, i), e = static_cast<double>((*x)[i]);
      if (std::isfinite(a) && std::isfinite(e) &&
          std::fabs(a - e) <= element_bound(*j->t, i))
        ++m;
    }
  }
  return {m, n};
}

bool q_side(Field f) {
  return f == Field::kO || f == Field::kLse || f == Field::kDq;
}
bool k_side(Field f) { return f == Field::kDk || f == Field::kDv; }

// The failing rows of one side (query: o, lse, dq; key: dk, dv), marked
// over the side's rows, and the first failing element's text.
struct FailingRows {
  std::vector<char> mark;
  int64_t count = 0;
  std::string first;
};
FailingRows failing_rows(const Fields& fs, bool query, int64_t rows) {
  FailingRows r;
  r.mark.assign(static_cast<size_t>(rows), 0);
  for (const Judged& j : fs.all) {
    if (query ? !q_side(j.t->field) : !k_side(j.t->field)) continue;
    for (size_t i : j.failing) {
      const int64_t row = j.row(i);
      if (row < 0 || row >= rows) continue;
      if (r.first.empty())
        r.first = std::string(name(j.t->field)) + j.t->index_text(i);
      if (!r.mark[static_cast<size_t>(row)]) ++r.count;
      r.mark[static_cast<size_t>(row)] = 1;
    }
  }
  return r;
}

// ---- (a) the norm's sum of squares out of the compute format's range ----

struct RangeRows {
  std::vector<char> far;  // per tensor row (b, h, n) of the side
  int64_t over = 0, under = 0;
  int64_t first = -1;
};

// The rows of side (0: q, 1: k) whose normalization row's sum of squares
// exceeds the compute format's largest finite, or falls below its smallest
// normal where the clamp does not govern the divisor.
RangeRows range_rows(const AttentionCase& c, int side, Precision cf) {
  const AttentionProblem& p = c.problem;
  const NormRows nr = norm_rows(p, side);
  const std::vector<double>& x = side == 0 ? c.q : c.k;
  RangeRows r;
  const int64_t trows = nr.B * nr.H * nr.N;
  r.far.assign(static_cast<size_t>(trows), 0);
  if (p.variant != Variant::kQKNorm || p.norm.kind == NormKind::kNone) return r;
  const LD big = max_finite(cf), tiny = min_normal(cf);
  std::vector<char> norm_far(static_cast<size_t>(nr.rows()), 0);
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    LD s2 = 0;
    for (int64_t e = 0; e < nr.len(); ++e) {
      const LD v = x[static_cast<size_t>(nr.at(r0, e))];
      s2 += v * v;
    }
    const LD scale = p.norm.kind == NormKind::kL2
                         ? std::sqrt(s2)
                         : s2 / static_cast<LD>(nr.len());
    const bool over = s2 > big;
    const bool under =
        s2 > 0 && s2 < tiny && scale > p.eps && p.norm.kind != NormKind::kLayer;
    r.over += over;
    r.under += under;
    norm_far[static_cast<size_t>(r0)] = over || under;
  }
  for (int64_t t = 0; t < trows; ++t) {
    const size_t nrow = row_of(nr, static_cast<size_t>(t * nr.D));
    r.far[static_cast<size_t>(t)] = norm_far[nrow];
    if (norm_far[nrow] && r.first < 0) r.first = t;
  }
  return r;
}

// c with every row of `q_far` / `k_far` (tensor rows) set to zero: its
// x_hat is 0, what an unscaled norm whose sum of squares overflows gives.
AttentionCase zero_rows(const AttentionCase& c, const RangeRows& qr,
                        const RangeRows& kr) {
  AttentionCase z = c;
  const auto D = static_cast<size_t>(c.problem.head_dim);
  for (size_t t = 0; t < qr.far.size(); ++t)
    if (qr.far[t]) std::fill_n(z.q.begin() + t * D, D, 0.0);
  for (size_t t = 0; t < kr.far.size(); ++t)
    if (kr.far[t]) std::fill_n(z.k.begin() + t * D, D, 0.0);
  return z;
}

std::string range_text(const RangeRows& qr, const RangeRows& kr, Precision cf) {
  const std::string fmt(name(cf));
  std::string s;
  if (qr.over + kr.over > 0)
    s = format("||x|| > %.2g, where the %s sum of squares overflows",
               std::sqrt(max_finite(cf)), fmt.c_str());
  if (qr.under + kr.under > 0)
    s += (s.empty() ? "" : ", or ") +
         format(
             "||x|| < %.2g above eps, where the %s sum of squares "
             "underflows",
             std::sqrt(min_normal(cf)), fmt.c_str());
  return s;
}

// The rows out of range on both sides, and the rows that are one or read
// one through the softmax (a query row attending to such a key or being
// one; a key row seen by such a query row or being one).
struct RangeInfo {
  RangeRows qr, kr;
  std::vector<char> q_read, k_read;
  bool any() const { return qr.over + qr.under + kr.over + kr.under > 0; }
};

RangeInfo range_info(const AttentionCase& c, Precision s) {
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  RangeInfo ri;
  ri.qr = range_rows(c, 0, cf);
  ri.kr = range_rows(c, 1, cf);
  const RangeRows &qr = ri.qr, &kr = ri.kr;
  std::vector<char>&q_read = ri.q_read, &k_read = ri.k_read;
  q_read.assign(qr.far.size(), 0);
  k_read = kr.far;
  if (!ri.any()) return ri;
  const int64_t H = p.heads, Hk = kv_heads_of(p), G = H / Hk, Nq = p.q_len,
                Nk = p.kv_len, B = p.batch;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const size_t qi = static_cast<size_t>((b * H + h) * Nq + i);
        const int64_t kb = (b * Hk + h / G) * Nk;
        bool reads = qr.far[qi];
        for (int64_t j = 0; j < Nk && !reads; ++j)
          reads = kr.far[static_cast<size_t>(kb + j)] &&
                  visible(p.mask, b, i, j, Nq, Nk);
        q_read[qi] = reads;
        if (!reads) continue;
        for (int64_t j = 0; j < Nk; ++j)
          if (visible(p.mask, b, i, j, Nq, Nk))
            k_read[static_cast<size_t>(kb + j)] = 1;
      }
  return ri;
}

void diagnose_norm_range(const AttentionCase& c, Precision s,
                         const RangeInfo& ri, const Fields& fs,
                         std::vector<Diagnosis>* out) {
  if (!ri.any()) return;
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  const RangeRows &qr = ri.qr, &kr = ri.kr;
  const int64_t H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len, Nk = p.kv_len,
                B = p.batch;
  const FailingRows fq = failing_rows(fs, true, B * H * Nq),
                    fk = failing_rows(fs, false, B * Hk * Nk);
  const int64_t failing = fq.count + fk.count;
  if (failing == 0) return;
  int64_t direct = 0, reading = 0;
  for (size_t t = 0; t < fq.mark.size(); ++t)
    if (fq.mark[t]) direct += qr.far[t], reading += ri.q_read[t];
  for (size_t t = 0; t < fk.mark.size(); ++t)
    if (fk.mark[t]) direct += kr.far[t], reading += ri.k_read[t];
  const std::string range = range_text(qr, kr, cf);
  auto row_text = [](const char* side, int64_t r, int64_t heads, int64_t n) {
    return format("%s[%lld,%lld,%lld]", side, (long long)(r / n / heads),
                  (long long)(r / n % heads), (long long)(r % n));
  };
  const std::string first = qr.first >= 0 ? row_text("q", qr.first, H, Nq)
                                          : row_text("k", kr.first, Hk, Nk);
  const bool over = qr.over + kr.over > 0;
  const std::string phrase = over && qr.under + kr.under > 0
                                 ? "norm overflow/underflow"
                             : over ? "norm overflow"
                                    : "norm underflow";
  const std::string counts =
      format("%lld q and %lld k rows of this case have %s (first %s)",
             (long long)(qr.over + qr.under), (long long)(kr.over + kr.under),
             range.c_str(), first.c_str());
  // (i) The forward equals x_hat = 0's on those rows.
  if (fs.fails(Field::kO) || fs.fails(Field::kLse)) {
    const AttentionCase z = zero_rows(c, qr, kr);
    std::array<std::vector<LD>, 4> store;
    const std::vector<LD> q = widen(z.q), k = widen(z.k), v = widen(z.v);
    std::vector<LD> o(q.size()), lse(static_cast<size_t>(B * H * Nq));
    reference::attention_forward<LD>(p, q.data(), k.data(), v.data(), o.data(),
                                     lse.data(), norm_args(z, &store));
    const auto [m, n] = matches(fs, {Field::kO, Field::kLse}, [&](Field f) {
      return f == Field::kO ? &o : &lse;
    });
    if (n > 0 && m >= kMost * n && reading >= kMost * failing) {
      out->push_back(
          {DiagnosisKind::kNormRange, phrase,
           format("%s: %s; the entry's o and lse equal what x_hat = 0 gives "
                  "for those rows on %lld of %lld failing elements, and %lld "
                  "of %lld failing rows are such rows or attend to one: they "
                  "normalize to 0 (an unscaled norm, as torch's F.normalize "
                  "in f32); scale the row before squaring",
                  phrase.c_str(), counts.c_str(), (long long)m, (long long)n,
                  (long long)reading, (long long)failing),
           0.97 * static_cast<double>(m) / static_cast<double>(n)});
      return;
    }
  }
  // (ii) The failing rows are those rows themselves.
  if (direct >= kMost * failing) {
    const bool all = direct == failing;
    out->push_back(
        {DiagnosisKind::kNormRange, phrase,
         format("%s: %s %lld failing rows (%s) are %s q/k rows with %s (%s): "
                "the norm or its backward mishandles rows whose "
                "sum of squares leaves the format's range; scale the row "
                "before squaring",
                phrase.c_str(), all ? "the" : "of the", (long long)failing,
                fs.failing_names({Field::kO, Field::kLse, Field::kDq,
                                  Field::kDk, Field::kDv})
                    .c_str(),
                all ? "exactly" : format("%lld", (long long)direct).c_str(),
                range.c_str(), counts.c_str()),
         0.9 * static_cast<double>(direct) / static_cast<double>(failing)});
  }
}

// ---- (b) NaN or inf on fully masked rows --------------------------------

void diagnose_masked(const AttentionCase& c, const OracleAttention& orc,
                     const Fields& fs, std::vector<Diagnosis>* out) {
  int64_t total = 0, masked = 0, spread = 0;
  std::vector<char> rows(orc.lse.size(), 0);
  int64_t nrows = 0;
  std::string first;
  for (const Judged& j : fs.all) {
    const bool q = q_side(j.t->field);
    for (size_t i : j.failing) {
      const double a = value(j, i);
      if (std::isfinite(a)) continue;
      if (!q) {
        ++spread;
        continue;
      }
      ++total;
      const int64_t r = j.row(i);
      if (r < 0 || r >= static_cast<int64_t>(orc.lse.size()) ||
          !std::isinf(orc.lse[static_cast<size_t>(r)]))
        continue;
      ++masked;
      if (!rows[static_cast<size_t>(r)]) ++nrows;
      rows[static_cast<size_t>(r)] = 1;
      if (first.empty())
        first = format("%s%s = %g", name(j.t->field),
                       j.t->index_text(static_cast<int64_t>(i)).c_str(), a);
    }
  }
  (void)c;
  if (masked == 0 || masked < kMost * total) return;
  out->push_back(
      {DiagnosisKind::kMaskedRowNonFinite, "NaN/inf on fully masked rows",
       format("NaN/inf on fully masked rows: %lld of %lld non-finite o/lse/dq "
              "failures sit on %lld fully masked query rows (first %s; there "
              "O = 0, dQ = 0 and lse = -inf)%s: guard the empty softmax (row "
              "max -inf, 0/0)",
              (long long)masked, (long long)total, (long long)nrows,
              first.c_str(),
              spread > 0 ? format("; %lld non-finite dk/dv elements follow "
                                  "from them",
                                  (long long)spread)
                               .c_str()
                         : ""),
       0.95 * static_cast<double>(masked) / static_cast<double>(total)});
}

// ---- (c) errors uniform at a 16-bit format's relative size ----------------

// Where a 16-bit format's unit roundoff over a sum of up to a few hundred
// terms puts err / M (measured: the f16 P.V plug-in 2^-11.8, bf16 P.V and dV
// accumulators 2^-8..2^-10): above what f32 arithmetic loses (2^-24
// sqrt(n)), below a formula bug's O(1). Values on a 16-bit grid (an f32
// entry's output exactly representable in f16 or bf16) are direct evidence
// and admit the wider window; without it the window starts at 2^-11, above
// the 2^-12..2^-16 of f32 kernels with a reduced-precision scalar (g or a
// rescale factor rounded to bf16, TF32 operands, a cheap exp), and the
// errors must be uniform (p90 / p10 <= 2^5) and beyond what the final
// rounding to storage explains (median margin >= 2).
constexpr double kGridLow = 0x1p-14, kLow = 0x1p-11, kHigh = 0x1p-6,
                 kSpread = 0x1p5;

void diagnose_sixteen_bit(const AttentionCase& c, const OracleAttention& orc,
                          Precision s, const RangeInfo& ri, const Fields& fs,
                          std::vector<Diagnosis>* out) {
  const double A = logit_amplitude(c);
  const bool wide_storage = s == Precision::kF32 || s == Precision::kF64;
  std::string fields, cause, evidence;
  double confidence = 0;
  // o, dv: the P.V-type sums whose magnitude M (sum of |terms|) is the
  // scale of an accumulator's rounding; lse on a grid only. (dq and dk sum
  // through the normalization backward: M is no such scale there.)
  // dV = P^T dO reads P through lse: where lse fails otherwise, dv's
  // errors are lse's, not an accumulator's.
  bool lse_ok = !fs.fails(Field::kLse);
  for (Field f : {Field::kLse, Field::kO, Field::kDv}) {
    const Judged* j = fs.find(f);
    if (j == nullptr || j->failing.empty() || !j->t->index_of.empty()) continue;
    if (f == Field::kDv && !lse_ok) continue;
    const std::vector<LD>* mag = f == Field::kO    ? &orc.o_mag
                                 : f == Field::kDv ? &orc.dv_mag
                                                   : nullptr;
    const ToleranceTable& t = *j->t;
    if (mag != nullptr && mag->size() != t.expected.size()) continue;
    // Rows that are or read a row out of the norm's range, where the norm
    // diagnosis holds (ri is empty otherwise), are its, not this one's.
    const std::vector<char>& reads = q_side(f) ? ri.q_read : ri.k_read;
    auto excluded = [&](size_t i) {
      const auto r = static_cast<size_t>(j->row(i));
      return r < reads.size() && reads[r];
    };
    int64_t judged = 0, near = 0;
    std::vector<char> rows(static_cast<size_t>(t.B * t.H * t.rows), 0);
    int64_t all_rows = 0;
    for (size_t i = 0; i < t.expected.size(); ++i) {
      if (!std::isfinite(t.expected[i]) || excluded(i)) continue;
      ++judged;
      const auto r = static_cast<size_t>(j->row(i));
      if (!rows[r]) ++all_rows;
      rows[r] = 1;
      if (judge_element(t, i, value(*j, i)).margin >= 0.5) ++near;
    }
    std::vector<double> rel, margin;
    std::fill(rows.begin(), rows.end(), 0);
    int64_t nrows = 0, nfail = 0, nonzero = 0, on_grid = 0;
    for (size_t i : j->failing) {
      if (excluded(i)) continue;
      ++nfail;
      const auto r = static_cast<size_t>(j->row(i));
      if (!rows[r]) ++nrows;
      rows[r] = 1;
      const double x = static_cast<double>(t.expected[i]), a = value(*j, i);
      const double M = mag != nullptr ? static_cast<double>((*mag)[i])
                                      : std::fabs(x) + std::fabs(A);
      if (!std::isfinite(a) || !std::isfinite(x) || !(M > 0)) continue;
      rel.push_back(std::fabs(a - x) / M);
      margin.push_back(judge_element(t, i, a).margin);
      if (a != 0) {
        ++nonzero;
        on_grid += round_to(Precision::kF16, a) == a ||
                   round_to(Precision::kBF16, a) == a;
      }
    }
    if (judged == 0 || 4 * nfail < judged || 2 * near < judged ||
        2 * nrows < all_rows || 2 * static_cast<int64_t>(rel.size()) < nfail)
      continue;
    auto quantile = [](std::vector<double> v, double q) {
      const auto k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k),
                       v.end());
      return v[k];
    };
    const double med = quantile(rel, 0.5), p10 = quantile(rel, 0.1),
                 p90 = quantile(rel, 0.9);
    const bool grid = wide_storage && nonzero > 0 && on_grid >= kMost * nonzero;
    const bool sized = grid ? med >= kGridLow && med <= kHigh
                            : mag != nullptr && med >= kLow && med <= kHigh &&
                                  p90 <= kSpread * p10 &&
                                  quantile(margin, 0.5) >= 2;
    if (!sized) continue;
    if (f == Field::kLse) lse_ok = true;
    if (fields.empty()) {
      cause = f == Field::kLse
                  ? "the softmax statistics (lse) computed or stored in 16 "
                    "bits (bf16/f16)"
              : f == Field::kO
                  ? "the softmax or P.V computed in 16 bits (bf16/f16)"
                  : "dV = P^T dO accumulated in 16 bits (bf16/f16)";
      evidence = format(
          "%lld of %lld %s elements fail, in %lld of %lld rows, with err/M a "
          "uniform 2^%.1f (median; 2^%.1f..2^%.1f from p10 to p90), M the "
          "magnitude the element sums%s",
          (long long)nfail, (long long)judged, name(f), (long long)nrows,
          (long long)all_rows, std::log2(med), std::log2(p10), std::log2(p90),
          grid ? format("; %lld of %lld of the entry's failing values lie on "
                        "the f16 or bf16 grid",
                        (long long)on_grid, (long long)nonzero)
                     .c_str()
               : "");
      confidence = (grid ? 0.9 : 0.8) * static_cast<double>(nfail) /
                   static_cast<double>(judged);
    }
    fields += (fields.empty() ? "" : ", ") + std::string(name(f));
  }
  if (fields.empty()) return;
  out->push_back(
      {DiagnosisKind::kSixteenBit, "16-bit arithmetic",
       format("16-bit arithmetic in %s: %s: the unit roundoff of f16 (2^-11) "
              "or bf16 (2^-8) over a short sum, not f32's (2^-24): %s",
              fields.c_str(), evidence.c_str(), cause.c_str()),
       confidence});
}

// ---- (d), (e ii) dK, dV against the oracle of a modified case ------------

// dk and/or dv fail while o, lse and dq pass.
bool only_dk_dv(const Fields& fs) {
  return (fs.fails(Field::kDk) || fs.fails(Field::kDv)) &&
         fs.passes(Field::kO) && fs.passes(Field::kLse) &&
         fs.passes(Field::kDq);
}

std::pair<int64_t, int64_t> dk_dv_matches(const Fields& fs,
                                          const AttentionCase& z) {
  const OracleAttention alt = oracle_attention(z);
  return matches(fs, {Field::kDk, Field::kDv},
                 [&](Field f) { return f == Field::kDk ? &alt.dk : &alt.dv; });
}

void diagnose_gqa(const AttentionCase& c, const Fields& fs,
                  std::vector<Diagnosis>* out) {
  const AttentionProblem& p = c.problem;
  const int64_t H = p.heads, G = H / kv_heads_of(p), Nq = p.q_len,
                D = p.head_dim;
  if (G <= 1 || !only_dk_dv(fs)) return;
  for (const int64_t keep : {int64_t{0}, G - 1}) {
    AttentionCase z = c;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        if (h % G != keep)
          std::fill_n(z.d_o.begin() + ((b * H + h) * Nq) * D, Nq * D, 0.0);
    const auto [m, n] = dk_dv_matches(fs, z);
    if (n == 0 || m < kMost * n) continue;
    out->push_back(
        {DiagnosisKind::kGqaGroupSum, "GQA group sum missing from dK/dV",
         format("GQA group sum missing from dK/dV: with %lld query heads per "
                "kv head, %s fail while o, lse, dq pass, and %lld of their "
                "%lld failing elements equal the oracle's dK/dV of query head "
                "%lld of each group alone (the other heads' dO zeroed): sum "
                "dK and dV over the group's query heads",
                (long long)G,
                fs.failing_names({Field::kDk, Field::kDv}).c_str(),
                (long long)m, (long long)n, (long long)keep),
         0.97 * static_cast<double>(m) / static_cast<double>(n)});
    return;
  }
}

// ---- (e) rows after the last full block ----------------------------------

std::vector<int64_t> block_candidates(const std::vector<int64_t>& declared) {
  std::vector<int64_t> out;
  for (int64_t b : declared)
    if (b >= 2 && std::find(out.begin(), out.end(), b) == out.end())
      out.push_back(b);
  for (int64_t b : {8, 16, 32, 64, 128})
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  return out;
}

// The first row after the last full block of `blk` in a sequence of `len`
// rows, or -1 if there is no partial block after a full one.
int64_t tail_start(int64_t len, int64_t blk) {
  if (len <= blk || len % blk == 0) return -1;
  return len / blk * blk;
}

// "16", "8 or 16", "16, 32 or 64": the block sizes that cut the same tail.
std::string sizes_text(const std::vector<int64_t>& v) {
  std::string t;
  for (size_t i = 0; i < v.size(); ++i)
    t += (i == 0              ? ""
          : i + 1 == v.size() ? " or "
                              : ", ") +
         std::to_string(v[i]);
  return t;
}

void diagnose_tail_block(const AttentionCase& c, const Fields& fs,
                         const std::vector<int64_t>& declared,
                         std::vector<Diagnosis>* out) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len;
  const FailingRows fq = failing_rows(fs, true, B * H * Nq),
                    fk = failing_rows(fs, false, B * Hk * Nk);
  const std::vector<int64_t> cands = block_candidates(declared);
  auto key_len = [&](int64_t b) {
    return p.mask.key_lengths.empty()
               ? Nk
               : std::min(Nk, p.mask.key_lengths[static_cast<size_t>(b)]);
  };
  // Key rows that failing query rows attend to: the backward reads the
  // entry's own O and lse, so a wrong query row spreads to those keys' dk
  // and dv; they are not evidence against a query-side tail.
  std::vector<char> seen(fk.mark.size(), 0);
  for (size_t r = 0; r < fq.mark.size(); ++r) {
    if (!fq.mark[r]) continue;
    const int64_t bh = static_cast<int64_t>(r) / Nq,
                  i = static_cast<int64_t>(r) % Nq, b = bh / H,
                  kb = (b * Hk + bh % H / (H / Hk)) * Nk;
    for (int64_t j = 0; j < Nk; ++j)
      if (visible(p.mask, b, i, j, Nq, Nk))
        seen[static_cast<size_t>(kb + j)] = 1;
  }
  bool k_spread = fk.count > 0 && fq.count > 0;
  for (size_t r = 0; r < fk.mark.size() && k_spread; ++r)
    k_spread = !fk.mark[r] || seen[r];
  // (i) Every failing row of each failing side after the last full block.
  if (fq.count + fk.count > 0) {
    int64_t best = -1;
    double best_frac = 2;
    std::vector<int64_t> same;  // every size that cuts best's tail
    for (int64_t blk : cands) {
      bool ok = true;
      double frac = 0;
      for (size_t r = 0; r < fq.mark.size() && ok; ++r) {
        if (!fq.mark[r]) continue;
        const int64_t t = tail_start(Nq, blk), n = static_cast<int64_t>(r) % Nq;
        ok = t > 0 && n >= t;
        if (ok) frac = std::max(frac, static_cast<double>(Nq - t) / Nq);
      }
      for (size_t r = 0; r < fk.mark.size() && ok && !k_spread; ++r) {
        if (!fk.mark[r]) continue;
        const int64_t b = static_cast<int64_t>(r) / (Hk * Nk),
                      n = static_cast<int64_t>(r) % Nk, len = key_len(b),
                      t = tail_start(len, blk);
        ok = t > 0 && n >= t && n < len;
        if (ok) frac = std::max(frac, static_cast<double>(len - t) / len);
      }
      if (ok && frac < best_frac) best = blk, best_frac = frac, same.clear();
      if (ok && frac == best_frac) same.push_back(blk);
    }
    // A random failing row lands in the tail with probability best_frac;
    // fewer than 1% of random patterns would put them all there.
    const double chance = std::pow(
        best_frac, static_cast<double>(fq.count + (k_spread ? 0 : fk.count)));
    if (best > 0 && chance <= 0.01) {
      const bool declared_b =
          std::find(declared.begin(), declared.end(), best) != declared.end();
      std::string where;
      if (fq.count > 0)
        where = format(
            "the %lld failing query rows (%s) are all rows >= %lld "
            "of q_len %lld",
            (long long)fq.count,
            fs.failing_names({Field::kO, Field::kLse, Field::kDq}).c_str(),
            (long long)tail_start(Nq, best), (long long)Nq);
      if (k_spread)
        where += format(
            "; %s fail on the keys those rows attend to (the "
            "backward reads the entry's O and lse)",
            fs.failing_names({Field::kDk, Field::kDv}).c_str());
      else if (fk.count > 0)
        where += (where.empty() ? "" : "; ") +
                 format(
                     "the %lld failing key rows (%s) all lie after the "
                     "last full block of each batch's keys",
                     (long long)fk.count,
                     fs.failing_names({Field::kDk, Field::kDv}).c_str());
      out->push_back(
          {DiagnosisKind::kTailBlock, "rows after the last full block",
           format("rows after the last full block of %s%s: %s (first %s), "
                  "every earlier row passes: the tail loop of a partial last "
                  "block",
                  sizes_text(same).c_str(),
                  declared_b
                      ? format(" (%lld declared by the entry)", (long long)best)
                            .c_str()
                      : "",
                  where.c_str(), (fq.count > 0 ? fq.first : fk.first).c_str()),
           0.9 * (1 - chance)});
      return;
    }
  }
  // (ii) dK/dV without the query rows after the last full block.
  if (!only_dk_dv(fs)) return;
  std::vector<int64_t> tried;
  for (int64_t blk : cands) {
    const int64_t t = tail_start(Nq, blk);
    if (t < 0 || std::find(tried.begin(), tried.end(), t) != tried.end())
      continue;
    if (tried.size() == 3) break;  // each try is an oracle evaluation
    tried.push_back(t);
    AttentionCase z = c;
    const int64_t D = p.head_dim;
    for (int64_t bh = 0; bh < B * H; ++bh)
      std::fill_n(z.d_o.begin() + (bh * Nq + t) * D, (Nq - t) * D, 0.0);
    const auto [m, n] = dk_dv_matches(fs, z);
    if (n == 0 || m < kMost * n) continue;
    std::vector<int64_t> same;
    for (int64_t b : cands)
      if (tail_start(Nq, b) == t) same.push_back(b);
    out->push_back(
        {DiagnosisKind::kTailBlock,
         "rows after the last full block (dK/dV reduction)",
         format("rows after the last full block of %s: %s fail while o, "
                "lse, dq pass, and %lld of their %lld failing elements equal "
                "the oracle's without query rows >= %lld of q_len %lld (their "
                "dO zeroed): the reduction over query blocks drops the partial "
                "last block",
                sizes_text(same).c_str(),
                fs.failing_names({Field::kDk, Field::kDv}).c_str(),
                (long long)m, (long long)n, (long long)t, (long long)Nq),
         0.95 * static_cast<double>(m) / static_cast<double>(n)});
    return;
  }
}

// ---- (f) a learned parameter's gradient alone ----------------------------

bool is_param(Field f) {
  return f == Field::kDg || f == Field::kScaleNormDg || f == Field::kDqWeight ||
         f == Field::kDkWeight || f == Field::kDqBias || f == Field::kDkBias;
}

void diagnose_parameter(const Fields& fs, std::initializer_list<Field> fwd,
                        std::vector<Diagnosis>* out) {
  std::string failing, detail;
  for (const Judged& j : fs.all) {
    if (j.failing.empty()) continue;
    if (!is_param(j.t->field)) return;
    failing += (failing.empty() ? "" : ", ") + std::string(name(j.t->field));
    if (detail.empty()) {
      const size_t i = j.failing.front();
      detail =
          j.t->expected.size() == 1
              ? format("%s = %.6g, expected %.6g", name(j.t->field),
                       value(j, i), static_cast<double>(j.t->expected[i]))
              : format("%lld of %lld %s elements", (long long)j.failing.size(),
                       (long long)j.t->expected.size(), name(j.t->field));
    }
  }
  if (failing.empty()) return;
  for (Field f : fwd)
    if (!fs.passes(f)) return;  // the forward must be judged and right
  std::string passing;
  for (const Judged& j : fs.all)
    if (!is_param(j.t->field))
      passing += (passing.empty() ? "" : ", ") + std::string(name(j.t->field));
  out->push_back(
      {DiagnosisKind::kParameterGradient,
       "gradient of a learned parameter (" + failing + ")",
       format("gradient of a learned parameter: %s fail(s) (%s) while %s "
              "pass: the forward and the input gradients are right, so the "
              "parameter's gradient (its reduction over heads, batches and "
              "rows, or its formula) is wrong",
              failing.c_str(), detail.c_str(), passing.c_str()),
       0.9});
}

void order(std::vector<Diagnosis>* d) {
  std::stable_sort(d->begin(), d->end(),
                   [](const Diagnosis& a, const Diagnosis& b) {
                     return a.confidence > b.confidence;
                   });
}

}  // namespace

const char* name(DiagnosisKind k) { return name_in(kKindNames, k); }

std::vector<Diagnosis> diagnose_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const std::vector<ToleranceTable>& tables, const AttentionResult& er,
    const std::vector<int64_t>& blocks) {
  const Fields fs = collect(tables, [&](Field f) {
    const std::span<const double> x = field_values(er, f);
    return std::vector<double>(x.begin(), x.end());
  });
  std::vector<Diagnosis> out;
  if (std::all_of(fs.all.begin(), fs.all.end(),
                  [](const Judged& j) { return j.failing.empty(); }))
    return out;
  const RangeInfo ri = range_info(c, s);
  diagnose_norm_range(c, s, ri, fs, &out);
  diagnose_masked(c, orc, fs, &out);
  // The rows the norm diagnosis explains are not evidence of 16-bit
  // arithmetic (their errors are of any size).
  const bool norm = !out.empty() && out[0].kind == DiagnosisKind::kNormRange;
  diagnose_sixteen_bit(c, orc, s, norm ? ri : RangeInfo{}, fs, &out);
  diagnose_gqa(c, fs, &out);
  diagnose_tail_block(c, fs, blocks, &out);
  diagnose_parameter(fs, {Field::kO, Field::kLse}, &out);
  order(&out);
  return out;
}

std::vector<Diagnosis> diagnose_scalenorm(
    const ScaleNormCase& c, Precision s, const OracleScaleNorm& orc,
    const std::vector<ToleranceTable>& tables, const ScaleNormResult& er) {
  (void)orc;
  const Fields fs = collect(tables, [&](Field f) -> std::vector<double> {
    if (f == Field::kY) return er.y;
    if (f == Field::kDx) return er.dx;
    return {er.dg};
  });
  std::vector<Diagnosis> out;
  if (std::all_of(fs.all.begin(), fs.all.end(),
                  [](const Judged& j) { return j.failing.empty(); }))
    return out;
  // (a) on ScaleNorm's rows: y = g x / max(||x||, eps).
  const Precision cf = compute_format(s);
  const int64_t R = c.problem.rows, L = c.problem.dim;
  // One side of RangeRows' kind: ScaleNorm's rows, its l2 norm's clamp.
  RangeRows xr, none;
  xr.far.assign(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) {
    LD s2 = 0;
    for (int64_t e = 0; e < L; ++e) {
      const LD v = c.x[static_cast<size_t>(r * L + e)];
      s2 += v * v;
    }
    const bool over = s2 > max_finite(cf),
               under = s2 > 0 && s2 < min_normal(cf) &&
                       std::sqrt(s2) > c.problem.eps;
    xr.over += over;
    xr.under += under;
    xr.far[static_cast<size_t>(r)] = over || under;
  }
  const std::vector<char>& far = xr.far;
  const int64_t nfar = xr.over + xr.under;
  std::vector<char> failing(static_cast<size_t>(R), 0), zero(failing);
  int64_t nfailing = 0, direct = 0, zeroed = 0;
  for (const Judged& j : fs.all) {
    if (j.t->field != Field::kY && j.t->field != Field::kDx) continue;
    for (size_t i : j.failing) {
      const auto r = static_cast<size_t>(j.row(i));
      if (r >= failing.size() || failing[r]) continue;
      failing[r] = 1;
      ++nfailing;
      direct += far[r];
      if (j.t->field == Field::kY && far[r]) {
        bool all_zero = true;
        for (int64_t e = 0; e < L; ++e)
          all_zero = all_zero && value(j, r * L + e) == 0;
        zeroed += all_zero;
      }
    }
  }
  if (nfar > 0 && nfailing > 0 && direct >= kMost * nfailing) {
    const std::string phrase = xr.over > 0 ? "norm overflow" : "norm underflow";
    out.push_back(
        {DiagnosisKind::kNormRange, phrase,
         format("%s: %s%lld failing y/dx rows are %s rows with %s (the case "
                "has %lld)%s; scale the row before squaring",
                phrase.c_str(), direct == nfailing ? "the " : "",
                (long long)nfailing,
                direct == nfailing ? "exactly the"
                                   : format("%lld", (long long)direct).c_str(),
                range_text(xr, none, cf).c_str(), (long long)nfar,
                zeroed > 0 ? format(", and %lld of them have y = 0 (x_hat = 0)",
                                    (long long)zeroed)
                                 .c_str()
                           : ""),
         0.9 * static_cast<double>(direct) / static_cast<double>(nfailing)});
  }
  diagnose_parameter(fs, {Field::kY, Field::kDx}, &out);
  order(&out);
  return out;
}

}  // namespace qknorm::validation
