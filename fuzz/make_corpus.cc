// Writes the hand-made seed corpus of the fuzz targets (fuzz/corpus/<target>/)
// in the byte format of fuzz_common.h, so the seeds are reproducible and
// documented here rather than opaque binary files.
//
//   fuzz_make_corpus OUT_DIR          writes OUT_DIR/<target>/<seed> (parked
//                                     seeds: OUT_DIR/../findings/<target>/)
//   fuzz_make_corpus --check DIR      exits 1 unless every seed exists in DIR
//                                     byte for byte (files not generated
//                                     here, e.g. crash reproducers, are kept)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"
#include "fuzz/seed_files.h"
#include "qknorm/formulation.h"
#include "validation/rng.h"

namespace qknorm::fuzz {
namespace {

using DL = std::numeric_limits<double>;
using FL = std::numeric_limits<float>;

struct Seed {
  std::string target, name;
  std::vector<uint8_t> bytes;
};

// An element generator: (tensor 0..3 = q, k, v, dO; flat index) -> value.
using Values = std::function<double(int, int64_t)>;

// A few reproducible values on a grid of 1/4 (2-byte small scalars).
double grid(int tensor, int64_t i) {
  validation::Rng rng(static_cast<uint64_t>(tensor * 1000003 + i));
  return std::round(rng.normal() * 8) / 4;
}

struct Attn {
  int64_t B = 1, H = 1, Nq = 4, Nk = 4, D = 4;
  bool sdpa = false, causal = false, threads = false, fwd_only = false;
  bool extra_len = false;
  int row_pad = 0;
  std::vector<int8_t> key_lengths;  // non-empty: padding mask
  double g = 12.3197;
  bool default_eps = true;
  double eps = 0;
  Values values = grid;

  // The mode byte (0 differential, 4 formulation) through eps.
  void header(ByteWriter& w, uint8_t mode) const {
    w.u8(mode);
    w.u8(static_cast<uint8_t>(B - 1)).u8(static_cast<uint8_t>(H - 1));
    w.u8(static_cast<uint8_t>(Nq - 1)).u8(static_cast<uint8_t>(Nk - 1));
    w.u8(static_cast<uint8_t>(D - 1));
    uint8_t flags = (sdpa ? 1 : 0) | (causal ? 2 : 0) |
                    (key_lengths.empty() ? 0 : 4) | (row_pad << 3) |
                    (threads ? 0x20 : 0) | (extra_len ? 0x40 : 0) |
                    (fwd_only ? 0x80 : 0);
    w.u8(flags);
    for (int8_t l : key_lengths) w.u8(static_cast<uint8_t>(l));
    w.scalar(g);
    if (default_eps)
      w.scalar_default();
    else
      w.scalar(eps);
  }

  std::vector<uint8_t> encode() const {
    ByteWriter w;
    header(w, 0);
    const int64_t nq = B * H * Nq * D, nk = B * H * Nk * D;
    for (int t = 0; t < 4; ++t)
      for (int64_t i = 0; i < (t == 0 || t == 3 ? nq : nk); ++i)
        w.scalar(values(t, i));
    return w.bytes();
  }
};

// FORMULATION mode (issue 16; attention_fuzzer.cc, decode_formulation):
// mode byte 4, the differential header with H up to 4, the formulation
// block (a preset index or a free combination, kv_heads as an index into
// the divisors of H or a raw signed value), then q, k, v (kv_heads heads),
// dO, and the learned parameters (values tensors 4..7: q_weight, k_weight,
// q_bias, k_bias; default: 1 + grid / 4 (grid / 4 for 1 + w), grid / 8).
double form_grid(int t, int64_t i) {
  if (t == 4 || t == 5) return 1 + grid(t, i) / 4;
  if (t >= 6) return grid(t, i) / 8;
  return grid(t, i);
}

// form_grid with the elements of tensor t where `where` holds set to x.
Values form_set(int t, std::function<bool(int64_t)> where, double x) {
  return [=](int tt, int64_t i) {
    return tt == t && where(i) ? x : form_grid(tt, i);
  };
}

struct AttnForm : Attn {
  AttnForm() {
    H = 4, D = 8;
    values = form_grid;
  }
  // Preset: index (< 0x80), keep_eps (bit 6), scale override (bit 5).
  // Free: sel >= 0x80 and the flag byte `free_flags`.
  uint8_t sel = 0, free_flags = 0;
  double scale = 0;  // written when bit 5 (preset) / bit 2 (free) says so
  uint8_t kv = 0;    // < 0x80: index into the divisors of H
  // VARIANT mode (issue 34; decode_variants): mode byte 0x44 and the
  // variant block after kv: bit 0 a softcap (the scalar `softcap`), bit 1 a
  // window (int8 window_left, window_right), bit 2 the causal mask with it,
  // bit 4 attention sinks (`sinks`, one scalar per query head; bit 3,
  // RoPE, is not written here).
  bool variants = false;
  uint8_t variant_bits = 0;
  double softcap = 0;
  int8_t window_left = -1, window_right = -1;
  std::vector<double> sinks;

