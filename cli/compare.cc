#include "cli/compare.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include "cli/app.h"
#include "cli/machine.h"
#include "qknorm/error.h"
#include "qknorm/validate.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::cli {
namespace {

using validation::HostTensor;

const std::vector<std::string> kInputNames = {"q", "k", "v", "g", "dO"};
const std::vector<std::string> kOutputNames = {"O", "dQ", "dK", "dV", "dg"};

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Canonical name of a file stem / key, or "" if it is none of ours.
std::string canonical(const std::string& raw) {
  const std::string s = lower(raw);
  if (s == "q" || s == "query") return "q";
  if (s == "k" || s == "key") return "k";
  if (s == "v" || s == "value") return "v";
  if (s == "g" || s == "scale") return "g";
  if (s == "do" || s == "d_o" || s == "grad_o" || s == "grad_out") return "dO";
  if (s == "o" || s == "out" || s == "output") return "O";
  if (s == "dq" || s == "grad_q") return "dQ";
  if (s == "dk" || s == "grad_k") return "dK";
  if (s == "dv" || s == "grad_v") return "dV";
  if (s == "dg" || s == "grad_g") return "dg";
  return "";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A registry-shaped stand-in for the user's framework: its "kernel" returns
// the dumped tensors. Fields the files do not hold are filled by the naive
// baseline (so the harness has something to compare) and dropped from the
// verdict afterwards. lse is never dumped: always the naive's, never judged.
class FileBackend final : public Backend {
 public:
  FileBackend(Precision p, const std::map<std::string, const HostTensor*>& outs)
      : Backend("compare", "-", p),
        outs_(outs),
        naive_(validation::naive_for(p)) {}

  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace*, const ExecConfig& cfg) const override {
    naive_.attention_forward(p, a, nullptr, cfg);
    put("O", a.o, p.batch, p.heads, p.q_len, p.head_dim);
  }
  void attention_backward(const AttentionProblem& p, const BackwardArgs& a,
                          Workspace*, const ExecConfig& cfg) const override {
    naive_.attention_backward(p, a, nullptr, cfg);
    put("dQ", a.dq, p.batch, p.heads, p.q_len, p.head_dim);
    put("dK", a.dk, p.batch, p.heads, p.kv_len, p.head_dim);
    put("dV", a.dv, p.batch, p.heads, p.kv_len, p.head_dim);
    if (const auto it = outs_.find("dg"); it != outs_.end())
      *a.dg = it->second->values[0];
  }
  void scalenorm_forward(const ScaleNormProblem&, const ScaleNormForwardArgs&,
                         Workspace*, const ExecConfig&) const override {
    throw Error("compare", {}, "ScaleNorm is not compared");
  }
  void scalenorm_backward(const ScaleNormProblem&, const ScaleNormBackwardArgs&,
                          Workspace*, const ExecConfig&) const override {
    throw Error("compare", {}, "ScaleNorm is not compared");
  }

 private:
  void put(const std::string& name, const MutTensor4& t, int64_t B, int64_t H,
           int64_t rows, int64_t D) const {
    const auto it = outs_.find(name);
    if (it == outs_.end()) return;
    const std::vector<double>& v = it->second->values;
    size_t idx = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < rows; ++n)
          for (int64_t d = 0; d < D; ++d)
            encode(precision(), v[idx++], t.data,
                   static_cast<size_t>(b * t.layout.batch_stride +
                                       h * t.layout.head_stride +
                                       n * t.layout.row_stride + d));
  }

  std::map<std::string, const HostTensor*> outs_;
  const Backend& naive_;
};

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

}  // namespace

void add_compare_options(CLI::App& app, CompareOptions& o) {
  app.add_option(
         "--inputs", o.inputs,
         "Input files: q.npy k.npy v.npy g.npy [dO.npy], or one .safetensors "
         "(keys q, k, v, g, dO), or NAME=PATH")
      ->required()
      ->type_name("FILE");
  app.add_option(
         "--outputs", o.outputs,
         "The framework's outputs: O.npy [dQ.npy dK.npy dV.npy dg.npy], or one "
         ".safetensors (keys O, dQ, dK, dV, dg), or NAME=PATH")
      ->required()
      ->type_name("FILE");
}

