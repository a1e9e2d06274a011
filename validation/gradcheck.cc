#include "validation/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "reference/reference.h"
#include "validation/field.h"
#include "validation/rng.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {
namespace {

using LD = long double;

// Flat parameter vector [q | k | v | g] (attention) or [x | g] (ScaleNorm),
// with per-element steps and the name of each element.
struct Flat {
  std::vector<LD> x, step;
  std::vector<int64_t> group;  // 0 q, 1 k, 2 v, 3 g (attention); 0 x, 1 g
  std::function<std::string(size_t)> item;
};

void add_rows(const std::vector<double>& t, int64_t D, int group, LD eps,
              LD g_div, Flat* f) {
  const int64_t rows = static_cast<int64_t>(t.size()) / D;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<LD> row(t.begin() + r * D, t.begin() + (r + 1) * D);
    const LD n = reference::nrm2<LD>(row.data(), D);
    const LD h = n > eps ? kFdStep * n / g_div : kFdStep * eps;
    for (int64_t d = 0; d < D; ++d) {
      f->x.push_back(row[static_cast<size_t>(d)]);
      f->step.push_back(h);
      f->group.push_back(group);
    }
  }
}

void add_norm_rows(const AttentionProblem& p, int side,
                   const std::vector<double>& t, LD gdiv, Flat* f) {
  const NormRows nr = norm_rows(p, side);
  const int64_t L = nr.len();
  std::vector<LD> den(static_cast<size_t>(nr.rows()), 1);
  std::vector<int64_t> row_of(t.size());
  for (int64_t r = 0; r < nr.rows(); ++r) {
    LD s1 = 0, s2 = 0;
    for (int64_t e = 0; e < L; ++e) {
      const LD x = t[static_cast<size_t>(nr.at(r, e))];
      row_of[static_cast<size_t>(nr.at(r, e))] = r;
      s1 += x;
      s2 += x * x;
    }
    const LD n = static_cast<LD>(L), eps = static_cast<LD>(p.eps);
    if (p.norm.kind == NormKind::kRms)
      den[static_cast<size_t>(r)] = std::sqrt(s2 / n + eps);
    if (p.norm.kind == NormKind::kLayer)
      den[static_cast<size_t>(r)] =
          std::sqrt(std::max<LD>(0, s2 / n - (s1 / n) * (s1 / n)) + eps);
    if (p.norm.kind == NormKind::kNone)
      den[static_cast<size_t>(r)] = std::max<LD>(1, std::sqrt(s2));
  }
  for (size_t i = 0; i < t.size(); ++i) {
    f->x.push_back(t[i]);
    f->step.push_back(kFdStep * den[static_cast<size_t>(row_of[i])] / gdiv);
    f->group.push_back(side);
  }
}

std::string index4(const AttentionProblem& p, int64_t rows, int64_t i,
                   int64_t heads) {
  const int64_t D = p.head_dim;
  const int64_t d = i % D, n = (i / D) % rows, h = (i / D / rows) % heads,
                b = i / D / rows / heads;
  char buf[96];
  std::snprintf(buf, sizeof buf, "[%lld,%lld,%lld,%lld]", (long long)b,
                (long long)h, (long long)n, (long long)d);
  return buf;
}

