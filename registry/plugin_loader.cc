// Plug-in entries (include/qknorm/plugin.h): a Backend that forwards every
// call across the C ABI, the loader, and --isolate (each call in a child
// process). Nothing here computes attention: the plug-in does.
#include "qknorm/plugin_loader.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "qknorm/contract.h"
#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/plugin.h"

namespace qknorm {
namespace {

bool g_isolate = false;

// ---- crash report without --isolate ---------------------------------------
// The call in flight on this thread, for the fatal-signal handler: it writes
// "qknorm: crash inside plug-in call: <entry> <call> on <problem>", puts the
// previous action back and returns, so the fault repeats under the previous
// handler (the default one, or a sanitizer's) and the process ends as it
// would have.
thread_local char t_call[768];
struct sigaction g_old[32];
const int kFatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

void on_fatal(int sig) {
  if (t_call[0] != '\0') {
    const char head[] = "\nqknorm: crash inside plug-in call: ";
    ssize_t r = write(2, head, sizeof head - 1);
    r = write(2, t_call, strnlen(t_call, sizeof t_call));
    r = write(2, "\n", 1);
    (void)r;
  }
  sigaction(sig, &g_old[sig], nullptr);
}

void install_crash_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kFatal) {
      struct sigaction sa;
      std::memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_fatal;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, &g_old[sig]);
    }
  });
}

class CallScope {
 public:
  explicit CallScope(const std::string& what) {
    std::strncpy(t_call, what.c_str(), sizeof t_call - 1);
    t_call[sizeof t_call - 1] = '\0';
  }
  ~CallScope() { t_call[0] = '\0'; }
};

// ---- conversions ------------------------------------------------------------
int32_t dtype_of(Precision p) {
  switch (p) {
    case Precision::kF64:
      return QKNORM_DTYPE_F64;
    case Precision::kF32:
      return QKNORM_DTYPE_F32;
    case Precision::kBF16:
      return QKNORM_DTYPE_BF16;
    case Precision::kF16:
      return QKNORM_DTYPE_F16;
  }
  return -1;
}

qknorm_attention_problem to_c(const AttentionProblem& p) {
  qknorm_attention_problem c{};
  c.batch = p.batch;
  c.heads = p.heads;
  c.kv_heads = kv_heads_of(p);
  c.q_len = p.q_len;
  c.kv_len = p.kv_len;
  c.head_dim = p.head_dim;
  c.variant =
      p.variant == Variant::kSDPA ? QKNORM_VARIANT_SDPA : QKNORM_VARIANT_QKNORM;
  c.g = p.g;
  c.eps = p.eps;
  c.causal = p.mask.causal;
  c.key_lengths =
      p.mask.key_lengths.empty() ? nullptr : p.mask.key_lengths.data();
  c.key_lengths_size = static_cast<int64_t>(p.mask.key_lengths.size());
  const Normalization& n = p.norm;
  c.norm_kind = n.kind == NormKind::kRms     ? QKNORM_NORM_RMS
                : n.kind == NormKind::kLayer ? QKNORM_NORM_LAYER
                : n.kind == NormKind::kNone  ? QKNORM_NORM_NONE
                                             : QKNORM_NORM_L2;
  c.norm_axis =
      n.axis == NormAxis::kAllHeads ? QKNORM_AXIS_ALL_HEADS : QKNORM_AXIS_HEAD;
  c.weight_shape = n.weight == ParamShape::kDim       ? QKNORM_PARAM_DIM
                   : n.weight == ParamShape::kHeadDim ? QKNORM_PARAM_HEAD_DIM
                                                      : QKNORM_PARAM_NONE;
  c.one_plus_weight = n.one_plus_weight;
  c.bias = n.bias;
  c.shared_qk_weight = n.shared_qk_weight;
  c.round_before_weight = n.round_before_weight;
  c.fixed_scale = p.fixed_scale;
  c.scale = p.scale;
  return c;
}

