#include "validation/run.h"

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/validate.h"
#include "reference/register.h"

namespace qknorm::validation {
namespace {

// A storage buffer holding a [B,H,rows,D] tensor with `pad` extra elements
// after each row, prefilled with NaN (caught if an output is left unwritten).
struct Buffer {
  Precision prec;
  int64_t B, H, rows, D, pad;
  std::vector<unsigned char> bytes;
  Layout4 layout;
  Buffer(Precision p, int64_t B_, int64_t H_, int64_t rows_, int64_t D_,
         int64_t pad_)
      : prec(p), B(B_), H(H_), rows(rows_), D(D_), pad(pad_) {
    const int64_t rs = D + pad;
    layout = Layout4{H * rows * rs, rows * rs, rs};
    bytes.resize(static_cast<size_t>(B * H * rows * rs) * element_bytes(p));
    for (size_t i = 0; i < static_cast<size_t>(B * H * rows * rs); ++i)
      encode(p, std::numeric_limits<double>::quiet_NaN(), bytes.data(), i);
  }
  int64_t size() const { return B * H * rows * (D + pad); }
  size_t offset(int64_t idx) const {
    const int64_t d = idx % D, r = idx / D;
    return static_cast<size_t>(r * (D + pad) + d);
  }
  void store(const std::vector<double>& x) {
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      encode(prec, x[static_cast<size_t>(i)], bytes.data(), offset(i));
  }
  std::vector<double> load() const {
    std::vector<double> x(static_cast<size_t>(B * H * rows * D));
    for (int64_t i = 0; i < B * H * rows * D; ++i)
      x[static_cast<size_t>(i)] = decode(prec, bytes.data(), offset(i));
    return x;
  }
  ConstTensor4 cview() const { return {bytes.data(), size(), layout}; }
  MutTensor4 view() { return {bytes.data(), size(), layout}; }
};

// The case's tensors must have the problem's element counts before they are
// copied into the entry's buffers: a case edited by hand (kv_heads changed,
// a tensor resized) is bad input, named like every other.
void check_case_length(const char* name, const std::vector<double>& x,
                       int64_t want, const char* dims) {
  if (static_cast<int64_t>(x.size()) == want) return;
  throw Error(std::string("case ") + name, {},
              "length must be " + std::string(dims) + " = " +
                  std::to_string(want) + " (got " + std::to_string(x.size()) +
                  ")");
}

AttentionResult run_impl(const Backend& b, const AttentionCase& c,
                         const ExecConfig& cfg, Workspace* ws, bool backward) {
  const AttentionProblem& p = c.problem;
  validate_problem(p);
  {
    const int64_t Hk = kv_heads_of(p);
    const int64_t nq = p.batch * p.heads * p.q_len * p.head_dim,
                  nk = p.batch * Hk * p.kv_len * p.head_dim;
    check_case_length("q", c.q, nq, "batch*heads*q_len*head_dim");
    check_case_length("k", c.k, nk, "batch*kv_heads*kv_len*head_dim");
    check_case_length("v", c.v, nk, "batch*kv_heads*kv_len*head_dim");
    if (backward)
      check_case_length("d_o", c.d_o, nq, "batch*heads*q_len*head_dim");
  }
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  const int64_t B = p.batch, H = p.heads, D = p.head_dim, pad = c.row_pad,
                Hk = kv_heads_of(p);
  Buffer q(s, B, H, p.q_len, D, pad), k(s, B, Hk, p.kv_len, D, pad),
      v(s, B, Hk, p.kv_len, D, pad), o(s, B, H, p.q_len, D, pad);
  q.store(c.q);
  k.store(c.k);
  v.store(c.v);
  AttentionResult r;
  r.lse.assign(static_cast<size_t>(B * H * p.q_len),
               std::numeric_limits<double>::quiet_NaN());
  auto ref = [](const std::vector<double>& x) {
    return ParamRef{x.empty() ? nullptr : x.data(),
                    static_cast<int64_t>(x.size())};
  };
  const NormParams params{ref(c.q_weight), ref(c.k_weight), ref(c.q_bias),
                          ref(c.k_bias)};
  ForwardArgs fa{q.cview(), k.cview(),    v.cview(),
                 o.view(),  r.lse.data(), static_cast<int64_t>(r.lse.size()),
                 params};
  checked_attention_forward(b, p, fa, ws, cfg);
  r.o = o.load();
  if (!backward) return r;
  Buffer d_o(s, B, H, p.q_len, D, pad), dq(s, B, H, p.q_len, D, pad),
      dk(s, B, Hk, p.kv_len, D, pad), dv(s, B, Hk, p.kv_len, D, pad);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.dq_weight.assign(c.q_weight.size(), nan);
  r.dk_weight.assign(c.k_weight.size(), nan);
  r.dq_bias.assign(c.q_bias.size(), nan);
  r.dk_bias.assign(c.k_bias.size(), nan);
  auto mref = [](std::vector<double>& x) {
    return MutParamRef{x.empty() ? nullptr : x.data(),
                       static_cast<int64_t>(x.size())};
  };
  d_o.store(c.d_o);
  r.dg = std::numeric_limits<double>::quiet_NaN();
  BackwardArgs ba{
      q.cview(),
      k.cview(),
      v.cview(),
      o.cview(),
      d_o.cview(),
      r.lse.data(),
      static_cast<int64_t>(r.lse.size()),
      dq.view(),
      dk.view(),
      dv.view(),
      &r.dg,
      params,
      {mref(r.dq_weight), mref(r.dk_weight), mref(r.dq_bias), mref(r.dk_bias)}};
  checked_attention_backward(b, p, ba, ws, cfg);
  r.dq = dq.load();
  r.dk = dk.load();
  r.dv = dv.load();
  return r;
}
}  // namespace

AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, true);
}

AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, false);
}

ScaleNormResult run_scalenorm(const Backend& b, const ScaleNormCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  const ScaleNormProblem& p = c.problem;
  const Precision s = b.precision();
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  Buffer x(s, 1, 1, p.rows, p.dim, 0), y(s, 1, 1, p.rows, p.dim, 0),
      dy(s, 1, 1, p.rows, p.dim, 0), dx(s, 1, 1, p.rows, p.dim, 0);
  x.store(c.x);
  dy.store(c.dy);
  ScaleNormResult r;
  ScaleNormForwardArgs fa{{x.bytes.data(), x.size(), p.dim},
                          {y.bytes.data(), y.size(), p.dim}};
  checked_scalenorm_forward(b, p, fa, ws, cfg);
  r.y = y.load();
  r.dg = std::numeric_limits<double>::quiet_NaN();
  ScaleNormBackwardArgs ba{{x.bytes.data(), x.size(), p.dim},
                           {dy.bytes.data(), dy.size(), p.dim},
                           {dx.bytes.data(), dx.size(), p.dim},
                           &r.dg};
  checked_scalenorm_backward(b, p, ba, ws, cfg);
  r.dx = dx.load();
  return r;
}

const Backend& naive_for(Precision p) { return reference::naive_backend(p); }

namespace {

// The fields a result holds as vectors; dg is its one scalar.
constexpr std::pair<Field, std::vector<double> AttentionResult::*>
    kResultVectors[] = {
        {Field::kO, &AttentionResult::o},
        {Field::kLse, &AttentionResult::lse},
        {Field::kDq, &AttentionResult::dq},
        {Field::kDk, &AttentionResult::dk},
        {Field::kDv, &AttentionResult::dv},
        {Field::kDqWeight, &AttentionResult::dq_weight},
        {Field::kDkWeight, &AttentionResult::dk_weight},
        {Field::kDqBias, &AttentionResult::dq_bias},
        {Field::kDkBias, &AttentionResult::dk_bias},
};

}  // namespace

std::span<const double> field_values(const AttentionResult& r, Field f) {
  if (f == Field::kDg) return {&r.dg, 1};
  for (const auto& [field, member] : kResultVectors)
    if (field == f) return r.*member;
  return {};
}

std::span<double> field_values(AttentionResult& r, Field f) {
  const std::span<const double> c = field_values(std::as_const(r), f);
  return {const_cast<double*>(c.data()), c.size()};
}

}  // namespace qknorm::validation