Flat flatten(const AttentionCase& c) {
  const AttentionProblem& p = c.problem;
  const bool qk = p.variant == Variant::kQKNorm;
  // sdpa: no clamp; its logits move by ||other|| h / sqrt(D), O(h) for
  // unit-scale inputs, so the plain relative step is used (eps -> 0 guard).
  const LD eps = qk ? static_cast<LD>(p.eps) : 0.0L;
  const LD gdiv =
      qk ? std::max<LD>(1, is_paper_formulation(p)
                               ? std::fabs(static_cast<LD>(p.g))
                               : static_cast<LD>(logit_amplitude(c)))
         : 1;
  Flat f;
  if (qk && p.norm.kind != NormKind::kL2) {
    // rms, layer, none: smooth everywhere (no clamp kink). x_hat moves by
    // h / den, den = sqrt(mean x^2 + eps) (rms), sqrt(var + eps) (layer)
    // over the normalization row, or 1 (none): h = kFdStep den / gdiv.
    add_norm_rows(p, 0, c.q, gdiv, &f);
    add_norm_rows(p, 1, c.k, gdiv, &f);
  } else {
    add_rows(c.q, p.head_dim, 0, eps, gdiv, &f);
    add_rows(c.k, p.head_dim, 1, eps, gdiv, &f);
  }
  add_rows(c.v, p.head_dim, 2, 0, 1, &f);
  int grp = 4;
  for (const std::vector<double>* w :
       {&c.q_weight, &c.k_weight, &c.q_bias, &c.k_bias}) {
    for (double x : *w) {
      f.x.push_back(x);
      f.step.push_back(kFdStep * std::max<LD>(1, std::fabs(x)) / gdiv);
      f.group.push_back(grp);
    }
    ++grp;
  }
  // Sinks step by kFdStep times a power of two at least max(1, |sink|):
  // sink +- h is exact in the double the problem holds.
  for (double s : p.sinks) {
    f.x.push_back(s);
    f.step.push_back(std::ldexp(static_cast<LD>(kFdStep),
                                std::ilogb(std::max(1.0, std::fabs(s))) + 1));
    f.group.push_back(8);
  }
  f.x.push_back(p.g);
  f.step.push_back(kFdStep * std::max<LD>(1, std::fabs(static_cast<LD>(p.g))));
  f.group.push_back(3);
  for (auto& s : f.step)
    if (s == 0)
      s = kFdStep;  // all-zero v row: any step is fine (L is linear in v)
  const size_t nq = c.q.size(), nk = c.k.size();
  const size_t np[4] = {c.q_weight.size(), c.k_weight.size(), c.q_bias.size(),
                        c.k_bias.size()};
  const size_t ns = p.sinks.size();
  f.item = [p, nq, nk, np, ns](size_t i) -> std::string {
    if (i < nq)
      return name(Field::kDq) +
             index4(p, p.q_len, static_cast<int64_t>(i), p.heads);
    if (i < nq + nk)
      return name(Field::kDk) +
             index4(p, p.kv_len, static_cast<int64_t>(i - nq), kv_heads_of(p));
    if (i < nq + 2 * nk)
      return name(Field::kDv) + index4(p, p.kv_len,
                                       static_cast<int64_t>(i - nq - nk),
                                       kv_heads_of(p));
    size_t j = i - nq - 2 * nk;
    constexpr Field kParams[4] = {Field::kDqWeight, Field::kDkWeight,
                                  Field::kDqBias, Field::kDkBias};
    for (int t = 0; t < 4; ++t) {
      if (j < np[t])
        return std::string(name(kParams[t])) + "[" + std::to_string(j) + "]";
      j -= np[t];
    }
    if (j < ns)
      return std::string(name(Field::kDSinks)) + "[" + std::to_string(j) + "]";
    return name(Field::kDg);
  };
  return f;
}

LD loss(const AttentionCase& c, const std::vector<LD>& x) {
  AttentionProblem p = c.problem;
  const size_t nq = c.q.size(), nk = c.k.size();
  const LD* q = x.data();
  const LD* k = q + nq;
  const LD* v = k + nk;
  const LD* pw = v + nk;
  reference::NormArgs<LD> w;  // storage f64: x_hat is never rounded
  const LD** dst[4] = {&w.q_weight, &w.k_weight, &w.q_bias, &w.k_bias};
  const std::vector<double>* src[4] = {&c.q_weight, &c.k_weight, &c.q_bias,
                                       &c.k_bias};
  for (int t = 0; t < 4; ++t) {
    *dst[t] = src[t]->empty() ? nullptr : pw;
    pw += src[t]->size();
  }
  for (double& s : p.sinks) s = static_cast<double>(*pw++);
  p.g = static_cast<double>(x.back());
  // g is perturbed in long double but the problem holds a double: perturb g
  // only by steps exactly representable in double (kFdStep * 2^k is).
  std::vector<LD> o(nq), lse(static_cast<size_t>(p.batch * p.heads * p.q_len));
  reference::attention_forward<LD>(p, q, k, v, o.data(), lse.data(), w);
  LD L = 0;
  for (size_t i = 0; i < nq; ++i) L += static_cast<LD>(c.d_o[i]) * o[i];
  return L;
}

