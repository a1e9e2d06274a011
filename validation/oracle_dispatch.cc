// The oracle's arithmetic (OraclePrecision, validation/oracle.h): which one
// a case gets (use_double), the result's widening to long double, the
// public oracle_attention and the sub-cases' shared operands. The oracle
// itself is oracle_in<T> (oracle_attention.cc).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "reference/reference.h"
#include "validation/operands.h"
#include "validation/oracle.h"
#include "validation/oracle_internal.h"

namespace qknorm::validation {
namespace {

// f(x, y) for every value and channel of the oracle, x of a and y of b (the
// same member): the one list of OracleValues' members.
template <class A, class B, class F>
void each_value(A& a, B& b, F&& f) {
  f(a.o, b.o), f(a.lse, b.lse), f(a.dq, b.dq), f(a.dk, b.dk), f(a.dv, b.dv);
  f(a.dg, b.dg), f(a.dg_scale, b.dg_scale), f(a.dq_scale, b.dq_scale);
  f(a.dk_scale, b.dk_scale), f(a.dv_scale, b.dv_scale);
  f(a.dq_o_sens, b.dq_o_sens), f(a.dk_o_sens, b.dk_o_sens);
  f(a.dg_o_sens, b.dg_o_sens), f(a.dq_uf_sens, b.dq_uf_sens);
  f(a.dk_uf_sens, b.dk_uf_sens), f(a.dg_uf_sens, b.dg_uf_sens);
  f(a.dg_o_rel_sens, b.dg_o_rel_sens);
  f(a.o_mag, b.o_mag), f(a.dv_mag, b.dv_mag), f(a.dq_mag, b.dq_mag);
  f(a.dk_mag, b.dk_mag), f(a.dq_o_sens_e, b.dq_o_sens_e);
  f(a.dk_o_sens_e, b.dk_o_sens_e), f(a.dq_uf_sens_e, b.dq_uf_sens_e);
  f(a.dk_uf_sens_e, b.dk_uf_sens_e), f(a.dq_o_rel_e, b.dq_o_rel_e);
  f(a.dk_o_rel_e, b.dk_o_rel_e), f(a.o_dev_mag, b.o_dev_mag);
  f(a.dq_ds_mag, b.dq_ds_mag), f(a.dk_ds_mag, b.dk_ds_mag);
  f(a.o_p_sens_e, b.o_p_sens_e), f(a.dv_p_sens_e, b.dv_p_sens_e);
  f(a.dq_p_sens_e, b.dq_p_sens_e), f(a.dk_p_sens_e, b.dk_p_sens_e);
  f(a.dg_p_sens, b.dg_p_sens);
  f(a.row_ties, b.row_ties), f(a.dv_norm_sq_e, b.dv_norm_sq_e);
  f(a.dv_norm_lin_e, b.dv_norm_lin_e);
  f(a.dv_norm_lse_sq_e, b.dv_norm_lse_sq_e);
  f(a.dv_norm_lse_lin_e, b.dv_norm_lse_lin_e);
  f(a.dv_norm_rep_e, b.dv_norm_rep_e), f(a.dk_rowmax_e, b.dk_rowmax_e);
  f(a.dk_sum_rowmax_e, b.dk_sum_rowmax_e), f(a.dk_norm_z_e, b.dk_norm_z_e);
  f(a.dk_norm_lin_e, b.dk_norm_lin_e);
  f(a.dk_norm_lse_lin_e, b.dk_norm_lse_lin_e);
  f(a.dk_norm_rep_e, b.dk_norm_rep_e);
  f(a.dq_weight, b.dq_weight), f(a.dk_weight, b.dk_weight);
  f(a.dq_bias, b.dq_bias), f(a.dk_bias, b.dk_bias);
  f(a.d_sinks, b.d_sinks);
  for (size_t ch = 0; ch < kChannels; ++ch) {
    f(a.dq_weight_ch[ch], b.dq_weight_ch[ch]);
    f(a.dk_weight_ch[ch], b.dk_weight_ch[ch]);
    f(a.dq_bias_ch[ch], b.dq_bias_ch[ch]);
    f(a.dk_bias_ch[ch], b.dk_bias_ch[ch]);
    f(a.dq_weight_sh_ch[ch], b.dq_weight_sh_ch[ch]);
    f(a.dk_weight_sh_ch[ch], b.dk_weight_sh_ch[ch]);
  }
  f(a.dq_shift_e, b.dq_shift_e), f(a.dk_shift_e, b.dk_shift_e);
  f(a.dq_flip_e, b.dq_flip_e), f(a.dk_flip_e, b.dk_flip_e);
  f(a.dg_shift, b.dg_shift);
}

// Whether double holds this case's oracle as long double does (kAuto).
// Storage f32, bf16 and f16 put every input in [2^-149, 2^128) (or 0),
// and the case's scale and eps are checked to be there too. Every channel
// term (oracle_in) is a product of at most two input magnitudes (dO, v),
// two operand magnitudes (|x_hat| |w| + |beta| < 2^136: |x_hat| <= sqrt(L)
// < 2^8), the scale, 1 / den < 2^149 and counts below 2^64: below 2^950,
// no overflow in double (2^1024), which the result's finiteness check
// guards as well (a non-finite value that is not a masked row's lse: the
// case runs again in long double). Underflow: P is in (0, 1] and a term
// P x (x such a product) may flush below 2^-1074 in double where long
// double keeps it; where P_ij > 0 is a channel's switch, alive (oracle_in)
// asks it of long double's P from S, and a flushed term is otherwise a
// value below 2^-1074 beside every bound's absolute part (ulp_c(0) >=
// 2^-149 per element, rule.h): no bound moves by more than double's own
// rounding. Round-before-weight formulations in 16-bit storage (Qwen3)
// stay in long double: their x_hat rounds to storage, and an oracle whose
// x_hat lies within u_f64 of a rounding midpoint would round it as the
// exact one may not, a logit change the rule's oracle channel has no term
// for (logit_flip is the kernel's).
bool use_double(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  if (c.storage == Precision::kF64 || reference::rounds_x_hat(p, c.storage))
    return false;
  auto in_range = [](double x) {
    const double a = std::fabs(x);
    return a == 0 || (a >= 0x1p-149 && a < 0x1p128);
  };
  for (const std::vector<double>* x : {&c.q, &c.k, &c.v, &c.d_o, &c.q_weight,
                                       &c.k_weight, &c.q_bias, &c.k_bias})
    for (double e : *x)
      if (!in_range(e)) return false;
  if (p.variant != Variant::kQKNorm) return true;
  return in_range(p.fixed_scale ? p.scale : p.g) && in_range(p.eps);
}

// Every value finite but a fully masked row's lse (-inf): the check that
// double held what long double would have (use_double).
template <class T>
bool all_finite(const OracleValues<T>& r) {
  bool ok = true;
  auto check = [&](const auto& x, const auto&) {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_arithmetic_v<X>) {
      ok = ok && std::isfinite(x);
    } else if (&x != &r.lse) {
      for (const auto& e : x) ok = ok && std::isfinite(e);
    } else {
      for (const auto& e : x) ok = ok && (std::isfinite(e) || e < 0);
    }
  };
  each_value(r, r, check);
  return ok;
}

// r's values into out (long double) and the unit roundoff T ran at.
template <class T>
void widen_values(const OracleValues<T>& r, OracleAttention* out) {
  if constexpr (!std::is_same_v<T, long double>) {
    each_value(r, *out, [](const auto& x, auto& y) {
      using X = std::decay_t<decltype(x)>;
      if constexpr (std::is_arithmetic_v<X>) {
        y = x;
      } else {
        y.assign(x.begin(), x.end());
      }
    });
  }
  out->unit_roundoff = std::numeric_limits<T>::epsilon() / 2;
  out->resolution = static_cast<double>(std::numeric_limits<T>::denorm_min());
  out->tiny = static_cast<double>(std::numeric_limits<T>::min());
}

// The oracle in T into *out; false (a narrower T only) where a value came
// out non-finite (use_double).
template <class T>
bool run_oracle(const AttentionCase& c, const GivenRows* given,
                const RowCounts& counts, const SubCaseOf& sub,
                OracleWorkspace::Arrays& a, OracleAttention* out) {
  if constexpr (std::is_same_v<T, long double>) {
    oracle_in<T>(c, given, counts, sub, a.in<T>(), *out, *out);
    widen_values(static_cast<const OracleValues<T>&>(*out), out);
    return true;
  } else {
    // The workspace's result arrays, emptied (their memory kept).
    OracleValues<T>& r = a.in<T>().out;
    each_value(r, r, [](auto& x, auto&) {
      using X = std::decay_t<decltype(x)>;
      if constexpr (std::is_arithmetic_v<X>) {
        x = 0;
      } else {
        x.clear();
      }
    });
    oracle_in<T>(c, given, counts, sub, a.in<T>(), r, *out);
    if (!all_finite(r)) return false;
    widen_values(r, out);
    return true;
  }
}

}  // namespace

