#include "validation/run.h"

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qknorm/error.h"
#include "qknorm/validate.h"
#include "reference/register.h"
#include "validation/buffers.h"

namespace qknorm::validation {
namespace {

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
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  // The entry's storage, rows padded as the case says, every output
  // prefilled with NaN (an element left unwritten is caught); the backward
  // reads the entry's own O and lse.
  AttentionBuffers bufs(c, b.precision());
  checked_attention_forward(b, p, bufs.forward_args(), ws, cfg);
  if (backward) checked_attention_backward(b, p, bufs.backward_args(), ws, cfg);
  return bufs.result(backward);
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
  ScaleNormBuffers bufs(c, s, 0);
  checked_scalenorm_forward(b, p, bufs.forward_args(), ws, cfg);
  checked_scalenorm_backward(b, p, bufs.backward_args(), ws, cfg);
  return bufs.result(true);
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
