#include "qknorm/formulation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

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
  std::string cap;
  if (p.softcap != 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " softcap=%.17g", p.softcap);
    cap = buf;
  }
  if (has_sinks(p)) cap += " sinks=" + sinks_spec(p.sinks);
  if (p.variant == Variant::kSDPA) return "sdpa" + cap;
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
  if (has_rope(p)) s += " rope=" + rope_spec(p.rope);
  return s + cap;
}

// The model presets. Sources (read in the stored copy of
// github.com/huggingface/transformers, src/transformers/...):
// - masking_utils.py, sliding_window_overlay: key kv_idx is kept iff
//   kv_idx > q_idx - sliding_window, on top of causal_mask_function's
//   kv_idx <= q_idx: i - j < w, FlashAttention's (w - 1, 0). Every windowed
//   model below builds its sliding layers' mask there.
// - qwen3: Qwen3's released config.json (e.g. Qwen3-8B, Qwen3-4B before
//   its 2507 update, which has 5e6): rope_theta 1000000; q_norm/k_norm per
//   head before apply_rotary_pos_emb (rotate_half: half-split).
// - olmo2: OLMo 2's released config.json: rope_theta 500000; q_norm/k_norm
//   over the whole projection before the rotation.
// - gemma3: models/gemma3/configuration_gemma3.py: rope_theta 1e6 (global),
//   rope_local_base_freq 10000 (sliding layers), query_pre_attn_scalar 256;
//   the class default sliding_window is 4096, the released Gemma 3 4B, 12B
//   and 27B configs (and the Gemma 3 report) use 1024.
// - llama4: models/llama4/configuration_llama4.py: default_theta 500000,
//   rms_norm_eps 1e-5, use_qk_norm, no_rope_layer_interval 4,
//   attn_temperature_tuning (NoPE layers only); modeling_llama4.py:
//   Llama4TextL2Norm is x * rsqrt(mean(x^2) + eps) with no weight, built
//   as Llama4TextL2Norm(config.rms_norm_eps) (1e-5, not its 1e-6 default),
//   applied after apply_rotary_emb (complex multiply of adjacent pairs:
//   interleaved, in f32, result cast back), scaling head_dim^-0.5.
//   Llama 4's llama3 rope scaling and its chunked attention (8192-token
//   chunks) are left out.
// - qwen3-next: models/qwen3_next/configuration_qwen3_next.py:
//   partial_rotary_factor 0.25, rms_norm_eps 1e-6, head_dim 256;
//   Qwen3NextRMSNorm: weight zeros, x_hat * (1 + w) in f32 then cast (no
//   rounding before the weight); apply_rotary_pos_emb rotates the first
//   rotary_dim dims (rotate_half) and passes the rest. rope_theta 1e7 is
//   the released Qwen3-Next-80B-A3B config's (the class has no default).
// - gpt-oss: models/gpt_oss/configuration_gpt_oss.py: default_theta
//   150000, head_dim 64, sliding_window 128, layer_types alternating
//   sliding/full, rope_type yarn factor 32; modeling_gpt_oss.py:
//   _apply_rotary_emb chunks x in halves (half-split), cos and sin scaled
//   by YaRN's attention_scaling and cast to x.dtype, scaling
//   head_dim^-0.5, sinks [num_attention_heads] concatenated to the logits.
//   YaRN is not modelled: its attention_scaling multiplies cos and sin,
//   a logit scale sdpa cannot express; plain theta is used.
// - gemma2: models/gemma2/configuration_gemma2.py: query_pre_attn_scalar
//   256, attn_logit_softcapping 50.0, sliding_window 4096, head_dim 256,
//   rope theta the default 10000; no QK-norm.
const std::vector<ModelPreset>& model_presets() {
  const Normalization none{};  // unused where a formulation is named
  Normalization l4{NormKind::kRms, kH,   ParamShape::kNone, false, false,
                   false,          false};
  Normalization q3n{NormKind::kRms, kH,   ParamShape::kDim, true, false,
                    false,          false};
  Normalization g2{NormKind::kNone, kH,   ParamShape::kNone, false, false,
                   false,           false};
  constexpr auto kHalf = RopePairing::kHalf;
  constexpr auto kAfter = RopeOrder::kAfterNorm;
  constexpr auto kQ = Variant::kQKNorm;
  // name, formulation, variant, norm, eps, scale, rotary_fraction, pairing,
  // order, theta, cos_sin_storage, window, softcap, sinks.
  static const std::vector<ModelPreset> table = {
      {"qwen3", "qwen3", kQ, none, 0, 0, 1, kHalf, kAfter, 1e6, true, 0, 0,
       false},
      {"olmo2", "olmo2", kQ, none, 0, 0, 1, kHalf, kAfter, 500000, true, 0, 0,
       false},
      {"gemma3-local", "gemma3", kQ, none, 0, 0, 1, kHalf, kAfter, 10000, true,
       1024, 0, false},
      {"gemma3-global", "gemma3", kQ, none, 0, 0, 1, kHalf, kAfter, 1e6, true,
       0, 0, false},
      {"llama4", "", kQ, l4, 1e-5, 0, 1, RopePairing::kInterleaved,
       RopeOrder::kBeforeNorm, 500000, false, 0, 0, false},
      {"qwen3-next", "", kQ, q3n, 1e-6, 0, 0.25, kHalf, kAfter, 1e7, true, 0, 0,
       false},
      {"gpt-oss", "", Variant::kSDPA, none, kDefaultQKNormEps, 0, 1, kHalf,
       kAfter, 150000, true, 128, 0, true},
      {"gemma2", "", kQ, g2, 1e-6, 1.0 / 16.0, 1, kHalf, kAfter, 10000, true,
       4096, 50, false},
  };
  return table;
}

