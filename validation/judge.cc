#include "validation/judge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <string>

namespace qknorm::validation {
namespace {

using LD = long double;

double d(LD x) { return static_cast<double>(x); }

}  // namespace

std::string label(const FieldVerdict& v) {
  if (v.property == nullptr) return name(v.id);
  return std::string(name(v.id)) + "[all rows: " + v.property + "]";
}

bool passes(ElementClass c) {
  return c == ElementClass::kWithin || c == ElementClass::kEqualInfinity ||
         c == ElementClass::kNotRepresentable;
}

long double overflow_threshold(Precision fmt) {
  const double mf = max_finite(fmt);
  return static_cast<LD>(mf) + static_cast<LD>(ulp(fmt, mf)) / 2;
}

InfinityReach infinity_reach(const ToleranceTable& t, size_t i) {
  const LD x = t.expected[i];
  const LD delta = t.delta[i];
  const LD thr = overflow_threshold(t.fmt);
  return {x + delta >= thr, x - delta <= -thr};
}

namespace {

// What judging element i of table t takes from the table alone: the same for
// every value judged against it (the entry's and the naive baseline's), so
// judge_field derives it once per element.
struct ElementRule {
  LD x = 0;
  double delta = 0;
  InfinityReach reach;
  LD target = 0;     // x, clamped to the format's range where reach is set
  double bound = 0;  // delta + the half spacing at target
};

// overflow_threshold(t.fmt) and max_finite(t.fmt), once per table.
struct FormatLimits {
  LD threshold = 0;
  double max_finite = 0;
};
FormatLimits limits(Precision fmt) {
  return {overflow_threshold(fmt), max_finite(fmt)};
}

ElementRule element_rule(const ToleranceTable& t, size_t i,
                         const FormatLimits& lim) {
  ElementRule r;
  r.x = t.expected[i];
  r.delta = t.delta[i];
  if (std::isinf(r.x)) return r;
  // As infinity_reach(t, i), with the table's threshold.
  const LD delta = r.delta;
  r.reach = {r.x + delta >= lim.threshold, r.x - delta <= -lim.threshold};
  r.target = r.x;
  if (r.reach.positive || r.reach.negative)
    r.target = std::clamp<LD>(r.x, -lim.max_finite, lim.max_finite);
  r.bound = r.delta + half_spacing(t.fmt, d(r.target), r.delta);
  return r;
}

ElementJudgement judge_by(const ElementRule& r, double actual) {
  ElementJudgement j;
  if (std::isinf(r.x)) {
    j.bound = 0;
    if (actual == d(r.x)) {
      j.cls = ElementClass::kEqualInfinity;
    } else {
      j.cls = ElementClass::kWrongNonFinite;
      j.err = j.margin = std::numeric_limits<double>::infinity();
    }
    return j;
  }
  // A correct kernel holds a value in [x - delta, x + delta] before its
  // final rounding (validation/rule.h); where that interval reaches the
  // format's overflow threshold on one side, the value may round to that
  // side's infinity, whatever the sign of x (an ill-conditioned element
  // whose bound dwarfs |x|: the soak finding of issue 31).
  if ((r.reach.positive || r.reach.negative) && std::isinf(actual) &&
      (std::signbit(actual) ? r.reach.negative : r.reach.positive)) {
    j.cls = ElementClass::kNotRepresentable;
    return j;
  }
  j.bound = r.bound;
  if (!std::isfinite(actual)) {
    j.cls = ElementClass::kWrongNonFinite;
    j.err = j.margin = std::numeric_limits<double>::infinity();
    return j;
  }
  j.err = d(std::fabs(static_cast<LD>(actual) - r.target));
  j.margin = j.bound > 0
                 ? j.err / j.bound
                 : (j.err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  j.cls = j.err <= j.bound ? ElementClass::kWithin : ElementClass::kOver;
  return j;
}

}  // namespace

ElementJudgement judge_element(const ToleranceTable& t, size_t i,
                               double actual) {
  return judge_by(element_rule(t, i, limits(t.fmt)), actual);
}

double element_bound(const ToleranceTable& t, size_t i) {
  const LD x = t.expected[i];
  if (std::isinf(x)) return 0;
  const double mf = max_finite(t.fmt);
  const LD target = std::clamp<LD>(x, -mf, mf);
  return t.delta[i] + half_spacing(t.fmt, d(target), t.delta[i]);
}

namespace {

std::string diagnose(const ToleranceTable& t, size_t i, double actual,
                     const ElementJudgement& j) {
  char buf[320];
  const std::string where =
      std::string(name(t.field)) + t.index_text(static_cast<int64_t>(i));
  const double x = d(t.expected[i]);
  const bool masked = !t.masked_row.empty() && t.masked_row[i];
  const std::string fmt(name(t.fmt));
  if (j.cls == ElementClass::kWrongNonFinite) {
    if (std::isnan(actual))
      std::snprintf(buf, sizeof buf, "%s is NaN where %.17g is defined%s",
                    where.c_str(), x,
                    masked ? " (fully masked row: O = 0, lse = -inf)" : "");
    else if (std::isinf(x))
      std::snprintf(buf, sizeof buf, "%s is %.17g where %g is defined%s",
                    where.c_str(), actual, x,
                    masked ? " (fully masked row)" : "");
    else
      std::snprintf(buf, sizeof buf,
                    "%s is %g where the finite %.17g is defined (%s in %s; "
                    "its bound interval [%.6g, %.6g] does not reach the "
                    "overflow threshold %s%g)%s",
                    where.c_str(), actual, x,
                    !std::isinf(round_to(t.fmt, x)) ? "it is representable"
                    : x < 0                         ? "it rounds to -inf"
                                                    : "it rounds to +inf",
                    fmt.c_str(), x - t.delta[i], x + t.delta[i],
                    actual < 0 ? "-" : "+", d(overflow_threshold(t.fmt)),
                    masked ? " (fully masked row: O = 0)" : "");
  } else {
    std::snprintf(buf, sizeof buf,
                  "%s = %.17g, expected %.17g: |err| %.3e > bound %.3e "
                  "(margin %.3g, kappa %.3g)",
                  where.c_str(), actual, x, j.err, j.bound, j.margin,
                  t.cond[i]);
  }
  return buf;
}

}  // namespace

namespace {

// judge_field with the expected values' compare basis given; `naive` (may
// be null) is judged for its statistics and margin only.
FieldVerdict judge_values(const ToleranceTable& t, const CompareBasis& basis,
                          std::span<const double> actual,
                          const std::span<const double>* naive) {
  FieldVerdict v;
  v.id = t.field;
  v.count = static_cast<int64_t>(t.expected.size());
  v.entry = compare(actual, t.expected, basis);
  if (naive != nullptr) {
    v.has_naive = true;
    v.naive = compare(*naive, t.expected, basis);
  }
  // The entry's and the naive's judgements share each element's rule.
  const FormatLimits lim = limits(t.fmt);
  v.margin = -1;
  for (size_t i = 0; i < t.expected.size(); ++i) {
    const double a = i < actual.size()
                         ? actual[i]
                         : std::numeric_limits<double>::quiet_NaN();
    const ElementRule rule = element_rule(t, i, lim);
    const ElementJudgement j = judge_by(rule, a);
    if (t.cond[i] > kIllConditioned) ++v.ill_conditioned;
    if (j.cls == ElementClass::kNotRepresentable) ++v.not_representable;
    if (!passes(j.cls)) {
      if (v.failures == 0) v.diagnosis = diagnose(t, i, a, j);
      ++v.failures;
    }
    if (j.margin > v.margin) {
      v.margin = j.margin;
      v.worst_index = static_cast<int64_t>(i);
      v.worst_expected = d(t.expected[i]);
      v.worst_actual = a;
      v.worst_bound = j.bound;
    }
    if (naive != nullptr && i < naive->size())
      v.naive_margin =
          std::max(v.naive_margin, judge_by(rule, (*naive)[i]).margin);
  }
  if (v.margin < 0) v.margin = 0;
  if (v.worst_index >= 0) v.worst_where = t.index_text(v.worst_index);
  v.pass = v.failures == 0;
  return v;
}

}  // namespace

FieldVerdict judge_field(const ToleranceTable& t,
                         std::span<const double> actual,
                         const std::vector<double>* naive) {
  const std::span<const double> n = naive != nullptr
                                        ? std::span<const double>(*naive)
                                        : std::span<const double>();
  return judge_values(t, compare_basis(t.expected, t.fmt), actual,
                      naive != nullptr ? &n : nullptr);
}

FieldVerdict judge_field(const ToleranceTable& t,
                         const std::vector<double>& actual,
                         const std::vector<double>* naive) {
  return judge_field(t, std::span<const double>(actual), naive);
}

void apply_backward_input(const AttentionResult& er, AgreementReport* rep) {
  if (er.backward_input == BackwardInput::kEntry) return;
  if (er.backward_input == BackwardInput::kRecomputes) {
    rep->note = "backward fields judged as computed: " + er.backward_note;
    return;
  }
  const bool ran = er.backward_input == BackwardInput::kOracle;
  std::string fields;
  for (FieldVerdict& f : rep->fields) {
    // The forward's fields and the sampled verdict's O(n D) properties keep
    // their verdicts.
    if (f.property != nullptr || f.id == Field::kO || f.id == Field::kLse)
      continue;
    fields += (fields.empty() ? "" : ", ") + label(f);
    if (ran) {
      f.note = "judged on the oracle's O and lse";
      continue;
    }
    FieldVerdict not_judged;
    not_judged.id = f.id;
    not_judged.amplitude = f.amplitude;
    not_judged.count = f.count;
    not_judged.judged = false;
    not_judged.note = "not judged: " + er.backward_note;
    f = std::move(not_judged);
  }
  if (fields.empty()) return;
  rep->note = (ran ? "backward fields " + fields +
                         " judged on the oracle's O (rounded to storage) and "
                         "lse: "
                   : "backward fields " + fields + " not judged: ") +
              er.backward_note;
}

void apply_memory(const MemoryEvidence& m, AgreementReport* rep) {
  for (const GuardViolation& w : m.writes)
    rep->out_of_bounds.push_back("wrote outside its views during the " +
                                 m.write_call + ": " + w.message());
  if (!m.writes.empty()) rep->pass = false;
}

namespace {
void finish(AgreementReport* rep) {
  rep->pass = true;
  rep->margin = 0;
  for (const auto& f : rep->fields) {
    rep->pass = rep->pass && f.pass;
    if (f.margin > rep->margin || rep->worst_field.empty()) {
      rep->margin = std::max(rep->margin, f.margin);
      rep->worst_field = label(f);
    }
  }
}
}  // namespace

PreparedAttention prepare_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const AttentionResult* nr, bool forward_only, const std::string& naive_name,
    const ComputeContract& contract, const std::vector<Field>* only) {
  PreparedAttention p;
  p.naive_name = nr != nullptr ? naive_name : "";
  p.case_desc = c.describe();
  p.contract = contract.describe();
  p.amplitude = logit_amplitude(c);
  p.tables = attention_tolerances(c, s, orc, forward_only, contract);
  if (!contract.is_default())
    p.looseness = contract_looseness(
        p.tables, attention_tolerances(c, s, orc, forward_only));
  if (only != nullptr)
    std::erase_if(p.tables, [&](const ToleranceTable& t) {
      return std::find(only->begin(), only->end(), t.field) == only->end();
    });
  for (const ToleranceTable& t : p.tables) {
    p.bases.push_back(compare_basis(t.expected, t.fmt));
    FieldVerdict nv;
    if (nr != nullptr) {
      // The naive's statistics and margin, as judge_values gives them.
      const std::span<const double> x = field_values(*nr, t.field);
      nv.has_naive = true;
      nv.naive = compare(x, t.expected, p.bases.back());
      const FormatLimits lim = limits(t.fmt);
      for (size_t i = 0; i < t.expected.size() && i < x.size(); ++i)
        nv.naive_margin = std::max(
            nv.naive_margin, judge_by(element_rule(t, i, lim), x[i]).margin);
    }
    p.naive.push_back(std::move(nv));
  }
  return p;
}

AgreementReport judge_attention(const PreparedAttention& p,
                                const AttentionCase& c, Precision s,
                                const OracleAttention& orc,
                                const AttentionResult& er,
                                const std::string& entry_name) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = p.naive_name;
  rep.case_desc = p.case_desc;
  rep.contract = p.contract;
  rep.looseness = p.looseness;
  for (size_t k = 0; k < p.tables.size(); ++k) {
    const ToleranceTable& t = p.tables[k];
    FieldVerdict v =
        judge_values(t, p.bases[k], field_values(er, t.field), nullptr);
    v.has_naive = p.naive[k].has_naive;
    v.naive = p.naive[k].naive;
    v.naive_margin = p.naive[k].naive_margin;
    v.amplitude = p.amplitude;
    rep.fields.push_back(std::move(v));
  }
  apply_backward_input(er, &rep);
  finish(&rep);
  apply_memory(er.memory, &rep);
  if (!rep.pass) rep.diagnoses = diagnose_attention(c, s, orc, p.tables, er);
  return rep;
}

