#!/usr/bin/python3
"""Dump a PyTorch QKNorm attention forward + backward for `qknorm-check compare`.

QKNorm (Henry et al. 2020): q_hat = q / max(||q||, eps), k_hat likewise,
S = g * q_hat k_hat^T (no 1/sqrt(d)), P = softmax(S) over visible keys,
O = P V. Autograd gives dQ, dK, dV and dg for a random upstream gradient dO.

Writes q, k, v, g, dO (inputs) and O, dQ, dK, dV, dg (outputs) into OUTDIR as
.npy files (float64 / float32 / float16) or as one dump.safetensors (any of
those plus bfloat16; python/qknorm_assert.py's writer, no safetensors
package needed).

  /usr/bin/python3 torch_qknorm_dump.py OUTDIR [--dtype float32] [--causal]
      [--format npy|safetensors] [--wrong]

--wrong scales O by (1 + 1e-2) before saving: the tool must report FAIL.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch

# The safetensors writer of python/qknorm_assert.py (bfloat16 as BF16 bits).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
from qknorm_assert import write_safetensors  # noqa: E402


def qknorm_attention(q, k, v, g, eps, causal):
    storage = q.dtype
    if storage == torch.float16:
        # torch's CPU kernels lack float16 clamp_min / softmax: compute in
        # float32 on the float16 values (storage mode, as our 16-bit entries
        # do); autograd still returns float16 gradients.
        q, k, v, g = (t.float() for t in (q, k, v, g))
    qh = q / q.norm(dim=-1, keepdim=True).clamp_min(eps)
    kh = k / k.norm(dim=-1, keepdim=True).clamp_min(eps)
    s = g * (qh @ kh.transpose(-1, -2))
    if causal:  # key j visible to query i iff j <= i + kv_len - q_len
        nq, nk = s.shape[-2], s.shape[-1]
        i = torch.arange(nq).unsqueeze(1)
        j = torch.arange(nk).unsqueeze(0)
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(storage)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--dtype", default="float32",
                    choices=["float64", "float32", "float16", "bfloat16"])
    ap.add_argument("--shape", default="2,8,72,64", help="B,H,N,D")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--format", default="npy", choices=["npy", "safetensors"])
    ap.add_argument("--wrong", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    if a.format == "npy" and dtype == torch.bfloat16:
        ap.error("npy has no bfloat16: use --format safetensors")
    torch.manual_seed(a.seed)
    B, H, N, D = (int(x) for x in a.shape.split(","))
    L = 72  # the paper's g_init(L) = log2(L^2 - L)
    q = torch.randn(B, H, N, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, N, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, N, D, dtype=dtype, requires_grad=True)
    g = torch.tensor(math.log2(L * L - L), dtype=dtype, requires_grad=True)
    d_o = torch.randn(B, H, N, D, dtype=dtype)
    o = qknorm_attention(q, k, v, g, 1e-12, a.causal)
    o.backward(d_o)
    if a.wrong:
        o = o * (1 + 1e-2)
    tensors = {"q": q, "k": k, "v": v, "g": g, "dO": d_o, "O": o,
               "dQ": q.grad, "dK": k.grad, "dV": v.grad,
               # dg is judged at f32 (the compute precision of the 16-bit
               # modes), so a 16-bit g's gradient is saved widened.
               "dg": g.grad.float() if dtype in (torch.float16, torch.bfloat16)
               else g.grad}
    os.makedirs(a.outdir, exist_ok=True)
    if a.format == "safetensors":
        write_safetensors(os.path.join(a.outdir, "dump.safetensors"), tensors)
    else:
        for name, t in tensors.items():
            np.save(os.path.join(a.outdir, name + ".npy"), t.detach().numpy())
    print(f"wrote {a.format} dump of a {a.dtype} QKNorm attention {B}x{H}x{N}x{D} "
          f"(g = {g.item():.6f}{', causal' if a.causal else ''}"
          f"{', O deliberately wrong' if a.wrong else ''}) to {a.outdir}")


if __name__ == "__main__":
    main()
