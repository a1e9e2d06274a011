// Per (batch b, head h), with Q [q_len, D], K, V [kv_len, D]
// (qknorm/attention.h):
//   qknorm: q_hat = q / max(||q||, eps), k_hat likewise, S = g q_hat k_hat^T
//   sdpa:   S = q k^T / sqrt(D)
//   P = softmax over the visible keys, O = P V, lse = log sum exp S
// Backward: dV = P^T dO, dP = dO V^T, delta = rowsum(dO * O),
//   dS = P (dP - delta), dg = sum dS C (C = q_hat k_hat^T),
//   dq_hat = g dS k_hat, dk_hat = g dS^T q_hat, then per row
//   dx = (du - u (u . du)) / ||x|| if ||x|| > eps, else du / eps.
// ScaleNorm: y = g x / max(||x||, eps); dx = (g / ||x||)(dy - u (u . dy))
// (g dy / eps in the clamp), dg = sum dy . u.
#include "naive_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace naive {
namespace {

using qknorm::AttentionProblem;
using Row = std::vector<double>;

// Row n of head (b, h) of a strided [B, H, N, D] tensor.
const double* row(const qknorm::ConstTensor4& t, int64_t b, int64_t h,
                  int64_t n) {
  const auto& l = t.layout;
  return static_cast<const double*>(t.data) + b * l.batch_stride +
         h * l.head_stride + n * l.row_stride;
}
double* row(const qknorm::MutTensor4& t, int64_t b, int64_t h, int64_t n) {
  const auto& l = t.layout;
  return static_cast<double*>(t.data) + b * l.batch_stride + h * l.head_stride +
         n * l.row_stride;
}

double dot(const double* x, const double* y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// ||x||, scaled by max |x_i| so that no finite row overflows or underflows.
double norm2(const double* x, int64_t n) {
  double amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0) return 0;
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] / amax) * (x[i] / amax);
  return amax * std::sqrt(s);
}

// The logit operands of one head: q_hat and k_hat (qknorm) or q and k
// (sdpa), with the norms the backward needs, and the logit scale.
struct Operands {
  std::vector<Row> q, k;       // [q_len][D], [kv_len][D]
  std::vector<double> qn, kn;  // ||q_i||, ||k_j|| (qknorm)
  double scale = 1;
};

void load_side(const AttentionProblem& p, const qknorm::ConstTensor4& t,
               int64_t b, int64_t h, int64_t rows, std::vector<Row>* x,
               std::vector<double>* norms) {
  const int64_t D = p.head_dim;
  x->assign(rows, Row(D));
  norms->assign(rows, 0);
  for (int64_t n = 0; n < rows; ++n) {
    const double* src = row(t, b, h, n);
    double div = 1;
    if (p.variant == qknorm::Variant::kQKNorm) {
      (*norms)[n] = norm2(src, D);
      div = std::max((*norms)[n], p.eps);
    }
    for (int64_t d = 0; d < D; ++d) (*x)[n][d] = src[d] / div;
  }
}

Operands operands(const AttentionProblem& p, const qknorm::ConstTensor4& q,
                  const qknorm::ConstTensor4& k, int64_t b, int64_t h) {
  Operands o;
  load_side(p, q, b, h, p.q_len, &o.q, &o.qn);
  load_side(p, k, b, h, p.kv_len, &o.k, &o.kn);
  o.scale = p.variant == qknorm::Variant::kQKNorm
                ? p.g
                : 1 / std::sqrt(static_cast<double>(p.head_dim));
  return o;
}

// Row i of P (0 where masked) and lse_i; -inf for a fully masked row.
double softmax_row(const AttentionProblem& p, const Operands& x, int64_t b,
                   int64_t i, double* prow) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < p.kv_len; ++j) {
    prow[j] = 0;
    if (qknorm::visible(p.mask, b, i, j, p.q_len, p.kv_len))
      m = std::max(m, x.scale * dot(x.q[i].data(), x.k[j].data(), p.head_dim));
  }
  if (m == -std::numeric_limits<double>::infinity()) return m;
  double l = 0;
  for (int64_t j = 0; j < p.kv_len; ++j)
    if (qknorm::visible(p.mask, b, i, j, p.q_len, p.kv_len)) {
      prow[j] =
          std::exp(x.scale * dot(x.q[i].data(), x.k[j].data(), p.head_dim) - m);
      l += prow[j];
    }
  for (int64_t j = 0; j < p.kv_len; ++j) prow[j] /= l;
  return m + std::log(l);
}

// Normalization backward of one row, du -> dx (qknorm only).
void unit_backward(const Row& u, double nrm, double eps, const Row& du,
                   double* dx) {
  const int64_t D = static_cast<int64_t>(u.size());
  if (nrm > eps) {
    const double c = dot(u.data(), du.data(), D);
    for (int64_t d = 0; d < D; ++d) dx[d] = (du[d] - u[d] * c) / nrm;
  } else {
    for (int64_t d = 0; d < D; ++d) dx[d] = du[d] / eps;
  }
}

}  // namespace

