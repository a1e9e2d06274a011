#include "qknorm/formulation.h"

#include <cmath>
#include <cstdio>

#include "qknorm/error.h"

namespace qknorm {

namespace {

using S = Preset::Scale;
constexpr auto kH = NormAxis::kHead;

}  // namespace

const std::vector<Preset>& presets() {
  // Normalization's fields in declaration order: kind, axis, weight,
  // one_plus_weight, bias, shared_qk_weight, round_before_weight.
  static const std::vector<Preset> table = {
      {"paper",
       Normalization{NormKind::kL2, kH, ParamShape::kNone, false, false, false,
                     false},
       1e-12, S::kLearnedG, 0, false},
      {"qwen3",
       Normalization{NormKind::kRms, kH, ParamShape::kDim, false, false, false,
                     true},
       1e-6, S::kInvSqrtD, 0, true},
      {"gemma3",
       Normalization{NormKind::kRms, kH, ParamShape::kDim, true, false, false,
                     false},
       1e-6, S::kConstant, 1.0 / 16.0, true},
      {"olmo2",
       Normalization{NormKind::kRms, NormAxis::kAllHeads, ParamShape::kHeadDim,
                     false, false, false, false},
       1e-6, S::kInvSqrtD, 0, true},
      {"timm",
       Normalization{NormKind::kLayer, kH, ParamShape::kDim, false, true, false,
                     false},
       1e-6, S::kInvSqrtD, 0, false},
      {"vit22b",
       Normalization{NormKind::kLayer, kH, ParamShape::kDim, false, false,
                     false, false},
       1e-6, S::kInvSqrtD, 0, false},
      {"chameleon",
       Normalization{NormKind::kLayer, kH, ParamShape::kHeadDim, false, true,
                     false, false},
       1e-5, S::kInvSqrtD, 0, true},
      {"ngpt",
       Normalization{NormKind::kL2, kH, ParamShape::kHeadDim, false, false,
                     true, false},
       1e-12, S::kSqrtD, 0, false},
  };
  return table;
}

const Preset* find_preset(std::string_view name) {
  for (const Preset& p : presets())
    if (name == p.name) return &p;
  return nullptr;
}

namespace {

double preset_scale(const Preset& s, int64_t D) {
  switch (s.scale) {
    case S::kInvSqrtD:
      return 1 / std::sqrt(static_cast<double>(D));
    case S::kSqrtD:
      return std::sqrt(static_cast<double>(D));
    case S::kConstant:
      return s.scale_constant;
    case S::kLearnedG:
      break;
  }
  return 0;
}

bool same(const Normalization& a, const Normalization& b) {
  return a.kind == b.kind && a.axis == b.axis && a.weight == b.weight &&
         a.one_plus_weight == b.one_plus_weight && a.bias == b.bias &&
         a.shared_qk_weight == b.shared_qk_weight &&
         a.round_before_weight == b.round_before_weight;
}

}  // namespace

void apply_preset(std::string_view name, AttentionProblem* p) {
  const Preset* s = find_preset(name);
  if (s == nullptr) {
    std::string known;
    for (const Preset& q : presets()) known += std::string(" ") + q.name;
    throw Error(
        "formulation", {},
        "unknown preset '" + std::string(name) + "' (known:" + known + ")");
  }
  p->variant = Variant::kQKNorm;
  p->norm = s->norm;
  p->eps = s->eps;
  p->fixed_scale = s->scale != S::kLearnedG;
  p->scale = p->fixed_scale ? preset_scale(*s, p->head_dim) : 1.0;
}

std::string formulation_name(const AttentionProblem& p) {
  if (p.variant == Variant::kSDPA) return "sdpa";
  for (const Preset& s : presets()) {
    if (!same(s.norm, p.norm) || s.eps != p.eps) continue;
    if (p.fixed_scale != (s.scale != S::kLearnedG)) continue;
    if (p.fixed_scale && p.scale != preset_scale(s, p.head_dim)) continue;
    return s.name;
  }
  return "custom";
}

std::string describe_formulation(const AttentionProblem& p) {
  char cap[48] = "";
  if (p.softcap != 0)
    std::snprintf(cap, sizeof cap, " softcap=%.17g", p.softcap);
  if (p.variant == Variant::kSDPA) return std::string("sdpa") + cap;
  static const char* kinds[] = {"l2", "rms", "layer", "none"};
  static const char* shapes[] = {"none", "[D]", "[H,D]"};
  const Normalization& n = p.norm;
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "%s norm=%s%s weight=%s%s%s%s%s eps=%g scale=%s%.9g",
      formulation_name(p).c_str(), kinds[static_cast<int>(n.kind)],
      n.axis == NormAxis::kAllHeads ? "(all heads)" : "",
      shapes[static_cast<int>(n.weight)], n.one_plus_weight ? "(1+w)" : "",
      n.shared_qk_weight ? "(shared q,k)" : "",
      n.round_before_weight ? "(x_hat rounded first)" : "",
      n.bias ? " bias" : "", p.eps,
      p.fixed_scale ? "" : "g=", p.fixed_scale ? p.scale : p.g);
  std::string s = buf;
  if (kv_heads_of(p) != p.heads)
    s += " kv_heads=" + std::to_string(kv_heads_of(p));
  return s + cap;
}

bool is_paper_formulation(const AttentionProblem& p) {
  if (kv_heads_of(p) != p.heads || p.softcap != 0 || has_window(p.mask))
    return false;
  if (p.variant == Variant::kSDPA) return true;
  const Normalization& n = p.norm;
  return n.kind == NormKind::kL2 && n.axis == NormAxis::kHead &&
         n.weight == ParamShape::kNone && !n.bias && !n.one_plus_weight &&
         !n.shared_qk_weight && !p.fixed_scale;
}

int64_t param_size(const AttentionProblem& p, int side) {
  if (p.variant != Variant::kQKNorm) return 0;
  const Normalization& n = p.norm;
  if (n.weight == ParamShape::kNone) return 0;
  if (side == 1 && n.shared_qk_weight) return 0;
  if (n.weight == ParamShape::kDim) return p.head_dim;
  return (side == 0 ? p.heads : kv_heads_of(p)) * p.head_dim;
}

}  // namespace qknorm