std::vector<LD> flat_grad(const AttentionGradients& g) {
  std::vector<LD> r = g.dq;
  r.insert(r.end(), g.dk.begin(), g.dk.end());
  r.insert(r.end(), g.dv.begin(), g.dv.end());
  for (const auto* w : {&g.dq_weight, &g.dk_weight, &g.dq_bias, &g.dk_bias})
    r.insert(r.end(), w->begin(), w->end());
  r.insert(r.end(), g.d_sinks.begin(), g.d_sinks.end());
  r.push_back(g.dg);
  return r;
}

GradCheckReport full(const Flat& f, const std::vector<LD>& grad,
                     const std::function<LD(const std::vector<LD>&)>& loss,
                     double tol) {
  GradCheckReport rep;
  int ngroups = 0;
  for (int64_t gi : f.group)
    ngroups = std::max<int>(ngroups, static_cast<int>(gi) + 1);
  std::vector<LD> gscale(static_cast<size_t>(ngroups), 0);
  for (size_t i = 0; i < grad.size(); ++i)
    gscale[static_cast<size_t>(f.group[i])] =
        std::max(gscale[static_cast<size_t>(f.group[i])], std::fabs(grad[i]));
  std::vector<LD> x = f.x;
  for (size_t i = 0; i < x.size(); ++i) {
    const LD h = f.step[i], x0 = x[i];
    x[i] = x0 + h;
    const LD lp = loss(x);
    x[i] = x0 - h;
    const LD lm = loss(x);
    x[i] = x0;
    const LD fd = (lp - lm) / (2 * h);
    // Each element is judged relative to its tensor's largest gradient,
    // but never below 1e-2 of the largest gradient of any tensor: a tensor
    // whose exact gradient is 0 (a key bias: softmax ignores a shift shared
    // by a row's logits) holds only rounding noise, ~1e-19, and the
    // difference quotient holds its own, ~1e-12 (u_LD |L| / h); a tensor
    // identically 0 everywhere is judged against 1.
    LD all = 0;
    for (LD gs : gscale) all = std::max(all, gs);
    const LD scale = std::max({gscale[static_cast<size_t>(f.group[i])],
                               1e-2L * all, all > 0 ? 1e-300L : 1.0L});
    const double rel = static_cast<double>(std::fabs(fd - grad[i]) / scale);
    ++rep.checked;
    if (rel > rep.worst_rel || rep.worst_item.empty()) {
      rep.worst_rel = rel;
      rep.worst_item = f.item(i);
      rep.worst_fd = fd;
      rep.worst_analytic = grad[i];
    }
  }
  rep.pass = rep.worst_rel <= tol;
  return rep;
}

GradCheckReport directions(
    const Flat& f, const std::vector<LD>& grad,
    const std::function<LD(const std::vector<LD>&)>& loss, int n_dirs,
    uint64_t seed, double tol) {
  GradCheckReport rep;
  Rng rng(seed);
  std::vector<LD> x(f.x.size());
  for (int d = 0; d < n_dirs; ++d) {
    std::vector<LD> t(f.x.size());
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<LD>(rng.normal()) * f.step[i];
    // t already carries the per-element step; h = 1 along t.
    LD dot = 0, mag = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      dot += grad[i] * t[i];
      mag += std::fabs(grad[i] * t[i]);
    }
    for (size_t i = 0; i < t.size(); ++i) x[i] = f.x[i] + t[i];
    const LD lp = loss(x);
    for (size_t i = 0; i < t.size(); ++i) x[i] = f.x[i] - t[i];
    const LD lm = loss(x);
    const LD fd = (lp - lm) / 2;
    const double rel =
        static_cast<double>(std::fabs(fd - dot) / (mag > 0 ? mag : 1));
    ++rep.checked;
    if (rel > rep.worst_rel || rep.worst_item.empty()) {
      rep.worst_rel = rel;
      rep.worst_item = "direction " + std::to_string(d) + " (rng seed " +
                       std::to_string(seed) + ")";
      rep.worst_fd = fd;
      rep.worst_analytic = dot;
    }
  }
  rep.pass = rep.worst_rel <= tol;
  return rep;
}