std::map<std::string, HostTensor> load_tensors(
    const std::vector<std::string>& specs, const std::string& flag) {
  std::map<std::string, HostTensor> out;
  const std::vector<std::string>& allowed =
      flag == "--inputs" ? kInputNames : kOutputNames;
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

EntryRow compare_tensors(const std::map<std::string, HostTensor>& in,
                         const std::map<std::string, HostTensor>& outs,
                         const SuiteOptions& s, std::string* case_desc) {
  const HostTensor &q = need(in, "q", "--inputs"),
                   &k = need(in, "k", "--inputs"),
                   &v = need(in, "v", "--inputs");
  const HostTensor& o = need(outs, "O", "--outputs");
  const Precision prec = q.dtype;
  for (const auto* t : {&k, &v, &o})
    if (t->dtype != prec)
      throw Error(t->name, {},
                  std::string("dtype ") + std::string(name(t->dtype)) +
                      " differs from q's " + std::string(name(prec)) +
                      " (the naive baseline runs at one dtype)");
  const std::vector<int64_t> sq = as4(q, "q"), sk = as4(k, "k"),
                             sv = as4(v, "v");
  if (sk != sv)
    throw Error(
        "v", {},
        "shape " + v.shape_text() + " differs from k's " + k.shape_text());
  if (sk[0] != sq[0] || sk[1] != sq[1] || sk[3] != sq[3])
    throw Error("k", {},
                "shape " + k.shape_text() + " does not match q's " +
                    q.shape_text() + " (need the same B, H, D)");
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
  if (s.g.size() > 1) throw Error("--g", {}, "compare takes one g");
  if (!s.g.empty()) {
    p.g = s.g[0];
  } else if (const auto it = in.find("g"); it != in.end()) {
    p.g = scalar(it->second, "g");
  } else if (p.variant == Variant::kQKNorm) {
    throw Error("--inputs", {},
                "no tensor named g (give g.npy, a key g, or --g)");
  }
  if (s.masks.size() > 1) throw Error("--mask", {}, "compare takes one mask");
  if (!s.masks.empty()) apply_mask(s.masks[0], &p);
  validate_problem(p);

  std::map<std::string, const HostTensor*> given = {{"O", &o}};
  validation::AttentionCase c;
  c.problem = p;
  c.q = q.values;
  c.k = k.values;
  c.v = v.values;
  bool backward = false;
  for (const std::string gname : {"dQ", "dK", "dV", "dg"}) {
    const auto it = outs.find(gname);
    if (it == outs.end()) continue;
    backward = true;
    const HostTensor& t = it->second;
    if (gname == "dg") {
      scalar(t, "dg");
    } else {
      if (t.dtype != prec)
        throw Error(gname, {},
                    std::string("dtype ") + std::string(name(t.dtype)) +
                        " differs from q's " + std::string(name(prec)));
      if (as4(t, gname) != (gname == "dQ" ? sq : sk))
        throw Error(gname, {},
                    "shape " + t.shape_text() + " does not match " +
                        (gname == "dQ" ? q : k).shape_text());
    }
    given[gname] = &t;
  }
  if (backward) {
    const HostTensor& d_o = need(in, "dO", "--inputs");
    if (d_o.dtype != prec)
      throw Error("dO", {},
                  std::string("dtype ") + std::string(name(d_o.dtype)) +
                      " differs from q's " + std::string(name(prec)));
    if (as4(d_o, "dO") != sq)
      throw Error(
          "dO", {},
          "shape " + d_o.shape_text() + " differs from q's " + q.shape_text());
    c.d_o = d_o.values;
  } else {
    // Forward only: the oracle still runs its backward, on a zero dO.
    c.d_o.assign(c.q.size(), 0.0);
  }
  // The case came from files: its distribution and seed mean nothing.
  *case_desc = c.describe();
  case_desc->erase(std::min(case_desc->find(" dist="), case_desc->size()));
  *case_desc += " (tensors from files)";
  const FileBackend fb(prec, given);
  const validation::AgreementReport rep =
      validation::check_attention(fb, c, {}, !backward);
  CaseResult cr = from_report(rep, nullptr);
  cr.desc = *case_desc;
  // Keep only the fields the files gave (lse is never dumped).
  const std::map<std::string, std::string> field_of = {
      {"o", "O"}, {"dq", "dQ"}, {"dk", "dK"}, {"dv", "dV"}, {"dg", "dg"}};
  std::vector<FieldResult> kept;
  for (const FieldResult& f : cr.fields) {
    const auto it = field_of.find(f.field);
    if (it != field_of.end() && given.count(it->second)) kept.push_back(f);
  }
  cr.fields = kept;
  cr.pass = std::all_of(kept.begin(), kept.end(),
                        [](const FieldResult& f) { return f.pass; });
  if (!cr.pass) {
    cr.failure = "compared outputs vs oracle (naive " + rep.naive_name +
                 ") on " + *case_desc + "\n";
    for (const FieldResult& f : kept)
      if (!f.pass)
        cr.failure += fmt::format(
            "  field {}: err={:.6e} > bound={:.6e} (naive err {:.6e})\n    "
            "{}\n",
            f.field, f.entry.max_abs, f.limit, f.naive.max_abs,
            validation::describe(f.entry));
  } else {
    cr.failure.clear();
  }
  EntryRow row;
  row.kind = "attention";
  row.name = "files:" + std::string(name(prec));
  row.family = "compare";
  row.target = "-";
  row.precision = std::string(name(prec));
  row.rule = "naive";
  row.cases.push_back(cr);
  summarize(&row);
  return row;
}

int run_compare(const CompareOptions& o, const SuiteOptions& s,
                const std::string& json, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  Report rep;
  rep.title = "qknorm-check compare";
  try {
    const auto in = load_tensors(o.inputs, "--inputs");
    const auto outs = load_tensors(o.outputs, "--outputs");
    std::string desc;
    rep.rows.push_back(compare_tensors(in, outs, s, &desc));
    rep.cases.push_back(desc);
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