  // The problem the fuzzer decodes (for the element counts).
  AttentionProblem problem() const {
    AttentionProblem p;
    p.batch = B, p.heads = H, p.q_len = Nq, p.kv_len = Nk, p.head_dim = D;
    p.variant = sdpa ? Variant::kSDPA : Variant::kQKNorm;
    if (sel < 0x80) {
      apply_preset(presets()[sel % presets().size()].name, &p);
      p.variant = sdpa ? Variant::kSDPA : Variant::kQKNorm;
    } else {
      p.norm.kind = static_cast<NormKind>(sel & 3);
      p.norm.axis = (sel & 4) ? NormAxis::kAllHeads : NormAxis::kHead;
      const int w = (sel >> 3) & 3;
      p.norm.weight = w == 1   ? ParamShape::kDim
                      : w == 2 ? ParamShape::kHeadDim
                               : ParamShape::kNone;
      p.norm.one_plus_weight = (sel & 0x20) != 0;
      p.norm.bias = (sel & 0x40) != 0;
      p.norm.shared_qk_weight = (free_flags & 1) != 0;
    }
    if (kv & 0x80) {
      p.kv_heads = static_cast<int8_t>(static_cast<uint8_t>(kv << 1)) / 2;
    } else {
      std::vector<int64_t> div;
      for (int64_t d = 1; d <= H; ++d)
        if (H % d == 0) div.push_back(d);
      p.kv_heads = div[kv % div.size()];
    }
    return p;
  }

  std::vector<uint8_t> encode() const {
    ByteWriter w;
    header(w, variants ? 0x44 : 4);
    w.u8(sel);
    if (sel < 0x80 && (sel & 0x20)) w.scalar(scale);
    if (sel >= 0x80) {
      w.u8(free_flags);
      if (free_flags & 4) w.scalar(scale);
    }
    w.u8(kv);
    if (variants) {
      w.u8(variant_bits);
      if (variant_bits & 1) w.scalar(softcap);
      if (variant_bits & 2)
        w.u8(static_cast<uint8_t>(window_left))
            .u8(static_cast<uint8_t>(window_right));
      if (variant_bits & 16)
        for (double x : sinks) w.scalar(x);
    }
    const AttentionProblem p = problem();
    const int64_t nq = B * H * Nq * D, nk = B * kv_heads_of(p) * Nk * D;
    for (int t = 0; t < 4; ++t)
      for (int64_t i = 0; i < (t == 0 || t == 3 ? nq : nk); ++i)
        w.scalar(values(t, i));
    if (p.variant == Variant::kQKNorm) {
      const bool op = p.norm.one_plus_weight;
      for (int side = 0; side < 2; ++side)
        for (int64_t i = 0; i < param_size(p, side); ++i)
          w.scalar(values(4 + side, i) - (op ? 1 : 0));
      for (int side = 0; side < 2 && p.norm.bias; ++side)
        for (int64_t i = 0; i < param_size(p, side); ++i)
          w.scalar(values(6 + side, i));
    }
    return w.bytes();
  }
};

// Layout mode: raw dims, strides as (kind, payload) byte strings.
struct AttnLayout {
  int64_t B = 1, H = 1, Nq = 3, Nk = 3, D = 4;
  uint8_t flags = 0;
  double g = 12.3197;
  // Per tensor q, k, v, o: stride bytes (row, head, batch) and size delta.
  std::vector<uint8_t> strides[4];
  int8_t delta[4] = {0, 0, 0, 0};
  Values values = grid;

