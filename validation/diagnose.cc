#include "validation/diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "qknorm/name_table.h"
#include "validation/diagnose_internal.h"
#include "validation/judge.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {
namespace diag {

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

}  // namespace diag

namespace {

using diag::Fields;
using diag::format;
using diag::Judged;
using diag::kMost;
using diag::q_side;
using diag::RangeInfo;
using diag::RangeRows;
using diag::value;

constexpr NamedValue<DiagnosisKind> kKindNames[] = {
    {DiagnosisKind::kNormRange, "norm-range"},
    {DiagnosisKind::kMaskedRowNonFinite, "masked-row-nonfinite"},
    {DiagnosisKind::kSixteenBit, "16-bit"},
    {DiagnosisKind::kGqaGroupSum, "gqa-group-sum"},
    {DiagnosisKind::kTailBlock, "tail-block"},
    {DiagnosisKind::kParameterGradient, "parameter-gradient"},
    {DiagnosisKind::kSink, "sink"},
    {DiagnosisKind::kOutOfBoundsWrite, "out-of-bounds-write"},
    {DiagnosisKind::kOutOfBoundsRead, "out-of-bounds-read"},
};

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
// ---- (f) a learned parameter's gradient alone ----------------------------

bool is_param(Field f) {
  return f == Field::kDg || f == Field::kScaleNormDg || f == Field::kDqWeight ||
         f == Field::kDkWeight || f == Field::kDqBias || f == Field::kDkBias ||
         f == Field::kDSinks;
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

// ---- (g) attention sinks: dropped, or another head's ----------------------

// From each failing lse_i (attention.h: log of the visible keys' sum plus
// exp(sink_h)), the sink the entry used: the oracle's visible share is z =
// 1 - exp(sink_h - lse_i), so the entry's sink share is exp(a - lse_i) - z
// and its sink lse_i + log of that. A row whose a is log z within its bound
// dropped the sink (modular #6591's generic path); one whose sink is
// another head's, within the bound carried through that log, read the
// wrong head's (modular #6591 with seq_q > 1).
void diagnose_sinks(const AttentionCase& c, const OracleAttention& orc,
                    const Fields& fs, std::vector<Diagnosis>* out) {
  const AttentionProblem& p = c.problem;
  if (!has_sinks(p)) return;
  // Each hypothesis changes a row's softmax denominator: the visible keys'
  // share z = 1 - exp(sink - lse) of the oracle's plus `extra` (0: the sink
  // dropped; exp(s2 - lse): head h2's sink s2 in its place), in units of
  // exp(lse). Judged on lse where the entry gives it (the row's lse is
  // lse + log(z + extra)); else on O (a dump without lse, e.g. a PyTorch
  // op's: the row's O is O / (z + extra), every key's weight rescaled).
  const Judged* j = fs.find(Field::kLse);
  const bool on_lse = j != nullptr && !j->failing.empty();
  if (!on_lse) j = fs.find(Field::kO);
  if (j == nullptr || j->failing.empty() || !j->t->index_of.empty() ||
      orc.lse.empty())
    return;
  const char* field = on_lse ? "lse" : "o";
  // clear: the failing elements off the oracle's value by more than 2
  // bounds, the only ones that can be evidence (a marginal failure of any
  // cause is none); each hypothesis must explain most of them.
  // dropped, other: the clear elements that hypothesis alone explains;
  // both: those both explain (another head's sink far below the row's own
  // is nearly no sink: either hypothesis may be the cause there).
  int64_t dropped = 0, other = 0, both = 0, clear = 0;
  std::string first_drop, first_other;
  for (size_t i : j->failing) {
    const double a = value(*j, i);
    const int64_t r = j->row(i);
    const int64_t h = (r / p.q_len) % p.heads;
    const LD l = orc.lse[static_cast<size_t>(r)];
    const LD sink = p.sinks[static_cast<size_t>(h)];
    const double tol = element_bound(*j->t, i);
    if (std::isnan(a) || !std::isfinite(static_cast<double>(l))) continue;
    const LD z = 1 - std::exp(sink - l);
    const LD ref = on_lse ? l : j->t->expected[i];
    if (std::fabs(a - static_cast<double>(ref)) <= 2 * tol) continue;
    ++clear;
    // The row's value under a denominator share z + extra (NaN where that
    // share is empty: a fully masked row without its sink has no O).
    auto predict = [&](LD extra) {
      const LD share = z + extra;
      if (!(share > 0))
        return on_lse ? -std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
      return static_cast<double>(on_lse ? l + std::log(share) : ref / share);
    };
    // A hypothesis explains the element where the entry's value is within
    // the bound of its prediction and the prediction is clear of the
    // oracle's (2 bounds: a marginal failure of any cause is no evidence).
    auto explains = [&](double predicted) {
      return (a == predicted || std::fabs(a - predicted) <= tol) &&
             !(std::fabs(predicted - static_cast<double>(ref)) <= 2 * tol);
    };
    const double vis = predict(0);
    const bool drop = explains(vis);
    // Another head's sink: the heads whose prediction explains the row
    // (of distinct sinks; the message names one where it is the only one).
    int64_t match = -1, matches = 0;
    for (int64_t h2 = 0; std::isfinite(a) && h2 < p.heads; ++h2) {
      const double s2 = p.sinks[static_cast<size_t>(h2)];
      if (h2 == h || s2 == p.sinks[static_cast<size_t>(h)]) continue;
      if (!explains(predict(std::exp(static_cast<LD>(s2) - l)))) continue;
      if (matches == 0 || s2 != p.sinks[static_cast<size_t>(match)]) ++matches;
      match = h2;
    }
    if (drop && matches > 0) {
      ++both;
      continue;
    }
    if (drop) {
      if (first_drop.empty())
        first_drop =
            format("%s%s = %.9g, %s %.9g", field,
                   j->t->index_text(static_cast<int64_t>(i)).c_str(), a,
                   on_lse ? "the visible keys alone"
                          : "the row renormalized without the sink",
                   vis);
      ++dropped;
      continue;
    }
    if (matches == 0) continue;
    ++other;
    if (matches == 1 && first_other.empty())
      first_other = format(
          "%s%s = %.9g is the row with head %lld's sink %.9g, not its own "
          "%.9g",
          field, j->t->index_text(static_cast<int64_t>(i)).c_str(), a,
          (long long)match, p.sinks[static_cast<size_t>(match)],
          p.sinks[static_cast<size_t>(h)]);
  }
  const auto n = static_cast<double>(clear);
  const std::string what = format("%s off by more than 2 bounds%s",
                                  on_lse ? "lse rows" : "O elements",
                                  on_lse ? "" : " (the entry gives no lse)");
  // A hypothesis holds where it explains most clear elements (those it
  // shares included) and some alone; of two, the one that explains more
  // alone.
  const bool drop_holds = dropped > 0 && dropped + both >= kMost * n;
  const bool other_holds = other > 0 && other + both >= kMost * n;
  if (drop_holds && !(other_holds && other > dropped))
    out->push_back(
        {DiagnosisKind::kSink, "attention sink dropped",
         format("attention sink dropped: %lld of %lld failing %s are what "
                "the visible keys alone give (%lld of them fit another head's "
                "sink too; first %s): the sink's exp(sink - m) is missing "
                "from the row sums (a path without the sink, modular #6591)",
                (long long)(dropped + both), (long long)clear, what.c_str(),
                (long long)both, first_drop.c_str()),
         0.95});
  else if (other_holds)
    out->push_back(
        {DiagnosisKind::kSink, "another head's attention sink",
         format("another head's attention sink: %lld of %lld failing %s "
                "hold another head's sink (%lld of them fit a dropped sink "
                "too; first %s): the sink index is not the query head "
                "(modular #6591: indexed by the query row when seq_q > 1)",
                (long long)(other + both), (long long)clear, what.c_str(),
                (long long)both,
                first_other.empty() ? "every row fits more than one head's"
                                    : first_other.c_str()),
         0.95});
}

void order(std::vector<Diagnosis>* d) {
  std::stable_sort(d->begin(), d->end(),
                   [](const Diagnosis& a, const Diagnosis& b) {
                     return a.confidence > b.confidence;
                   });
}

}  // namespace

const char* name(DiagnosisKind k) { return name_in(kKindNames, k); }

std::vector<Diagnosis> memory_diagnoses(const MemoryEvidence& m,
                                        bool fields_fail) {
  std::vector<Diagnosis> out;
  if (!m.writes.empty()) {
    Diagnosis d;
    d.kind = DiagnosisKind::kOutOfBoundsWrite;
    d.phrase = "out-of-bounds write";
    // The facts (value, bits, pattern) are the report's out_of_bounds
    // lines; the cause names where.
    d.message =
        "out-of-bounds write: the entry stored outside its views "
        "during the " +
        m.write_call + " (";
    for (size_t i = 0; i < m.writes.size(); ++i)
      d.message += (i == 0 ? "" : "; ") + m.writes[i].tensor + " index " +
                   std::to_string(m.writes[i].index) + ": " + m.writes[i].where;
    d.message += ")";
    d.confidence = 1;
    out.push_back(std::move(d));
  }
  if (fields_fail && !m.poisoned.empty()) {
    Diagnosis d;
    d.kind = DiagnosisKind::kOutOfBoundsRead;
    d.phrase = "out-of-bounds read";
    d.message =
        "out-of-bounds read: the entry read outside an input view (past a "
        "sequence's last row, in a row-pad gap, or before the view: the "
        "harness NaN-poisons them) and the NaN it read reached ";
    for (size_t i = 0; i < m.poisoned.size(); ++i) {
      const PoisonedOutput& p = m.poisoned[i];
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "%s%s (%lld elements hold the poison, first %s, bits "
                    "0x%llx)",
                    i == 0 ? "" : ", ", p.tensor.c_str(), (long long)p.count,
                    p.first.c_str(), (unsigned long long)p.bits);
      d.message += buf;
    }
    d.confidence = 1;
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<Diagnosis> diagnose_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const std::vector<ToleranceTable>& tables, const AttentionResult& er,
    const std::vector<int64_t>& blocks) {
  const Fields fs = diag::collect(tables, [&](Field f) {
    const std::span<const double> x = field_values(er, f);
    return std::vector<double>(x.begin(), x.end());
  });
  const bool fail =
      !std::all_of(fs.all.begin(), fs.all.end(),
                   [](const Judged& j) { return j.failing.empty(); });
  std::vector<Diagnosis> out = memory_diagnoses(er.memory, fail);
  if (!fail) return out;
  const RangeInfo ri = diag::range_info(c, s);
  diag::diagnose_norm_range(c, s, ri, fs, &out);
  diagnose_masked(c, orc, fs, &out);
  // The rows the norm diagnosis explains are not evidence of 16-bit
  // arithmetic (their errors are of any size).
  const bool norm = std::any_of(out.begin(), out.end(), [](const Diagnosis& d) {
    return d.kind == DiagnosisKind::kNormRange;
  });
  diagnose_sixteen_bit(c, orc, s, norm ? ri : RangeInfo{}, fs, &out);
  diag::diagnose_gqa(c, fs, &out);
  diag::diagnose_tail_block(c, fs, blocks, &out);
  diagnose_parameter(fs, {Field::kO, Field::kLse}, &out);
  diagnose_sinks(c, orc, fs, &out);
  order(&out);
  return out;
}

std::vector<Diagnosis> diagnose_scalenorm(
    const ScaleNormCase& c, Precision s, const OracleScaleNorm& orc,
    const std::vector<ToleranceTable>& tables, const ScaleNormResult& er) {
  (void)orc;
  const Fields fs = diag::collect(tables, [&](Field f) -> std::vector<double> {
    if (f == Field::kY) return er.y;
    if (f == Field::kDx) return er.dx;
    return {er.dg};
  });
  const bool fail =
      !std::all_of(fs.all.begin(), fs.all.end(),
                   [](const Judged& j) { return j.failing.empty(); });
  std::vector<Diagnosis> out = memory_diagnoses(er.memory, fail);
  if (!fail) return out;
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
                diag::range_text(xr, none, cf).c_str(), (long long)nfar,
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