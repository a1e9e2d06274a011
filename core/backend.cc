#include "qknorm/backend.h"

#include <cmath>
#include <type_traits>

#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"

namespace qknorm {

double g_init(double L) {
  if (!(L > 1) || !std::isfinite(L))
    throw Error("L", {}, "g_init needs a finite sequence length L > 1");
  return std::log2(L * L - L);
}

Backend::Backend(std::string family, std::string target, Precision precision)
    : family_(std::move(family)),
      target_(std::move(target)),
      precision_(precision) {
  name_ = family_ + ":";
  if (target_ != "-") name_ += target_ + ":";
  name_ += std::string(qknorm::name(precision_));
}

namespace {
void check_supported(const Backend& b, const AttentionProblem& p) {
  if (b.supports(p)) return;
  // What else the problem asks for (a plug-in declares each separately).
  std::string also;
  auto add = [&](const std::string& s) {
    also += (also.empty() ? "" : ", ") + s;
  };
  if (p.variant == Variant::kSDPA) add("sdpa");
  if (kv_heads_of(p) != p.heads)
    add("GQA " + std::to_string(p.heads) + ":" +
        std::to_string(kv_heads_of(p)));
  if (p.mask.causal) add("causal mask");
  if (!p.mask.key_lengths.empty()) add("padding mask");
  if (has_window(p.mask))
    add("window (" + std::to_string(p.mask.window_left) + ", " +
        std::to_string(p.mask.window_right) + ")");
  throw Error("formulation", {},
              "entry " + b.name() + " does not implement " +
                  describe_formulation(p) +
                  (also.empty() ? "" : " (with " + also + ")"));
}
}  // namespace

namespace {
// Every front door: validate the arguments against the entry's precision,
// refuse an attention formulation the entry does not implement, then call.
template <class Problem, class Args>
void run_checked(void (*validate)(const Problem&, const Args&, Precision),
                 void (Backend::*call)(const Problem&, const Args&, Workspace*,
                                       const ExecConfig&) const,
                 const Backend& b, const Problem& p, const Args& a,
                 Workspace* ws, const ExecConfig& cfg) {
  validate(p, a, b.precision());
  if constexpr (std::is_same_v<Problem, AttentionProblem>)
    check_supported(b, p);
  (b.*call)(p, a, ws, cfg);
}
}  // namespace

void checked_attention_forward(const Backend& b, const AttentionProblem& p,
                               const ForwardArgs& a, Workspace* ws,
                               const ExecConfig& cfg) {
  run_checked(validate_forward, &Backend::attention_forward, b, p, a, ws, cfg);
}
void checked_attention_backward(const Backend& b, const AttentionProblem& p,
                                const BackwardArgs& a, Workspace* ws,
                                const ExecConfig& cfg) {
  if (!b.has_attention_backward())
    throw Error(b.name(), {},
                "is forward only: it implements no attention backward");
  run_checked(validate_backward, &Backend::attention_backward, b, p, a, ws,
              cfg);
}
void checked_scalenorm_forward(const Backend& b, const ScaleNormProblem& p,
                               const ScaleNormForwardArgs& a, Workspace* ws,
                               const ExecConfig& cfg) {
  if (!b.has_scalenorm())
    throw Error(b.name(), {}, "implements no ScaleNorm (attention only)");
  run_checked(validate_scalenorm_forward, &Backend::scalenorm_forward, b, p, a,
              ws, cfg);
}
void checked_scalenorm_backward(const Backend& b, const ScaleNormProblem& p,
                                const ScaleNormBackwardArgs& a, Workspace* ws,
                                const ExecConfig& cfg) {
  if (!b.has_scalenorm())
    throw Error(b.name(), {}, "implements no ScaleNorm (attention only)");
  run_checked(validate_scalenorm_backward, &Backend::scalenorm_backward, b, p,
              a, ws, cfg);
}

void Registry::add(std::unique_ptr<Backend> b) {
  add_unowned(*b);
  owned_.push_back(std::move(b));
}

void Registry::add_unowned(const Backend& b) {
  if (find(b.name()) != nullptr)
    throw Error("registry", {}, "duplicate entry name '" + b.name() + "'");
  view_.push_back(&b);
}

const Backend* Registry::find(std::string_view name) const {
  for (const Backend* b : view_)
    if (b->name() == name) return b;
  return nullptr;
}

bool glob_match(std::string_view g, std::string_view s) {
  size_t gi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (gi < g.size() && (g[gi] == '?' || g[gi] == s[si])) {
      ++gi, ++si;
    } else if (gi < g.size() && g[gi] == '*') {
      star = gi++, mark = si;
    } else if (star != std::string_view::npos) {
      gi = star + 1, si = ++mark;
    } else {
      return false;
    }
  }
  while (gi < g.size() && g[gi] == '*') ++gi;
  return gi == g.size();
}

std::vector<const Backend*> Registry::match(std::string_view glob) const {
  std::vector<const Backend*> r;
  for (const Backend* b : view_)
    if (glob_match(glob, b->name())) r.push_back(b);
  return r;
}

}  // namespace qknorm