AgreementReport judge_attention(
    const AttentionCase& c, Precision s, const OracleAttention& orc,
    const AttentionResult& er, const AttentionResult* nr, bool forward_only,
    const std::string& entry_name, const std::string& naive_name,
    const std::vector<Field>* only, const ComputeContract& contract) {
  return judge_attention(prepare_attention(c, s, orc, nr, forward_only,
                                           naive_name, contract, only),
                         c, s, orc, er, entry_name);
}

double contract_looseness(const std::vector<ToleranceTable>& tables,
                          const std::vector<ToleranceTable>& base) {
  auto o_of = [](const std::vector<ToleranceTable>& ts) {
    for (const ToleranceTable& t : ts)
      if (t.field == Field::kO) return &t;
    return static_cast<const ToleranceTable*>(nullptr);
  };
  const ToleranceTable *a = o_of(tables), *b = o_of(base);
  if (a == nullptr || b == nullptr) return 1;
  std::vector<double> r;
  for (size_t i = 0; i < a->delta.size() && i < b->delta.size(); ++i) {
    const double x = element_bound(*a, i), y = element_bound(*b, i);
    if (y > 0 && !std::isnan(x / y)) r.push_back(x / y);
  }
  if (r.empty()) return 1;
  std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
  return r[r.size() / 2];
}