// The C view of a tensor: qknorm_const_tensor4 for a read-only view,
// qknorm_tensor4 for an output.
template <class Ptr>
auto to_c(const TensorRef4<Ptr>& t, int32_t dt) {
  using C = std::conditional_t<std::is_same_v<Ptr, const void*>,
                               qknorm_const_tensor4, qknorm_tensor4>;
  return C{t.data,
           t.size,
           t.layout.batch_stride,
           t.layout.head_stride,
           t.layout.row_stride,
           dt};
}
qknorm_params to_c(const NormParams& p) {
  return {p.q_weight.data, p.k_weight.data, p.q_bias.data, p.k_bias.data,
          p.q_weight.size, p.k_weight.size, p.q_bias.size, p.k_bias.size};
}
qknorm_param_grads to_c(const NormParamGrads& p) {
  return {p.q_weight.data, p.k_weight.data, p.q_bias.data, p.k_bias.data,
          p.q_weight.size, p.k_weight.size, p.q_bias.size, p.k_bias.size};
}

uint32_t required_features(const AttentionProblem& p) {
  uint32_t f = 0;
  if (p.variant == Variant::kSDPA) f |= QKNORM_FEATURE_SDPA;
  if (kv_heads_of(p) != p.heads) f |= QKNORM_FEATURE_GQA;
  if (p.mask.causal || !p.mask.key_lengths.empty()) f |= QKNORM_FEATURE_MASK;
  if (p.variant != Variant::kQKNorm) return f;
  const Normalization& n = p.norm;
  if (n.kind == NormKind::kRms) f |= QKNORM_FEATURE_RMS;
  if (n.kind == NormKind::kLayer) f |= QKNORM_FEATURE_LAYER;
  if (n.kind == NormKind::kNone) f |= QKNORM_FEATURE_NO_NORM;
  if (n.axis == NormAxis::kAllHeads) f |= QKNORM_FEATURE_ALL_HEADS;
  if (n.weight != ParamShape::kNone) f |= QKNORM_FEATURE_WEIGHT;
  if (n.one_plus_weight) f |= QKNORM_FEATURE_ONE_PLUS_W;
  if (n.bias) f |= QKNORM_FEATURE_BIAS;
  if (n.shared_qk_weight) f |= QKNORM_FEATURE_SHARED_W;
  if (n.round_before_weight) f |= QKNORM_FEATURE_ROUND_FIRST;
  if (p.fixed_scale) f |= QKNORM_FEATURE_FIXED_SCALE;
  return f;
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

std::string describe(const AttentionProblem& p) {
  std::string s = "attention B=" + std::to_string(p.batch) +
                  " H=" + std::to_string(p.heads) +
                  " kv_heads=" + std::to_string(kv_heads_of(p)) +
                  " Nq=" + std::to_string(p.q_len) +
                  " Nk=" + std::to_string(p.kv_len) +
                  " D=" + std::to_string(p.head_dim) +
                  (p.variant == Variant::kSDPA ? " sdpa" : " qknorm") +
                  " g=" + num(p.g) + " eps=" + num(p.eps);
  if (p.mask.causal) s += " causal";
  if (!p.mask.key_lengths.empty()) s += " padded";
  if (has_window(p.mask))
    s += " window=(" + std::to_string(p.mask.window_left) + "," +
         std::to_string(p.mask.window_right) + ")";
  if (p.variant == Variant::kQKNorm && !is_paper_formulation(p))
    s += " formulation=" + describe_formulation(p);
  return s;
}
std::string describe(const ScaleNormProblem& p) {
  return "scalenorm rows=" + std::to_string(p.rows) +
         " dim=" + std::to_string(p.dim) + " g=" + num(p.g) +
         " eps=" + num(p.eps);
}

// ---- one call, in process or in a child -------------------------------------
// An output region of a call: the caller's buffer, redirected to shared
// memory in a child process so that the parent sees what the child wrote.
struct Out {
  void** ptr;  // the pointer field inside the C argument struct
  size_t bytes;
};

struct Shared {
  int rc;
  char err[1024];
};

// Runs fn(err, err_size) (which reads the C argument structs whose output
// pointers `outs` point into) and throws Error("plugin <entry>", ...) on a
// non-zero return, a crash or an exit.
template <class F>
void invoke(const std::string& entry, const std::string& what,
            const std::vector<Out>& outs, F&& fn) {
  const std::string call = entry + " " + what;
  if (!g_isolate) {
    char err[1024] = {0};
    int rc;
    {
      CallScope scope(call);
      rc = fn(err, sizeof err);
    }
    if (rc != 0) {
      err[sizeof err - 1] = '\0';
      throw Error("plugin " + entry, {},
                  what + " returned " + std::to_string(rc) + ": " +
                      (err[0] ? err : "(no message)"));
    }
    return;
  }
  // One anonymous shared mapping: the status block, then each output.
  size_t total = sizeof(Shared);
  std::vector<size_t> at;
  for (const Out& o : outs) {
    total = (total + 63) / 64 * 64;
    at.push_back(total);
    total += o.bytes;
  }
  void* map = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    throw Error("plugin " + entry, {},
                "--isolate: mmap of " + std::to_string(total) +
                    " bytes failed: " + std::strerror(errno));
  auto* base = static_cast<unsigned char*>(map);
  auto* sh = static_cast<Shared*>(map);
  sh->rc = INT_MIN;
  sh->err[0] = '\0';
  std::vector<void*> orig;
  for (size_t i = 0; i < outs.size(); ++i) {
    orig.push_back(*outs[i].ptr);
    if (*outs[i].ptr != nullptr) {
      std::memcpy(base + at[i], *outs[i].ptr, outs[i].bytes);
      *outs[i].ptr = base + at[i];
    }
  }
  auto restore = [&] {
    for (size_t i = 0; i < outs.size(); ++i) *outs[i].ptr = orig[i];
  };
  const pid_t pid = fork();
  if (pid == 0) {
    sh->rc = fn(sh->err, sizeof sh->err);
    _exit(0);
  }
  int status = 0;
  const pid_t w = pid < 0 ? -1 : waitpid(pid, &status, 0);
  restore();
  std::string failure;
  if (pid < 0 || w < 0) {
    failure =
        std::string("--isolate: fork/wait failed: ") + std::strerror(errno);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    failure = "crashed with signal " + std::to_string(sig) + " (SIG" +
              (name ? name : "?") + ") in " + what + " (--isolate)";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
             sh->rc == INT_MIN) {
    failure = what + " ended the process (exit status " +
              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
              ") (--isolate)";
  } else if (sh->rc != 0) {
    sh->err[sizeof sh->err - 1] = '\0';
    failure = what + " returned " + std::to_string(sh->rc) + ": " +
              (sh->err[0] ? sh->err : "(no message)");
  } else {
    for (size_t i = 0; i < outs.size(); ++i)
      if (orig[i] != nullptr) std::memcpy(orig[i], base + at[i], outs[i].bytes);
  }
  munmap(map, total);
  if (!failure.empty()) throw Error("plugin " + entry, {}, failure);
}

size_t bytes4(const qknorm_tensor4& t, Precision p) {
  return t.data ? static_cast<size_t>(t.size) * element_bytes(p) : 0;
}
size_t bytes2(const qknorm_tensor2& t, Precision p) {
  return t.data ? static_cast<size_t>(t.size) * element_bytes(p) : 0;
}
size_t doubles(const void* p, int64_t n) {
  return p ? static_cast<size_t>(n) * sizeof(double) : 0;
}

// ---- the Backend ------------------------------------------------------------
struct Library {
  std::string path;
  void* handle = nullptr;
  const qknorm_plugin* desc = nullptr;
};

class PluginWorkspace : public Workspace {
 public:
  PluginWorkspace(const qknorm_plugin_entry* e, void* ws) : e_(e), ws_(ws) {}
  ~PluginWorkspace() override {
    if (ws_ != nullptr && e_->free_workspace != nullptr)
      e_->free_workspace(e_->ctx, ws_);
  }
  void* get() const { return ws_; }

 private:
  const qknorm_plugin_entry* e_;
  void* ws_;
};

Precision precision_of(int32_t dt) {
  switch (dt) {
    case QKNORM_DTYPE_F64:
      return Precision::kF64;
    case QKNORM_DTYPE_F32:
      return Precision::kF32;
    case QKNORM_DTYPE_BF16:
      return Precision::kBF16;
    default:
      return Precision::kF16;
  }
}

class PluginBackend : public Backend {
 public:
  // e: the entry in the current ABI version's layout (the loader's copy),
  // its contract already parsed.
  PluginBackend(const std::string& plugin, const qknorm_plugin_entry* e,
                ComputeContract contract = {})
      : Backend("plugin", plugin + "." + e->name, precision_of(e->storage)),
        e_(e),
        contract_(contract) {}

  bool has_attention_backward() const override {
    return (e_->implements & QKNORM_IMPLEMENTS_ATTENTION_BACKWARD) != 0;
  }
  bool has_scalenorm() const override {
    return (e_->implements & QKNORM_IMPLEMENTS_SCALENORM) != 0;
  }
  ComputeContract contract() const override { return contract_; }
  std::string built_for() const override {
    return e_->built_for != nullptr ? e_->built_for : "";
  }
  bool deterministic() const override {
    return (e_->flags & QKNORM_FLAG_NONDETERMINISTIC) == 0;
  }
  bool backward_recomputes() const override {
    return (e_->flags & QKNORM_FLAG_BACKWARD_RECOMPUTES) != 0;
  }
  // QKNORM_FLAG_SERIAL_CALLS: one call of the entry at a time (the lock
  // is held for the call; without the flag, none is taken).
  std::unique_lock<std::mutex> serial() const {
    if ((e_->flags & QKNORM_FLAG_SERIAL_CALLS) == 0) return {};
    return std::unique_lock<std::mutex>(serial_mu_);
  }

  bool supports(const AttentionProblem& p) const override {
    // The C ABI (plugin.h) carries no softcap, window, RoPE or sinks yet
    // (issue 34): a plug-in cannot be told of one, so it is not given such a
    // problem.
    return p.softcap == 0 && !has_window(p.mask) && !has_rope(p) &&
           !has_sinks(p) && (required_features(p) & ~e_->features) == 0;
  }
  std::unique_ptr<Workspace> make_workspace() const override {
    void* ws = e_->make_workspace ? e_->make_workspace(e_->ctx) : nullptr;
    return std::make_unique<PluginWorkspace>(e_, ws);
  }

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& cfg) const override {
    const auto lock = serial();
    const qknorm_attention_problem cp = to_c(p);
    qknorm_forward_args ca = forward_args(a, cfg);
    invoke(name(), "attention_forward on " + describe(p),
           {{&ca.o.data, bytes4(ca.o, precision())},
            {reinterpret_cast<void**>(&ca.lse), doubles(ca.lse, ca.lse_size)}},
           [&](char* err, size_t n) {
             return e_->attention_forward(e_->ctx, raw(ws), &cp, &ca, err, n);
           });
  }

  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace* ws, const ExecConfig& cfg) const override {
    const auto lock = serial();
    const qknorm_attention_problem cp = to_c(p);
    const int32_t dt = dtype_of(precision());
    qknorm_backward_args ca{};
    shared_args(a, cfg, &ca);
    ca.d_o = to_c(a.d_o, dt);
    ca.dq = to_c(a.dq, dt);
    ca.dk = to_c(a.dk, dt);
    ca.dv = to_c(a.dv, dt);
    ca.dg = a.dg;
    ca.d_params = to_c(a.d_params);
    qknorm_param_grads& g = ca.d_params;
    invoke(name(), "attention_backward on " + describe(p),
           {{&ca.dq.data, bytes4(ca.dq, precision())},
            {&ca.dk.data, bytes4(ca.dk, precision())},
            {&ca.dv.data, bytes4(ca.dv, precision())},
            {reinterpret_cast<void**>(&ca.dg), doubles(ca.dg, 1)},
            {reinterpret_cast<void**>(&g.q_weight),
             doubles(g.q_weight, g.q_weight_size)},
            {reinterpret_cast<void**>(&g.k_weight),
             doubles(g.k_weight, g.k_weight_size)},
            {reinterpret_cast<void**>(&g.q_bias),
             doubles(g.q_bias, g.q_bias_size)},
            {reinterpret_cast<void**>(&g.k_bias),
             doubles(g.k_bias, g.k_bias_size)}},
           [&](char* err, size_t n) {
             return e_->attention_backward(e_->ctx, raw(ws), &cp, &ca, err, n);
           });
  }

  bool attention_probabilities(const AttentionProblem& p, const ForwardArgs& a,
                               double* probs, Workspace* ws) const override {
    if (e_->attention_probabilities == nullptr) return false;
    const auto lock = serial();
    const qknorm_attention_problem cp = to_c(p);
    qknorm_forward_args ca = forward_args(a, {});
    const size_t n =
        static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len) *
        sizeof(double);
    invoke(name(), "attention_probabilities on " + describe(p),
           {{&ca.o.data, bytes4(ca.o, precision())},
            {reinterpret_cast<void**>(&ca.lse), doubles(ca.lse, ca.lse_size)},
            {reinterpret_cast<void**>(&probs), n}},
           [&](char* err, size_t m) {
             return e_->attention_probabilities(e_->ctx, raw(ws), &cp, &ca,
                                                probs, err, m);
           });
    return true;
  }

  void scalenorm_forward(const ScaleNormProblem& p,
                         const ScaleNormForwardArgs& a, Workspace* ws,
                         const ExecConfig& cfg) const override {
    const auto lock = serial();
    const qknorm_scalenorm_problem cp{p.rows, p.dim, p.g, p.eps};
    const int32_t dt = dtype_of(precision());
    qknorm_scalenorm_forward_args ca{{a.x.data, a.x.size, a.x.row_stride, dt},
                                     {a.y.data, a.y.size, a.y.row_stride, dt},
                                     cfg.threads};
    invoke(name(), "scalenorm_forward on " + describe(p),
           {{&ca.y.data, bytes2(ca.y, precision())}}, [&](char* err, size_t n) {
             return e_->scalenorm_forward(e_->ctx, raw(ws), &cp, &ca, err, n);
           });
  }

  void scalenorm_backward(const ScaleNormProblem& p,
                          const ScaleNormBackwardArgs& a, Workspace* ws,
                          const ExecConfig& cfg) const override {
    const auto lock = serial();
    const qknorm_scalenorm_problem cp{p.rows, p.dim, p.g, p.eps};
    const int32_t dt = dtype_of(precision());
    qknorm_scalenorm_backward_args ca{
        {a.x.data, a.x.size, a.x.row_stride, dt},
        {a.dy.data, a.dy.size, a.dy.row_stride, dt},
        {a.dx.data, a.dx.size, a.dx.row_stride, dt},
        a.dg,
        cfg.threads};
    invoke(name(), "scalenorm_backward on " + describe(p),
           {{&ca.dx.data, bytes2(ca.dx, precision())},
            {reinterpret_cast<void**>(&ca.dg), doubles(ca.dg, 1)}},
           [&](char* err, size_t n) {
             return e_->scalenorm_backward(e_->ctx, raw(ws), &cp, &ca, err, n);
           });
  }

 private:
  static void* raw(Workspace* ws) {
    auto* w = dynamic_cast<PluginWorkspace*>(ws);
    return w ? w->get() : nullptr;
  }
  // The fields the forward and backward arguments share, converted alike
  // (the C structs name them as the C++ ones do).
  template <class Args, class CArgs>
  void shared_args(const Args& a, const ExecConfig& cfg, CArgs* ca) const {
    const int32_t dt = dtype_of(precision());
    ca->q = to_c(a.q, dt);
    ca->k = to_c(a.k, dt);
    ca->v = to_c(a.v, dt);
    ca->o = to_c(a.o, dt);
    ca->lse = a.lse;
    ca->lse_size = a.lse_size;
    ca->params = to_c(a.params);
    ca->threads = cfg.threads;
  }
  qknorm_forward_args forward_args(const ForwardArgs& a,
                                   const ExecConfig& cfg) const {
    qknorm_forward_args ca{};
    shared_args(a, cfg, &ca);
    return ca;
  }

  const qknorm_plugin_entry* e_;
  ComputeContract contract_;
  mutable std::mutex serial_mu_;  // QKNORM_FLAG_SERIAL_CALLS
};

