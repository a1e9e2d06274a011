#!/usr/bin/python3
"""Model presets (issue 34) transcribed in torch f64: one attention layer of
each model of qknorm-check's --model (include/qknorm/formulation.h), written
from Hugging Face transformers' modeling code as the preset's comment cites
it (core/formulation.cc, model_presets()): the QK-norm, RoPE as HF computes
it (rotate_half pairs dims (e, e + r/2); Llama 4's complex product pairs
(2e, 2e+1)), the mask as masking_utils builds it (causal, and for a sliding
layer kv_idx > q_idx - sliding_window), the softcap and the sinks. Every
tensor is float64 and every angle exact (the dumps judge the formulation,
not HF's rounding). Each model's dump holds q, k, v, dO, its weights
(q_weight, k_weight) and sinks, and O, dQ, dK, dV, dq_weight, dk_weight,
d_sinks from autograd.

  /usr/bin/python3 python/model_dumps.py OUTDIR [CASE ...]

writes OUTDIR/CASE/*.npy (CASES: one per model, two for Gemma 2) and prints the compare command of each; the
unittest python/test_model_dumps.py judges them through qknorm_assert.
"""
import math
import os
import sys

import numpy as np
import torch

# case: (model, (B, H, Hk, Nq, Nk, D, input std)). The windowed models are
# judged past their window (Nk > window; the queries are the last Nq
# positions, as a chunk of prefill after a cache), the rest on a short
# prefill; Gemma 2 also on a short one with inputs of std 2 (logits of std
# ~1), where its softcap 50 shows against compare's bound (on the long one
# the bound's sqrt(Nk) growth hides it, and at std 4 its logits leave the
# first-order bound unresolved: bound inf).
CASES = {
    "qwen3": ("qwen3", (2, 4, 2, 12, 12, 16, 1.0)),
    "olmo2": ("olmo2", (2, 4, 2, 12, 12, 16, 1.0)),
    "gemma3-local": ("gemma3-local", (1, 2, 1, 8, 1040, 16, 1.0)),
    "gemma3-global": ("gemma3-global", (2, 4, 2, 12, 12, 16, 1.0)),
    "llama4": ("llama4", (2, 4, 2, 12, 12, 16, 1.0)),
    "qwen3-next": ("qwen3-next", (2, 4, 2, 12, 12, 16, 1.0)),
    "gpt-oss": ("gpt-oss", (1, 4, 2, 24, 160, 16, 1.0)),
    "gemma2": ("gemma2", (1, 2, 1, 8, 4112, 16, 2.0)),
    "gemma2-short": ("gemma2", (2, 4, 2, 12, 12, 16, 2.0)),
}
MODELS = tuple(dict.fromkeys(m for m, _ in CASES.values()))


def rms(x, eps):
    """x * rsqrt(mean(x^2) + eps) over the last dim (HF's RMSNorm core)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def inv_freq(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_half(x, pos, dim, theta):
    """HF's apply_rotary_pos_emb with a partial rotary_dim: the first `dim`
    dims rotated (x * cos + rotate_half(x) * sin, emb = cat(freqs, freqs)),
    the rest passed."""
    freqs = pos[:, None].double() * inv_freq(dim, theta)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    rot, rest = x[..., :dim], x[..., dim:]
    rot = rot * emb.cos() + rotate_half(rot) * emb.sin()
    return torch.cat((rot, rest), dim=-1)


def rope_interleaved(x, pos, theta):
    """Llama 4's apply_rotary_emb: adjacent pairs (2e, 2e + 1) as complex
    numbers times exp(i pos inv_freq_e), written in real arithmetic."""
    D = x.shape[-1]
    t = pos[:, None].double() * inv_freq(D, theta)[None, :]
    c, s = t.cos(), t.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def keep_mask(Nq, Nk, window):
    """masking_utils: causal_mask_function (kv_idx <= q_idx) and, for a
    sliding layer, sliding_window_overlay (kv_idx > q_idx - window); the
    queries sit at the last Nq positions."""
    qi = torch.arange(Nk - Nq, Nk)[:, None]
    kj = torch.arange(Nk)[None, :]
    keep = kj <= qi
    if window:
        keep = keep & (kj > qi - window)
    return keep


def attend(q, k, v, scale, keep, softcap=0.0, sinks=None):
    """eager_attention_forward: GQA by repeat_kv, logits * scaling, the
    softcap (Gemma 2: tanh(s / cap) * cap), the mask, then softmax; with
    sinks (gpt-oss) one column per head joins the softmax and is dropped."""
    H, Hk = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // Hk, dim=1)
    v = v.repeat_interleave(H // Hk, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is None:
        return torch.softmax(s, dim=-1) @ v
    col = sinks.reshape(1, H, 1, 1).expand(s.shape[0], H, s.shape[2], 1)
    comb = torch.cat([s, col], dim=-1)
    comb = comb - comb.max(dim=-1, keepdim=True).values
    return torch.softmax(comb, dim=-1)[..., :-1] @ v


def forward(model, q, k, v, qw, kw, sinks):
    """One attention layer of `model` on q [B, H, Nq, D], k, v [B, Hk, Nk,
    D] (the projections' outputs, heads split), weights qw, kw."""
    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    qpos, kpos = torch.arange(Nk - Nq, Nk), torch.arange(Nk)
    if model == "qwen3":  # Qwen3RMSNorm(head_dim), then RoPE theta 1e6
        q, k = rms(q, 1e-6) * qw, rms(k, 1e-6) * kw
        q, k = rope_half(q, qpos, D, 1e6), rope_half(k, kpos, D, 1e6)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model == "olmo2":  # Olmo2RMSNorm over the whole projection
        def whole(x, w, Hx):
            flat = x.transpose(1, 2).reshape(B, x.shape[2], Hx * D)
            y = rms(flat, 1e-6) * w
            return y.reshape(B, x.shape[2], Hx, D).transpose(1, 2)
        q, k = whole(q, qw, H), whole(k, kw, Hk)
        q, k = rope_half(q, qpos, D, 5e5), rope_half(k, kpos, D, 5e5)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model in ("gemma3-local", "gemma3-global"):  # Gemma3RMSNorm (1 + w)
        local = model == "gemma3-local"
        theta = 1e4 if local else 1e6
        q, k = rms(q, 1e-6) * (1 + qw), rms(k, 1e-6) * (1 + kw)
        q, k = rope_half(q, qpos, D, theta), rope_half(k, kpos, D, theta)
        return attend(q, k, v, 256 ** -0.5,
                      keep_mask(Nq, Nk, 1024 if local else 0))
    if model == "llama4":  # RoPE, then Llama4TextL2Norm(rms_norm_eps 1e-5)
        q, k = rope_interleaved(q, qpos, 5e5), rope_interleaved(k, kpos, 5e5)
        q, k = rms(q, 1e-5), rms(k, 1e-5)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model == "qwen3-next":  # Qwen3NextRMSNorm (1 + w), partial RoPE
        r = int(D * 0.25)
        q, k = rms(q, 1e-6) * (1 + qw), rms(k, 1e-6) * (1 + kw)
        q, k = rope_half(q, qpos, r, 1e7), rope_half(k, kpos, r, 1e7)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model == "gpt-oss":  # sdpa, RoPE 150000 (no YaRN), window, sinks
        q, k = rope_half(q, qpos, D, 1.5e5), rope_half(k, kpos, D, 1.5e5)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 128),
                      sinks=sinks)
    if model == "gemma2":  # no QK-norm, query_pre_attn_scalar, softcap
        q, k = rope_half(q, qpos, D, 1e4), rope_half(k, kpos, D, 1e4)
        return attend(q, k, v, 256 ** -0.5, keep_mask(Nq, Nk, 4096),
                      softcap=50.0)
    raise ValueError(f"unknown model {model!r} (known: {', '.join(MODELS)})")


