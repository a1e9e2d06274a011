#!/usr/bin/python3
"""Dump one QK-norm formulation (issue 16) as the model's PyTorch code runs
it, forward + backward, for `qknorm-check compare --formulation PRESET`.

Each preset follows its model's attention structurally, projections left
out: q and k normalized as the model normalizes them (per head, or over the
whole projection for OLMo2), weighted (Gemma: x_hat * (1 + w)), shifted
(LayerNorm bias), Qwen3's x_hat cast back to the input dtype before the
weight; GQA by repeat (repeat_kv, kv head j serves query heads
j*group..(j+1)*group-1); S = scale * q k^T, causal, softmax, O = P V.
Autograd gives dQ, dK, dV and the parameter gradients for a random dO.

Writes q, k, v, dO, q_weight, k_weight, q_bias, k_bias (those the preset
has; g for `paper`) and O, dQ, dK, dV, dq_weight, dk_weight, dq_bias,
dk_bias (dg for `paper`) as .npy files into OUTDIR.

  /usr/bin/python3 torch_formulation_dump.py OUTDIR --preset qwen3 [--wrong]

--wrong writes a deliberately wrong dump: for presets with GQA the dV of
the first query head of each group instead of the group's sum (the GQA
backward bug users report); otherwise O scaled by 1.01.
"""
import argparse
import math
import os

import numpy as np
import torch

# name: (kind, all_heads, weight shape, one_plus, bias, shared, round_first,
#        eps, scale(D), gqa)
PRESETS = {
    "paper": ("l2", False, None, False, False, False, False, 1e-12, None, False),
    "qwen3": ("rms", False, "D", False, False, False, True, 1e-6,
              lambda d: d ** -0.5, True),
    "gemma3": ("rms", False, "D", True, False, False, False, 1e-6,
               lambda d: 256 ** -0.5, True),
    "olmo2": ("rms", True, "HD", False, False, False, False, 1e-6,
              lambda d: d ** -0.5, True),
    "timm": ("layer", False, "D", False, True, False, False, 1e-6,
             lambda d: d ** -0.5, False),
    "vit22b": ("layer", False, "D", False, False, False, False, 1e-6,
               lambda d: d ** -0.5, False),
    "chameleon": ("layer", False, "HD", False, True, False, False, 1e-5,
                  lambda d: d ** -0.5, True),
    "ngpt": ("l2", False, "HD", False, False, True, False, 1e-12,
             lambda d: d ** 0.5, False),
}


def normalize(x, kind, eps, all_heads):
    """x: [B, H, N, D]; the normalization row is D, or H*D (all heads)."""
    B, H, N, D = x.shape
    if all_heads:
        x = x.transpose(1, 2).reshape(B, N, H * D)
    if kind == "l2":
        y = x / x.norm(dim=-1, keepdim=True).clamp_min(eps)
    elif kind == "rms":  # Qwen3RMSNorm / Gemma3RMSNorm / Olmo2RMSNorm
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:  # LayerNorm statistics, no affine here
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=eps)
    if all_heads:
        y = y.reshape(B, N, H, D).transpose(1, 2)
    return y


def weighted(xh, w, b, shape, one_plus, H, D):
    if shape is None:
        return xh
    view = (1, 1, 1, D) if shape == "D" else (1, H, 1, D)
    wv = (1 + w if one_plus else w).reshape(view)
    y = xh * wv
    if b is not None:
        y = y + b.reshape(view)
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--shape", default="1,4,16,32", help="B,H,N,D")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wrong", action="store_true")
    a = ap.parse_args()
    (kind, all_heads, wshape, one_plus, has_bias, shared, round_first, eps,
     scale_of, gqa) = PRESETS[a.preset]
    B, H, N, D = (int(x) for x in a.shape.split(","))
    Hk = H // 2 if gqa else H
    group = H // Hk
    dt = torch.float32
    torch.manual_seed(a.seed)
    q = torch.randn(B, H, N, D, dtype=dt, requires_grad=True)
    k = torch.randn(B, Hk, N, D, dtype=dt, requires_grad=True)
    v = torch.randn(B, Hk, N, D, dtype=dt, requires_grad=True)
    d_o = torch.randn(B, H, N, D, dtype=dt)
    params = {}

    def param(name, n_heads, init):
        if wshape is None:
            return None
        n = D if wshape == "D" else n_heads * D
        t = (init + (0.1 if "bias" in name else 0.25) * torch.randn(n, dtype=dt))
        t = t.detach().requires_grad_(True)
        params[name] = t
        return t

    base = 0.0 if one_plus else 1.0
    qw = param("q_weight", H, base)
    kw = qw if shared else param("k_weight", Hk, base)
    qb = param("q_bias", H, 0.0) if has_bias else None
    kb = param("k_bias", Hk, 0.0) if has_bias else None

    def side(x, w, b, nh):
        xh = normalize(x, kind, eps, all_heads)
        if round_first:  # HF Qwen3: hidden_states.to(input_dtype) first
            xh = xh.to(x.dtype)
        return weighted(xh, w, b, wshape, one_plus, nh, D)

    qt = side(q, qw, qb, H)
    kt = side(k, kw, kb, Hk)
    g = None
    if scale_of is None:
        g = torch.tensor(12.3197, dtype=dt, requires_grad=True)
        scale = g
    else:
        scale = scale_of(D)
    kr = kt.repeat_interleave(group, dim=1)
    vr = v.repeat_interleave(group, dim=1)
    vr.retain_grad()
    s = scale * (qt @ kr.transpose(-1, -2))
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = p @ vr
    (o * d_o).sum().backward()

    out = {"q": q, "k": k, "v": v, "dO": d_o, "O": o, "dQ": q.grad,
           "dK": k.grad, "dV": v.grad}
    if g is not None:
        out["g"] = g
        out["dg"] = g.grad
    for name, t in params.items():
        out[name] = t
        out["d" + name] = t.grad
    if a.wrong:
        if gqa:  # the first query head's dV of each group, not the sum
            out["dV"] = vr.grad[:, ::group]
        else:
            out["O"] = o * 1.01
    os.makedirs(a.outdir, exist_ok=True)
    for name, t in out.items():
        np.save(os.path.join(a.outdir, name + ".npy"),
                np.ascontiguousarray(t.detach().numpy()))


if __name__ == "__main__":
    main()