AgreementReport judge_scalenorm(const ScaleNormCase& c, Precision s,
                                const OracleScaleNorm& orc,
                                const ScaleNormResult& er,
                                const ScaleNormResult* nr,
                                const std::string& entry_name,
                                const std::string& naive_name,
                                const std::vector<Field>* only) {
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.naive_name = nr != nullptr ? naive_name : "";
  rep.case_desc = c.describe();
  std::vector<ToleranceTable> tables = scalenorm_tolerances(c, s, orc);
  if (only != nullptr)
    std::erase_if(tables, [&](const ToleranceTable& t) {
      return std::find(only->begin(), only->end(), t.field) == only->end();
    });
  for (const ToleranceTable& t : tables) {
    auto pick = [&](const ScaleNormResult& r) -> std::vector<double> {
      if (t.field == Field::kY) return r.y;
      if (t.field == Field::kDx) return r.dx;
      return {r.dg};
    };
    const std::vector<double> naive =
        nr != nullptr ? pick(*nr) : std::vector<double>{};
    rep.fields.push_back(
        judge_field(t, pick(er), nr != nullptr ? &naive : nullptr));
  }
  finish(&rep);
  apply_memory(er.memory, &rep);
  if (!rep.pass) rep.diagnoses = diagnose_scalenorm(c, s, orc, tables, er);
  return rep;
}