Flat flatten(const ScaleNormCase& c) {
  Flat f;
  add_rows(c.x, c.problem.dim, 0, static_cast<LD>(c.problem.eps),
           /*g_div=*/1, &f);  // L = g <dy, u(x)>: g only scales L
  f.x.push_back(c.problem.g);
  f.step.push_back(kFdStep *
                   std::max<LD>(1, std::fabs(static_cast<LD>(c.problem.g))));
  f.group.push_back(1);
  const int64_t D = c.problem.dim;
  const size_t nx = c.x.size();
  f.item = [D, nx](size_t i) -> std::string {
    if (i >= nx) return name(Field::kScaleNormDg);
    return name(Field::kDx) +
           ("[" + std::to_string(i / D) + "," + std::to_string(i % D) + "]");
  };
  return f;
}

LD loss(const ScaleNormCase& c, const std::vector<LD>& x) {
  ScaleNormProblem p = c.problem;
  p.g = static_cast<double>(x.back());
  std::vector<LD> y(c.x.size());
  reference::scalenorm_forward<LD>(p, x.data(), y.data());
  LD L = 0;
  for (size_t i = 0; i < y.size(); ++i) L += static_cast<LD>(c.dy[i]) * y[i];
  return L;
}

std::vector<LD> flat_grad(const ScaleNormGradients& g) {
  std::vector<LD> r = g.dx;
  r.push_back(g.dg);
  return r;
}

}  // namespace

std::string GradCheckReport::message() const {
  char buf[384];
  std::snprintf(buf, sizeof buf,
                "gradcheck %s: %lld checked, worst %s: finite-diff=%.17Lg "
                "analytic=%.17Lg rel=%.3e",
                pass ? "ok" : "FAILED", (long long)checked, worst_item.c_str(),
                worst_fd, worst_analytic, worst_rel);
  return buf;
}

namespace {

// Note on g: the loss stores the perturbed g in a double. Steps
// kFdStep * max(1,|g|) are not exact multiples in general, so the loss uses
// the double-rounded g on both sides; the finite difference then divides by
// the true (rounded) distance between the two g values.
template <class Case, class Gradients>
GradCheckReport check_full(const Case& c, const Gradients& grad, double tol) {
  Flat f = flatten(c);
  // Make the g step exactly representable: g +- h rounded to double.
  const double g = c.problem.g;
  const double h = static_cast<double>(f.step.back());
  f.step.back() = static_cast<LD>((g + h) - g);
  return full(
      f, flat_grad(grad), [&](const std::vector<LD>& x) { return loss(c, x); },
      tol);
}

template <class Case, class Gradients>
GradCheckReport check_directions(const Case& c, const Gradients& grad,
                                 int n_dirs, uint64_t seed, double tol) {
  Flat f = flatten(c);
  // Directional mode keeps g fixed (its derivative is checked in full mode
  // and by the dg finite-difference property): zero step on g.
  f.step.back() = 0;
  return directions(
      f, flat_grad(grad), [&](const std::vector<LD>& x) { return loss(c, x); },
      n_dirs, seed, tol);
}

}  // namespace

GradCheckReport check_attention_full(const AttentionCase& c,
                                     const AttentionGradients& grad,
                                     double tol) {
  return check_full(c, grad, tol);
}

GradCheckReport check_attention_directions(const AttentionCase& c,
                                           const AttentionGradients& grad,
                                           int n_dirs, uint64_t seed,
                                           double tol) {
  return check_directions(c, grad, n_dirs, seed, tol);
}

GradCheckReport check_scalenorm_full(const ScaleNormCase& c,
                                     const ScaleNormGradients& grad,
                                     double tol) {
  return check_full(c, grad, tol);
}

GradCheckReport check_scalenorm_directions(const ScaleNormCase& c,
                                           const ScaleNormGradients& grad,
                                           int n_dirs, uint64_t seed,
                                           double tol) {
  return check_directions(c, grad, n_dirs, seed, tol);
}

}  // namespace qknorm::validation