bool valid_name(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (const char* c = s; *c; ++c)
    if (!(std::isalnum(static_cast<unsigned char>(*c)) || *c == '_' ||
          *c == '-' || *c == '.'))
      return false;
  return std::strlen(s) <= 64;
}

std::mutex g_mu;
std::vector<Library>& libraries() {
  static auto* v = new std::vector<Library>;
  return *v;
}
// Every loaded entry in the current ABI version's layout, whatever version its
// plug-in declared (the backends point here; a deque never moves them).
std::deque<qknorm_plugin_entry>& loaded_entries() {
  static auto* d = new std::deque<qknorm_plugin_entry>;
  return *d;
}

// The fields every ABI version's entry has (version 1's), copied.
template <class Old>
void copy_v1_fields(const Old& o, qknorm_plugin_entry* e) {
  e->name = o.name;
  e->storage = o.storage;
  e->features = o.features;
  e->ctx = o.ctx;
  e->make_workspace = o.make_workspace;
  e->free_workspace = o.free_workspace;
  e->attention_forward = o.attention_forward;
  e->attention_backward = o.attention_backward;
  e->attention_probabilities = o.attention_probabilities;
  e->scalenorm_forward = o.scalenorm_forward;
  e->scalenorm_backward = o.scalenorm_backward;
}

