#!/usr/bin/python3
"""Tests of qknorm_assert (issue 17, part 6) with torch 1.13 autograd.

QKNorm attention (cli/examples/torch_qknorm_dump.py's qknorm_attention) and
ScaleNorm computed by torch in float32 with autograd pass; a corrupted
output raises AssertionError whose message says FAIL and names the element;
bad input raises QKNormInputError; bfloat16 tensors go through a
.safetensors dump; the module never imports torch.

  /usr/bin/python3 python/test_qknorm_assert.py [QKNORM_CHECK]
  QKNORM_CHECK=... python3 -m pytest python/test_qknorm_assert.py

Script mode exits 77 (ctest SKIP_RETURN_CODE) when torch or numpy is
missing; under unittest or pytest the torch tests are skipped instead.
ctest runs it as cli_python_assert.
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "cli", "examples"))

try:
    import numpy as np
    import torch
    from torch_qknorm_dump import qknorm_attention
except ImportError:
    torch = None

if torch is not None:
    import qknorm_assert as qa


def scalenorm(x, g, eps=1e-5):
    """ScaleNorm (Nguyen & Salazar 2019): g x / max(||x||, eps) per row."""
    return g * x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def binary_or_skip(case):
    try:
        qa.find_qknorm_check()
    except FileNotFoundError as e:
        case.skipTest(str(e))


@unittest.skipIf(torch is None, "needs torch and numpy")
class AttentionTest(unittest.TestCase):
    def setUp(self):
        binary_or_skip(self)
        torch.manual_seed(1)
        shape = (1, 2, 12, 16)
        self.q, self.k, self.v = (torch.randn(*shape, requires_grad=True)
                                  for _ in range(3))
        self.g = torch.tensor(12.3197, requires_grad=True)
        self.d_o = torch.randn(*shape)
        self.out = qknorm_attention(self.q, self.k, self.v, self.g, 1e-12, True)
        self.out.backward(self.d_o)
        self.grads = {"dO": self.d_o, "dQ": self.q.grad, "dK": self.k.grad,
                      "dV": self.v.grad, "dg": self.g.grad}

    def test_correct_results_pass(self):
        report = qa.assert_qknorm_attention(self.q, self.k, self.v, self.g,
                                            self.out, grads=self.grads,
                                            mask="causal")
        self.assertIn("files:f32", report)
        self.assertIn("PASS", report)
        # Forward only; numpy arrays work the same.
        qa.assert_qknorm_attention(*(t.detach().numpy() for t in (
            self.q, self.k, self.v, self.g, self.out)), mask="causal")

    def test_corrupted_output_fails(self):
        bad = self.out.detach().clone()
        bad[0, 1, 5, 3] *= 1.01
        with self.assertRaises(AssertionError) as cm:
            qa.assert_qknorm_attention(self.q, self.k, self.v, self.g, bad,
                                       grads=self.grads, mask="causal")
        self.assertIn("FAIL", str(cm.exception))
        self.assertIn("worst o[0,1,5,3]", str(cm.exception))
        # The mask is part of the problem: without it the correct O fails.
        with self.assertRaises(AssertionError):
            qa.assert_qknorm_attention(self.q, self.k, self.v, self.g,
                                       self.out)

    def test_bad_input_is_an_input_error(self):
        q = self.q.detach().clone()
        q[0, 0, 2, 1] = float("nan")
        with self.assertRaises(qa.QKNormInputError) as cm:
            qa.assert_qknorm_attention(q, self.k, self.v, self.g, self.out)
        self.assertIn("q[0,0,2,1]: element is NaN", str(cm.exception))
        with self.assertRaises(qa.QKNormInputError) as cm:
            qa.assert_qknorm_attention(self.q, self.k, self.v, self.g,
                                       self.out, grads={"dQ": self.q.grad})
        self.assertIn("no tensor named dO", str(cm.exception))
        with self.assertRaises(qa.QKNormInputError):
            qa.assert_qknorm_attention(self.q, self.k, self.v, self.g,
                                       self.out, grads={"dz": self.q.grad})

    def test_bfloat16_goes_through_safetensors(self):
        # bf16 storage, f32 compute, outputs rounded once (our entries'
        # contract); g stays f32 so that dg is not rounded to bf16.
        q, k, v = (t.detach().bfloat16().requires_grad_()
                   for t in (self.q, self.k, self.v))
        g = self.g.detach().clone().requires_grad_()
        out = qknorm_attention(q.float(), k.float(), v.float(), g, 1e-12,
                               True).bfloat16()
        d_o = self.d_o.bfloat16()
        out.backward(d_o)
        report = qa.assert_qknorm_attention(
            q, k, v, g, out, mask="causal",
            grads={"dO": d_o, "dQ": q.grad, "dK": k.grad, "dV": v.grad,
                   "dg": g.grad})
        self.assertIn("files:bf16", report)
        bad = out.detach().clone()
        bad[0, 0, 7, 2] *= 1.05
        with self.assertRaises(AssertionError) as cm:
            qa.assert_qknorm_attention(q, k, v, g, bad, mask="causal")
        self.assertIn("FAIL", str(cm.exception))


def window_attention(q, k, v, g, eps, w):
    """QKNorm attention in which each query sees its w latest keys (i - j < w,
    j <= i: FlashAttention's window (w - 1, 0)), the mask written with
    torch.triu / torch.tril as model code builds it."""
    qh = q / q.norm(dim=-1, keepdim=True).clamp_min(eps)
    kh = k / k.norm(dim=-1, keepdim=True).clamp_min(eps)
    s = g * (qh @ kh.transpose(-1, -2))
    n = s.shape[-1]
    inf = torch.full((n, n), float("-inf"), dtype=s.dtype)
    mask = torch.triu(inf, diagonal=1) + torch.tril(inf, diagonal=-w)
    return torch.softmax(s + mask, dim=-1) @ v


@unittest.skipIf(torch is None, "needs torch and numpy")
class WindowTest(unittest.TestCase):
    """The sliding window (issue 34): torch's windowed attention passes under
    its window and FAILs under the window one key wider (transformers
    #39408's (w, 0) for (w - 1, 0)) or without it, naming the element."""

    def test_window_is_judged_under_its_convention(self):
        binary_or_skip(self)
        torch.manual_seed(3)
        shape = (1, 2, 16, 16)
        q, k, v = (torch.randn(*shape, dtype=torch.float64,
                               requires_grad=True) for _ in range(3))
        g = torch.tensor(12.3197, dtype=torch.float64, requires_grad=True)
        d_o = torch.randn(*shape, dtype=torch.float64)
        out = window_attention(q, k, v, g, 1e-12, 4)
        out.backward(d_o)
        grads = {"dO": d_o, "dQ": q.grad, "dK": k.grad, "dV": v.grad,
                 "dg": g.grad}
        report = qa.assert_qknorm_attention(q, k, v, g, out, grads=grads,
                                            mask="causal+window:3,0")
        self.assertIn("PASS", report)
        for wrong in ("causal+window:4,0", "causal+window:2,0", "causal"):
            with self.assertRaises(AssertionError) as cm:
                qa.assert_qknorm_attention(q, k, v, g, out, grads=grads,
                                           mask=wrong)
            self.assertIn("FAIL", str(cm.exception))
            self.assertIn("worst o[", str(cm.exception))


def rope_attention(q, k, v, g, eps, rotary, theta):
    """The paper's QK-norm, then RoPE as Hugging Face's Llama code applies
    it (rotate_half over the first `rotary` dims, cos and sin of
    positions * inv_freq concatenated twice), causal: written here from the
    model code's formulas, not from qknorm."""
    qh = q / q.norm(dim=-1, keepdim=True).clamp_min(eps)
    kh = k / k.norm(dim=-1, keepdim=True).clamp_min(eps)
    n = q.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary, 2,
                                             dtype=torch.float64) / rotary))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(x):
        r, rest = x[..., :rotary], x[..., rotary:]
        return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)

    s = g * (rope(qh) @ rope(kh).transpose(-1, -2))
    mask = torch.triu(torch.full((n, n), float("-inf"), dtype=s.dtype),
                      diagonal=1)
    return torch.softmax(s + mask, dim=-1) @ v