  std::vector<uint8_t> encode() const {
    ByteWriter w;
    w.u8(1);
    w.dim(B).dim(H).dim(Nq).dim(Nk).dim(D);
    w.u8(flags);
    w.scalar(g).scalar_default();
    for (int t = 0; t < 4; ++t) {
      const std::vector<uint8_t>& s =
          strides[t].empty() ? std::vector<uint8_t>{0, 0, 0} : strides[t];
      for (uint8_t b : s) w.u8(b);
      w.u8(static_cast<uint8_t>(delta[t]));
    }
    // Only small shapes carry values (the dims of other seeds reach
    // INT64_MAX: their products are formed only once the shape is known to
    // be small; UBSan finding of the Clang sanitizer build).
    if (B <= 2 && H <= 2 && Nq <= 16 && Nk <= 16 && D <= 16 && B > 0 && H > 0 &&
        Nq > 0 && Nk > 0 && D > 0) {
      const int64_t nq = B * H * Nq * D, nk = B * H * Nk * D;
      for (int t = 0; t < 3; ++t)
        for (int64_t i = 0; i < (t == 0 ? nq : nk); ++i) w.scalar(values(t, i));
    }
    return w.bytes();
  }
};

struct Scale {
  int64_t rows = 4, dim = 8;
  double g = 2.8284271247461903;  // sqrt(8)
  bool default_eps = true;
  double eps = 0;
  Values values = grid;  // tensor 0 = x, 1 = dy

