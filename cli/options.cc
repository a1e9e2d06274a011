#include "cli/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "qknorm/error.h"
#include "qknorm/formulation.h"
#include "qknorm/validate.h"

namespace qknorm::cli {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

int64_t parse_int(const std::string& what, const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw Error(what, {}, "'" + s + "' is not an integer");
  return v;
}

}  // namespace

AttentionProblem parse_shape(const std::string& s) {
  const std::vector<std::string> parts = split(s, 'x');
  if (parts.size() != 4 && parts.size() != 5)
    throw Error("--shape", {},
                "'" + s + "' must be BxHxNxD or BxHxNqxNkxD (e.g. 2x8x72x64)");
  std::vector<int64_t> v;
  for (const auto& p : parts) {
    v.push_back(parse_int("--shape", p));
    if (v.back() < 1)
      throw Error("--shape", {}, "'" + s + "': every dimension must be >= 1");
  }
  AttentionProblem p;
  p.batch = v[0];
  p.heads = v[1];
  p.q_len = v[2];
  p.kv_len = parts.size() == 5 ? v[3] : v[2];
  p.head_dim = v.back();
  // Sizes the CLI would have to allocate: refuse overflow early.
  validate_problem(p);
  return p;
}

void apply_mask(const std::string& s, AttentionProblem* p) {
  p->mask = Mask{};
  for (const std::string& part : split(s, '+')) {
    if (part == "none") continue;
    if (part == "causal") {
      p->mask.causal = true;
    } else if (part == "pad") {
      for (int64_t b = 0; b < p->batch; ++b)
        p->mask.key_lengths.push_back(p->kv_len -
                                      b * p->kv_len / (2 * p->batch));
    } else if (part.rfind("pad:", 0) == 0) {
      for (const auto& len : split(part.substr(4), ','))
        p->mask.key_lengths.push_back(parse_int("--mask", len));
      if (static_cast<int64_t>(p->mask.key_lengths.size()) != p->batch)
        throw Error("--mask", {},
                    "'" + s + "' gives " +
                        std::to_string(p->mask.key_lengths.size()) +
                        " key lengths for batch " + std::to_string(p->batch));
    } else if (part.rfind("window:", 0) == 0) {
      // FlashAttention's (left, right), -1 unbounded (attention.h).
      const std::vector<std::string> lr = split(part.substr(7), ',');
      if (lr.size() != 2)
        throw Error("--mask", {},
                    "'" + part + "': a window is window:LEFT,RIGHT (e.g. " +
                        "window:127,0; -1 leaves a side unbounded)");
      p->mask.window_left = parse_int("--mask", lr[0]);
      p->mask.window_right = parse_int("--mask", lr[1]);
    } else {
      throw Error("--mask", {},
                  "unknown mask '" + part +
                      "' (none, causal, pad, pad:L1,..., window:LEFT,RIGHT, "
                      "joined with +, e.g. causal+pad or causal+window:127,0)");
    }
  }
  validate_problem(*p);
}

validation::Distribution parse_dist(const std::string& s) {
  validation::Distribution d;
  if (!validation::parse_distribution(s, &d))
    throw Error("--dist", {},
                "unknown distribution '" + s + "' (" +
                    validation::distribution_names() + ")");
  return d;
}

std::vector<validation::InputClass> parse_classes(
    const std::vector<std::string>& names) {
  std::vector<bool> chosen(std::size(validation::kAllInputClasses), false);
  for (const std::string& list : names)
    for (const std::string& n : split(list, ',')) {
      validation::InputClass k;
      if (!validation::parse_input_class(n, &k))
        throw Error("--classes", {},
                    "unknown input class '" + n + "' (" +
                        validation::input_class_names() + ")");
      chosen[static_cast<size_t>(k)] = true;
    }
  std::vector<validation::InputClass> out;
  for (validation::InputClass c : validation::kAllInputClasses)
    if (chosen[static_cast<size_t>(c)]) out.push_back(c);
  return out;
}

Precision parse_prec(const std::string& s) {
  Precision p;
  if (!parse_precision(s, &p))
    throw Error("--precision", {},
                "unknown precision '" + s + "' (f64, f32, bf16, f16)");
  return p;
}

void apply_sinks(const std::string& spec, AttentionProblem* p) {
  p->sinks = parse_sinks(spec);
  // One value: every query head's sink.
  if (p->sinks.size() == 1)
    p->sinks.assign(static_cast<size_t>(p->heads), p->sinks[0]);
}