const ModelPreset* find_model(std::string_view name) {
  for (const ModelPreset& m : model_presets())
    if (name == m.name) return &m;
  return nullptr;
}

void apply_model(std::string_view name, AttentionProblem* p) {
  const ModelPreset* m = find_model(name);
  if (m == nullptr) {
    std::string known;
    for (const ModelPreset& q : model_presets())
      known += std::string(" ") + q.name;
    throw Error(
        "model", {},
        "unknown model '" + std::string(name) + "' (known:" + known + ")");
  }
  if (*m->formulation != '\0') {
    apply_preset(m->formulation, p);
  } else {
    p->norm = m->norm;
    p->eps = m->eps;
    p->fixed_scale = m->variant == Variant::kQKNorm;
    p->scale = m->scale > 0 ? m->scale
                            : 1 / std::sqrt(static_cast<double>(p->head_dim));
    if (m->variant == Variant::kSDPA) p->scale = 1.0;
  }
  p->variant = m->variant;
  Rope r;
  if (m->rotary_fraction > 0) {
    // HF: int(head_dim * partial_rotary_factor).
    r.rotary_dim = static_cast<int64_t>(static_cast<double>(p->head_dim) *
                                        m->rotary_fraction);
    r.pairing = m->pairing;
    r.order = m->order;
    r.theta = m->theta;
    r.angle_f32 = true;
    r.cos_sin_storage = m->cos_sin_storage;
  }
  p->rope = r;
  p->softcap = m->softcap;
  p->mask.window_left = m->window > 0 ? m->window - 1 : -1;
  p->mask.window_right = m->window > 0 ? 0 : -1;
  if (!m->sinks) {
    p->sinks.clear();
  } else if (p->sinks.empty()) {
    p->sinks.assign(static_cast<size_t>(p->heads), 0.0);
  }
}

std::string sinks_spec(const std::vector<double>& sinks) {
  if (sinks.empty()) return "off";
  std::string s;
  for (double x : sinks) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.17g", s.empty() ? "" : ",", x);
    s += buf;
  }
  return s;
}

std::vector<double> parse_sinks(std::string_view spec) {
  std::vector<double> out;
  if (spec == "off") return out;
  std::string text(spec);
  size_t at = 0;
  while (true) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const double x = std::strtod(item.c_str(), &stop);
    if (item.empty() || stop != item.c_str() + item.size())
      throw Error("sinks", {static_cast<int64_t>(out.size())},
                  "'" + item +
                      "' is not a number (sinks: X or X,Y,... one "
                      "per query head, or off)");
    out.push_back(x);
    if (end == text.size()) break;
    at = end + 1;
  }
  return out;
}

std::string rope_spec(const Rope& r) {
  if (r.rotary_dim <= 0) return "off";
  std::string s = std::to_string(r.rotary_dim);
  s += r.pairing == RopePairing::kHalf ? ",half" : ",interleaved";
  s += r.order == RopeOrder::kAfterNorm ? ",after" : ",before";
  if (r.inv_freq.empty()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, ",theta=%.17g", r.theta);
    s += buf;
  } else {
    s += ",inv_freq[" + std::to_string(r.inv_freq.size()) + "]";
  }
  if (r.position_offset != 0)
    s += ",offset=" + std::to_string(r.position_offset);
  if (r.angle_f32) s += ",angle_f32";
  if (r.cos_sin_storage) s += ",cos_sin_storage";
  return s;
}

Rope parse_rope(std::string_view spec) {
  Rope r;
  auto bad = [&](const std::string& why) {
    return Error("rope", {},
                 "'" + std::string(spec) + "': " + why +
                     " (expected DIM[,half|interleaved][,after|before]"
                     "[,theta=X][,offset=N][,angle_f32][,cos_sin_storage])");
  };
  size_t at = 0;
  bool first = true;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item(spec.substr(at, comma - at));
    at = comma + 1;
    auto number = [&](const std::string& text, bool integer) {
      size_t used = 0;
      double v = 0;
      try {
        v = integer ? static_cast<double>(std::stoll(text, &used))
                    : std::stod(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != text.size())
        throw bad("'" + text + "' is not " +
                  (integer ? "an integer" : "a number"));
      return v;
    };
    if (first) {
      r.rotary_dim = static_cast<int64_t>(number(item, true));
      first = false;
    } else if (item == "half") {
      r.pairing = RopePairing::kHalf;
    } else if (item == "interleaved") {
      r.pairing = RopePairing::kInterleaved;
    } else if (item == "after") {
      r.order = RopeOrder::kAfterNorm;
    } else if (item == "before") {
      r.order = RopeOrder::kBeforeNorm;
    } else if (item.rfind("theta=", 0) == 0) {
      r.theta = number(item.substr(6), false);
    } else if (item.rfind("offset=", 0) == 0) {
      r.position_offset = static_cast<int64_t>(number(item.substr(7), true));
    } else if (item == "angle_f32") {
      r.angle_f32 = true;
    } else if (item == "cos_sin_storage") {
      r.cos_sin_storage = true;
    } else {
      throw bad("unknown item '" + item + "'");
    }
  }
  return r;
}

bool is_paper_formulation(const AttentionProblem& p) {
  if (kv_heads_of(p) != p.heads || p.softcap != 0 || has_window(p.mask) ||
      has_rope(p) || has_sinks(p))
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
