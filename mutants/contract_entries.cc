#include "mutants/contract_entries.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace qknorm::property {
namespace {

std::string kernel_name(ContractKernel k) {
  switch (k) {
    case ContractKernel::kEagerStorage:
      return "eager-storage";
    case ContractKernel::kEagerRowSumBf16Chop:
      return "eager-rowsum-bf16-chop";
    case ContractKernel::kPvAccF16:
      return "pv-acc-f16";
    case ContractKernel::kPvAccF16RoundsP:
      return "pv-acc-f16-rounds-p";
  }
  return "?";
}

// x rounded toward zero to bf16 (chopping: the bug; the right rounding is
// round_to's nearest-even).
double chop_bf16(double x) {
  const double r = round_to(Precision::kBF16, x);
  if (std::fabs(r) <= std::fabs(x)) return r;
  return r - std::copysign(ulp(Precision::kBF16, std::fabs(x)), x);
}

// One (b, h) slice of a strided 4-D tensor as dense rows.
struct Slice {
  std::vector<double> x;  // [rows, D]
};

class ContractEntry final : public Backend {
 public:
  ContractEntry(ContractKernel k, Precision s, const ComputeContract& declared)
      : Backend("contract:" + kernel_name(k), "-", s),
        kernel_(k),
        declared_(declared) {}