bool custom_suite(const SuiteOptions& o) {
  return !o.shapes.empty() || !o.g.empty() || !o.masks.empty() ||
         !o.dists.empty() || o.variant != "qknorm" ||
         o.eps != kDefaultQKNormEps || !o.scalenorm.empty() ||
         !o.formulations.empty() || o.kv_heads != 0 || !o.norm.empty() ||
         !o.norm_axis.empty() || !o.weight.empty() || !o.flags.empty() ||
         o.scale != 0 || o.softcap != 0 || !o.rope.empty() ||
         !o.sinks.empty() || !o.model.empty();
}

void apply_formulation(const SuiteOptions& o, const std::string& preset,
                       AttentionProblem* p) {
  if (!preset.empty()) {
    apply_preset(preset, p);
    if (o.eps_given) p->eps = o.eps;
  }
  if (!o.model.empty()) {
    apply_model(o.model, p);
    if (o.eps_given) p->eps = o.eps;
  }
  Normalization& n = p->norm;
  auto pick = [](const char* opt, const std::string& v,
                 std::initializer_list<const char*> names) {
    int i = 0;
    std::string known;
    for (const char* x : names) {
      if (v == x) return i;
      known += std::string(i ? ", " : "") + x;
      ++i;
    }
    throw Error(opt, {}, "unknown value '" + v + "' (" + known + ")");
  };
  if (!o.norm.empty())
    n.kind = static_cast<NormKind>(
        pick("--norm", o.norm, {"l2", "rms", "layer", "none"}));
  if (!o.norm_axis.empty())
    n.axis = static_cast<NormAxis>(
        pick("--norm-axis", o.norm_axis, {"head", "all-heads"}));
  if (!o.weight.empty())
    n.weight = static_cast<ParamShape>(
        pick("--weight", o.weight, {"none", "dim", "head-dim"}));
  for (const std::string& f : split(o.flags, ',')) {
    if (f.empty()) continue;
    switch (pick("--norm-flags", f,
                 {"one-plus-weight", "bias", "shared-qk-weight",
                  "round-before-weight"})) {
      case 0:
        n.one_plus_weight = true;
        break;
      case 1:
        n.bias = true;
        break;
      case 2:
        n.shared_qk_weight = true;
        break;
      default:
        n.round_before_weight = true;
        break;
    }
  }
  if (o.scale != 0) {
    p->fixed_scale = true;
    p->scale = o.scale;
  }
  if (o.kv_heads != 0) p->kv_heads = o.kv_heads;
  if (o.softcap != 0) p->softcap = o.softcap;
  if (!o.rope.empty()) p->rope = parse_rope(o.rope);
  if (!o.sinks.empty()) apply_sinks(o.sinks, p);
  validate_problem(*p);
}

namespace {
Suite product_suite(const SuiteOptions& o);
}  // namespace

Suite build_suite(const SuiteOptions& o) {
  if (o.variant != "qknorm" && o.variant != "sdpa")
    throw Error("--variant", {},
                "must be qknorm or sdpa (got '" + o.variant + "')");
  if (!std::isfinite(o.eps) || o.eps <= 0)
    throw Error("--eps", {}, "must be finite and > 0");
  for (double g : o.g)
    if (!std::isfinite(g)) throw Error("--g", {}, "must be finite");
  const std::vector<validation::InputClass> classes = parse_classes(o.classes);
  Suite s = custom_suite(o) ? product_suite(o) : default_suite(o.seed);
  return classes.empty() ? s : select_classes(s, classes);
}

