// Registry entries of the reference. Each gathers the strided storage into
// dense arrays of its arithmetic type (exact: storage <= arithmetic width),
// runs the loops of reference.cc, and rounds every output to storage (RNE).
#include <memory>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/precision.h"
#include "reference/reference.h"
#include "reference/register.h"
#include "reference/storage.h"

namespace qknorm::reference {
namespace {

template <class T>
class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(Precision p) : Backend("reference", "-", p) {}

  // Every formulation and variant of attention.h.
  bool supports(const AttentionProblem&) const override { return true; }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig&) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim;
    QkvParams<T> in;
    load_qkv_params(p, a, s, &in);
    const auto &q = in.q, &k = in.k, &v = in.v;
    const Params<T>& w = in.w;
    std::vector<T> o(q.size()), lse(static_cast<size_t>(B * H * p.q_len));
    reference::attention_forward<T>(p, q.data(), k.data(), v.data(), o.data(),
                                    lse.data(), w.args);
    scatter(s, o, a.o, B, H, p.q_len, D);
    for (size_t i = 0; i < lse.size(); ++i)
      a.lse[i] = static_cast<double>(lse[i]);
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig&) const override {
    const Precision s = precision();
    const int64_t B = p.batch, H = p.heads, D = p.head_dim, Hk = kv_heads_of(p);
    QkvParams<T> in;
    load_qkv_params(p, a, s, &in);
    const auto &q = in.q, &k = in.k, &v = in.v;
    const Params<T>& w = in.w;
    auto o = gather<T>(s, a.o, B, H, p.q_len, D);
    auto d_o = gather<T>(s, a.d_o, B, H, p.q_len, D);
    std::vector<T> lse(a.lse, a.lse + a.lse_size);
    std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<T> dqw(static_cast<size_t>(a.d_params.q_weight.size)),
        dkw(static_cast<size_t>(a.d_params.k_weight.size)),
        dqb(static_cast<size_t>(a.d_params.q_bias.size)),
        dkb(static_cast<size_t>(a.d_params.k_bias.size));
    NormGrads<T> dw;
    auto ptr = [](std::vector<T>& x) { return x.empty() ? nullptr : x.data(); };
    dw.q_weight = ptr(dqw);
    dw.k_weight = ptr(dkw);
    dw.q_bias = ptr(dqb);
    dw.k_bias = ptr(dkb);
    std::vector<T> dsinks(static_cast<size_t>(a.d_sinks_size));
    dw.sinks = ptr(dsinks);
    T dg = 0;
    reference::attention_backward<T>(
        p, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(),
        dq.data(), dk.data(), dv.data(), &dg, nullptr, w.args, dw);
    scatter(s, dq, a.dq, B, H, p.q_len, D);
    scatter(s, dk, a.dk, B, Hk, p.kv_len, D);
    scatter(s, dv, a.dv, B, Hk, p.kv_len, D);
    *a.dg = static_cast<double>(dg);
    auto out = [](const std::vector<T>& x, const MutParamRef& r) {
      for (size_t i = 0; i < x.size(); ++i)
        r.data[i] = static_cast<double>(x[i]);
    };
    out(dqw, a.d_params.q_weight);
    out(dkw, a.d_params.k_weight);
    out(dqb, a.d_params.q_bias);
    out(dkb, a.d_params.k_bias);
    for (size_t h = 0; h < dsinks.size(); ++h)
      a.d_sinks[h] = static_cast<double>(dsinks[h]);
  }

  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace*,
                         const ExecConfig&) const override {
    const Precision s = precision();
    auto x = gather<T>(s, rows4(a.x), 1, 1, p.rows, p.dim);
    std::vector<T> y(x.size());
    reference::scalenorm_forward<T>(p, x.data(), y.data());
    scatter(s, y, rows4(a.y), 1, 1, p.rows, p.dim);
  }

  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace*,
                          const ExecConfig&) const override {
    const Precision s = precision();
    auto x = gather<T>(s, rows4(a.x), 1, 1, p.rows, p.dim);
    auto dy = gather<T>(s, rows4(a.dy), 1, 1, p.rows, p.dim);
    std::vector<T> dx(x.size());
    T dg = 0;
    reference::scalenorm_backward<T>(p, x.data(), dy.data(), dx.data(), &dg);
    scatter(s, dx, rows4(a.dx), 1, 1, p.rows, p.dim);
    *a.dg = static_cast<double>(dg);
  }

  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace*) const override {
    const Precision s = precision();
    auto q = gather<T>(s, a.q, p.batch, p.heads, p.q_len, p.head_dim);
    auto k = gather<T>(s, a.k, p.batch, kv_heads_of(p), p.kv_len, p.head_dim);
    Params<T> w;
    load_params(a.params, s, &w);
    std::vector<T> pr(
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
    reference::attention_probabilities<T>(p, q.data(), k.data(), pr.data(),
                                          w.args);
    for (size_t i = 0; i < pr.size(); ++i)
      probs[i] = static_cast<double>(pr[i]);
    return true;
  }
};

}  // namespace

const Backend& naive_backend(Precision p) {
  // Leaked like the registry that holds them: any registry may still hold
  // them at exit.
  static const Backend* const kEntries[] = {
      new ReferenceBackend<double>(Precision::kF64),
      new ReferenceBackend<float>(Precision::kF32),
      new ReferenceBackend<float>(Precision::kBF16),
      new ReferenceBackend<float>(Precision::kF16)};
  switch (p) {
    case Precision::kF64:
      return *kEntries[0];
    case Precision::kF32:
      return *kEntries[1];
    case Precision::kBF16:
      return *kEntries[2];
    case Precision::kF16:
      return *kEntries[3];
  }
  throw Error("reference", {}, "no reference entry for this precision");
}

void register_backends(Registry& r) {
  for (Precision p : kAllPrecisions) r.add_unowned(naive_backend(p));
}

}  // namespace qknorm::reference
