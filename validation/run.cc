#include "validation/run.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
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

// What a validator's Error says, without what()'s "qknorm: " prefix:
// "o[1,0,0,0]: element is NaN (finite input required)".
std::string without_prefix(const Error& e) {
  const std::string w = e.what(), prefix = "qknorm: ";
  return w.rfind(prefix, 0) == 0 ? w.substr(prefix.size()) : w;
}

// Why the o and lse a forward left in `bufs` are no valid backward input;
// "" if they are one. O must be finite (the validator's rule, and its
// message); lse finite, or -inf on a fully masked row, where the validator
// accepts -inf on any row: an entry's -inf on a row that sees keys is its
// forward's failure, which the backward would only repeat.
std::string invalid_backward_input(const AttentionCase& c,
                                   const AttentionBuffers& bufs) {
  const AttentionProblem& p = c.problem;
  try {
    validate_finite("o", bufs.o.data(), bufs.o.layout(), p.batch, p.heads,
                    p.q_len, p.head_dim, bufs.o.precision());
  } catch (const Error& e) {
    return without_prefix(e);
  }
  const double* lse = bufs.lse.doubles();
  const int64_t rows = p.batch * p.heads * p.q_len;
  for (int64_t r = 0; r < rows; ++r) {
    const double x = lse[r];
    if (std::isfinite(x)) continue;
    const int64_t b = r / (p.heads * p.q_len), h = r / p.q_len % p.heads,
                  i = r % p.q_len;
    const KeyRange keys = qknorm::visible_keys(p.mask, b, i, p.q_len, p.kv_len);
    const bool sees_keys = keys.begin < keys.end;
    if (x == -std::numeric_limits<double>::infinity() && !sees_keys) continue;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "lse[%lld,%lld,%lld]: element is %g (finite required: the "
                  "row sees keys)",
                  (long long)b, (long long)h, (long long)i, x);
    return buf;
  }
  return "";
}

// The buffers of a run: a copy of `fresh` (run_attention_on) or new ones.
AttentionBuffers buffers_for(const Backend& b, const AttentionCase& c,
                             const AttentionBuffers* fresh) {
  if (fresh == nullptr) return AttentionBuffers(c, b.precision());
  auto same = [](const TensorBuffer& t, const Shape4& s, int64_t row_stride) {
    return t.shape().B == s.B && t.shape().H == s.H &&
           t.shape().rows == s.rows && t.shape().D == s.D &&
           t.layout().row_stride == row_stride;
  };
  const AttentionProblem& p = c.problem;
  const int64_t rs = p.head_dim + c.row_pad;
  if (fresh->q.precision() != b.precision() ||
      !same(fresh->q, {p.batch, p.heads, p.q_len, p.head_dim}, rs) ||
      !same(fresh->k, {p.batch, kv_heads_of(p), p.kv_len, p.head_dim}, rs))
    throw std::invalid_argument(
        "run_attention_on: buffers of another case for " + b.name());
  return *fresh;
}

AttentionResult run_impl(const Backend& b, const AttentionCase& c,
                         const ExecConfig& cfg, Workspace* ws, bool backward,
                         const OracleSource& oracle,
                         const AttentionBuffers* fresh = nullptr) {
  const AttentionProblem& p = c.problem;
  validate_problem(p);
  {
    const int64_t Hk = kv_heads_of(p);
    const int64_t nq = p.batch * p.heads * p.q_len * p.head_dim,
                  nk = p.batch * Hk * p.kv_len * p.head_dim;
    check_case_length("q", c.q, nq, "batch*heads*q_len*head_dim");
    check_case_length("k", c.k, nk, "batch*kv_heads*kv_len*head_dim");
    check_case_length("v", c.v, nk, "batch*kv_heads*kv_len*head_dim");
    if (backward && b.has_attention_backward())
      check_case_length("d_o", c.d_o, nq, "batch*heads*q_len*head_dim");
  }
  std::unique_ptr<Workspace> own;
  if (ws == nullptr) {
    own = b.make_workspace();
    ws = own.get();
  }
  // The entry's storage, rows padded as the case says, every output
  // prefilled with NaN (an element left unwritten is caught); the backward
  // reads the entry's own O and lse where they are a valid backward input.
  AttentionBuffers bufs = buffers_for(b, c, fresh);
  checked_attention_forward(b, p, bufs.forward_args(), ws, cfg);
  // The guards and the poison after each call (validation/buffers.h): a
  // written guard fails the case (the backward does not run after a forward
  // that wrote one); outputs holding an input's poison explain the
  // failures they cause.
  MemoryEvidence memory;
  memory.writes = bufs.guard_violations();
  if (!memory.writes.empty()) memory.write_call = "forward";
  memory.poisoned = bufs.poisoned_outputs(false);
  auto with_memory = [&](AttentionResult r) {
    r.memory = std::move(memory);
    return r;
  };
  if (!backward) return with_memory(bufs.result(false));
  if (!b.has_attention_backward()) {
    // A forward-only entry (Backend::has_attention_backward): its gradient
    // fields stay NaN and the verdict marks them "not judged".
    return with_memory(fed_result(bufs, forward_only_feed(bufs)));
  }
  if (!memory.writes.empty()) {
    BackwardFeed f = forward_only_feed(bufs);
    f.note = kForwardWroteOutsideNote;
    return with_memory(fed_result(bufs, std::move(f)));
  }
  BackwardFeed feed = b.backward_recomputes() ? recompute_feed(&bufs)
                                              : feed_backward(c, oracle, &bufs);
  if (feed.input != BackwardInput::kNotRun) {
    checked_attention_backward(b, p, bufs.backward_args(), ws, cfg);
    memory.writes = bufs.guard_violations();
    if (!memory.writes.empty()) memory.write_call = "backward";
    memory.poisoned = bufs.poisoned_outputs(true);
  } else {
    // The backward does not run, but the caller's own backward input is
    // still validated: a non-finite dO is the caller's error
    // (qknorm::Error), as the backward's front door would say (found by the
    // CI's attention fuzzer: dO = inf on a case whose forward lse overflows
    // was accepted).
    const BackwardArgs a = bufs.backward_args();
    validate_tensor("d_o", a.d_o.data, a.d_o.size, a.d_o.layout, p.batch,
                    p.heads, p.q_len, p.head_dim);
    validate_finite("d_o", a.d_o.data, a.d_o.layout, p.batch, p.heads, p.q_len,
                    p.head_dim, b.precision());
  }
  return with_memory(fed_result(bufs, std::move(feed)));
}
}  // namespace