namespace {

// The suite of the attention options' lists (custom_suite()).
Suite product_suite(const SuiteOptions& o) {
  Suite s = default_suite(o.seed);
  const std::vector<std::string> shapes =
      o.shapes.empty() ? std::vector<std::string>{"2x8x72x64"} : o.shapes;
  // Without --g: the built-in shape keeps its pair {g_init(72), 20}; a
  // shape of the user's gets the paper's initialisation for its own key
  // length, g_init(Nk) (g_init(2) for Nk = 1), one case per mask and
  // distribution. Each case of a production shape costs a whole problem per
  // entry, and g_init(72) is no more representative of Nk = 32768 than 20.
  auto gs_for = [&](const AttentionProblem& shape) {
    if (!o.g.empty()) return o.g;
    if (o.shapes.empty()) return std::vector<double>{g_init(72), 20};
    return std::vector<double>{
        g_init(static_cast<double>(std::max<int64_t>(shape.kv_len, 2)))};
  };
  const std::vector<std::string> masks =
      o.masks.empty() ? std::vector<std::string>{"causal", "pad"} : o.masks;
  // Without --dist: gaussian and wide, or gaussian alone at production
  // lengths (kLongSeq; long_run_note says so).
  auto dists_for = [&](const AttentionProblem& shape) {
    if (!o.dists.empty()) return o.dists;
    if (std::max(shape.q_len, shape.kv_len) >= kLongSeq)
      return std::vector<std::string>{"gaussian"};
    return std::vector<std::string>{"gaussian", "wide"};
  };
  const std::vector<std::string> forms =
      o.formulations.empty() ? std::vector<std::string>{""} : o.formulations;
  if (!o.formulations.empty() && o.variant == "sdpa")
    throw Error("--formulation", {}, "applies to the qknorm variant only");
  s.attention.clear();
  for (const auto& sh : shapes) {
    const AttentionProblem shape = parse_shape(sh);
    for (const auto& f : forms)
      for (double g : gs_for(shape))
        for (const auto& m : masks)
          for (const auto& d : dists_for(shape)) {
            AttentionProblem p = shape;
            p.g = g;
            p.eps = o.eps;
            p.variant = o.variant == "sdpa" ? Variant::kSDPA : Variant::kQKNorm;
            apply_mask(m, &p);
            apply_formulation(o, f, &p);
            s.attention.push_back(
                {p, parse_dist(d),
                 o.seed + static_cast<uint64_t>(s.attention.size())});
          }
  }
  s.timing = s.attention.front().problem;
  s.timing.mask = Mask{};
  if (!o.scalenorm.empty()) {
    s.scalenorm.clear();
    for (const auto& sn : o.scalenorm) {
      const std::vector<std::string> parts = split(sn, 'x');
      if (parts.size() != 2)
        throw Error("--scalenorm", {},
                    "'" + sn + "' must be ROWSxDIM (e.g. 144x512)");
      ScaleNormProblem p;
      p.rows = parse_int("--scalenorm", parts[0]);
      p.dim = parse_int("--scalenorm", parts[1]);
      p.g = p.dim >= 1 ? scalenorm_g_init(p.dim) : 1;
      validate_problem(p);
      s.scalenorm.push_back(
          {p, validation::Distribution::kGaussian,
           o.seed +
               static_cast<uint64_t>(s.attention.size() + s.scalenorm.size())});
    }
  }
  return s;
}

}  // namespace

std::string long_run_note(const SuiteOptions& o) {
  if (!o.dists.empty()) return "";
  std::vector<std::string> long_shapes;
  for (const std::string& sh : o.shapes) {
    const AttentionProblem p = parse_shape(sh);
    if (std::max(p.q_len, p.kv_len) >= kLongSeq) long_shapes.push_back(sh);
  }
  if (long_shapes.empty()) return "";
  std::string names;
  for (const std::string& sh : long_shapes)
    names += (names.empty() ? "" : ", ") + sh;
  return "distribution: gaussian only for shape " + names +
         " (n >= " + std::to_string(kLongSeq) +
         ": each distribution costs the whole problem per entry and an oracle "
         "pass per precision, and both defaults exceed the 10-minute budget "
         "on 2 cores); judge the others with --dist wide (or any of " +
         validation::distribution_names() + "), one run each";
}

std::vector<const Backend*> select_entries(const Registry& r,
                                           const SuiteOptions& o) {
  std::vector<Precision> precs;
  for (const auto& p : o.precisions) precs.push_back(parse_prec(p));
  std::vector<const Backend*> out;
  for (const Backend* b : r.entries()) {
    auto any = [](const std::vector<std::string>& globs, const std::string& s) {
      if (globs.empty()) return true;
      return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
        return glob_match(g, s);
      });
    };
    if (!any(o.backends, b->name()) && !any(o.backends, b->family())) continue;
    if (!any(o.targets, b->target())) continue;
    if (!precs.empty() &&
        std::find(precs.begin(), precs.end(), b->precision()) == precs.end())
      continue;
    out.push_back(b);
  }
  if (out.empty()) {
    std::string names;
    for (const Backend* b : r.entries()) names += " " + b->name();
    throw Error("--backend/--target/--precision", {},
                "the filters select no registry entry (entries:" + names + ")");
  }
  return out;
}

}  // namespace qknorm::cli