@unittest.skipIf(torch is None, "needs torch and numpy")
class RopeTest(unittest.TestCase):
    """RoPE (issue 34): Hugging Face's rotate_half transcribed in torch
    passes under its spec and FAILs under the other pairing, the full head
    for its partial rotary, or no rotation, naming the element."""

    def test_rope_is_judged_under_its_spec(self):
        binary_or_skip(self)
        torch.manual_seed(4)
        shape = (1, 2, 12, 16)
        q, k, v = (torch.randn(*shape, dtype=torch.float64,
                               requires_grad=True) for _ in range(3))
        g = torch.tensor(12.3197, dtype=torch.float64, requires_grad=True)
        d_o = torch.randn(*shape, dtype=torch.float64)
        out = rope_attention(q, k, v, g, 1e-12, 8, 10000.0)
        out.backward(d_o)
        grads = {"dO": d_o, "dQ": q.grad, "dK": k.grad, "dV": v.grad,
                 "dg": g.grad}
        report = qa.assert_qknorm_attention(
            q, k, v, g, out, grads=grads, mask="causal",
            rope="8,half,after,theta=10000")
        self.assertIn("PASS", report)
        for wrong in ("8,interleaved,after,theta=10000",
                      "16,half,after,theta=10000", None):
            with self.assertRaises(AssertionError) as cm:
                qa.assert_qknorm_attention(q, k, v, g, out, grads=grads,
                                           mask="causal", rope=wrong)
            self.assertIn("FAIL", str(cm.exception))
            self.assertIn("worst o[", str(cm.exception))


