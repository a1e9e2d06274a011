#include "cli/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <span>

#include "cli/app.h"
#include "cli/machine.h"
#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::cli {
namespace {

using validation::Field;
using validation::HostTensor;

const std::vector<std::string> kInputNames = {
    "q",        "k",      "v",      "g", "dO", "q_weight",
    "k_weight", "q_bias", "k_bias", "x", "dy", "sinks"};
// The fields an --outputs file can hold, each under its tensor_name (cli/
// suite.h); ScaleNorm's dg shares attention's name "dg".
constexpr Field kAttentionOutputs[] = {
    Field::kO,      Field::kDq,       Field::kDk,       Field::kDv,
    Field::kDg,     Field::kDqWeight, Field::kDkWeight, Field::kDqBias,
    Field::kDkBias, Field::kDSinks};
constexpr Field kScaleNormOutputs[] = {Field::kY, Field::kDx};

const std::vector<std::string>& output_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (Field f : kAttentionOutputs) v.push_back(tensor_name(f));
    for (Field f : kScaleNormOutputs) v.push_back(tensor_name(f));
    return v;
  }();
  return names;
}

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Other spellings of an output field's tensor (PyTorch's grad_*, "out");
// its tensor_name in any case is always accepted.
const std::pair<const char*, Field> kOutputAliases[] = {
    {"out", Field::kO},     {"output", Field::kO},  {"grad_q", Field::kDq},
    {"grad_k", Field::kDk}, {"grad_v", Field::kDv}, {"grad_g", Field::kDg},
    {"d_x", Field::kDx},    {"grad_x", Field::kDx}};

// Canonical name of a file stem / key, or "" if it is none of ours.
std::string canonical(const std::string& raw) {
  const std::string s = lower(raw);
  if (s == "q" || s == "query") return "q";
  if (s == "k" || s == "key") return "k";
  if (s == "v" || s == "value") return "v";
  if (s == "g" || s == "scale") return "g";
  if (s == "do" || s == "d_o" || s == "grad_o" || s == "grad_out") return "dO";
  // ScaleNorm (issue 17): x, g, dy in; y, dx, dg out.
  if (s == "x") return "x";
  if (s == "dy" || s == "d_y" || s == "grad_y") return "dy";
  // The formulation's parameters (issue 16).
  for (const char* n : {"q_weight", "k_weight", "q_bias", "k_bias", "sinks"})
    if (s == n) return n;
  // The outputs: O, dQ, dK, dV, dg, their parameter gradients; y, dx.
  for (const std::string& n : output_names())
    if (s == lower(n)) return n;
  for (const auto& [alias, f] : kOutputAliases)
    if (s == alias) return tensor_name(f);
  return "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const HostTensor& need(const std::map<std::string, HostTensor>& m,
                       const std::string& name, const std::string& flag) {
  const auto it = m.find(name);
  if (it == m.end())
    throw Error(flag, {},
                "no tensor named " + name + " (give " + name +
                    ".npy, a safetensors key " + name + ", or " + name +
                    "=PATH)");
  return it->second;
}

// [B,H,N,D] from a 2-, 3- or 4-D shape.
std::vector<int64_t> as4(const HostTensor& t, const std::string& what) {
  if (t.shape.size() < 2 || t.shape.size() > 4)
    throw Error(
        what, {},
        "shape " + t.shape_text() + " must be [B,H,N,D], [H,N,D] or [N,D]");
  std::vector<int64_t> s(4 - t.shape.size(), 1);
  s.insert(s.end(), t.shape.begin(), t.shape.end());
  for (int64_t d : s)
    if (d < 1)
      throw Error(what, {},
                  "shape " + t.shape_text() + " has an empty dimension");
  return s;
}

double scalar(const HostTensor& t, const std::string& what) {
  if (t.values.size() != 1)
    throw Error(what, {}, "must hold one value (shape " + t.shape_text() + ")");
  return t.values[0];
}