void NaiveF64::attention_forward(const AttentionProblem& p,
                                 const qknorm::ForwardArgs& a,
                                 qknorm::Workspace*,
                                 const qknorm::ExecConfig&) const {
  Row prow(p.kv_len);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const Operands x = operands(p, a.q, a.k, b, h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        a.lse[(b * p.heads + h) * p.q_len + i] =
            softmax_row(p, x, b, i, prow.data());
        double* o = row(a.o, b, h, i);
        for (int64_t d = 0; d < p.head_dim; ++d) {
          double s = 0;
          for (int64_t j = 0; j < p.kv_len; ++j)
            if (prow[j] != 0) s += prow[j] * row(a.v, b, h, j)[d];
          o[d] = s;
        }
      }
    }
}

bool NaiveF64::attention_probabilities(const AttentionProblem& p,
                                       const qknorm::ForwardArgs& a,
                                       double* probs,
                                       qknorm::Workspace*) const {
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const Operands x = operands(p, a.q, a.k, b, h);
      for (int64_t i = 0; i < p.q_len; ++i)
        softmax_row(p, x, b, i,
                    probs + ((b * p.heads + h) * p.q_len + i) * p.kv_len);
    }
  return true;
}

void NaiveF64::attention_backward(const AttentionProblem& p,
                                  const qknorm::BackwardArgs& a,
                                  qknorm::Workspace*,
                                  const qknorm::ExecConfig&) const {
  const int64_t D = p.head_dim;
  const bool qknorm = p.variant == qknorm::Variant::kQKNorm;
  double dg = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const Operands x = operands(p, a.q, a.k, b, h);
      std::vector<Row> dqh(p.q_len, Row(D, 0)), dkh(p.kv_len, Row(D, 0));
      for (int64_t j = 0; j < p.kv_len; ++j)
        std::fill_n(row(a.dv, b, h, j), D, 0.0);
      double dg_head = 0;
      for (int64_t i = 0; i < p.q_len; ++i) {
        const double lse = a.lse[(b * p.heads + h) * p.q_len + i];
        if (lse == -std::numeric_limits<double>::infinity()) continue;
        const double* d_o = row(a.d_o, b, h, i);
        const double delta = dot(d_o, row(a.o, b, h, i), D);
        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (!qknorm::visible(p.mask, b, i, j, p.q_len, p.kv_len)) continue;
          const double c = dot(x.q[i].data(), x.k[j].data(), D);
          const double pij = std::exp(x.scale * c - lse);
          const double* v = row(a.v, b, h, j);
          double* dv = row(a.dv, b, h, j);
          for (int64_t d = 0; d < D; ++d) dv[d] += pij * d_o[d];
          const double ds = pij * (dot(d_o, v, D) - delta);
          dg_head += ds * c;
          for (int64_t d = 0; d < D; ++d) {
            dqh[i][d] += x.scale * ds * x.k[j][d];
            dkh[j][d] += x.scale * ds * x.q[i][d];
          }
        }
      }
      // The gradients of the logit operands -> dq, dk.
      auto store = [&](const std::vector<Row>& u, const std::vector<double>& n,
                       const std::vector<Row>& du,
                       const qknorm::MutTensor4& t) {
        for (size_t r = 0; r < u.size(); ++r) {
          double* out = row(t, b, h, static_cast<int64_t>(r));
          if (qknorm)
            unit_backward(u[r], n[r], p.eps, du[r], out);
          else
            std::copy(du[r].begin(), du[r].end(), out);
        }
      };
      store(x.q, x.qn, dqh, a.dq);
      store(x.k, x.kn, dkh, a.dk);
      dg += dg_head;
    }
  *a.dg = qknorm ? dg : 0;
}

void NaiveF64::scalenorm_forward(const qknorm::ScaleNormProblem& p,
                                 const qknorm::ScaleNormForwardArgs& a,
                                 qknorm::Workspace*,
                                 const qknorm::ExecConfig&) const {
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* x = static_cast<const double*>(a.x.data) + r * a.x.row_stride;
    double* y = static_cast<double*>(a.y.data) + r * a.y.row_stride;
    const double div = std::max(norm2(x, p.dim), p.eps);
    for (int64_t d = 0; d < p.dim; ++d) y[d] = p.g * (x[d] / div);
  }
}

void NaiveF64::scalenorm_backward(const qknorm::ScaleNormProblem& p,
                                  const qknorm::ScaleNormBackwardArgs& a,
                                  qknorm::Workspace*,
                                  const qknorm::ExecConfig&) const {
  double dg = 0;
  Row u(p.dim), du(p.dim);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* x = static_cast<const double*>(a.x.data) + r * a.x.row_stride;
    const double* dy =
        static_cast<const double*>(a.dy.data) + r * a.dy.row_stride;
    double* dx = static_cast<double*>(a.dx.data) + r * a.dx.row_stride;
    const double nrm = norm2(x, p.dim);
    const double div = std::max(nrm, p.eps);
    for (int64_t d = 0; d < p.dim; ++d) {
      u[d] = x[d] / div;
      du[d] = p.g * dy[d];
    }
    dg += dot(dy, u.data(), p.dim);
    unit_backward(u, nrm, p.eps, du, dx);
  }
  *a.dg = dg;
}

}  // namespace naive