def sink_attention(q, k, v, sinks, causal):
    """gpt-oss's sdpa with sinks, transcribed: the logits with one sink
    column per head appended, softmax, the sink column dropped."""
    H, Hk = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // Hk, dim=1)
    v = v.repeat_interleave(H // Hk, dim=1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1),
                          float("-inf"))
    col = sinks.reshape(1, H, 1, 1).expand(s.shape[0], H, s.shape[2], 1)
    comb = torch.cat([s, col], dim=-1)
    comb = comb - comb.max(dim=-1, keepdim=True).values
    return torch.softmax(comb, dim=-1)[..., :-1] @ v


@unittest.skipIf(torch is None, "needs torch and numpy")
class SinksTest(unittest.TestCase):
    """Attention sinks (issue 34): gpt-oss's sdpa with sinks in torch f64
    passes with its sinks (and their gradient) and FAILs without them, or
    with one head's sink changed, naming the element."""

    def test_sinks_are_judged(self):
        binary_or_skip(self)
        torch.manual_seed(5)
        q = torch.randn(1, 4, 10, 8, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(1, 2, 10, 8, dtype=torch.float64,
                            requires_grad=True) for _ in range(2))
        sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64,
                             requires_grad=True)
        d_o = torch.randn(1, 4, 10, 8, dtype=torch.float64)
        out = sink_attention(q, k, v, sinks, True)
        out.backward(d_o)
        grads = {"dO": d_o, "dQ": q.grad, "dK": k.grad, "dV": v.grad,
                 "d_sinks": sinks.grad}
        report = qa.assert_qknorm_attention(
            q, k, v, None, out, grads=grads, mask="causal", variant="sdpa",
            params={"sinks": sinks.detach()})
        self.assertIn("PASS", report)
        self.assertIn("sinks=0.5,-1,2,0", report)
        wrong = sinks.detach().clone()
        wrong[3] = 0.25
        for params in ({}, {"sinks": wrong}):
            g = dict(grads)
            if not params:
                del g["d_sinks"]
            with self.assertRaises(AssertionError) as cm:
                qa.assert_qknorm_attention(q, k, v, None, out, grads=g,
                                           mask="causal", variant="sdpa",
                                           params=params)
            self.assertIn("FAIL", str(cm.exception))
            self.assertIn("worst o[", str(cm.exception))


@unittest.skipIf(torch is None, "needs torch and numpy")
class ScaleNormTest(unittest.TestCase):
    def setUp(self):
        binary_or_skip(self)
        torch.manual_seed(2)
        self.x = torch.randn(2, 8, 32, requires_grad=True)
        self.g = torch.tensor(32 ** 0.5, requires_grad=True)
        self.d_y = torch.randn(2, 8, 32)
        self.y = scalenorm(self.x, self.g)
        self.y.backward(self.d_y)
        self.grads = {"dy": self.d_y, "dx": self.x.grad, "dg": self.g.grad}

    def test_correct_results_pass(self):
        report = qa.assert_scalenorm(self.x, self.g, self.y, grads=self.grads)
        self.assertIn("scalenorm rows=16 dim=32", report)
        self.assertIn("PASS", report)
        qa.assert_scalenorm(self.x, self.g, self.y)  # forward only

    def test_corrupted_output_fails(self):
        dx = self.x.grad.clone()
        dx[1, 2, 7] *= 1.01  # row 1 * 8 + 2 = 10 of the flattened rows
        with self.assertRaises(AssertionError) as cm:
            qa.assert_scalenorm(self.x, self.g, self.y,
                                grads={"dy": self.d_y, "dx": dx})
        self.assertIn("FAIL", str(cm.exception))
        self.assertIn("worst dx[10,7]", str(cm.exception))
        # The y of another g (1% off) fails.
        with self.assertRaises(AssertionError):
            qa.assert_scalenorm(self.x, self.g * 1.01, self.y)

    def test_bad_input_is_an_input_error(self):
        with self.assertRaises(qa.QKNormInputError) as cm:
            qa.assert_scalenorm(self.x, self.g, self.y[:, :4])
        self.assertIn("differs from x's", str(cm.exception))
        with self.assertRaises(qa.QKNormInputError) as cm:
            qa.assert_scalenorm(self.x, self.g, self.y,
                                grads={"dx": self.x.grad})
        self.assertIn("no tensor named dy", str(cm.exception))
        with self.assertRaises(TypeError):
            qa.assert_scalenorm(self.x, self.g, self.y, colour="red")

    def test_module_does_not_import_torch(self):
        code = ("import sys; sys.path.insert(0, %r); import qknorm_assert; "
                "sys.exit('torch' in sys.modules)" % HERE)
        self.assertEqual(subprocess.run([sys.executable, "-c", code]).returncode,
                         0)


def main():
    if len(sys.argv) > 1:
        os.environ["QKNORM_CHECK"] = sys.argv[1]
    if torch is None:
        print("SKIP: this python has no torch/numpy (apt-get install "
              "python3-torch)")
        sys.exit(77)
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    sys.exit(0 if result.wasSuccessful() and not result.skipped else 1)


if __name__ == "__main__":
    main()