// A NaN or inf in an input tensor (dense [B,H,rows,D] values) throws
// Error(name, [b,h,n,d], "element is NaN (finite input required)").
void require_finite(const char* name, const std::vector<double>& v,
                    const std::vector<int64_t>& s4) {
  validate_finite(name, v.data(), contiguous_layout(s4[1], s4[2], s4[3]), s4[0],
                  s4[1], s4[2], s4[3], Precision::kF64);
}

}  // namespace

std::map<std::string, HostTensor> load_tensors(
    const std::vector<std::string>& specs, const std::string& flag) {
  std::map<std::string, HostTensor> out;
  const std::vector<std::string>& allowed =
      flag == "--inputs" ? kInputNames : output_names();
  auto keep = [&](std::string name, HostTensor t, const std::string& path,
                  bool strict) {
    const std::string c = canonical(name);
    if (c.empty() ||
        std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
      if (strict)
        throw Error(path, {},
                    "tensor name '" + name + "' is not one of the " + flag +
                        " (" + fmt::format("{}", fmt::join(allowed, ", ")) +
                        ")");
      return;  // other keys of a shared safetensors file
    }
    if (out.count(c)) throw Error(path, {}, "tensor " + c + " given twice");
    t.name = c;
    out.emplace(c, std::move(t));
  };
  for (const std::string& spec : specs) {
    std::string name, path = spec;
    if (const size_t eq = spec.find('='); eq != std::string::npos && eq > 0) {
      name = spec.substr(0, eq);
      path = spec.substr(eq + 1);
    }
    if (ends_with(lower(path), ".safetensors")) {
      if (!name.empty())
        throw Error(
            path, {},
            "NAME=PATH takes a .npy file; safetensors keys name themselves");
      for (HostTensor& t : validation::read_safetensors_file(path)) {
        const std::string key = t.name;
        keep(key, std::move(t), path, false);
      }
    } else {
      HostTensor t = validation::read_npy_file(path);
      const std::string key = name.empty() ? t.name : name;
      keep(key, std::move(t), path, true);
    }
  }
  return out;
}

namespace {

// The files' results are reported as entry "files:<dtype>".
std::string files_entry(Precision prec) {
  return "files:" + std::string(name(prec));
}

// The report row of the one judged case.
// `cls`: the files' case's input class, by validation::input_class from its
// rows and mask (a file carries no distribution).
EntryRow files_row(const char* kind, Precision prec,
                   const std::string& case_desc, validation::InputClass cls,
                   validation::AgreementReport rep) {
  rep.case_desc = case_desc;
  EntryRow row;
  row.kind = kind;
  row.name = files_entry(prec);
  row.family = "compare";
  row.target = "-";
  row.precision = std::string(name(prec));
  row.cases.push_back(from_report(rep));
  row.cases.back().input_class = cls;
  summarize(&row);
  return row;
}

// x's (rows, dim): dim is the last dimension, rows the product of the
// others ([dim] is one row).
std::pair<int64_t, int64_t> rows_dim(const HostTensor& t,
                                     const std::string& what) {
  if (t.shape.empty())
    throw Error(what, {},
                "shape [] must be [..., dim] (rows x dim; leading dims are "
                "the rows)");
  for (int64_t d : t.shape)
    if (d < 1)
      throw Error(what, {},
                  "shape " + t.shape_text() + " has an empty dimension");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < t.shape.size(); ++i) rows *= t.shape[i];
  return {rows, t.shape.back()};
}

// A NaN or inf in a ScaleNorm input throws Error(name, index in the file's
// own shape, "element is NaN (finite input required)").
void require_finite_nd(const HostTensor& t, const std::string& name) {
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double x = t.values[i];
    if (std::isfinite(x)) continue;
    std::vector<int64_t> idx(t.shape.size());
    int64_t rest = static_cast<int64_t>(i);
    for (size_t a = t.shape.size(); a-- > 0;) {
      idx[a] = rest % t.shape[a];
      rest /= t.shape[a];
    }
    throw Error(name, idx,
                std::string("element is ") +
                    (std::isnan(x) ? "NaN" : (x > 0 ? "+Inf" : "-Inf")) +
                    " (finite input required)");
  }
}