  std::vector<uint8_t> encode() const {
    ByteWriter w;
    w.u8(0);
    w.u8(static_cast<uint8_t>(rows - 1)).u8(static_cast<uint8_t>(dim - 1));
    w.scalar(g);
    if (default_eps)
      w.scalar_default();
    else
      w.scalar(eps);
    for (int t = 0; t < 2; ++t)
      for (int64_t i = 0; i < rows * dim; ++i) w.scalar(values(t, i));
    return w.bytes();
  }
};

// Values of `base` with tensor `t`'s elements replaced by f(i) when `when`.
Values with(int t, std::function<double(int64_t)> f, Values base = grid) {
  return [=](int tt, int64_t i) { return tt == t ? f(i) : base(tt, i); };
}

// VARIANT-mode seeds (issue 34): the logit softcap and the sliding window on
// presets and sdpa, a decode row, a window past the padding (rows that see
// no key at a block's end), and invalid ones.
void variant_seeds(
    const std::function<void(const std::string&, const std::vector<uint8_t>&)>&
        add) {
  auto seed = [](uint8_t sel, uint8_t bits) {
    AttnForm f;
    f.variants = true;
    f.sel = sel;
    f.kv = 1;  // H = 4: kv_heads = 2
    f.variant_bits = bits;
    return f;
  };
  AttnForm f = seed(0, 1);  // the paper's, capped at 5, causal
  f.softcap = 5, f.causal = true, f.kv = 2;
  add("variant_paper_softcap5_causal", f.encode());
  f = seed(1, 2 | 4);  // qwen3 (GQA), causal window (3, 0)
  f.window_left = 3, f.window_right = 0, f.Nq = 9, f.Nk = 12;
  add("variant_qwen3_causal_window_3_0", f.encode());
  f = seed(2, 1 | 2);  // gemma3, cap 50 and window (2, 1) over padding
  f.softcap = 50, f.window_left = 2, f.window_right = 1, f.B = 2;
  f.key_lengths = {3, 4};
  add("variant_gemma3_softcap50_window_2_1_padding", f.encode());
  f = seed(0, 2);  // sdpa, look-ahead only: window (-1, 1)
  f.sdpa = true, f.kv = 0, f.window_left = -1, f.window_right = 1;
  add("variant_sdpa_window_right_only", f.encode());
  f = seed(1, 1 | 2 | 4);  // decode: 1 query, 16 keys, window (7, 0), cap 2
  f.Nq = 1, f.Nk = 16, f.softcap = 2, f.window_left = 7, f.window_right = 0;
  add("variant_qwen3_decode_window_7_0_softcap2", f.encode());
  // Window (0, 0) past a padding of 2 keys: the rows at keys >= 2 see none.
  f = seed(0, 2);
  f.kv = 2, f.Nq = 6, f.Nk = 6, f.window_left = 0, f.window_right = 0;
  f.key_lengths = {2};
  add("variant_paper_window_past_padding", f.encode());
  // A cap valid in f64 only (outside f32's normal range).
  f = seed(0, 1);
  f.kv = 2, f.softcap = 1e39;
  add("variant_paper_softcap_beyond_f32", f.encode());
  // Sinks (gpt-oss): sdpa with GQA, causal, a window (3, 0) and one sink
  // per head; the paper's with padding (the second batch's rows fully
  // masked: the sink alone); one sink dominating (+30).
  f = seed(0, 2 | 4 | 16);
  f.sdpa = true, f.Nq = 7, f.Nk = 7, f.window_left = 3, f.window_right = 0;
  f.sinks = {-0.5, 0.25, 1.5, 0};
  add("variant_sdpa_causal_window_3_0_sinks", f.encode());
  f = seed(0, 16);
  f.kv = 2, f.B = 2, f.key_lengths = {3, 0}, f.sinks = {2, -1, 0.5, 30};
  add("variant_paper_sinks_masked_rows", f.encode());
  f = seed(0, 16);
  f.kv = 2, f.sinks = {0.5, 1e39, 0, 0};  // beyond f32's range
  add("invalid_variant_sink_beyond_f32", f.encode());
  f = seed(0, 2);
  f.kv = 2, f.window_left = -2, f.window_right = 0;
  add("invalid_variant_window_left_minus_2", f.encode());
  f = seed(0, 1);
  f.kv = 2, f.softcap = -5;
  add("invalid_variant_softcap_negative", f.encode());
}

// FORMULATION-mode seeds (issue 16): every preset (with GQA where the
// model ships it), free combinations, and invalid ones.
void formulation_seeds(
    const std::function<void(const std::string&, const std::vector<uint8_t>&)>&
        add) {
  const auto& table = presets();
  for (size_t i = 0; i < table.size(); ++i) {
    AttnForm f;
    f.sel = static_cast<uint8_t>(i);
    // H = 4: kv index 1 is kv_heads = 2 (divisors 1, 2, 4); 2 is 4 = H.
    f.kv = table[i].gqa ? 1 : 2;
    f.causal = i % 2 == 1;
    add(std::string("form_") + table[i].name + (table[i].gqa ? "_gqa" : ""),
        f.encode());
  }
  AttnForm f;
  f.sel = 1, f.kv = 0, f.H = 2, f.D = 16, f.Nq = 3, f.Nk = 5;
  add("form_qwen3_mqa", f.encode());  // kv_heads = 1
  f = AttnForm{};
  f.sel = 2 | 0x40 | 0x20, f.default_eps = false, f.eps = 1e-3, f.scale = 0.5;
  f.kv = 0;
  add("form_gemma3_eps_scale_override", f.encode());
  // Free: layer norm across heads, [H, D] weight as 1 + w, bias, fixed
  // scale, GQA.
  f = AttnForm{};
  f.sel = 0x80 | 2 | 4 | (2 << 3) | 0x20 | 0x40;
  f.free_flags = 4, f.scale = 0.25, f.kv = 1, f.threads = true;
  add("form_free_layer_allheads_1pw_bias_fixed", f.encode());
  // Free: rms per head, [D] weight, zero q and k rows, tiny eps.
  f = AttnForm{};
  f.sel = 0x80 | 1 | (1 << 3), f.kv = 1;
  f.default_eps = false, f.eps = 1e-30;
  f.values = [](int t, int64_t i) {
    return t < 2 && (i / 8) % 3 == 1 ? 0.0 : form_grid(t, i);
  };
  add("form_free_rms_zero_rows", f.encode());
  // Free: nGPT's shared weight [H, D], l2, learned g, a zero q row.
  f = AttnForm{};
  f.sel = 0x80 | 0 | (2 << 3), f.free_flags = 1, f.H = 2, f.kv = 1;
  f.values = form_set(
      0, [](int64_t i) { return i < 8; }, 0.0);
  add("form_free_ngpt_shared_zero_row", f.encode());
  // Free: no normalization, per head, fixed scale, MQA, padding mask.
  f = AttnForm{};
  f.sel = 0x80 | 3, f.free_flags = 4, f.scale = 0.125, f.kv = 0, f.B = 2;
  f.key_lengths = {2, 4};
  add("form_free_none_fixed_mqa_padding", f.encode());
  // Free: layer over all heads of a constant row (x_hat = 0).
  f = AttnForm{};
  f.sel = 0x80 | 2 | 4 | (2 << 3), f.kv = 2, f.H = 2, f.D = 4;
  f.values = [](int t, int64_t i) {
    return t < 2 && i < 8 ? 1.5 : form_grid(t, i);
  };
  add("form_free_layer_allheads_constant_row", f.encode());
  // sdpa with GQA (the normalization is ignored).
  f = AttnForm{};
  f.sdpa = true, f.sel = 0, f.kv = 0;
  add("form_sdpa_mqa", f.encode());
  // Invalid: bias without weight; shared weight with GQA; kv_heads 3 of 4;
  // negative kv_heads; infinite fixed scale; an infinite weight.
  f = AttnForm{};
  f.sel = 0x80 | 1 | 0x40, f.kv = 2;
  add("invalid_form_bias_without_weight", f.encode());
  f.sel = 0x80 | (2 << 3), f.free_flags = 1, f.kv = 1;
  add("invalid_form_shared_weight_gqa", f.encode());
  f = AttnForm{};
  f.sel = 1, f.kv = 0x80 | 3;
  add("invalid_form_kv_heads_not_divisor", f.encode());
  f.kv = 0xff;  // -1
  add("invalid_form_kv_heads_negative", f.encode());
  f = AttnForm{};
  f.sel = 0x20, f.scale = DL::infinity(), f.kv = 2;
  add("invalid_form_scale_inf", f.encode());
  f = AttnForm{};
  f.sel = 4, f.kv = 2, f.H = 2;
  f.values = form_set(
      4, [](int64_t i) { return i == 3; }, DL::infinity());
  add("invalid_form_weight_inf", f.encode());
  // A weight beyond f16's range: valid in f64/f32/bf16, rejected in f16.
  f.values = form_set(
      4, [](int64_t i) { return i == 3; }, 1e5);
  add("form_timm_weight_beyond_f16", f.encode());
}

std::vector<Seed> attention_seeds() {
  std::vector<Seed> s;
  auto add = [&](const std::string& n, const std::vector<uint8_t>& b) {
    s.push_back({"attention_fuzzer", n, b});
  };
  Attn a;
  a.D = 1, a.Nq = 3, a.Nk = 3;
  add("d1", a.encode());
  a = Attn{};
  a.Nk = 1, a.Nq = 5, a.D = 8;
  add("kv_len1", a.encode());
  a = Attn{};
  a.Nq = a.Nk = 1, a.D = 1;
  add("minimal", a.encode());
  a = Attn{};
  a.values = [](int t, int64_t i) { return t < 2 ? 0.0 : grid(t, i); };
  add("zero_qk_rows", a.encode());
  a.values = [](int, int64_t) { return 0.0; };
  add("all_zero", a.encode());
  a = Attn{};
  a.D = 3;  // q rows 0 and 2 zero, k row 1 zero
  a.values = [](int t, int64_t i) {
    const int64_t row = i / 3;
    if ((t == 0 && row % 2 == 0) || (t == 1 && row == 1)) return 0.0;
    return grid(t, i);
  };
  add("some_zero_rows", a.encode());
  a = Attn{};
  a.causal = true, a.Nq = 5, a.Nk = 2;
  add("causal_fully_masked_rows", a.encode());
  a = Attn{};
  a.causal = true, a.Nq = a.Nk = 6, a.D = 5, a.threads = true;
  add("causal_square_threads", a.encode());
  a = Attn{};
  a.B = 2, a.key_lengths = {0, 3}, a.Nk = 5;
  add("padding_fully_masked_batch", a.encode());
  a.causal = true, a.key_lengths = {2, 5}, a.Nq = 3, a.H = 2;
  add("padding_and_causal", a.encode());
  a = Attn{};
  a.values = with(
      0, [](int64_t i) { return i % 3 ? DL::max() : -DL::max(); },
      with(1, [](int64_t) { return DL::max(); }));
  add("huge_f64_qk", a.encode());
  a.values = [](int, int64_t i) { return i % 3 ? FL::max() : -FL::max(); };
  add("huge_f32_all", a.encode());
  a.values = with(
      0, [](int64_t) { return 3e38; },
      with(1, [](int64_t i) { return i % 2 ? 2e38 : -1e38; }));
  add("near_f32_max_qk", a.encode());
  a = Attn{};
  a.values = [](int t, int64_t i) {
    return t < 2 ? DL::denorm_min() * static_cast<double>(i % 5 + 1)
                 : grid(t, i);
  };
  add("subnormal_f64_qk", a.encode());
  a.values = [](int t, int64_t i) {
    return t < 2 ? FL::denorm_min() * static_cast<double>(i % 7 + 1)
                 : grid(t, i);
  };
  add("subnormal_f32_qk", a.encode());
  a.values = [](int t, int64_t i) {
    return t < 2 ? 0x1p-24 * static_cast<double>(i % 3 + 1) : grid(t, i);
  };
  add("subnormal_f16_qk", a.encode());
  a = Attn{};
  a.values = with(0, [](int64_t i) { return 1e-13 * (i % 3 + 1); });
  add("q_below_eps", a.encode());
  a = Attn{};
  a.g = 0;
  add("g_zero", a.encode());
  a.g = -3;
  add("g_negative", a.encode());
  a.g = -24.85;
  a.Nk = 9;
  add("g_negative_large", a.encode());
  a.g = 30;
  add("g_30", a.encode());
  a.g = 1e4;
  add("g_1e4_saturating", a.encode());
  a.g = 3e38;
  add("g_near_f32_max", a.encode());
  // One key's logit 92 below the other's (g = 1e4, cosines 1 and 0.9908):
  // P ~ 1e-40, below f32's normal range, where blas:f32's exp flushes to 0;
  // the v rows make O_0 = P itself (CI finding, issue 15: O = -2e-40 returned
  // as 0 FAILed against a bound of ulp(0) per probability).
  a = Attn{};
  a.Nq = 1;
  a.Nk = 2;
  a.D = 2;
  a.g = 1e4;
  a.values = [](int t, int64_t i) {
    static const double q[2] = {1, 0}, k[4] = {1, 0, 0.9908, 0.13533},
                        v[4] = {0, 1, 1, 1}, dO[2] = {1, -1};
    return t == 0 ? q[i] : t == 1 ? k[i] : t == 2 ? v[i] : dO[i];
  };
  add("p_below_f32_normal", a.encode());
  a = Attn{};
  a.values = [](int t, int64_t i) { return t == 2 ? 7e4 : grid(t, i); };
  add("v_beyond_f16_max", a.encode());
  a = Attn{};
  a.values = [](int t, int64_t i) { return t == 2 ? 6e4 : grid(t, i); };
  a.Nk = 8;
  add("v_near_f16_max", a.encode());
  a = Attn{};
  a.sdpa = true;
  add("sdpa", a.encode());
  a.sdpa = true, a.causal = true, a.Nq = 3, a.Nk = 7, a.D = 16;
  add("sdpa_causal_rect", a.encode());
  a = Attn{};
  a.sdpa = true;
  a.values = [](int t, int64_t i) { return t < 2 ? 1e20 * grid(t, i) : 1.0; };
  add("sdpa_huge_logits", a.encode());
  a = Attn{};
  a.B = 2, a.H = 2, a.Nq = 7, a.Nk = 9, a.D = 5, a.row_pad = 3;
  a.threads = true, a.key_lengths = {9, 4};
  add("row_pad_threads_b2h2", a.encode());
  a = Attn{};
  a.Nq = a.Nk = 16, a.D = 16, a.fwd_only = true;
  add("max_shape_forward_only", a.encode());
  a = Attn{};
  a.default_eps = false, a.eps = 1e-300;
  a.values = with(0, [](int64_t i) { return i < 4 ? 0.0 : grid(0, i); });
  add("eps_tiny_zero_row", a.encode());
  a.eps = 1e3;  // every row in the clamp region
  add("eps_large", a.encode());
  // Invalid inputs: each must raise qknorm::Error.
  a = Attn{};
  a.values = with(0, [](int64_t i) { return i == 5 ? DL::quiet_NaN() : 1.0; });
  add("invalid_nan_q", a.encode());
  a.values = with(2, [](int64_t i) { return i == 0 ? -DL::infinity() : 1.0; });
  add("invalid_inf_v", a.encode());
  a.values = with(3, [](int64_t i) { return i == 15 ? DL::infinity() : 1.0; });
  add("invalid_inf_do", a.encode());
  a = Attn{};
  a.default_eps = false, a.eps = 0;
  add("invalid_eps_zero", a.encode());
  a.eps = -1e-12;
  add("invalid_eps_negative", a.encode());
  a.eps = DL::quiet_NaN();
  add("invalid_eps_nan", a.encode());
  a = Attn{};
  a.g = DL::infinity();
  add("invalid_g_inf", a.encode());
  a.g = DL::quiet_NaN();
  add("invalid_g_nan", a.encode());
  a = Attn{};
  a.key_lengths = {5};
  add("invalid_key_length_too_long", a.encode());
  a.key_lengths = {-1};
  add("invalid_key_length_negative", a.encode());
  a.key_lengths = {2, 2}, a.extra_len = true;
  add("invalid_key_length_count", a.encode());
  a = Attn{};
  a.sdpa = true, a.default_eps = false, a.eps = 0, a.g = DL::quiet_NaN();
  add("sdpa_ignores_g_eps", a.encode());

  // LAYOUT mode.
  AttnLayout l;
  add("layout_dense", l.encode());
  l.strides[0] = {1, 3, 0, 0};     // q row stride D + 3
  l.strides[1] = {0, 2, 0};        // k heads alias (H = 1: harmless)
  l.strides[2] = {1, 1, 1, 5, 0};  // v padded rows and heads
  l.strides[3] = {1, 2, 1, 7, 1, 1};
  l.H = 2, l.B = 2;
  add("layout_strided_b2h2", l.encode());
  l.strides[0] = {0, 2, 2};  // q: every head and batch reads one block
  add("layout_aliased_inputs", l.encode());
  l = AttnLayout{};
  l.delta[1] = -1;
  add("invalid_layout_size_short", l.encode());
  l = AttnLayout{};
  l.strides[3] = {1, 0, 0, 0};
  l.strides[0] = {2, 0, 0};  // row stride 0 < D
  add("invalid_layout_row_stride_zero", l.encode());
  l = AttnLayout{};
  l.strides[1] = {3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0};
  add("invalid_layout_huge_row_stride", l.encode());
  // k's last element at exactly INT64_MAX (D + (Nk - 1) row stride, no
  // overflow): the size check once added 3 to it (UBSan, CI of 183cdfc).
  l = AttnLayout{};
  l.Nk = 2;
  l.strides[1] = {3, 0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0};
  add("invalid_layout_need_int64_max", l.encode());
  l = AttnLayout{};
  l.D = 0;
  add("invalid_dim_zero", l.encode());
  l = AttnLayout{};
  l.Nq = -3;
  add("invalid_dim_negative", l.encode());
  l = AttnLayout{};
  l.B = std::numeric_limits<int64_t>::max(), l.Nk = 2;
  add("invalid_count_overflow", l.encode());
  l = AttnLayout{};
  l.B = int64_t{1} << 10, l.H = int64_t{1} << 10, l.Nq = int64_t{1} << 10;
  add("valid_shape_huge_buffer_short", l.encode());
  formulation_seeds(add);
  variant_seeds(add);
  return s;
}

std::vector<Seed> scalenorm_seeds() {
  std::vector<Seed> s;
  auto add = [&](const std::string& n, const std::vector<uint8_t>& b) {
    s.push_back({"scalenorm_fuzzer", n, b});
  };
  Scale c;
  add("basic", c.encode());
  c.dim = 1, c.g = 1;
  add("d1", c.encode());
  c = Scale{};
  c.values = with(0, [](int64_t i) { return i < 8 ? 0.0 : grid(0, i); });
  add("zero_row", c.encode());
  c.values = [](int, int64_t) { return 0.0; };
  add("all_zero", c.encode());
  c = Scale{};
  c.values = with(0, [](int64_t i) { return i % 2 ? DL::max() : -DL::max(); });
  add("huge_f64", c.encode());
  c.values = with(0, [](int64_t i) { return i % 2 ? FL::max() : 1.0; });
  add("huge_f32", c.encode());
  c.values = with(0, [](int64_t) { return 2e19; });
  add("sum_of_squares_overflows_f32", c.encode());
  c.values = with(0, [](int64_t i) { return DL::denorm_min() * (i % 4); });
  add("subnormal_f64", c.encode());
  c.values = with(0, [](int64_t i) { return FL::denorm_min() * (i % 4 + 1); });
  add("subnormal_f32", c.encode());
  c.values = with(0, [](int64_t i) { return 1e-6 * grid(0, i); });
  add("below_eps", c.encode());
  // g subnormal in f32 (2.2e-41 holds ~14 bits): y and dx are linear in g,
  // and with x below eps and dy ~ 1e5 the rounding of g reaches dx at 3e-5
  // relatively (the CI's fixed-seed run on another CPU, stop 39).
  c.g = 2.2163599186429212e-41;
  c.values = with(
      1, [](int64_t i) { return 1e5 * grid(1, i); },
      with(0, [](int64_t i) { return 1e-6 * grid(0, i); }));
  add("subnormal_g_f32_large_dy", c.encode());
  c = Scale{};
  c = Scale{};
  c.g = 0;
  add("g_zero", c.encode());
  c.g = -3;
  add("g_negative", c.encode());
  c.g = 3e38;
  add("g_near_f32_max", c.encode());
  c.g = 1e300;
  add("g_huge_f64", c.encode());
  c = Scale{};
  c.rows = 16, c.dim = 32;
  add("max_shape", c.encode());
  c = Scale{};
  c.values = with(0, [](int64_t i) { return i == 3 ? DL::quiet_NaN() : 1.0; });
  add("invalid_nan_x", c.encode());
  c.values = with(1, [](int64_t i) { return i == 0 ? DL::infinity() : 1.0; });
  add("invalid_inf_dy", c.encode());
  c.values = with(0, [](int64_t) { return 1e5; });
  add("x_beyond_f16_max", c.encode());
  c = Scale{};
  c.default_eps = false, c.eps = 0;
  add("invalid_eps_zero", c.encode());
  c.eps = 1e-300;
  c.values = with(0, [](int64_t i) { return i < 8 ? 0.0 : 1.0; });
  add("eps_tiny_zero_row", c.encode());
  c = Scale{};
  c.g = DL::infinity();
  add("invalid_g_inf", c.encode());
  // LAYOUT mode: rows, dim as dims; per tensor (x, y, dy, dx) stride bytes
  // and a size delta; then values.
  auto layout = [](int64_t rows, int64_t dim,
                   std::vector<std::vector<uint8_t>> specs, bool vals) {
    ByteWriter w;
    w.u8(1).dim(rows).dim(dim).scalar(2.0).scalar_default();
    for (auto& sp : specs)
      for (uint8_t b : sp) w.u8(b);
    if (vals)
      for (int t = 0; t < 2; ++t)
        for (int64_t i = 0; i < rows * dim; ++i) w.scalar(grid(t, i));
    return w.bytes();
  };
  add("layout_dense", layout(3, 5, {{0, 0}, {0, 0}, {0, 0}, {0, 0}}, true));
  add("layout_padded",
      layout(3, 5, {{1, 3, 0}, {1, 1, 0}, {2, 0}, {1, 7, 0}}, true));
  add("layout_aliased_x_rows",
      layout(3, 5, {{2, 0}, {0, 0}, {0, 0}, {0, 0}}, true));
  add("invalid_layout_short",
      layout(3, 5, {{0, 0}, {0, 0xff}, {0, 0}, {0, 0}}, false));
  add("invalid_rows_zero",
      layout(0, 5, {{0, 0}, {0, 0}, {0, 0}, {0, 0}}, false));
  add("invalid_overflow", layout(std::numeric_limits<int64_t>::max() / 2, 3,
                                 {{0, 0}, {0, 0}, {0, 0}, {0, 0}}, false));
  // x's last element at exactly INT64_MAX (dim + row stride, no overflow):
  // the size check once added 3 to it (UBSan, the CI fuzz run of 183cdfc).
  add("invalid_layout_need_int64_max",
      layout(2, 5,
             {{3, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0},
              {0, 0},
              {0, 0},
              {0, 0}},
             false));
  return s;
}

// Seeds that fail on an entry whose owner has not fixed it yet: written to
// fuzz/findings/<target>/ (not replayed by ctest) instead of the corpus.
// Move a seed back by deleting its line here once its entry passes.
bool parked(const Seed& s) {
  // Empty: every seed passes on every entry (the last four, g_near_f32_max,
  // huge_f64_qk, scalenorm huge_f64 and sdpa_huge_logits, were fixed with
  // the crash-blas-* / crash-simd-* reproducers, fuzz/README.md).
  // "<target>/<seed>" entries.
  static const std::vector<std::string> kParked = {};
  return std::find(kParked.begin(), kParked.end(), s.target + "/" + s.name) !=
         kParked.end();
}

}  // namespace
}  // namespace qknorm::fuzz

int main(int argc, char** argv) {
  using namespace qknorm::fuzz;
  const auto cmd = parse_seed_command(argc, argv);
  if (!cmd) return 2;
  const bool check = cmd->check;
  std::filesystem::path root = cmd->dir.lexically_normal();
  if (root.filename().empty()) root = root.parent_path();  // "corpus/"
  std::vector<Seed> seeds = attention_seeds();
  for (auto& s : scalenorm_seeds()) seeds.push_back(s);
  int bad = 0;
  for (const Seed& s : seeds) {
    const auto path = (parked(s) ? root.parent_path() / "findings" : root) /
                      s.target / s.name;
    const std::string_view bytes(reinterpret_cast<const char*>(s.bytes.data()),
                                 s.bytes.size());
    if (!write_or_check_seed(path, bytes, check)) ++bad;
  }
  std::fprintf(stderr, "%zu seeds %s%s\n", seeds.size(),
               check ? "checked in " : "written to ", root.c_str());
  if (bad)
    std::fprintf(stderr, "%d seed(s) out of date: rerun fuzz_make_corpus %s\n",
                 bad, root.c_str());
  return bad ? 1 : 0;
}