// Entry i of descriptor d in the current version's layout: a version-1
// entry as if it declared every function (it must define them all) and no
// contract; a version-1 or 2 entry with no flags.
qknorm_plugin_entry entry_current(const qknorm_plugin* d, int32_t i) {
  if (d->abi_version >= 3) return d->entries[i];
  const void* raw = d->entries;
  qknorm_plugin_entry e{};
  if (d->abi_version == 2) {
    const qknorm_plugin_entry_v2& o =
        static_cast<const qknorm_plugin_entry_v2*>(raw)[i];
    copy_v1_fields(o, &e);
    e.implements = o.implements;
    e.contract = o.contract;
    e.built_for = o.built_for;
  } else {
    copy_v1_fields(static_cast<const qknorm_plugin_entry_v1*>(raw)[i], &e);
    e.implements =
        QKNORM_IMPLEMENTS_ATTENTION_BACKWARD | QKNORM_IMPLEMENTS_SCALENORM;
  }
  e.flags = 0;
  return e;
}

// The rules of qknorm_plugin_entry's functions and `implements` (plugin.h);
// "" when e keeps them.
std::string function_rule(const qknorm_plugin_entry& e, uint32_t version) {
  if (version == 1) {
    if (!e.attention_forward || !e.attention_backward || !e.scalenorm_forward ||
        !e.scalenorm_backward)
      return "attention_forward, attention_backward, scalenorm_forward and "
             "scalenorm_backward are required (ABI version 1; version 2 "
             "makes the backward and ScaleNorm optional)";
    return "";
  }
  constexpr uint32_t kKnown =
      QKNORM_IMPLEMENTS_ATTENTION_BACKWARD | QKNORM_IMPLEMENTS_SCALENORM;
  if ((e.implements & ~kKnown) != 0)
    return "implements has unknown bits " +
           std::to_string(e.implements & ~kKnown);
  constexpr uint32_t kKnownFlags = QKNORM_FLAG_NONDETERMINISTIC |
                                   QKNORM_FLAG_SERIAL_CALLS |
                                   QKNORM_FLAG_BACKWARD_RECOMPUTES;
  if ((e.flags & ~kKnownFlags) != 0)
    return "flags has unknown bits " + std::to_string(e.flags & ~kKnownFlags);
  if (!e.attention_forward) return "attention_forward is required";
  const bool bwd = (e.implements & QKNORM_IMPLEMENTS_ATTENTION_BACKWARD) != 0;
  if (bwd != (e.attention_backward != nullptr))
    return bwd ? "implements has QKNORM_IMPLEMENTS_ATTENTION_BACKWARD but "
                 "attention_backward is NULL"
               : "attention_backward is set but implements lacks "
                 "QKNORM_IMPLEMENTS_ATTENTION_BACKWARD";
  const bool sn = (e.implements & QKNORM_IMPLEMENTS_SCALENORM) != 0;
  if (sn != (e.scalenorm_forward != nullptr) ||
      sn != (e.scalenorm_backward != nullptr))
    return sn ? "implements has QKNORM_IMPLEMENTS_SCALENORM but "
                "scalenorm_forward or scalenorm_backward is NULL"
              : "scalenorm_forward or scalenorm_backward is set but "
                "implements lacks QKNORM_IMPLEMENTS_SCALENORM";
  return "";
}

}  // namespace