// The attention problem's options mean nothing to ScaleNorm: giving one is
// an error rather than silently ignored.
void reject_attention_options(const SuiteOptions& s,
                              const ComputeContract& contract) {
  auto no = [](bool given, const char* flag) {
    if (given)
      throw Error(
          flag, {},
          "does not apply to a ScaleNorm dump (it takes --g and --eps)");
  };
  no(!s.masks.empty(), "--mask");
  no(s.variant != "qknorm", "--variant");
  no(!s.formulations.empty(), "--formulation");
  no(s.kv_heads != 0, "--kv-heads");
  no(!s.norm.empty(), "--norm");
  no(!s.norm_axis.empty(), "--norm-axis");
  no(!s.weight.empty(), "--weight");
  no(!s.flags.empty(), "--norm-flags");
  no(s.scale != 0, "--scale");
  no(s.softcap != 0, "--softcap");
  no(!s.rope.empty(), "--rope");
  no(!s.sinks.empty(), "--sinks");
  if (!contract.is_default())
    throw Error(
        contract == ComputeContract::storage() ? "--compute" : "--contract", {},
        contract.describe() +
            " is not available for ScaleNorm dumps (its bound "
            "assumes f32 compute for 16-bit storage); use "
            "--contract f32-accumulate");
}

// ScaleNorm (issue 17): x, g, [dy] in; y, [dx, dg] out.
EntryRow compare_scalenorm(const std::map<std::string, HostTensor>& in,
                           const std::map<std::string, HostTensor>& outs,
                           const SuiteOptions& s, std::string* case_desc,
                           const ComputeContract& contract) {
  reject_attention_options(s, contract);
  const HostTensor& x = need(in, "x", "--inputs");
  const HostTensor& y = need(outs, tensor_name(Field::kY), "--outputs");
  const Precision prec = x.dtype;
  const auto [rows, dim] = rows_dim(x, "x");
  // y, dy, dx: x's shape and dtype.
  auto same_as_x = [&](const HostTensor& t, const std::string& nm) {
    if (t.dtype != prec)
      throw Error(nm, {},
                  std::string("dtype ") + std::string(name(t.dtype)) +
                      " differs from x's " + std::string(name(prec)) +
                      " (the naive baseline runs at one dtype)");
    if (t.shape != x.shape)
      throw Error(
          nm, {},
          "shape " + t.shape_text() + " differs from x's " + x.shape_text());
  };
  same_as_x(y, tensor_name(Field::kY));
  ScaleNormProblem p;
  p.rows = rows;
  p.dim = dim;
  p.eps = s.eps_given ? s.eps : kDefaultScaleNormEps;
  if (s.g.size() > 1) throw Error("--g", {}, "compare takes one g");
  if (!s.g.empty()) {
    p.g = s.g[0];
  } else if (const auto it = in.find("g"); it != in.end()) {
    p.g = scalar(it->second, "g");
  } else {
    throw Error("--inputs", {},
                "no tensor named g (give g.npy, a key g, or --g)");
  }
  validate_problem(p);

  validation::ScaleNormCase c;
  c.problem = p;
  c.x = x.values;
  validation::ScaleNormResult given;
  given.y = y.values;
  std::vector<Field> only = {Field::kY};
  bool backward = false;
  if (const auto it = outs.find(tensor_name(Field::kDx)); it != outs.end()) {
    same_as_x(it->second, tensor_name(Field::kDx));
    given.dx = it->second.values;
    only.push_back(Field::kDx);
    backward = true;
  }
  if (const auto it = outs.find(tensor_name(Field::kScaleNormDg));
      it != outs.end()) {
    given.dg = scalar(it->second, tensor_name(Field::kScaleNormDg));
    only.push_back(Field::kScaleNormDg);
    backward = true;
  }
  if (backward) {
    const HostTensor& dy = need(in, "dy", "--inputs");
    same_as_x(dy, "dy");
    c.dy = dy.values;
  } else {
    // Forward only: the oracle still runs its backward, on a zero dy.
    c.dy.assign(c.x.size(), 0.0);
  }
  // Inputs must be finite; outputs are the verdict's to classify.
  require_finite_nd(x, "x");
  if (backward) require_finite_nd(need(in, "dy", "--inputs"), "dy");
  *case_desc = c.describe();
  case_desc->erase(std::min(case_desc->find(" dist="), case_desc->size()));
  *case_desc +=
      " (tensors from files; elements [row,col], x's leading dims "
      "flattened to rows)";
  const Backend& naive = validation::naive_for(prec);
  const validation::ScaleNormResult naive_result =
      validation::run_scalenorm(naive, c);
  return files_row("scalenorm", prec, *case_desc, validation::input_class(c),
                   validation::judge_scalenorm(
                       c, prec, validation::oracle_scalenorm(c), given,
                       &naive_result, files_entry(prec), naive.name(), &only));
}

