// Differential libFuzzer target for ScaleNorm (Nguyen & Salazar 2019):
// y = g x / max(||x||, eps), every registry entry against the oracle.
//
// Input (byte format: fuzz_common.h). First byte: mode.
//   mode even: DIFFERENTIAL. rows = 1 + u8 % 16, dim = 1 + u8 % 32, g, eps,
//     then x and dy element by element; run through the harness
//     (check_scalenorm: forward, backward, dg).
//   mode odd: LAYOUT. rows, dim as dims (any int64), g, eps, a row stride
//     (kind, extra) and a size delta for each of x, y, dy, dx, then values.
// Checks: invalid input (the fuzzer's model of validate.h) raises
// qknorm::Error and nothing else; valid input in the representable domain
// passes check_scalenorm, every row of y has norm <= |g| (up to rounding),
// and strided runs meet the dense bound without writing outside y / dx.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "qknorm/backend.h"
#include "validation/baseline_bounds.h"
#include "validation/check.h"

namespace qknorm::fuzz {
namespace {

using validation::AgreementReport;
using validation::OracleScaleNorm;
using validation::ScaleNormCase;
using LD = long double;

constexpr double kHeadroom = 64.0;  // as in attention_fuzzer.cc

bool problem_valid(const ScaleNormProblem& p) {
  int64_t n;
  return p.rows >= 1 && p.dim >= 1 &&
         !__builtin_mul_overflow(p.rows, p.dim, &n) &&
         n <= std::numeric_limits<int64_t>::max() / 8 && std::isfinite(p.eps) &&
         p.eps > 0 && std::isfinite(p.g);
}

// Domain: y, dx fit the storage format, dg the compute format, and the
// intermediates g dy (<= |g| max|dy|) and the dg terms (<= rows D max|dy|)
// fit the compute format with kHeadroom; no row sits on the clamp kink.
bool in_domain(const ScaleNormCase& c, const OracleScaleNorm& orc,
               Precision s) {
  const Precision cf = compute_format(s);
  if (!representable(orc.y, s) || !representable(orc.dx, s) ||
      !representable(orc.dg, cf))
    return false;
  if (near_clamp_kink(c.x, c.problem.dim, c.problem.eps, s)) return false;
  LD dymax = 0;
  for (double v : c.dy) dymax = std::max<LD>(dymax, std::fabs(v));
  const LD lim = max_finite(cf) / kHeadroom;
  // dx = (g / n) (dy - u (u . dy)): the terms before cancellation, and the
  // rounding noise of the difference, scale with |g| ||dy|| / max(n, eps),
  // which must be representable (found by the fuzzer: x = (2^-149, 2^-149),
  // dy = (1, 1), a true dx of 0 computed as -inf by a f32 kernel).
  LD dy_norm = 0;
  for (size_t r = 0; r < c.dy.size(); r += static_cast<size_t>(c.problem.dim)) {
    LD t = 0;
    for (int64_t d = 0; d < c.problem.dim; ++d)
      t += static_cast<LD>(c.dy[r + d]) * c.dy[r + d];
    dy_norm = std::max(dy_norm, std::sqrt(t));
  }
  const LD term = std::fabs(static_cast<LD>(c.problem.g)) * dy_norm /
                  min_row_norm(c.x, c.problem.dim, c.problem.eps);
  // ... and its noise, (dim + 8) u_c * term, must fit the storage format.
  const LD noise = (c.problem.dim + 8) * compute_roundoff(s) * term;
  if (!(term <= lim) || !(noise <= max_finite(s) / kHeadroom)) return false;
  return std::fabs(static_cast<LD>(c.problem.g)) * c.problem.dim * dymax <=
             lim &&
         static_cast<LD>(c.problem.rows) * c.problem.dim * dymax <= lim;
}

std::string entry_ctx(const Backend& e, const ScaleNormCase& c) {
  std::string m = "entry " + e.name() + " on " + c.describe() +
                  " class=" + validation::name(validation::input_class(c));
  // Small cases print their values (findings are minimized, so most are).
  if (c.x.size() <= 16) {
    for (const auto* t : {&c.x, &c.dy}) {
      m += t == &c.x ? "\n  x:" : "\n  dy:";
      for (double v : *t) {
        char b[32];
        std::snprintf(b, sizeof b, " %.9g", v);
        m += b;
      }
    }
  }
  return m;
}

// ||y_r|| <= |g|: u has norm 1 (or < 1 in the clamp region). The computed
// norm carries (2 dim + 8) u of relative error; elements in the subnormal
// range an absolute one (underflow_slack).
void check_row_norms(const Backend& e, const ScaleNormCase& c,
                     const std::vector<double>& y) {
  const int64_t D = c.problem.dim;
  const double tol = (2.0 * D + 8) * compute_roundoff(e.precision()) +
                     2 * unit_roundoff(e.precision());
  for (int64_t r = 0; r < c.problem.rows; ++r) {
    LD s = 0;
    for (int64_t d = 0; d < D; ++d) {
      const LD v = y[static_cast<size_t>(r * D + d)];
      s += v * v;
    }
    const LD n = std::sqrt(s);
    if (!(n <= std::fabs(static_cast<LD>(c.problem.g)) * (1 + tol) +
                   underflow_slack(e.precision(), D)))
      fail("ScaleNorm row norm exceeds |g|",
           entry_ctx(e, c) + "\n  row " + std::to_string(r) + " norm " +
               std::to_string(static_cast<double>(n)));
  }
}

void differential(ByteReader& r) {
  ScaleNormCase c;
  c.problem.rows = 1 + r.u8() % 16;
  c.problem.dim = 1 + r.u8() % 32;
  c.problem.g = r.scalar(1.0);
  c.problem.eps = r.scalar(kDefaultScaleNormEps);
  const size_t n = static_cast<size_t>(c.problem.rows * c.problem.dim);
  for (size_t i = 0; i < n; ++i) c.x.push_back(r.scalar());
  for (size_t i = 0; i < n; ++i) c.dy.push_back(r.scalar());
  const bool pvalid = problem_valid(c.problem);
  // The rounded case, its oracle and the naive baseline's result are the
  // same for every entry of a precision: computed once per input and
  // precision; each entry then runs once and is judged against them
  // (judge_scalenorm, the rule of check_scalenorm). Issue 14: before, each
  // entry recomputed the oracle twice and ran itself twice.
  struct PerPrecision {
    bool done = false, oracle_done = false, naive_done = false;
    ScaleNormCase rc;
    OracleScaleNorm oracle;
    validation::ScaleNormResult naive;
  } per[4];
  for (const Backend* e : all_backends().entries()) {
    if (!e->available()) continue;
    PerPrecision& pp = per[static_cast<int>(e->precision())];
    if (!pp.done) {
      pp.rc = validation::round_inputs(c, e->precision());
      pp.done = true;
    }
    const ScaleNormCase& rc = pp.rc;
    const Context ctx([&] { return entry_ctx(*e, rc); });
    const bool valid =
        pvalid &&
        compute_range_ok(c.problem.g, c.problem.eps, e->precision()) &&
        all_finite(rc.x) && all_finite(rc.dy);
    if (!valid) {
      expect_outcome(true, ctx, [&] { validation::run_scalenorm(*e, rc); });
      continue;
    }
    if (!pp.oracle_done) {
      pp.oracle = validation::oracle_scalenorm(rc);
      pp.oracle_done = true;
    }
    const OracleScaleNorm& orc = pp.oracle;
    if (!in_domain(rc, orc, e->precision())) {
      try {
        validation::run_scalenorm(*e, rc);
      } catch (const Error&) {
      } catch (const std::exception& ex) {
        fail("exception other than qknorm::Error",
             ctx.str() + "\n  what(): " + ex.what());
      }
      continue;
    }
    const Backend& nb = validation::naive_for(e->precision());
    if (!pp.naive_done) {  // the naive entry answers for its own failure
      expect_outcome(false, Context([&] { return entry_ctx(nb, rc); }),
                     [&] { pp.naive = validation::run_scalenorm(nb, rc); });
      pp.naive_done = true;
    }
    AgreementReport rep;
    validation::ScaleNormResult res;
    expect_outcome(false, ctx, [&] {
      res = validation::run_scalenorm(*e, rc);
      rep = validation::judge_scalenorm(rc, e->precision(), orc, res, &pp.naive,
                                        e->name(), nb.name());
    });
    log_verdict(rep, ctx);
    if (!rep.pass)
      fail("entry disagrees with the oracle",
           rep.failure_message() + ctx.str());
    if (e == &validation::naive_for(e->precision()))
      check_baseline(
          rep, validation::baseline_bounds(rc, orc, e->precision()),
          {{validation::Field::kY,
            underflow_slack(e->precision(), rc.problem.dim,
                            std::fabs(rc.problem.g))},
           {validation::Field::kScaleNormDg,
            underflow_slack(e->precision(), rc.problem.dim * rc.problem.rows,
                            sum_abs(rc.dy))}});
    check_row_norms(*e, rc, res.y);
  }
}

// ---- LAYOUT mode ----------------------------------------------------------

constexpr int64_t kMaxElements = 1 << 14;
constexpr int64_t kSmallBuffer = 16;

struct Spec2 {
  int64_t row_stride = 0, size = kSmallBuffer;
  bool valid = false;
};

Spec2 decode_spec(ByteReader& r, const ScaleNormProblem& p, bool small) {
  Spec2 s;
  const uint8_t tag = r.u8();
  switch (tag % 4) {
    case 0:
      s.row_stride = p.dim;
      break;
    case 1:
      s.row_stride = sat_add(p.dim, r.u8() % 8);
      break;
    case 2:
      s.row_stride = 0;
      break;
    default:
      s.row_stride = static_cast<int64_t>(r.u64());
      break;
  }
  const int delta = static_cast<int8_t>(r.u8()) % 4;
  const int64_t need = required_size({0, 0, s.row_stride}, 1, 1, p.rows, p.dim);
  // need may be INT64_MAX itself (dim + (rows - 1) row_stride without
  // overflow): need + 3 would overflow (UBSan, CI fuzz run of 183cdfc).
  if (small && need > 0 && need <= kMaxElements - 3)
    s.size = std::max<int64_t>(1, need + delta);
  s.valid = small && need > 0 && s.row_stride >= p.dim && s.size >= need;
  return s;
}

void layout(ByteReader& r) {
  ScaleNormProblem p;
  p.rows = r.dim();
  p.dim = r.dim();
  p.g = r.scalar(1.0);
  p.eps = r.scalar(kDefaultScaleNormEps);
  const bool small = problem_valid(p) && p.rows <= 16 && p.dim <= 64;
  Spec2 sx = decode_spec(r, p, small), sy = decode_spec(r, p, small),
        sdy = decode_spec(r, p, small), sdx = decode_spec(r, p, small);
  const bool valid = small && sx.valid && sy.valid && sdy.valid && sdx.valid;
  std::vector<double> xv, dyv;
  if (valid) {
    for (int64_t i = 0; i < p.rows * p.dim; ++i) xv.push_back(r.scalar());
    for (int64_t i = 0; i < p.rows * p.dim; ++i) dyv.push_back(r.scalar());
  }
  const int64_t rows = valid ? p.rows : 1, dim = valid ? p.dim : 1;
  for (const Backend* e : all_backends().entries()) {
    if (!e->available()) continue;
    const Precision s = e->precision();
    auto buf = [&](const char* name, const Spec2& sp) {
      return TensorBuffer(name, s, {1, 1, rows, dim}, {0, 0, sp.row_stride},
                          sp.size);
    };
    TensorBuffer x = buf("x", sx), y = buf("y", sy), dy = buf("dy", sdy),
                 dx = buf("dx", sdx);
    ScaleNormCase c;
    c.problem = p;
    if (valid) {
      x.store(xv);
      dy.store(dyv);
      c.x = x.load();
      c.dy = dy.load();
    }
    const bool finite = all_finite(c.x) && all_finite(c.dy);
    const Context ctx([&] { return "LAYOUT " + entry_ctx(*e, c); });
    double dg = std::numeric_limits<double>::quiet_NaN();
    auto ws = e->make_workspace();
    const bool ok = valid && finite && compute_range_ok(p.g, p.eps, s);
    const bool ran = expect_outcome(!ok, ctx, [&] {
      ScaleNormForwardArgs fa{{x.data(), x.size(), sx.row_stride},
                              {y.data(), y.size(), sy.row_stride}};
      checked_scalenorm_forward(*e, p, fa, ws.get());
      ScaleNormBackwardArgs ba{{x.data(), x.size(), sx.row_stride},
                               {dy.data(), dy.size(), sdy.row_stride},
                               {dx.data(), dx.size(), sdx.row_stride},
                               &dg};
      checked_scalenorm_backward(*e, p, ba, ws.get());
    });
    if (!ran) continue;
    if (!y.guards_intact() || !dx.guards_intact())
      fail("entry wrote outside its output layout", ctx.str());
    const OracleScaleNorm orc = validation::oracle_scalenorm(c);
    if (!in_domain(c, orc, s) || y.overlapping() || dx.overlapping()) continue;
    const AgreementReport rep = validation::check_scalenorm(*e, c);
    log_verdict(rep, ctx);
    if (!rep.pass)
      fail("entry disagrees with the oracle",
           rep.failure_message() + ctx.str());
    validation::ScaleNormResult strided;
    strided.y = y.load();
    strided.dx = dx.load();
    strided.dg = dg;
    const AgreementReport srep = validation::judge_scalenorm(
        c, s, orc, strided, nullptr, e->name() + " (strided)", "");
    log_verdict(srep, ctx);
    if (!srep.pass)
      fail("strided result outside the tolerance bound",
           srep.failure_message() + ctx.str());
  }
}

}  // namespace
}  // namespace qknorm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qknorm::fuzz::ByteReader r(data, size);
  if (r.u8() & 1)
    qknorm::fuzz::layout(r);
  else
    qknorm::fuzz::differential(r);
  return 0;
}
