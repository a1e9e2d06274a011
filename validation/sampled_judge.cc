// judge_sampled: the verdict on a long problem's whole result from the
// sampled oracle (validation/sampled.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "validation/rule.h"
#include "validation/sampled.h"

namespace qknorm::validation {

AgreementReport judge_sampled(const AttentionCase& c, const SampledOracle& so,
                              const AttentionResult& er,
                              const std::string& entry_name) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim, group = H / Hk;
  const Precision s = so.storage;
  const Precision wf = compute_format(s);
  // The entry's contract: its coarsest unit roundoff for the properties'
  // u_c (compute_roundoff(s) for f32-accumulate), P's and the logits'
  // resolution (rule.h, contract_units).
  const ContractUnits cu = contract_units(so.options.contract, s);
  const double uc = cu.u, c_res = ulp(wf, 0);
  AgreementReport rep;
  rep.entry_name = entry_name;
  rep.case_desc = c.describe() + " [" + so.describe() + "]";
  rep.contract = so.options.contract.describe();
  // f32-accumulate's sampled tables are not built here: looseness unknown.
  if (!so.options.contract.is_default()) rep.looseness = 0;
  for (const ToleranceTable& t : so.tables) {
    const std::span<const double> all = field_values(er, t.field);
    std::vector<double> actual(t.index_of.empty() ? all.size()
                                                  : t.index_of.size());
    for (size_t i = 0; i < actual.size(); ++i) {
      const size_t at =
          t.index_of.empty() ? i : static_cast<size_t>(t.index_of[i]);
      actual[i] =
          at < all.size() ? all[at] : std::numeric_limits<double>::quiet_NaN();
    }
    FieldVerdict v = judge_field(t, actual, nullptr);
    if (v.worst_index >= 0 && !t.index_of.empty())
      v.worst_index = t.index_of[static_cast<size_t>(v.worst_index)];
    v.amplitude = so.amplitude;
    rep.fields.push_back(std::move(v));
  }
  // The O(n D) properties of every row.
  auto property = [&](Field id, const char* label) {
    FieldVerdict v;
    v.id = id;
    v.property = label;
    v.amplitude = so.amplitude;
    return v;
  };
  // Counts one judged element. describe() gives its (where, why) and runs
  // only for the field's first failure or a new worst: the properties below
  // judge up to B H Nq D elements (16.8M at 1x4x32768x128), and formatting
  // every one took about a quarter of an entry's time at n = 8192.
  auto note = [](FieldVerdict* v, double margin, double expected, double actual,
                 double bound, const auto& describe) {
    ++v->count;
    const bool fail = !(margin <= 1);
    const bool worst = !(margin <= v->margin);
    if (!(fail && v->failures == 0) && !worst) {
      if (fail) ++v->failures;
      return;
    }
    const auto [where, why] = describe();
    if (fail) {
      if (v->failures == 0) v->diagnosis = why;
      ++v->failures;
    }
    if (worst) {
      v->margin = margin;
      v->worst_where = where;
      v->worst_expected = expected;
      v->worst_actual = actual;
      v->worst_bound = bound;
    }
  };
  auto idx = [](int64_t b, int64_t h, int64_t n, int64_t d) {
    char buf[96];
    if (d < 0)
      std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld]", (long long)b,
                    (long long)h, (long long)n);
    else
      std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld,%lld]", (long long)b,
                    (long long)h, (long long)n, (long long)d);
    return std::string(buf);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // In f16 storage a gradient may exceed the format's range (a zero row's
  // du / eps with eps = 1e-12): the full verdict accepts the infinity where
  // the oracle's value overflows, and outside the sample the oracle's value
  // is unknown, so there an infinity (never a NaN) in dq, dk, dv is counted
  // as not representable instead of failed.
  auto grad_overflow = [&](double x) {
    return s == Precision::kF16 && std::isinf(x);
  };
  // A backward that did not run (validation/run.h) is not judged here
  // either (apply_backward_input below).
  const bool grads = er.backward_input != BackwardInput::kNotRun;
  // Finite everywhere; fully masked rows exactly O = 0, lse = -inf, dQ = 0.
  {
    FieldVerdict v = property(Field::kO, "finite, masked rows defined");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Nq; ++i) {
          const int64_t row = (b * H + h) * Nq + i;
          const bool masked = visible_keys(p, b, i) == 0;
          const double l = er.lse[static_cast<size_t>(row)];
          if (masked ? !(l == -inf) : !std::isfinite(l))
            note(&v, inf, masked ? -inf : 0, l, 0, [&] {
              const std::string w = name(Field::kLse) + idx(b, h, i, -1);
              return std::pair(w, w + " is " + std::to_string(l) +
                                      (masked ? " on a fully masked row "
                                                "(defined: -inf)"
                                              : ", not finite"));
            });
          for (int64_t d = 0; d < D; ++d) {
            const auto e = static_cast<size_t>(row * D + d);
            for (int f = 0; f < (grads ? 2 : 1); ++f) {
              const double x = f == 0 ? er.o[e] : er.dq[e];
              const char* nm = name(f == 0 ? Field::kO : Field::kDq);
              if (f == 1 && !masked && grad_overflow(x)) {
                ++v.not_representable;
                continue;
              }
              if (masked ? x != 0 : !std::isfinite(x))
                note(&v, inf, 0, x, 0, [&] {
                  const std::string w = nm + idx(b, h, i, d);
                  return std::pair(w, w + " = " + std::to_string(x) +
                                          (masked ? " on a fully masked row "
                                                    "(defined: 0)"
                                                  : ", not finite"));
                });
            }
          }
        }
    for (size_t e = 0; grads && e < er.dk.size(); ++e)
      for (int f = 0; f < 2; ++f) {
        const double x = f == 0 ? er.dk[e] : er.dv[e];
        if (grad_overflow(x)) {
          ++v.not_representable;
          continue;
        }
        if (!std::isfinite(x)) {
          const auto r = static_cast<int64_t>(e) / D;
          const std::string w = name(f == 0 ? Field::kDk : Field::kDv) +
                                idx(r / (Hk * Nk), (r / Nk) % Hk, r % Nk,
                                    static_cast<int64_t>(e) % D);
          note(&v, inf, 0, x, 0,
               [&] { return std::pair(w, w + " is not finite"); });
        }
      }
    for (Field f : {Field::kDg, Field::kDqWeight, Field::kDkWeight,
                    Field::kDqBias, Field::kDkBias}) {
      const std::span<const double> x = field_values(er, f);
      for (size_t e = 0; grads && e < x.size(); ++e)
        if (!std::isfinite(x[e]))
          note(&v, inf, 0, x[e], 0, [&] {
            const std::string w =
                std::string(name(f)) + "[" + std::to_string(e) + "]";
            return std::pair(w, w + " is not finite");
          });
    }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  // Non-saturation: every logit lies in [-A, A], so lse_i lies in log(n_i)
  // +- A, with the rule's lse bound as slack.
  {
    FieldVerdict v = property(Field::kLse, "log n +- A");
    const double A = std::fabs(so.amplitude);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t n = visible_keys(p, b, i);
        if (n == 0) continue;
        const double ln = std::log(static_cast<double>(n));
        const double mag = std::fabs(ln) + A;
        const double slack = uc * (so.lse_units + 2 * mag) + so.lse_abs +
                             cu.logit_res + half_spacing(wf, mag, 0);
        for (int64_t h = 0; h < H; ++h) {
          const double l = er.lse[static_cast<size_t>((b * H + h) * Nq + i)];
          if (!std::isfinite(l)) continue;  // judged above
          const double out = std::max(0.0, std::fabs(l - ln) - A);
          const double margin = slack > 0 ? out / slack : (out > 0 ? inf : 0);
          note(&v, margin, ln, l, A + slack, [&] {
            char why[200];
            std::snprintf(why, sizeof why,
                          "lse%s = %.17g outside log(%lld) +- A = %.17g +- "
                          "%.6g (slack %.3e)",
                          idx(b, h, i, -1).c_str(), l, (long long)n, ln, A,
                          slack);
            return std::pair(name(Field::kLse) + idx(b, h, i, -1),
                             std::string(why));
          });
        }
      }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  // O_id is a convex combination of the visible v_jd (a key prefix): it lies
  // within their range, up to the row sum's rounding (sum_units(n) + the
  // final operations, relative to max |v_jd|) and the subnormal resolution.
  {
    FieldVerdict v = property(Field::kO, "within the visible v");
    std::vector<double> lo(static_cast<size_t>(Nk * D)),
        hi(static_cast<size_t>(Nk * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hk = 0; hk < Hk; ++hk) {
        const double* vb = c.v.data() + (b * Hk + hk) * Nk * D;
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t d = 0; d < D; ++d) {
            const auto e = static_cast<size_t>(j * D + d);
            const double x = vb[e];
            lo[e] = j == 0 ? x : std::min(lo[e - static_cast<size_t>(D)], x);
            hi[e] = j == 0 ? x : std::max(hi[e - static_cast<size_t>(D)], x);
          }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i = 0; i < Nq; ++i) {
            const int64_t n = visible_keys(p, b, i);
            if (n == 0) continue;
            const double units = sum_units(static_cast<double>(n)) + kOpUnits;
            for (int64_t d = 0; d < D; ++d) {
              const auto e = static_cast<size_t>((n - 1) * D + d);
              const double x =
                  er.o[static_cast<size_t>(((b * H + h) * Nq + i) * D + d)];
              if (!std::isfinite(x)) continue;  // judged above
              const double top = std::max(std::fabs(lo[e]), std::fabs(hi[e]));
              const double slack =
                  uc * units * top +
                  c_res * (static_cast<double>(n) + 2 + kOpUnits) +
                  cu.p_res * static_cast<double>(n) * top +
                  half_spacing(s, top, 0);
              const double out = std::max({0.0, lo[e] - x, x - hi[e]});
              const double margin = out / slack;
              note(&v, margin, x < lo[e] ? lo[e] : hi[e], x, slack, [&] {
                char why[220];
                std::snprintf(why, sizeof why,
                              "o%s = %.17g outside the visible v's range "
                              "[%.17g, %.17g] (slack %.3e)",
                              idx(b, h, i, d).c_str(), x, lo[e], hi[e], slack);
                return std::pair(name(Field::kO) + idx(b, h, i, d),
                                 std::string(why));
              });
            }
          }
      }
    v.pass = v.failures == 0;
    rep.fields.push_back(std::move(v));
  }
  apply_backward_input(er, &rep);
  rep.pass = true;
  rep.margin = 0;
  for (const FieldVerdict& f : rep.fields) {
    rep.pass = rep.pass && f.pass;
    if (f.margin > rep.margin || rep.worst_field.empty()) {
      rep.margin = std::max(rep.margin, f.margin);
      rep.worst_field = label(f);
    }
  }
  const bool fields_fail = !rep.pass;
  apply_memory(er.memory, &rep);
  if (!rep.pass) rep.diagnoses = memory_diagnoses(er.memory, fields_fail);
  return rep;
}

}  // namespace qknorm::validation