// Whether an input stored in `in` is exact in the judged format `out`:
// the same format, f64, or f32 holding a 16-bit format. Throws naming the
// tensor otherwise.
void check_input_format(const HostTensor& t, Precision out) {
  const Precision in = t.dtype;
  const bool exact = in == out || out == Precision::kF64 ||
                     (out == Precision::kF32 &&
                      (in == Precision::kF16 || in == Precision::kBF16));
  if (exact) return;
  throw Error(t.name, {},
              std::string("dtype ") + std::string(name(in)) +
                  " is not exact in O's " + std::string(name(out)) +
                  " (inputs may be stored narrower than O, each in its own "
                  "format; the verdict and the naive baseline run in O's "
                  "format)");
}

EntryRow compare_attention(const std::map<std::string, HostTensor>& in,
                           const std::map<std::string, HostTensor>& outs,
                           const SuiteOptions& s, std::string* case_desc,
                           const ComputeContract& contract) {
  const HostTensor &q = need(in, "q", "--inputs"),
                   &k = need(in, "k", "--inputs"),
                   &v = need(in, "v", "--inputs");
  const HostTensor& o = need(outs, tensor_name(Field::kO), "--outputs");
  // The judged storage format is O's. The inputs may be stored narrower,
  // each in its own format (an inference engine's q in f32 beside an f16 or
  // bf16 K/V cache, O in f32: issue 35): their values are exact in O's
  // format, so the oracle and the naive baseline (which runs in O's format)
  // take them as given. An input wider than O's format is refused.
  const Precision prec = o.dtype;
  for (const auto* t : {&q, &k, &v}) check_input_format(*t, prec);
  const bool mixed = q.dtype != prec || k.dtype != prec || v.dtype != prec;
  const std::vector<int64_t> sq = as4(q, "q"), sk = as4(k, "k"),
                             sv = as4(v, "v");
  if (sk != sv)
    throw Error(
        "v", {},
        "shape " + v.shape_text() + " differs from k's " + k.shape_text());
  if (sk[0] != sq[0] || sk[1] < 1 || sq[1] % sk[1] != 0 || sk[3] != sq[3])
    throw Error("k", {},
                "shape " + k.shape_text() + " does not match q's " +
                    q.shape_text() +
                    " (need the same B and D, and k's heads dividing q's)");
  if (as4(o, "O") != sq)
    throw Error(
        "O", {},
        "shape " + o.shape_text() + " differs from q's " + q.shape_text());
  AttentionProblem p;
  p.batch = sq[0];
  p.heads = sq[1];
  p.q_len = sq[2];
  p.kv_len = sk[2];
  p.head_dim = sq[3];
  p.eps = s.eps;
  if (s.variant != "qknorm" && s.variant != "sdpa")
    throw Error("--variant", {}, "must be qknorm or sdpa");
  p.variant = s.variant == "sdpa" ? Variant::kSDPA : Variant::kQKNorm;
  p.kv_heads = sk[1] == sq[1] ? 0 : sk[1];
  if (s.formulations.size() > 1)
    throw Error("--formulation", {}, "compare takes one formulation");
  // The mask first: a --model sets the sliding window over it.
  if (s.masks.size() > 1) throw Error("--mask", {}, "compare takes one mask");
  if (!s.masks.empty()) apply_mask(s.masks[0], &p);
  if (p.variant == Variant::kQKNorm || !s.model.empty()) {
    SuiteOptions f = s;
    f.kv_heads = 0;  // the files' shapes give it
    apply_formulation(f, s.formulations.empty() ? "" : s.formulations[0], &p);
  }
  if (s.softcap != 0) p.softcap = s.softcap;
  if (!s.rope.empty()) p.rope = parse_rope(s.rope);
  // Sinks: --sinks, or a tensor "sinks" of one value per query head.
  if (!s.sinks.empty()) {
    apply_sinks(s.sinks, &p);
  } else if (const auto it = in.find("sinks"); it != in.end()) {
    p.sinks = it->second.values;
  }
  if (s.g.size() > 1) throw Error("--g", {}, "compare takes one g");
  if (!s.g.empty()) {
    p.g = s.g[0];
  } else if (const auto it = in.find("g"); it != in.end()) {
    p.g = scalar(it->second, "g");
  } else if (p.variant == Variant::kQKNorm && !p.fixed_scale) {
    throw Error("--inputs", {},
                "no tensor named g (give g.npy, a key g, or --g)");
  }
  validate_problem(p);

  validation::AttentionCase c;
  c.problem = p;
  c.q = q.values;
  c.k = k.values;
  c.v = v.values;
  c.storage = prec;
  // The formulation's parameters: any dtype, any shape with the right
  // element count (validation names a wrong length).
  auto param = [&](const char* nm, std::vector<double>* dst) {
    if (const auto it = in.find(nm); it != in.end()) *dst = it->second.values;
  };
  param("q_weight", &c.q_weight);
  param("k_weight", &c.k_weight);
  param("q_bias", &c.q_bias);
  param("k_bias", &c.k_bias);
  validation::AttentionResult given;
  given.o = o.values;
  std::vector<Field> only = {Field::kO};
  bool backward = false;
  for (const Field f : {Field::kDq, Field::kDk, Field::kDv, Field::kDg}) {
    const std::string gname = tensor_name(f);
    const auto it = outs.find(gname);
    if (it == outs.end()) continue;
    backward = true;
    only.push_back(f);
    const HostTensor& t = it->second;
    if (f == Field::kDg) {
      given.dg = scalar(t, gname);
      continue;
    }
    if (t.dtype != prec)
      throw Error(gname, {},
                  std::string("dtype ") + std::string(name(t.dtype)) +
                      " differs from O's " + std::string(name(prec)) +
                      " (the gradients are judged in O's format)");
    if (as4(t, gname) != (f == Field::kDq ? sq : sk))
      throw Error(gname, {},
                  "shape " + t.shape_text() + " does not match " +
                      (f == Field::kDq ? q : k).shape_text());
    if (f == Field::kDq) given.dq = t.values;
    if (f == Field::kDk) given.dk = t.values;
    if (f == Field::kDv) given.dv = t.values;
  }
  if (const auto it = outs.find(tensor_name(Field::kDSinks));
      it != outs.end()) {
    backward = true;
    given.d_sinks = it->second.values;
    if (static_cast<int64_t>(given.d_sinks.size()) !=
        (has_sinks(p) ? p.heads : 0))
      throw Error(tensor_name(Field::kDSinks), {},
                  "length must be " +
                      std::to_string(has_sinks(p) ? p.heads : 0) +
                      " (one per query head with sinks; got " +
                      std::to_string(given.d_sinks.size()) + ")");
    only.push_back(Field::kDSinks);
  }
  for (const Field field :
       {Field::kDqWeight, Field::kDkWeight, Field::kDqBias, Field::kDkBias}) {
    const char* gname = tensor_name(field);
    const auto it = outs.find(gname);
    if (it == outs.end()) continue;
    backward = true;
    const std::vector<double>& x = it->second.values;
    const int64_t need_n = param_size(
        p, field == Field::kDkWeight || field == Field::kDkBias ? 1 : 0);
    const bool is_bias = field == Field::kDqBias || field == Field::kDkBias;
    if (static_cast<int64_t>(x.size()) !=
        (is_bias && !p.norm.bias ? 0 : need_n))
      throw Error(gname, {},
                  "length must be " +
                      std::to_string(is_bias && !p.norm.bias ? 0 : need_n) +
                      " for this formulation (got " + std::to_string(x.size()) +
                      ")");
    if (field == Field::kDqWeight) given.dq_weight = x;
    if (field == Field::kDkWeight) given.dk_weight = x;
    if (field == Field::kDqBias) given.dq_bias = x;
    if (field == Field::kDkBias) given.dk_bias = x;
    only.push_back(field);
  }
  if (backward) {
    const HostTensor& d_o = need(in, "dO", "--inputs");
    check_input_format(d_o, prec);
    if (as4(d_o, "dO") != sq)
      throw Error(
          "dO", {},
          "shape " + d_o.shape_text() + " differs from q's " + q.shape_text());
    c.d_o = d_o.values;
  } else {
    // Forward only: the oracle still runs its backward, on a zero dO.
    c.d_o.assign(c.q.size(), 0.0);
  }
  // Inputs must be finite: the problem is undefined otherwise. Outputs are
  // not checked here: a NaN or inf in O, dQ, dK, dV or dg is the verdict's to
  // classify (validation/rule.h: a correctly rounded overflow passes,
  // anything else FAILs with its diagnosis).
  require_finite("q", c.q, sq);
  require_finite("k", c.k, sk);
  require_finite("v", c.v, sk);
  if (backward) require_finite("dO", c.d_o, sq);
  // The case came from files: its distribution and seed mean nothing.
  *case_desc = c.describe();
  case_desc->erase(std::min(case_desc->find(" dist="), case_desc->size()));
  if (!is_paper_formulation(p))
    *case_desc += " formulation=" + describe_formulation(p);
  *case_desc += " (tensors from files)";
  if (mixed)
    *case_desc += std::string(" (q ") + std::string(name(q.dtype)) + ", k " +
                  std::string(name(k.dtype)) + ", v " +
                  std::string(name(v.dtype)) + ", judged in O's " +
                  std::string(name(prec)) + ")";
  // The inputs are the files' values, already in `prec`: no rounding. The
  // naive same-precision baseline runs on them for the report's statistics
  // and its own margin only; it is no part of the verdict.
  const Backend& naive = validation::naive_for(prec);
  const validation::AttentionResult naive_result =
      backward ? validation::run_attention(naive, c)
               : validation::run_attention_forward(naive, c);
  return files_row(
      "attention", prec, *case_desc, validation::input_class(c),
      validation::judge_attention(
          c, prec, validation::oracle_attention(c), given, &naive_result,
          !backward, files_entry(prec), naive.name(), &only, contract));
}

}  // namespace