BackwardFeed forward_only_feed(const AttentionBuffers& bufs) {
  BackwardFeed f;
  f.forward = bufs.result(false);
  f.input = BackwardInput::kNotRun;
  f.note = kForwardOnlyNote;
  return f;
}

BackwardFeed recompute_feed(AttentionBuffers* bufs) {
  BackwardFeed f;
  f.forward = bufs->result(false);
  f.input = BackwardInput::kRecomputes;
  f.note = kRecomputesNote;
  bufs->o.store(std::vector<double>(f.forward.o.size(), 0.0));
  bufs->lse.store(std::vector<double>(f.forward.lse.size(), 0.0));
  return f;
}

BackwardFeed feed_backward(const AttentionCase& c, const OracleSource& oracle,
                           AttentionBuffers* bufs) {
  BackwardFeed f;
  f.forward = bufs->result(false);
  const std::string why = invalid_backward_input(c, *bufs);
  if (why.empty()) return f;
  f.note =
      "the entry's forward output is no valid backward input (" + why + ")";
  f.input = BackwardInput::kNotRun;
  const ExactForward x = oracle ? oracle() : ExactForward{};
  if (x.o.empty()) return f;
  const Precision s = bufs->o.precision();
  std::vector<double> o(x.o.size()), lse(x.lse.size());
  for (size_t e = 0; e < o.size(); ++e) {
    o[e] = round_to(s, static_cast<double>(x.o[e]));
    if (!std::isfinite(o[e])) {
      f.note += "; the oracle's O overflows " + std::string(name(s));
      return f;
    }
  }
  // lse as the entry keeps it, in its compute format (-inf stays where the
  // oracle's is -inf: a fully masked row). An lse beyond the compute
  // format's range (sdpa rows of 1e30: logits of +-1e42 in f32) is no
  // backward input either: the backward's front door refuses +inf, and -inf
  // on a row that sees keys makes P = exp(S - lse) infinite (found by
  // tests/window_test.cc: blas:f32, sdpa, `wide`, whose forward rightly
  // returned lse = +inf, not representable in f32).
  for (size_t e = 0; e < lse.size(); ++e) {
    lse[e] = round_to(compute_format(s), static_cast<double>(x.lse[e]));
    if (std::isnan(lse[e]) || (!std::isfinite(lse[e]) &&
                               std::isfinite(static_cast<double>(x.lse[e])))) {
      f.note += "; the oracle's lse overflows " +
                std::string(name(compute_format(s)));
      return f;
    }
  }
  bufs->o.store(o);
  bufs->lse.store(lse);
  f.input = BackwardInput::kOracle;
  return f;
}

AttentionResult fed_result(const AttentionBuffers& bufs, BackwardFeed feed) {
  AttentionResult r = bufs.result(true);
  r.o = std::move(feed.forward.o);
  r.lse = std::move(feed.forward.lse);
  r.backward_input = feed.input;
  r.backward_note = std::move(feed.note);
  return r;
}

AttentionResult run_attention(const Backend& b, const AttentionCase& c,
                              const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, true, nullptr);
}

AttentionResult run_attention_fed(const Backend& b, const AttentionCase& c,
                                  const OracleSource& oracle,
                                  const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, true, oracle);
}

AttentionResult run_attention_forward(const Backend& b, const AttentionCase& c,
                                      const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, false, nullptr);
}

AttentionResult run_attention_on(const Backend& b, const AttentionCase& c,
                                 const AttentionBuffers& fresh, bool backward,
                                 const ExecConfig& cfg, Workspace* ws) {
  return run_impl(b, c, cfg, ws, backward, nullptr, &fresh);
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
  // As run_attention: the guards after each call (the first call that
  // wrote one is named; ScaleNorm's backward runs regardless: its fields
  // fail or pass on their own), the poison at the end.
  MemoryEvidence memory;
  memory.writes = bufs.guard_violations();
  if (!memory.writes.empty()) memory.write_call = "forward";
  checked_scalenorm_backward(b, p, bufs.backward_args(), ws, cfg);
  if (memory.writes.empty()) {
    memory.writes = bufs.guard_violations();
    if (!memory.writes.empty()) memory.write_call = "backward";
  }
  memory.poisoned = bufs.poisoned_outputs(true);
  ScaleNormResult r = bufs.result(true);
  r.memory = std::move(memory);
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
        {Field::kDSinks, &AttentionResult::d_sinks},
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