// Empties r for reuse: each value array cleared (its memory kept), every
// other member as a fresh OracleAttention's.
void reset_keeping_memory(OracleAttention* r) {
  OracleValues<long double> values =
      std::move(static_cast<OracleValues<long double>&>(*r));
  each_value(values, values, [](auto& x, auto&) {
    using X = std::decay_t<decltype(x)>;
    if constexpr (std::is_arithmetic_v<X>) {
      x = X{};
    } else {
      x.clear();
    }
  });
  *r = OracleAttention{};
  static_cast<OracleValues<long double>&>(*r) = std::move(values);
}

void oracle_attention_into(const AttentionCase& c, const GivenRows* given,
                           const RowCounts& counts, OracleWorkspace* ws,
                           const OracleOptions& options, OracleAttention* out) {
  OracleWorkspace own;
  OracleWorkspace::Arrays& a = ws != nullptr ? *ws->arrays : *own.arrays;
  OracleAttention& r = *out;
  reset_keeping_memory(&r);
  // Forced precisions report what they computed, finite or not (tests).
  switch (options.precision) {
    case OraclePrecision::kFloat:
      if (!run_oracle<float>(c, given, counts, options.sub, a, &r))
        widen_values(a.f32.out, &r);
      return;
    case OraclePrecision::kDouble:
      if (!run_oracle<double>(c, given, counts, options.sub, a, &r))
        widen_values(a.f64.out, &r);
      return;
    case OraclePrecision::kLongDouble:
      run_oracle<long double>(c, given, counts, options.sub, a, &r);
      return;
    case OraclePrecision::kAuto:
      break;
  }
  // A sub-case runs in the arithmetic its whole case's operands were
  // normalized in (SharedOperands).
  const bool f64 = options.sub.shared != nullptr ? options.sub.shared->impl->f64
                                                 : use_double(c);
  if (f64 && run_oracle<double>(c, given, counts, options.sub, a, &r)) return;
  reset_keeping_memory(&r);
  run_oracle<long double>(c, given, counts, f64 ? SubCaseOf{} : options.sub, a,
                          &r);
}