std::string dump_kind(const std::map<std::string, HostTensor>& in,
                      const std::map<std::string, HostTensor>& outs,
                      const std::string& kind) {
  if (kind == "attention" || kind == "scalenorm") return kind;
  if (kind != "auto")
    throw Error("--kind", {}, "must be auto, attention or scalenorm");
  auto any = [](const std::map<std::string, HostTensor>& m,
                std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (m.count(n)) return true;
    return false;
  };
  auto any_field = [](const std::map<std::string, HostTensor>& m,
                      std::span<const Field> fields) {
    for (Field f : fields)
      if (m.count(tensor_name(f))) return true;
    return false;
  };
  // dg is both kinds' output: it decides nothing.
  const bool sn = any(in, {"x", "dy"}) || any_field(outs, kScaleNormOutputs);
  std::vector<Field> attention_only;
  for (Field f : kAttentionOutputs)
    if (f != Field::kDg) attention_only.push_back(f);
  const bool at = any(in, {"q", "k", "v", "dO", "q_weight", "k_weight",
                           "q_bias", "k_bias", "sinks"}) ||
                  any_field(outs, attention_only);
  if (sn && at)
    throw Error("--inputs", {},
                "the files hold attention tensors (q, k, v, O, ...) and "
                "ScaleNorm tensors (x, dy, y, dx): choose one with --kind "
                "attention or --kind scalenorm");
  return sn ? "scalenorm" : "attention";
}

