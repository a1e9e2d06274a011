// Named QK-norm formulations (issue 16): each preset is a set of values of
// AttentionProblem (normalization, eps, logit scale) and nothing more. The
// table (core/formulation.cc) follows the public model code:
//   paper      l2, scalar g learned, eps 1e-12, no 1/sqrt(D)  (Henry et al.)
//   qwen3      rms per head, gamma [D], eps 1e-6, x_hat rounded to storage
//              before the weight, scale 1/sqrt(D), GQA
//   gemma3     rms per head, x_hat (1 + w), w [D], eps 1e-6, scale
//              query_pre_attn_scalar^-1/2 = 256^-1/2, GQA
//   olmo2      rms over all heads of the projection, gamma [H_x D], eps
//              1e-6, scale 1/sqrt(D), GQA
//   timm       LayerNorm per head, gamma and beta [D], eps 1e-6, 1/sqrt(D)
//   vit22b     LayerNorm per head, gamma [D] (no bias), eps 1e-6, 1/sqrt(D)
//   chameleon  LayerNorm per head, gamma and beta [H_x, D], eps 1e-5,
//              1/sqrt(D), GQA
//   ngpt       x / ||x|| then times s_qk [H, D] on both q and k, scale
//              sqrt(D); nGPT's code has no eps (a zero row is NaN there):
//              the paper's clamp, eps 1e-12, is used instead.
#ifndef QKNORM_FORMULATION_H_
#define QKNORM_FORMULATION_H_

#include <string>
#include <string_view>
#include <vector>

#include "qknorm/attention.h"

namespace qknorm {

struct Preset {
  const char* name;
  Normalization norm;
  double eps;
  enum class Scale { kLearnedG, kInvSqrtD, kSqrtD, kConstant } scale;
  double scale_constant;  // kConstant only
  bool gqa;               // the model ships it with kv_heads < heads
};

const std::vector<Preset>& presets();
// nullptr if no preset has that name.
const Preset* find_preset(std::string_view name);
// Sets p's normalization, eps and logit scale (scale from p.head_dim: set
// the shape first). The variant becomes kQKNorm; g, kv_heads and the mask
// are left alone. Throws Error naming the preset if it is unknown.
void apply_preset(std::string_view name, AttentionProblem* p);
// "paper", "qwen3", ... or "custom" when p matches no preset.
std::string formulation_name(const AttentionProblem& p);
// One line: kind, axis, weight, bias, eps, scale, kv_heads, RoPE, softcap,
// sinks.
std::string describe_formulation(const AttentionProblem& p);
// RoPE (attention.h, Rope) as the text --rope takes and prints:
//   DIM[,half|interleaved][,after|before][,theta=X][,offset=N][,angle_f32]
//   [,cos_sin_storage]
// (defaults: half, after, theta=10000, offset=0; "off" for rotary_dim 0; a
// given inv_freq table prints as inv_freq[n] and does not parse back).
// parse_rope throws Error naming "rope" on anything else; validate() checks
// the values.
std::string rope_spec(const Rope& r);
Rope parse_rope(std::string_view spec);
// Sinks (attention.h) as the text --sinks takes and prints: one value per
// query head, comma-separated ("off" for none); each printed to 17 digits
// (it parses back exactly). parse_sinks throws Error naming "sinks" and the
// item's index on anything but numbers; the caller broadcasts a single
// value to every head, and validate() checks count and range.
std::string sinks_spec(const std::vector<double>& sinks);
std::vector<double> parse_sinks(std::string_view spec);

// Model presets (issue 34): one attention layer of a shipped model, its
// QK-norm formulation and its attention variants together (the sources of
// every number are cited in core/formulation.cc, model_presets()):
//   qwen3          qwen3 + RoPE D, half, after, theta 1e6
//   olmo2          olmo2 + RoPE D, half, after, theta 500000
//   gemma3-local   gemma3 + RoPE D, half, after, theta 10000, window
//                  (1023, 0) (sliding_window 1024)
//   gemma3-global  gemma3 + RoPE D, half, after, theta 1e6
//   llama4         rms per head, no weight, eps 1e-5, 1/sqrt(D) + RoPE D,
//                  interleaved, before the norm, theta 500000 (a RoPE
//                  layer; attention temperature tuning acts on the NoPE
//                  layers only and is left out)
//   qwen3-next     rms per head, x_hat (1 + w), w [D], eps 1e-6, 1/sqrt(D) +
//                  RoPE D / 4 (partial_rotary_factor 0.25), half, after,
//                  theta 1e7 (its output gate acts after attention: not
//                  modelled)
//   gpt-oss        sdpa + RoPE D, half, theta 150000 (YaRN left out: plain
//                  theta), window (127, 0) (a sliding layer), one sink per
//                  head
//   gemma2         no QK-norm (qknorm with norm none), fixed scale
//                  query_pre_attn_scalar^-1/2 = 256^-1/2, softcap 50 +
//                  RoPE D, half, theta 10000, window (4095, 0) (a local
//                  layer)
// Every RoPE claims Hugging Face's rounding points (angle_f32, and
// cos_sin_storage where HF casts cos and sin to the model dtype; Llama 4
// rotates in complex f32 and rounds only the result).
struct ModelPreset {
  const char* name;
  // A presets() name applied first, or "" for the fields below.
  const char* formulation;
  Variant variant;
  Normalization norm;  // formulation "" and kQKNorm only
  double eps;          // likewise
  // Fixed logit scale when formulation is "" (kQKNorm): > 0 that value,
  // 0 1/sqrt(head_dim).
  double scale;
  // RoPE: rotary_dim = head_dim * rotary_fraction (0: none).
  double rotary_fraction;
  RopePairing pairing;
  RopeOrder order;
  double theta;
  bool cos_sin_storage;
  // Sliding window in keys counting the query's own (Hugging Face's mask
  // keeps key j iff i - j < window and j <= i): FlashAttention's
  // (window - 1, 0); 0: none.
  int64_t window;
  double softcap;  // 0: none
  bool sinks;      // one learned logit per query head
};
const std::vector<ModelPreset>& model_presets();
// nullptr if no model has that name.
const ModelPreset* find_model(std::string_view name);
// Sets p's formulation (as apply_preset), variant, RoPE (rotary_dim from
// p->head_dim: set the shape first), softcap, sliding window (the mask's
// window_left/right: the model's, or none; causal and padding are left to
// the caller: a window (w, 0) is causal by itself) and sinks: for a model
// with sinks an empty p->sinks becomes `heads` zeros (the values are
// learned: the caller fills them), one given is kept; without, cleared.
// g and kv_heads are left alone. Throws Error naming "model" and listing
// the known names on an unknown one.
void apply_model(std::string_view name, AttentionProblem* p);

}  // namespace qknorm

#endif  // QKNORM_FORMULATION_H_