OracleAttention oracle_attention(const AttentionCase& c, const GivenRows* given,
                                 const RowCounts& counts, OracleWorkspace* ws,
                                 const OracleOptions& options) {
  OracleAttention r;
  oracle_attention_into(c, given, counts, ws, options, &r);
  return r;
}

bool oracle_storage_equivalent(const AttentionProblem& p, Precision a,
                               Precision b) {
  if (a == b) return true;
  return a != Precision::kF64 && b != Precision::kF64 &&
         compute_roundoff(a) == compute_roundoff(b) &&
         !reference::rounds_x_hat(p, a) && !reference::rounds_x_hat(p, b);
}

SharedOperands::SharedOperands(const AttentionCase& whole)
    : impl(std::make_unique<Impl>()) {
  impl->f64 = use_double(whole);
  auto fill = [&](auto* sides) {
    using T = typename std::decay_t<decltype(sides[0].xh)>::value_type;
    std::array<std::vector<T>, 4> store;
    const reference::NormArgs<T> w = norm_args<T>(whole, &store);
    for (int side = 0; side < 2; ++side) {
      const std::vector<double>& x = side == 0 ? whole.q : whole.k;
      const std::vector<T> xt(x.begin(), x.end());
      fill_operand_mags(whole, side, xt.data(), w, &sides[side]);
    }
  };
  if (impl->f64) {
    fill(impl->dbl);
  } else {
    fill(impl->ld);
  }
  impl->cosine = std::make_unique<CosineRows>(whole);
}
SharedOperands::~SharedOperands() = default;
const CosineRows& SharedOperands::cosine() const { return *impl->cosine; }

}  // namespace qknorm::validation