EntryRow compare_tensors(const std::map<std::string, HostTensor>& in,
                         const std::map<std::string, HostTensor>& outs,
                         const SuiteOptions& s, std::string* case_desc,
                         const ComputeContract& contract,
                         const std::string& kind) {
  return dump_kind(in, outs, kind) == "scalenorm"
             ? compare_scalenorm(in, outs, s, case_desc, contract)
             : compare_attention(in, outs, s, case_desc, contract);
}

ComputeContract CompareOptions::resolved_contract() const {
  const ComputeContract by_compute = compute == "storage"
                                         ? ComputeContract::storage()
                                         : ComputeContract::f32_accumulate();
  ComputeContract c = by_compute;
  std::string why;
  if (!contract.empty()) {
    if (!parse_contract(contract, &c, &why)) throw Error("--contract", {}, why);
    if (compute == "storage" && c != by_compute)
      throw Error("--contract", {},
                  contract +
                      " conflicts with --compute storage (its alias "
                      "for --contract storage); give one of them");
  }
  // The --round-* flags, each a KEY=FORMAT item on top of the preset.
  std::string spec = c.describe();
  // Appended piece by piece: GCC 12's -O3 flagged `"," + std::string(...)`
  // here with a false -Wrestrict (GCC bug 105329) once CLI11 left the file.
  for (size_t r = 0; r < round_points.size(); ++r)
    if (!round_points[r].empty()) {
      spec += ',';
      spec += key(static_cast<RoundingPoint>(r));
      spec += '=';
      spec += round_points[r];
    }
  if (!parse_contract(spec, &c, &why)) throw Error("--round-*", {}, why);
  return c;
}