void set_plugin_isolation(bool on) { g_isolate = on; }
bool plugin_isolation() { return g_isolate; }

void load_plugin_into(Registry& r, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  char resolved[PATH_MAX];
  const std::string key =
      realpath(path.c_str(), resolved) != nullptr ? resolved : path;
  for (const Library& l : libraries())
    if (l.path == key) return;
  const std::string who = "plugin " + path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    throw Error(who, {}, std::string("cannot load: ") + (e ? e : "?"));
  }
  auto get =
      reinterpret_cast<qknorm_plugin_get_fn>(dlsym(h, "qknorm_plugin_get"));
  if (get == nullptr) {
    dlclose(h);
    throw Error(who, {},
                "exports no qknorm_plugin_get (include/qknorm/plugin.h)");
  }
  const qknorm_plugin* d = get();
  auto fail = [&](const std::string& rule) {
    dlclose(h);
    throw Error(who, {}, rule);
  };
  if (d == nullptr) fail("qknorm_plugin_get returned NULL");
  if (d->abi_version < 1 || d->abi_version > QKNORM_PLUGIN_ABI_VERSION)
    fail("declares plug-in ABI version " + std::to_string(d->abi_version) +
         "; this qknorm knows versions 1 to " +
         std::to_string(QKNORM_PLUGIN_ABI_VERSION));
  if (!valid_name(d->name))
    fail("plug-in name must be 1 to 64 of [A-Za-z0-9_.-]");
  if (d->entry_count < 1 || d->entries == nullptr)
    fail("declares no entries (entry_count " + std::to_string(d->entry_count) +
         ")");
  std::set<std::string> seen;
  std::vector<qknorm_plugin_entry> entries;
  std::vector<ComputeContract> contracts;
  for (int32_t i = 0; i < d->entry_count; ++i) {
    const qknorm_plugin_entry e = entry_current(d, i);
    const std::string at = "entry " + std::to_string(i) + " ('" +
                           (e.name ? e.name : "(null)") + "'): ";
    if (!valid_name(e.name))
      fail(at + "name must be 1 to 64 of [A-Za-z0-9_.-]");
    if (e.storage < QKNORM_DTYPE_F64 || e.storage > QKNORM_DTYPE_F16)
      fail(at + "unknown storage dtype " + std::to_string(e.storage));
    if (const std::string rule = function_rule(e, d->abi_version);
        !rule.empty())
      fail(at + rule);
    if ((e.make_workspace == nullptr) != (e.free_workspace == nullptr))
      fail(at + "make_workspace and free_workspace come together");
    if (!seen.insert(std::string(e.name) + ":" + std::to_string(e.storage))
             .second)
      fail(at + "duplicate entry name and storage");
    ComputeContract contract;
    std::string why;
    if (e.contract != nullptr && !parse_contract(e.contract, &contract, &why))
      fail(at + "contract '" + e.contract + "': " + why);
    entries.push_back(e);
    contracts.push_back(contract);
  }
  for (const qknorm_plugin_entry& e : entries)
    if (r.find(PluginBackend(d->name, &e).name()) != nullptr)
      fail("entry '" + std::string(e.name) +
           "' is already registered (another plug-in of the same name?)");
  for (size_t i = 0; i < entries.size(); ++i) {
    loaded_entries().push_back(entries[i]);
    r.add(std::make_unique<PluginBackend>(d->name, &loaded_entries().back(),
                                          contracts[i]));
  }
  libraries().push_back({key, h, d});  // never closed: entries point into it
  install_crash_report();
}

void load_plugins_from_env(Registry& r) {
  const char* env = std::getenv("QKNORM_PLUGIN");
  if (env == nullptr) return;
  // QKNORM_ISOLATE=1: --isolate for every tool that reads QKNORM_PLUGIN
  // (the fuzzers have no flags of their own).
  if (const char* iso = std::getenv("QKNORM_ISOLATE");
      iso != nullptr && *iso != '\0' && std::strcmp(iso, "0") != 0)
    set_plugin_isolation(true);
  std::string s(env);
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(':', start);
    const std::string path = s.substr(
        start, end == std::string::npos ? std::string::npos : end - start);
    if (!path.empty()) load_plugin_into(r, path);
    if (end == std::string::npos) break;
    start = end + 1;
  }
}

}  // namespace qknorm
