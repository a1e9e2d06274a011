#include "cli/suite.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>

#include "qknorm/error.h"
#include "validation/baseline_bounds.h"

namespace qknorm::cli {
namespace {

using validation::Distribution;

AttentionProblem shape(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D,
                       double g) {
  AttentionProblem p;
  p.batch = B;
  p.heads = H;
  p.q_len = Nq;
  p.kv_len = Nk;
  p.head_dim = D;
  p.g = g;
  return p;
}

bool is_reference(const Backend& b) { return b.family() == "reference"; }

double ratio_of(double err, double base) {
  if (base > 0) return err / base;
  return err > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

double headroom_of(double err, double limit) {
  if (limit > 0) return err / limit;
  return err > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

}  // namespace

Suite default_suite(uint64_t seed) {
  const double g0 = g_init(72);  // the paper's L = 72 configuration
  const double g_learned = 20;   // inside the learned range 10.3..24.9
  Suite s;
  auto add = [&](AttentionProblem p, bool causal, std::vector<int64_t> pad,
                 Distribution dist) {
    p.mask.causal = causal;
    p.mask.key_lengths = std::move(pad);
    s.attention.push_back(
        {p, dist, seed + static_cast<uint64_t>(s.attention.size())});
  };
  // Translation scale, every pair of {g0, 20} x {causal, pad} x {gaussian,
  // wide} covered.
  add(shape(2, 8, 72, 72, 64, g0), true, {}, Distribution::kGaussian);
  add(shape(2, 8, 72, 72, 64, g0), false, {72, 48},
      Distribution::kWideMagnitude);
  add(shape(2, 8, 72, 72, 64, g_learned), true, {},
      Distribution::kWideMagnitude);
  add(shape(2, 8, 72, 72, 64, g_learned), false, {72, 48},
      Distribution::kGaussian);
  // Odd sizes: q_len != kv_len, odd head_dim, causal + padding.
  add(shape(1, 2, 33, 47, 31, g_learned), true, {29}, Distribution::kGaussian);
  // kv_len < q_len with causal: the first 12 query rows are fully masked.
  add(shape(2, 2, 17, 5, 8, g0), true, {}, Distribution::kWideMagnitude);
  s.timing = shape(2, 8, 72, 72, 64, g0);
  const uint64_t base = seed + static_cast<uint64_t>(s.attention.size());
  ScaleNormProblem sn;
  sn.rows = 2 * 72;
  sn.dim = 512;  // d_model of the paper's translation models
  sn.g = scalenorm_g_init(sn.dim);
  s.scalenorm.push_back({sn, Distribution::kGaussian, base});
  sn.rows = 33;
  sn.dim = 31;
  sn.g = scalenorm_g_init(sn.dim);
  s.scalenorm.push_back({sn, Distribution::kWideMagnitude, base + 1});
  return s;
}

CaseResult from_report(const validation::AgreementReport& rep,
                       const std::vector<double>* derived) {
  CaseResult r;
  r.desc = rep.case_desc;
  r.pass = true;
  std::string msg;
  for (size_t i = 0; i < rep.fields.size(); ++i) {
    const validation::FieldVerdict& f = rep.fields[i];
    FieldResult fr;
    fr.field = f.field;
    fr.entry = f.entry;
    fr.naive = f.naive;
    if (derived != nullptr) {
      fr.limit = (*derived)[i];
      fr.pass = !f.entry.nonfinite_mismatch && f.entry.max_abs <= fr.limit;
      if (!fr.pass) {
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "  field %s: err=%.6e > derived bound=%.6e\n    entry: ",
                      f.field.c_str(), f.entry.max_abs, fr.limit);
        msg += buf + validation::describe(f.entry) + "\n";
      }
    } else {
      fr.limit = f.bound;
      fr.pass = f.pass;
    }
    r.pass = r.pass && fr.pass;
    r.fields.push_back(fr);
  }
  if (!r.pass) {
    r.failure = derived == nullptr
                    ? rep.failure_message()
                    : "entry " + rep.entry_name + " vs oracle on " +
                          rep.case_desc + "\n" + msg;
  }
  return r;
}

namespace {

// A baseline's own report: its stats against the oracle, reported as both
// "entry" and "naive" (it is its own naive baseline), and its derived limits.
// One run and one oracle evaluation, where check_* would run the entry twice
// (as entry and as naive) and the bound would need a second oracle.
validation::FieldVerdict self_verdict(const std::string& field,
                                      const std::vector<double>& actual,
                                      const std::vector<long double>& oracle,
                                      Precision fmt) {
  validation::FieldVerdict v;
  v.field = field;
  v.entry = v.naive = validation::compare(actual, oracle, fmt);
  v.pass = true;
  return v;
}

// The format each field is stored in (the 16-bit modes keep lse and dg in
// their f32 compute precision), as in validation::check_attention.
Precision wide_fmt(Precision s) {
  return s == Precision::kF64 ? Precision::kF64 : Precision::kF32;
}

// The attention and ScaleNorm flavours of the validation calls, so that one
// judge() serves both.
struct AttentionOps {
  static auto make(const AttentionSpec& s, Precision range) {
    return validation::make_attention_case(s.problem, s.dist, s.seed, range);
  }
  template <class Case>
  static auto check(const Backend& b, const Case& c, const ExecConfig& e) {
    return validation::check_attention(b, c, e);
  }
  template <class Case>
  static validation::AgreementReport self_check(const Backend& b,
                                                const Case& rc,
                                                const ExecConfig& e,
                                                std::vector<double>* limits) {
    const Precision s = b.precision();
    const validation::AttentionResult r = validation::run_attention(b, rc, e);
    const validation::OracleAttention orc = validation::oracle_attention(rc);
    validation::AgreementReport rep;
    rep.entry_name = rep.naive_name = b.name();
    rep.case_desc = rc.describe();
    rep.fields = {self_verdict("o", r.o, orc.o, s),
                  self_verdict("lse", r.lse, orc.lse, wide_fmt(s)),
                  self_verdict("dq", r.dq, orc.dq, s),
                  self_verdict("dk", r.dk, orc.dk, s),
                  self_verdict("dv", r.dv, orc.dv, s),
                  self_verdict("dg", {r.dg}, {orc.dg}, wide_fmt(s))};
    const validation::ReferenceBounds bounds =
        validation::baseline_bounds(rc, orc, s);
    for (const auto& f : rep.fields)
      limits->push_back(validation::bound_of(bounds, f.field));
    return rep;
  }
};
struct ScaleNormOps {
  static auto make(const ScaleNormSpec& s, Precision range) {
    return validation::make_scalenorm_case(s.problem, s.dist, s.seed, range);
  }
  template <class Case>
  static auto check(const Backend& b, const Case& c, const ExecConfig& e) {
    return validation::check_scalenorm(b, c, e);
  }
  template <class Case>
  static validation::AgreementReport self_check(const Backend& b,
                                                const Case& rc,
                                                const ExecConfig& e,
                                                std::vector<double>* limits) {
    const Precision s = b.precision();
    const validation::ScaleNormResult r = validation::run_scalenorm(b, rc, e);
    const validation::OracleScaleNorm orc = validation::oracle_scalenorm(rc);
    validation::AgreementReport rep;
    rep.entry_name = rep.naive_name = b.name();
    rep.case_desc = rc.describe();
    rep.fields = {self_verdict("y", r.y, orc.y, s),
                  self_verdict("dx", r.dx, orc.dx, s),
                  self_verdict("dg", {r.dg}, {orc.dg}, wide_fmt(s))};
    const validation::ScaleNormBounds bounds =
        validation::baseline_bounds(rc, orc, s);
    for (const auto& f : rep.fields)
      limits->push_back(validation::bound_of(bounds, f.field));
    return rep;
  }
};

template <class Ops, class Spec>
CaseResult judge(const Backend& entry, const Spec& spec,
                 const ExecConfig& exec) {
  try {
    const Precision prec = entry.precision();
    // The case is drawn within what the entry's format represents (matters
    // for the wide-magnitude distribution only).
    const auto c = Ops::make(spec, prec);
    if (!is_reference(entry))
      return from_report(Ops::check(entry, c, exec), nullptr);
    std::vector<double> limits;
    const validation::AgreementReport rep = Ops::self_check(
        entry, validation::round_inputs(c, prec), exec, &limits);
    return from_report(rep, &limits);
  } catch (const std::exception& e) {
    CaseResult r;
    r.desc = Ops::make(spec, Precision::kF64).describe();
    r.error = e.what();
    r.failure = "entry " + entry.name() + " on " + r.desc + ": " + e.what();
    return r;
  }
}

}  // namespace

CaseResult judge_attention(const Backend& entry, const AttentionSpec& spec,
                           const ExecConfig& exec) {
  return judge<AttentionOps>(entry, spec, exec);
}

CaseResult judge_scalenorm(const Backend& entry, const ScaleNormSpec& spec,
                           const ExecConfig& exec) {
  return judge<ScaleNormOps>(entry, spec, exec);
}

void summarize(EntryRow* row) {
  row->fields.clear();
  row->pass = true;
  row->ratio = 0;
  row->headroom = 0;
  for (const CaseResult& c : row->cases) {
    row->pass = row->pass && c.pass;
    if (!c.error.empty())
      row->headroom = std::numeric_limits<double>::infinity();
    for (const FieldResult& f : c.fields) {
      auto it = std::find_if(
          row->fields.begin(), row->fields.end(),
          [&](const FieldSummary& s) { return s.field == f.field; });
      if (it == row->fields.end()) {
        row->fields.push_back(FieldSummary{f.field, {}, 0, 0, true});
        it = row->fields.end() - 1;
      }
      validation::ErrorStats& w = it->worst;
      if (f.entry.max_abs > w.max_abs || w.count == 0) {
        w.worst_index = f.entry.worst_index;
        w.worst_expected = f.entry.worst_expected;
        w.worst_actual = f.entry.worst_actual;
      }
      w.count += f.entry.count;
      w.max_abs = std::max(w.max_abs, f.entry.max_abs);
      w.max_rel = std::max(w.max_rel, f.entry.max_rel);
      w.normwise = std::max(w.normwise, f.entry.normwise);
      w.ulp_p50 = std::max(w.ulp_p50, f.entry.ulp_p50);
      w.ulp_p99 = std::max(w.ulp_p99, f.entry.ulp_p99);
      w.ulp_max = std::max(w.ulp_max, f.entry.ulp_max);
      w.scale = std::max(w.scale, f.entry.scale);
      w.nonfinite_mismatch = w.nonfinite_mismatch || f.entry.nonfinite_mismatch;
      it->ratio =
          std::max(it->ratio, ratio_of(f.entry.max_abs, f.naive.max_abs));
      it->headroom =
          std::max(it->headroom, headroom_of(f.entry.max_abs, f.limit));
      it->pass = it->pass && f.pass;
      row->ratio = std::max(row->ratio, it->ratio);
      row->headroom = std::max(row->headroom, it->headroom);
    }
  }
}

double forward_gflops(const Backend& b, const AttentionProblem& p,
                      const ExecConfig& exec) {
  const Precision prec = b.precision();
  const validation::AttentionCase c = validation::round_inputs(
      validation::make_attention_case(p, Distribution::kGaussian, 1, prec),
      prec);
  const size_t eb = element_bytes(prec);
  auto encode_all = [&](const std::vector<double>& x) {
    std::vector<unsigned char> buf(x.size() * eb);
    for (size_t i = 0; i < x.size(); ++i) encode(prec, x[i], buf.data(), i);
    return buf;
  };
  std::vector<unsigned char> q = encode_all(c.q), k = encode_all(c.k),
                             v = encode_all(c.v), o(c.q.size() * eb);
  std::vector<double> lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
  const Layout4 lq = contiguous_layout(p.heads, p.q_len, p.head_dim);
  const Layout4 lk = contiguous_layout(p.heads, p.kv_len, p.head_dim);
  const ForwardArgs a{{q.data(), static_cast<int64_t>(c.q.size()), lq},
                      {k.data(), static_cast<int64_t>(c.k.size()), lk},
                      {v.data(), static_cast<int64_t>(c.v.size()), lk},
                      {o.data(), static_cast<int64_t>(c.q.size()), lq},
                      lse.data(),
                      static_cast<int64_t>(lse.size())};
  std::unique_ptr<Workspace> ws = b.make_workspace();
  // Warm-up through the validating door (sizes the workspace, touches pages).
  checked_attention_forward(b, p, a, ws.get(), exec);
  // Best of several calls: at least kMinReps, until kMinSeconds have passed
  // (short calls are noisy on a shared 2-core machine), at most kMaxReps.
  constexpr int kMinReps = 3, kMaxReps = 200;
  constexpr double kMinSeconds = 0.05;
  using Clock = std::chrono::steady_clock;
  double best = std::numeric_limits<double>::infinity(), total = 0;
  for (int rep = 0; rep < kMaxReps && (rep < kMinReps || total < kMinSeconds);
       ++rep) {
    const auto t0 = Clock::now();
    b.attention_forward(p, a, ws.get(), exec);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  const double flops =
      4.0 * static_cast<double>(p.q_len) * static_cast<double>(p.kv_len) *
      static_cast<double>(p.head_dim) * static_cast<double>(p.batch * p.heads);
  return best > 0 ? flops / best * 1e-9 : 0;
}

std::vector<EntryRow> run_suite(const std::vector<const Backend*>& entries,
                                const Suite& suite, const RunOptions& opt) {
  std::vector<EntryRow> rows;
  const int per_entry =
      static_cast<int>(suite.attention.size() + suite.scalenorm.size());
  const int total = per_entry * static_cast<int>(entries.size());
  int done = 0;
  for (const Backend* b : entries) {
    for (const char* kind : {"attention", "scalenorm"}) {
      const bool attn = std::string(kind) == "attention";
      if (attn ? suite.attention.empty() : suite.scalenorm.empty()) continue;
      EntryRow row;
      row.kind = kind;
      row.name = b->name();
      row.family = b->family();
      row.target = b->target();
      row.precision = std::string(name(b->precision()));
      row.rule = is_reference(*b) ? "derived" : "naive";
      row.available = b->available();
      if (!row.available) {
        done += static_cast<int>(attn ? suite.attention.size()
                                      : suite.scalenorm.size());
        rows.push_back(row);
        continue;
      }
      if (attn) {
        for (const AttentionSpec& s : suite.attention) {
          if (opt.progress) opt.progress(done, total, b->name());
          row.cases.push_back(judge_attention(*b, s, opt.exec));
          ++done;
        }
        if (opt.time_forward) {
          try {
            row.gflops = forward_gflops(*b, suite.timing, opt.exec);
          } catch (const std::exception&) {
            row.gflops = 0;  // the judged cases already report the error
          }
        }
      } else {
        for (const ScaleNormSpec& s : suite.scalenorm) {
          if (opt.progress) opt.progress(done, total, b->name());
          row.cases.push_back(judge_scalenorm(*b, s, opt.exec));
          ++done;
        }
      }
      summarize(&row);
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace qknorm::cli