def weight_shapes(model, H, Hk, D):
    """The q and k weights' shapes (None: the model has none)."""
    if model in ("qwen3", "gemma3-local", "gemma3-global", "qwen3-next"):
        return (D,), (D,)
    if model == "olmo2":
        return (H * D,), (Hk * D,)
    return None, None


def make_dump(case, seed=34):
    """CASES[case]'s inputs drawn with torch.manual_seed(seed), the layer's
    output and gradients: {name: float64 tensor} (inputs) and the same
    (outputs)."""
    model, (B, H, Hk, Nq, Nk, D, std) = CASES[case]
    torch.manual_seed(seed)
    leaf = lambda *s: (std * torch.randn(*s, dtype=torch.float64)
                       ).requires_grad_()
    q, k, v = leaf(B, H, Nq, D), leaf(B, Hk, Nk, D), leaf(B, Hk, Nk, D)
    d_o = torch.randn(B, H, Nq, D, dtype=torch.float64)
    qs, ks = weight_shapes(model, H, Hk, D)
    # Gemma's and Qwen3-Next's (1 + w) weights start at 0, the others at 1:
    # a trained layer's, drawn around its start.
    base = 0.0 if model in ("gemma3-local", "gemma3-global",
                            "qwen3-next") else 1.0
    qw = kw = sinks = None
    if qs is not None:
        qw = (base + 0.2 * torch.randn(*qs, dtype=torch.float64)
              ).requires_grad_()
        kw = (base + 0.2 * torch.randn(*ks, dtype=torch.float64)
              ).requires_grad_()
    if model == "gpt-oss":
        sinks = torch.tensor([0.5, -1.0, 2.0, 0.25], dtype=torch.float64,
                             requires_grad=True)
    out = forward(model, q, k, v, qw, kw, sinks)
    out.backward(d_o)
    ins = {"q": q, "k": k, "v": v, "dO": d_o}
    outs = {"O": out, "dQ": q.grad, "dK": k.grad, "dV": v.grad}
    if qw is not None:
        ins.update(q_weight=qw, k_weight=kw)
        outs.update(dq_weight=qw.grad, dk_weight=kw.grad)
    if sinks is not None:
        ins["sinks"] = sinks
        outs["d_sinks"] = sinks.grad
    detach = lambda d: {n: t.detach() for n, t in d.items()}
    return detach(ins), detach(outs)


def write(case, outdir):
    """OUTDIR/CASE/NAME.npy for every tensor; returns the compare command
    (qknorm-check on PATH)."""
    ins, outs = make_dump(case)
    model = CASES[case][0]
    d = os.path.join(outdir, case)
    os.makedirs(d, exist_ok=True)
    spec = lambda names: [f"{n}={os.path.join(d, n + '.npy')}" for n in names]
    for n, t in list(ins.items()) + list(outs.items()):
        np.save(os.path.join(d, n + ".npy"), t.numpy())
    return " ".join(["qknorm-check", "compare", "--kind", "attention",
                     "--model", model, "--mask", "causal", "--inputs"] +
                    spec(ins) + ["--outputs"] + spec(outs))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for case in sys.argv[2:] or CASES:
        print(write(case, sys.argv[1]))


if __name__ == "__main__":
    main()
