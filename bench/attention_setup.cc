#include "bench/attention_setup.h"

#include <cblas.h>

#include <cstring>
#include <sstream>

#include "qknorm/formulation.h"
#include "qknorm/name_table.h"
#include "validation/case.h"
#include "validation/metrics.h"

namespace qknorm::bench {

std::string Shape::describe() const {
  std::ostringstream os;
  os << "H" << heads << " n" << n << " d" << d
     << (causal ? " causal" : " nomask");
  if (window_left >= 0) os << " window" << window_left;
  if (rope_dim > 0) os << " rope" << rope_dim;
  if (!formulation.empty())
    os << " " << formulation << " kv" << (kv_heads > 0 ? kv_heads : heads);
  return os.str();
}

double visible_pairs(const Shape& s) {
  const double n = static_cast<double>(s.n);
  if (s.window_left < 0) return s.causal ? n * (n + 1) / 2 : n * n;
  Mask m;
  m.causal = s.causal;
  m.window_left = s.window_left;
  m.window_right = 0;
  double pairs = 0;
  for (int64_t i = 0; i < s.n; ++i) {
    const KeyRange kr = visible_keys(m, 0, i, s.n, s.n);
    pairs += static_cast<double>(kr.end - kr.begin);
  }
  return pairs;
}

double forward_flops(const Shape& s) {
  return 4.0 * static_cast<double>(s.d) * visible_pairs(s) *
         static_cast<double>(s.heads);
}

double backward_flops(const Shape& s) {
  return 10.0 * static_cast<double>(s.d) * visible_pairs(s) *
         static_cast<double>(s.heads);
}

namespace {

// Encodes doubles to a storage buffer of `prec`.
std::vector<unsigned char> encoded(const std::vector<double>& x,
                                   Precision prec) {
  std::vector<unsigned char> out(x.size() * element_bytes(prec));
  for (size_t i = 0; i < x.size(); ++i) encode(prec, x[i], out.data(), i);
  return out;
}

// Written once with zeros so that every page is resident before timing.
std::vector<unsigned char> touched(int64_t elems, Precision prec) {
  return std::vector<unsigned char>(
      static_cast<size_t>(elems) * element_bytes(prec), 0);
}

}  // namespace

AttentionBuffers::AttentionBuffers(const Shape& s, Precision prec)
    : shape_(s),
      prec_(prec),
      elems_(s.heads * s.n * s.d),
      kv_elems_((s.kv_heads > 0 ? s.kv_heads : s.heads) * s.n * s.d) {
  const validation::AttentionCase c = validation::round_inputs(
      validation::make_attention_case(problem(false),
                                      validation::Distribution::kGaussian,
                                      kBenchSeed, prec),
      prec);
  q_ = encoded(c.q, prec);
  k_ = encoded(c.k, prec);
  v_ = encoded(c.v, prec);
  d_o_ = encoded(c.d_o, prec);
  o_ = touched(elems_, prec);
  dq_ = touched(elems_, prec);
  dk_ = touched(kv_elems_, prec);
  dv_ = touched(kv_elems_, prec);
  lse_.assign(static_cast<size_t>(s.heads * s.n), 0.0);
  qw_ = c.q_weight;
  kw_ = c.k_weight;
  qb_ = c.q_bias;
  kb_ = c.k_bias;
  dqw_.assign(qw_.size(), 0);
  dkw_.assign(kw_.size(), 0);
  dqb_.assign(qb_.size(), 0);
  dkb_.assign(kb_.size(), 0);
}

Rope bench_rope(int64_t rotary_dim) {
  Rope r;
  r.rotary_dim = rotary_dim;
  r.pairing = RopePairing::kHalf;
  r.order = RopeOrder::kAfterNorm;
  r.theta = 1e6;
  return r;
}

AttentionProblem AttentionBuffers::problem(bool causal, int64_t window_left,
                                           int64_t rope_dim) const {
  AttentionProblem p;
  p.batch = 1;
  p.heads = shape_.heads;
  p.q_len = p.kv_len = shape_.n;
  p.head_dim = shape_.d;
  p.variant = Variant::kQKNorm;
  p.g = kBenchG;
  p.mask.causal = causal;
  if (window_left >= 0) {
    p.mask.window_left = window_left;
    p.mask.window_right = 0;
  }
  if (!shape_.formulation.empty()) {
    apply_preset(shape_.formulation, &p);
    p.kv_heads = shape_.kv_heads;
  }
  if (rope_dim > 0) p.rope = bench_rope(rope_dim);
  return p;
}

ForwardArgs AttentionBuffers::forward_args() {
  const Layout4 l = contiguous_layout(shape_.heads, shape_.n, shape_.d);
  const Layout4 lk = contiguous_layout(
      shape_.kv_heads > 0 ? shape_.kv_heads : shape_.heads, shape_.n, shape_.d);
  auto ref = [](const std::vector<double>& x) {
    return ParamRef{x.empty() ? nullptr : x.data(),
                    static_cast<int64_t>(x.size())};
  };
  return ForwardArgs{ConstTensor4{q_.data(), elems_, l},
                     ConstTensor4{k_.data(), kv_elems_, lk},
                     ConstTensor4{v_.data(), kv_elems_, lk},
                     MutTensor4{o_.data(), elems_, l},
                     lse_.data(),
                     static_cast<int64_t>(lse_.size()),
                     {ref(qw_), ref(kw_), ref(qb_), ref(kb_)}};
}

BackwardArgs AttentionBuffers::backward_args() {
  const ForwardArgs f = forward_args();
  auto out = [&](std::vector<unsigned char>& b) {
    return MutTensor4{b.data(), elems_, f.o.layout};
  };
  auto kout = [&](std::vector<unsigned char>& b) {
    return MutTensor4{b.data(), kv_elems_, f.k.layout};
  };
  auto mref = [](std::vector<double>& x) {
    return MutParamRef{x.empty() ? nullptr : x.data(),
                       static_cast<int64_t>(x.size())};
  };
  const ConstTensor4 o{f.o.data, elems_, f.o.layout},
      d_o{d_o_.data(), elems_, f.o.layout};
  return BackwardArgs{f.q,
                      f.k,
                      f.v,
                      o,
                      d_o,
                      f.lse,
                      f.lse_size,
                      out(dq_),
                      kout(dk_),
                      kout(dv_),
                      &dg_,
                      f.params,
                      {mref(dqw_), mref(dkw_), mref(dqb_), mref(dkb_)}};
}

AttentionRun::AttentionRun(const Backend& entry)
    : entry_(&entry), ws_(entry.make_workspace()) {}

void AttentionRun::prepare_forward(AttentionBuffers& buf, bool causal,
                                   int threads, int64_t window_left,
                                   int64_t rope_dim) {
  checked_attention_forward(*entry_, buf.problem(causal, window_left, rope_dim),
                            buf.forward_args(), ws_.get(), ExecConfig{threads});
}

void AttentionRun::prepare_backward(AttentionBuffers& buf, bool causal,
                                    int threads, int64_t window_left,
                                    int64_t rope_dim) {
  checked_attention_backward(
      *entry_, buf.problem(causal, window_left, rope_dim), buf.backward_args(),
      ws_.get(), ExecConfig{threads});
}

void AttentionRun::forward(AttentionBuffers& buf, bool causal, int threads,
                           int64_t window_left, int64_t rope_dim) {
  entry_->attention_forward(buf.problem(causal, window_left, rope_dim),
                            buf.forward_args(), ws_.get(), ExecConfig{threads});
}

void AttentionRun::backward(AttentionBuffers& buf, bool causal, int threads,
                            int64_t window_left, int64_t rope_dim) {
  entry_->attention_backward(buf.problem(causal, window_left, rope_dim),
                             buf.backward_args(), ws_.get(),
                             ExecConfig{threads});
}

constexpr NamedValue<GemmOp> kGemmOpNames[] = {
    {GemmOp::kQK, "qk"}, {GemmOp::kPV, "pv"}, {GemmOp::kDV, "dv"},
    {GemmOp::kDP, "dp"}, {GemmOp::kDQ, "dq"}, {GemmOp::kDK, "dk"},
};

const char* gemm_op_name(GemmOp op) { return name_in(kGemmOpNames, op); }

GemmAnchor::GemmAnchor(const Shape& s) : shape_(s) {
  const size_t hnd = static_cast<size_t>(s.heads * s.n * s.d);
  // Values in the range attention sees (unit-norm rows, probabilities); the
  // rate does not depend on them as long as none is subnormal.
  q_.resize(hnd);
  k_.resize(hnd);
  v_.resize(hnd);
  d_o_.resize(hnd);
  o_.assign(hnd, 0.0f);
  dq_.assign(hnd, 0.0f);
  dk_.assign(hnd, 0.0f);
  dv_.assign(hnd, 0.0f);
  for (size_t i = 0; i < hnd; ++i) {
    q_[i] = 0.125f + 0.001f * static_cast<float>(i % 97);
    k_[i] = 0.125f - 0.001f * static_cast<float>(i % 89);
    v_[i] = 1.0f - 0.01f * static_cast<float>(i % 83);
    d_o_[i] = 0.5f - 0.01f * static_cast<float>(i % 79);
  }
  const size_t nn = static_cast<size_t>(s.n * s.n);
  s_.assign(nn, 1.0f / static_cast<float>(s.n));
  ds_.assign(nn, 0.25f / static_cast<float>(s.n));
}

void GemmAnchor::run(GemmOp op) {
  const int n = static_cast<int>(shape_.n), d = static_cast<int>(shape_.d);
  // The n x n products (S = Q K^T, dP = dO V^T) are n x n x d, NoTrans x
  // Trans; the others n x d x n with A = P or dS, transposed for dV and dK.
  const bool square = op == GemmOp::kQK || op == GemmOp::kDP;
  const CBLAS_TRANSPOSE ta =
      op == GemmOp::kDV || op == GemmOp::kDK ? CblasTrans : CblasNoTrans;
  for (int64_t h = 0; h < shape_.heads; ++h) {
    const size_t off = static_cast<size_t>(h * shape_.n * shape_.d);
    const float *q = q_.data() + off, *k = k_.data() + off,
                *v = v_.data() + off, *d_o = d_o_.data() + off;
    const float *a = nullptr, *b = nullptr;
    float* c = nullptr;
    switch (op) {
      case GemmOp::kQK:  // S = Q K^T
        a = q, b = k, c = s_.data();
        break;
      case GemmOp::kPV:  // O = P V
        a = s_.data(), b = v, c = o_.data() + off;
        break;
      case GemmOp::kDV:  // dV = P^T dO
        a = s_.data(), b = d_o, c = dv_.data() + off;
        break;
      case GemmOp::kDP:  // dP = dO V^T
        a = d_o, b = v, c = ds_.data();
        break;
      case GemmOp::kDQ:  // dQ = dS K
        a = ds_.data(), b = k, c = dq_.data() + off;
        break;
      case GemmOp::kDK:  // dK = dS^T Q
        a = ds_.data(), b = q, c = dk_.data() + off;
        break;
    }
    if (square)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, 1.0f, a, d,
                  b, d, 0.0f, c, n);
    else
      cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, n, d, n, 1.0f, a, n, b, d,
                  0.0f, c, d);
  }
}

double GemmAnchor::flops_per_gemm() const {
  return 2.0 * static_cast<double>(shape_.n) * static_cast<double>(shape_.n) *
         static_cast<double>(shape_.d) * static_cast<double>(shape_.heads);
}

void set_openblas_threads(int threads) { openblas_set_num_threads(threads); }

const char* openblas_corename() { return openblas_get_corename(); }

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + ",") {
    if (c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

std::vector<const Backend*> match_entries(const std::string& globs) {
  std::vector<const Backend*> out;
  const std::vector<std::string> pats = split_list(globs);
  for (const Backend* b : all_backends().entries()) {
    for (const std::string& p : pats) {
      if (glob_match(p, b->name())) {
        out.push_back(b);
        break;
      }
    }
  }
  return out;
}

}  // namespace qknorm::bench