int run_compare(const CompareOptions& o, const SuiteOptions& s,
                const std::string& json, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  Report rep;
  rep.title = "qknorm-check compare";
  ComputeContract contract;
  try {
    contract = o.resolved_contract();  // a bad option: kExitUsage
  } catch (const Error& e) {
    err << "qknorm-check compare: " << e.what() << "\n";
    return kExitUsage;
  }
  try {
    const auto in = load_tensors(o.inputs, "--inputs");
    const auto outs = load_tensors(o.outputs, "--outputs");
    std::string desc;
    rep.rows.push_back(compare_tensors(in, outs, s, &desc, contract, o.kind));
    rep.cases.push_back(desc);
    rep.case_classes.push_back(rep.rows.back().cases.front().input_class);
  } catch (const Error& e) {
    err << "qknorm-check compare: " << e.what() << "\n";
    return kExitInput;
  }
  rep.machine = machine_info(all_backends());
  rep.seeded = false;
  finalize(&rep);
  rep.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  if (!json.empty()) {
    try {
      if (json == "-") {
        out << to_json(rep) << "\n";
      } else {
        validation::write_file_bytes(json, to_json(rep) + "\n");
      }
    } catch (const Error& e) {
      err << "qknorm-check compare: " << e.what() << "\n";
      return kExitInput;
    }
  }
  if (json != "-") print_table(out, rep);
  return rep.pass ? kExitPass : kExitFail;
}

}  // namespace qknorm::cli
