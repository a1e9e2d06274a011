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

  /usr/bin/python3 python/model_dumps.py OUTDIR [CASE|BUG ...]

writes OUTDIR/CASE/*.npy (CASES: one per model, two for Gemma 2 and Qwen3)
and prints the compare command of each; the unittest
python/test_model_dumps.py judges them through qknorm_assert. A BUG (a key
of BUGS: the field reports of issue 34, each transcribed into one case's
torch code) writes that case's dump as the buggy kernel computes it: its
compare command FAILs, naming the field and the element.
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
    "qwen3-decode": ("qwen3", (2, 4, 2, 1, 40, 16, 1.0)),
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

# The field reports of issue 34, each transcribed into one case's forward
# (forward(..., bug=NAME)): bug: (case, what the buggy kernel computes).
# test_model_dumps judges each buggy dump under its model's own preset.
BUGS = {
    # vLLM #51049: fused_qk_norm_rope (per-head RMS, partial NeoX RoPE)
    # wrong for every head but the first of a warp chunk: here the heads
    # after the first get the norm but not the rotation.
    "vllm-51049-rope-first-head-only":
        ("qwen3-next", "RoPE applied to head 0 of q and k only"),
    # tt-mlir #9042: a RoPE/QKV decode fusion skipped Qwen3's QK-norm.
    "tt-mlir-9042-norm-skipped":
        ("qwen3-decode", "q and k rotated but never normalized (decode)"),
    # transformers #39408: the window one key too wide ((w, w) read as
    # kv_idx >= q_idx - w, where the model keeps kv_idx > q_idx - w).
    "transformers-39408-window-off-by-one":
        ("gemma3-local", "the sliding window keeps one key too many"),
    # sglang #33915: the logit softcap dropped on one backend's path...
    "sglang-33915-softcap-dropped":
        ("gemma2-short", "the logit softcap 50 not applied"),
    # ...and window_left ignored on another.
    "sglang-33915-window-ignored":
        ("gemma2", "the sliding window ignored (causal only)"),
    # modular #6591: the attention sink dropped on the generic path...
    "modular-6591-sink-dropped":
        ("gpt-oss", "the attention sinks left out of the softmax"),
    # ...and indexed by the query row where seq_q > 1.
    "modular-6591-sink-index-from-row":
        ("gpt-oss", "row i of head h reads sinks[(h * Nq + i) % H]"),
    # TransformerEngine's default (qk_norm_before_rope=False) on a model
    # that normalizes before RoPE.
    "transformer-engine-norm-after-rope":
        ("qwen3", "Qwen3's QK-norm applied after RoPE instead of before"),
}


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


def keep_mask(Nq, Nk, window, wide_by=0):
    """masking_utils: causal_mask_function (kv_idx <= q_idx) and, for a
    sliding layer, sliding_window_overlay (kv_idx > q_idx - window); the
    queries sit at the last Nq positions. wide_by keys more on the left:
    a field bug's window."""
    qi = torch.arange(Nk - Nq, Nk)[:, None]
    kj = torch.arange(Nk)[None, :]
    keep = kj <= qi
    if window:
        keep = keep & (kj > qi - window - wide_by)
    return keep


def attend(q, k, v, scale, keep, softcap=0.0, sinks=None, sink_of_row=False):
    """eager_attention_forward: GQA by repeat_kv, logits * scaling, the
    softcap (Gemma 2: tanh(s / cap) * cap), the mask, then softmax; with
    sinks (gpt-oss) one column per head joins the softmax and is dropped.
    sink_of_row: row i of head h reads sinks[(h * Nq + i) % H] (a field
    bug)."""
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
    if sink_of_row:
        Nq = s.shape[2]
        idx = (torch.arange(H)[:, None] * Nq + torch.arange(Nq)[None, :]) % H
        col = sinks[idx].reshape(1, H, Nq, 1).expand(s.shape[0], H, Nq, 1)
    comb = torch.cat([s, col], dim=-1)
    comb = comb - comb.max(dim=-1, keepdim=True).values
    return torch.softmax(comb, dim=-1)[..., :-1] @ v


def forward(model, q, k, v, qw, kw, sinks, bug=None):
    """One attention layer of `model` on q [B, H, Nq, D], k, v [B, Hk, Nk,
    D] (the projections' outputs, heads split), weights qw, kw; bug: a key
    of BUGS, the field bug transcribed into it."""
    B, H, Nq, D = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    qpos, kpos = torch.arange(Nk - Nq, Nk), torch.arange(Nk)
    if model == "qwen3":  # Qwen3RMSNorm(head_dim), then RoPE theta 1e6
        norm = lambda x, w: x if bug == "tt-mlir-9042-norm-skipped" else \
            rms(x, 1e-6) * w
        if bug == "transformer-engine-norm-after-rope":
            q, k = rope_half(q, qpos, D, 1e6), rope_half(k, kpos, D, 1e6)
            q, k = norm(q, qw), norm(k, kw)
        else:
            q, k = norm(q, qw), norm(k, kw)
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
        wide = int(bug == "transformers-39408-window-off-by-one")
        return attend(q, k, v, 256 ** -0.5,
                      keep_mask(Nq, Nk, 1024 if local else 0, wide))
    if model == "llama4":  # RoPE, then Llama4TextL2Norm(rms_norm_eps 1e-5)
        q, k = rope_interleaved(q, qpos, 5e5), rope_interleaved(k, kpos, 5e5)
        q, k = rms(q, 1e-5), rms(k, 1e-5)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model == "qwen3-next":  # Qwen3NextRMSNorm (1 + w), partial RoPE
        r = int(D * 0.25)
        q, k = rms(q, 1e-6) * (1 + qw), rms(k, 1e-6) * (1 + kw)
        if bug == "vllm-51049-rope-first-head-only":
            q = torch.cat((rope_half(q[:, :1], qpos, r, 1e7), q[:, 1:]), 1)
            k = torch.cat((rope_half(k[:, :1], kpos, r, 1e7), k[:, 1:]), 1)
        else:
            q, k = rope_half(q, qpos, r, 1e7), rope_half(k, kpos, r, 1e7)
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 0))
    if model == "gpt-oss":  # sdpa, RoPE 150000 (no YaRN), window, sinks
        q, k = rope_half(q, qpos, D, 1.5e5), rope_half(k, kpos, D, 1.5e5)
        if bug == "modular-6591-sink-dropped":
            sinks = None
        return attend(q, k, v, D ** -0.5, keep_mask(Nq, Nk, 128),
                      sinks=sinks,
                      sink_of_row=bug == "modular-6591-sink-index-from-row")
    if model == "gemma2":  # no QK-norm, query_pre_attn_scalar, softcap
        q, k = rope_half(q, qpos, D, 1e4), rope_half(k, kpos, D, 1e4)
        window = 0 if bug == "sglang-33915-window-ignored" else 4096
        softcap = 0.0 if bug == "sglang-33915-softcap-dropped" else 50.0
        return attend(q, k, v, 256 ** -0.5, keep_mask(Nq, Nk, window),
                      softcap=softcap)
    raise ValueError(f"unknown model {model!r} (known: {', '.join(MODELS)})")


def weight_shapes(model, H, Hk, D):
    """The q and k weights' shapes (None: the model has none)."""
    if model in ("qwen3", "gemma3-local", "gemma3-global", "qwen3-next"):
        return (D,), (D,)
    if model == "olmo2":
        return (H * D,), (Hk * D,)
    return None, None


def make_dump(case, seed=34, bug=None):
    """CASES[case]'s inputs drawn with torch.manual_seed(seed), the layer's
    output and gradients: {name: float64 tensor} (inputs) and the same
    (outputs); with bug (a key of BUGS, whose case must be `case`), the
    outputs of the buggy kernel."""
    if bug is not None and BUGS[bug][0] != case:
        raise ValueError(f"bug {bug!r} is transcribed into case "
                         f"{BUGS[bug][0]!r}, not {case!r}")
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
    out = forward(model, q, k, v, qw, kw, sinks, bug)
    out.backward(d_o)
    ins = {"q": q, "k": k, "v": v, "dO": d_o}
    outs = {"O": out, "dQ": q.grad, "dK": k.grad, "dV": v.grad}
    if qw is not None:
        ins.update(q_weight=qw, k_weight=kw)
        outs.update(dq_weight=qw.grad, dk_weight=kw.grad)
    if sinks is not None:
        ins["sinks"] = sinks
        outs["d_sinks"] = sinks.grad
    # A buggy kernel that never reads a parameter (the sinks dropped, the
    # norm skipped) reports it a zero gradient.
    for n, t in outs.items():
        if t is None:
            outs[n] = torch.zeros_like(ins[{"dq_weight": "q_weight",
                                            "dk_weight": "k_weight",
                                            "d_sinks": "sinks"}[n]])
    detach = lambda d: {n: t.detach() for n, t in d.items()}
    return detach(ins), detach(outs)


def write(name, outdir):
    """OUTDIR/NAME/TENSOR.npy for every tensor of the dump NAME (a case, or
    a bug of BUGS: its case's dump with the bug); returns the compare
    command (qknorm-check on PATH), which PASSes a case and FAILs a bug."""
    bug = name if name in BUGS else None
    case = BUGS[name][0] if bug else name
    ins, outs = make_dump(case, bug=bug)
    model = CASES[case][0]
    d = os.path.join(outdir, name)
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
    for name in sys.argv[2:] or CASES:
        print(write(name, sys.argv[1]))


if __name__ == "__main__":
    main()