std::string AgreementReport::failure_message() const {
  std::string m;
  for (const auto& f : fields) {
    if (f.pass) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "  field %s: %lld of %lld elements fail; worst %s%s: "
                  "expected %.17g, actual %.17g, bound %.6e (margin %.3g; "
                  "logit amplitude A=%.6g)\n    first failure: %s\n",
                  label(f).c_str(), (long long)f.failures, (long long)f.count,
                  label(f).c_str(), f.worst_where.c_str(), f.worst_expected,
                  f.worst_actual, f.worst_bound, f.margin, f.amplitude,
                  f.diagnosis.c_str());
    m += buf;
    if (!f.note.empty()) m += "    " + f.note + "\n";
    m += "    entry: " + describe(f.entry) + "\n";
    if (f.has_naive) {
      std::snprintf(buf, sizeof buf, "    naive margin %.3g: ", f.naive_margin);
      m += buf + describe(f.naive) + "\n";
    }
  }
  for (const std::string& w : out_of_bounds) m += "  " + w + "\n";
  if (m.empty()) return "";
  std::string under;
  if (contract != "f32-accumulate") {
    char buf[160];
    if (looseness > 0)
      std::snprintf(buf, sizeof buf,
                    "  judged under compute contract %s (o's bound %.3gx "
                    "f32-accumulate's, median)\n",
                    contract.c_str(), looseness);
    else
      std::snprintf(buf, sizeof buf, "  judged under compute contract %s\n",
                    contract.c_str());
    under = buf;
  }
  for (const Diagnosis& d : diagnoses)
    m += "  likely cause: " + d.message + "\n";
  return "entry " + entry_name + " vs oracle" +
         (naive_name.empty() ? "" : " (naive " + naive_name + ")") + " on " +
         case_desc + "\n" + under + m +
         (note.empty() ? "" : "  " + note + "\n");
}

}  // namespace qknorm::validation