  ComputeContract contract() const override { return declared_; }
  bool supports(const AttentionProblem& p) const override {
    return p.variant == Variant::kQKNorm && is_paper_formulation(p);
  }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig&) const override {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        Head hd = head(p, a.q, a.k, a.v, b, h);
        for (int64_t i = 0; i < p.q_len; ++i) {
          const auto iu = static_cast<size_t>(i);
          const size_t row =
              static_cast<size_t>((b * p.heads + h) * p.q_len + i);
          if (hd.l[iu] == 0) {  // fully masked: O = 0, lse = -inf
            for (int64_t d = 0; d < p.head_dim; ++d) put(a.o, b, h, i, d, 0.0);
            a.lse[row] = -std::numeric_limits<double>::infinity();
            continue;
          }
          for (int64_t d = 0; d < p.head_dim; ++d)
            put(a.o, b, h, i, d, pv(p, hd, i, d));
          a.lse[row] = f32(hd.m[iu] + std::log(hd.l[iu]));
        }
      }
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig&) const override {
    const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
    double dg = 0;
    const double g = el(p.g);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads; ++h) {
        const Head hd = head(p, a.q, a.k, a.v, b, h);
        const std::vector<double> d_o = rows(a.d_o, b, h, Nq, D);
        auto at = [&](int64_t r, int64_t d) {
          return static_cast<size_t>(r * D + d);
        };
        std::vector<double> ds(static_cast<size_t>(Nq * Nk), 0.0);
        for (int64_t i = 0; i < Nq; ++i) {
          std::vector<double> dp(static_cast<size_t>(Nk), 0.0);
          double delta = 0;
          for (int64_t j = 0; j < Nk; ++j) {
            const double pij = hd.p[static_cast<size_t>(i * Nk + j)];
            if (pij == 0) continue;
            double s = 0;
            for (int64_t d = 0; d < D; ++d)
              s = f32(s + f32(d_o[at(i, d)] * hd.v[at(j, d)]));
            dp[static_cast<size_t>(j)] = el(s);
            delta = f32(delta + f32(pij * dp[static_cast<size_t>(j)]));
          }
          delta = el(delta);
          for (int64_t j = 0; j < Nk; ++j) {
            const double pij = hd.p[static_cast<size_t>(i * Nk + j)];
            const double dsij =
                el(pij * el(dp[static_cast<size_t>(j)] - delta));
            ds[static_cast<size_t>(i * Nk + j)] = dsij;
            dg = f32(dg + f32(dsij * hd.c[static_cast<size_t>(i * Nk + j)]));
          }
        }
        // dV = P^T dO; dQ_hat = g dS K_hat; dK_hat = g dS^T Q_hat.
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (int64_t i = 0; i < Nq; ++i)
              s = f32(s + f32(hd.p[static_cast<size_t>(i * Nk + j)] *
                              d_o[at(i, d)]));
            put(a.dv, b, h, j, d, el(s));
          }
        std::vector<double> du(static_cast<size_t>(Nq * D)),
            dku(static_cast<size_t>(Nk * D));
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (int64_t j = 0; j < Nk; ++j)
              s = f32(s + f32(el(g * ds[static_cast<size_t>(i * Nk + j)]) *
                              hd.kh[at(j, d)]));
            du[at(i, d)] = el(s);
          }
        for (int64_t j = 0; j < Nk; ++j)
          for (int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (int64_t i = 0; i < Nq; ++i)
              s = f32(s + f32(el(g * ds[static_cast<size_t>(i * Nk + j)]) *
                              hd.qh[at(i, d)]));
            dku[at(j, d)] = el(s);
          }
        norm_backward(p, hd.qh, hd.qn, du, Nq, a.dq, b, h);
        norm_backward(p, hd.kh, hd.kn, dku, Nk, a.dk, b, h);
      }
    *a.dg = f32(dg);
  }

  void scalenorm_forward(const ScaleNormProblem&, const ScaleNormForwardArgs&,
                         Workspace*, const ExecConfig&) const override {
    throw std::logic_error(kernel_name(kernel_) + ": attention only");
  }
  void scalenorm_backward(const ScaleNormProblem&, const ScaleNormBackwardArgs&,
                          Workspace*, const ExecConfig&) const override {
    throw std::logic_error(kernel_name(kernel_) + ": attention only");
  }

 private:
  bool eager() const {
    return kernel_ == ContractKernel::kEagerStorage ||
           kernel_ == ContractKernel::kEagerRowSumBf16Chop;
  }
  static double f32(double x) { return round_to(Precision::kF32, x); }
  // An elementwise result (and a reduction's result): the storage format in
  // eager mode, f32 otherwise. Reductions accumulate in f32 (f32()).
  double el(double x) const {
    return eager() ? round_to(precision(), x) : f32(x);
  }

  // One (b, h) head's forward intermediates, rounded where the kernel does.
  struct Head {
    std::vector<double> qh, kh, v, qn, kn;  // unit rows, the cache, norms
    std::vector<double> c, p;               // [Nq, Nk]: cosines, P
    std::vector<double> m, l;               // per query row
  };

  std::vector<double> rows(const ConstTensor4& t, int64_t b, int64_t h,
                           int64_t n, int64_t D) const {
    std::vector<double> r(static_cast<size_t>(n * D));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < D; ++d)
        r[static_cast<size_t>(i * D + d)] =
            decode(precision(), t.data,
                   static_cast<size_t>(b * t.layout.batch_stride +
                                       h * t.layout.head_stride +
                                       i * t.layout.row_stride + d));
    return r;
  }
  void put(const MutTensor4& t, int64_t b, int64_t h, int64_t i, int64_t d,
           double x) const {
    encode(precision(), x, t.data,
           static_cast<size_t>(b * t.layout.batch_stride +
                               h * t.layout.head_stride +
                               i * t.layout.row_stride + d));
  }

  // Unit rows x / max(||x||, eps): the sum of squares accumulated in f32,
  // every result rounded by el(); norms into *n.
  void normalize(const AttentionProblem& p, std::vector<double>* x,
                 std::vector<double>* n, int64_t rows_n) const {
    const int64_t D = p.head_dim;
    n->assign(static_cast<size_t>(rows_n), 0.0);
    for (int64_t r = 0; r < rows_n; ++r) {
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double e = (*x)[static_cast<size_t>(r * D + d)];
        ss = f32(ss + f32(e * e));
      }
      const double nr = std::max(el(std::sqrt(el(ss))), p.eps);
      (*n)[static_cast<size_t>(r)] = nr;
      for (int64_t d = 0; d < D; ++d) {
        double& e = (*x)[static_cast<size_t>(r * D + d)];
        e = el(e / nr);
      }
    }
  }

  Head head(const AttentionProblem& p, const ConstTensor4& q,
            const ConstTensor4& k, const ConstTensor4& v, int64_t b,
            int64_t h) const {
    const int64_t Nq = p.q_len, Nk = p.kv_len, D = p.head_dim;
    Head hd;
    hd.qh = rows(q, b, h, Nq, D);
    hd.kh = rows(k, b, h, Nk, D);
    hd.v = rows(v, b, h, Nk, D);
    normalize(p, &hd.qh, &hd.qn, Nq);
    normalize(p, &hd.kh, &hd.kn, Nk);
    const double g = el(p.g);
    hd.c.assign(static_cast<size_t>(Nq * Nk), 0.0);
    hd.p.assign(static_cast<size_t>(Nq * Nk), 0.0);
    hd.m.assign(static_cast<size_t>(Nq), 0.0);
    hd.l.assign(static_cast<size_t>(Nq), 0.0);
    std::vector<double> s(static_cast<size_t>(Nk));
    for (int64_t i = 0; i < Nq; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Nk; ++j) {
        double c = 0;
        for (int64_t d = 0; d < D; ++d)
          c = f32(c + f32(hd.qh[static_cast<size_t>(i * D + d)] *
                          hd.kh[static_cast<size_t>(j * D + d)]));
        c = el(c);
        hd.c[static_cast<size_t>(i * Nk + j)] = c;
        s[static_cast<size_t>(j)] = el(g * c);
        if (visible(p.mask, b, i, j, Nq, Nk))
          m = std::max(m, s[static_cast<size_t>(j)]);
      }
      if (std::isinf(m)) continue;  // fully masked: P = 0, l = 0
      double l = 0;
      std::vector<double> e(static_cast<size_t>(Nk), 0.0);
      for (int64_t j = 0; j < Nk; ++j) {
        if (!visible(p.mask, b, i, j, Nq, Nk)) continue;
        const double ej = el(std::exp(el(s[static_cast<size_t>(j)] - m)));
        e[static_cast<size_t>(j)] = ej;
        l = kernel_ == ContractKernel::kEagerRowSumBf16Chop ? chop_bf16(l + ej)
                                                            : f32(l + ej);
      }
      l = el(l);
      hd.m[static_cast<size_t>(i)] = m;
      hd.l[static_cast<size_t>(i)] = l;
      for (int64_t j = 0; j < Nk; ++j) {
        double pij = el(e[static_cast<size_t>(j)] / l);
        if (kernel_ == ContractKernel::kPvAccF16RoundsP)
          pij = round_to(Precision::kF16, pij);
        hd.p[static_cast<size_t>(i * Nk + j)] = pij;
      }
    }
    return hd;
  }

  // O_id = sum_j P_ij v_jd: f32 products; the sum in f32 (eager: its
  // result rounded to storage) or in an f16 accumulator.
  double pv(const AttentionProblem& p, const Head& hd, int64_t i,
            int64_t d) const {
    const int64_t Nk = p.kv_len, D = p.head_dim;
    const bool f16_acc = kernel_ == ContractKernel::kPvAccF16 ||
                         kernel_ == ContractKernel::kPvAccF16RoundsP;
    double acc = 0;
    for (int64_t j = 0; j < Nk; ++j) {
      const double t = f32(hd.p[static_cast<size_t>(i * Nk + j)] *
                           hd.v[static_cast<size_t>(j * D + d)]);
      acc = f16_acc ? round_to(Precision::kF16, acc + t) : f32(acc + t);
    }
    return el(acc);
  }

  // dx = (du - u (u . du)) / n where ||x|| > eps, du / eps otherwise (the
  // clamp's branch), every result rounded by el().
  void norm_backward(const AttentionProblem& p, const std::vector<double>& u,
                     const std::vector<double>& n,
                     const std::vector<double>& du, int64_t rows_n,
                     const MutTensor4& dx, int64_t b, int64_t h) const {
    const int64_t D = p.head_dim;
    for (int64_t r = 0; r < rows_n; ++r) {
      const double nr = n[static_cast<size_t>(r)];
      const bool clamped = !(nr > p.eps);
      double c = 0;
      for (int64_t d = 0; d < D; ++d)
        c = f32(c + f32(u[static_cast<size_t>(r * D + d)] *
                        du[static_cast<size_t>(r * D + d)]));
      c = el(c);
      for (int64_t d = 0; d < D; ++d) {
        const double dud = du[static_cast<size_t>(r * D + d)];
        const double w =
            clamped ? dud : el(dud - el(u[static_cast<size_t>(r * D + d)] * c));
        put(dx, b, h, r, d, el(w / nr));
      }
    }
  }

  ContractKernel kernel_;
  ComputeContract declared_;
};

}  // namespace

std::unique_ptr<Backend> make_contract_entry(ContractKernel kernel, Precision s,
                                             const ComputeContract& declared) {
  return std::make_unique<ContractEntry>(kernel, s, declared);
}

}  // namespace qknorm::property
