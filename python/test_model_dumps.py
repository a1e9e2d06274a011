#!/usr/bin/python3
"""The model presets (issue 34) against their torch f64 transcriptions
(python/model_dumps.py): each model's dump PASSes `qknorm-check compare
--model MODEL` (forward and every gradient), PASSes the same settings
spelled out flag by flag, and FAILs under a neighbouring model or with one
setting wrong: a theta, the RoPE pairing, the partial rotary factor, the
window off by one, the softcap or the sinks dropped. Each field report of
issue 34 (model_dumps.BUGS: vLLM #51049, tt-mlir #9042, transformers
#39408, sglang #33915, modular #6591, TransformerEngine's norm order),
transcribed into its model's torch code, FAILs under the model's preset
with a message naming the field and the element.

  /usr/bin/python3 python/test_model_dumps.py [QKNORM_CHECK]

Script mode exits 77 (ctest SKIP_RETURN_CODE) when torch or numpy is
missing; under unittest or pytest the tests are skipped instead. ctest runs
it as cli_python_model_dumps.
"""
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The skip logic and script-mode main (exit 77 without torch) are
# test_qknorm_assert's.
from test_qknorm_assert import binary_or_skip, main  # noqa: E402

try:
    import numpy as np  # noqa: F401
    import torch
    import model_dumps as md
except ImportError:
    torch = None

if torch is not None:
    import qknorm_assert as qa

# Each model's settings as compare's flags (the preset spelled out), with
# the window the model's and RoPE claiming HF's rounding points (no-ops for
# f64 dumps).
_HF = ",angle_f32,cos_sin_storage"
SPELLED = {
    "qwen3": dict(formulation="qwen3", rope="16,half,after,theta=1000000" + _HF,
                  mask="causal"),
    "olmo2": dict(formulation="olmo2", rope="16,half,after,theta=500000" + _HF,
                  mask="causal"),
    "gemma3-local": dict(formulation="gemma3",
                         rope="16,half,after,theta=10000" + _HF,
                         mask="causal+window:1023,0"),
    "gemma3-global": dict(formulation="gemma3",
                          rope="16,half,after,theta=1000000" + _HF,
                          mask="causal"),
    "llama4": dict(rope="16,interleaved,before,theta=500000,angle_f32",
                   mask="causal",
                   extra_args=["--norm", "rms", "--scale", "0.25",
                               "--eps", "1e-5"]),
    "qwen3-next": dict(rope="4,half,after,theta=10000000" + _HF, mask="causal",
                       extra_args=["--norm", "rms", "--weight", "dim",
                                   "--norm-flags", "one-plus-weight",
                                   "--scale", "0.25", "--eps", "1e-6"]),
    "gpt-oss": dict(variant="sdpa", rope="16,half,after,theta=150000" + _HF,
                    mask="causal+window:127,0"),
    "gemma2": dict(rope="16,half,after,theta=10000" + _HF,
                   mask="causal+window:4095,0",
                   extra_args=["--norm", "none", "--scale", "0.0625",
                               "--softcap", "50"]),
}
SPELLED["gemma2-short"] = SPELLED["gemma2"]
SPELLED["qwen3-decode"] = SPELLED["qwen3"]

# One wrong setting per model (compare's flags after --model; --rope
# replaces the model's RoPE), or a neighbouring model.
WRONG = {
    "qwen3": [dict(rope="16,half,after,theta=10000" + _HF)],
    "qwen3-decode": [dict(rope="16,half,after,theta=10000" + _HF)],
    "olmo2": [dict(rope="16,half,after,theta=1000000" + _HF)],
    "gemma3-local": [dict(model="gemma3-global")],
    "gemma3-global": [dict(model="gemma3-local")],
    "llama4": [dict(rope="16,half,before,theta=500000,angle_f32")],
    "qwen3-next": [dict(rope="16,half,after,theta=10000000" + _HF)],
    "gpt-oss": [dict(drop_sinks=True)],
    "gemma2": [],
    "gemma2-short": [],  # the softcap dropped: its own test below
}

# The window off by one ((w, 0): i - j <= w, transformers #39408) and the
# softcap dropped, in the spelled-out form.
OFF_BY_ONE = {"gemma3-local": "causal+window:1024,0",
              "gpt-oss": "causal+window:128,0",
              "gemma2": "causal+window:4096,0"}


# The field reports whose cause the report names (validation/diagnose.cc;
# the sinks' hypotheses judged on O, the dumps having no lse).
DIAGNOSED = {
    "modular-6591-sink-dropped": "attention sink dropped",
    "modular-6591-sink-index-from-row": "another head's attention sink",
}


@unittest.skipIf(torch is None, "needs torch and numpy")
class ModelDumpTest(unittest.TestCase):
    dumps = {}

    @classmethod
    def dump(cls, case, bug=None):
        if (case, bug) not in cls.dumps:
            cls.dumps[case, bug] = md.make_dump(case, bug=bug)
        return cls.dumps[case, bug]

    def judge(self, which, drop_sinks=False, bug=None, **options):
        """Judges CASES[which]'s dump (with `bug`: as that field bug's
        kernel computes it) under compare with `options`."""
        ins, outs = self.dump(which, bug)
        params = {n: ins[n] for n in ("q_weight", "k_weight", "sinks")
                  if n in ins and not (drop_sinks and n == "sinks")}
        grads = {"dO": ins["dO"]}
        grads.update({n: t for n, t in outs.items() if n != "O"})
        if drop_sinks:
            del grads["d_sinks"]
        options.setdefault("mask", "causal")
        return qa.assert_qknorm_attention(ins["q"], ins["k"], ins["v"], None,
                                          outs["O"], grads=grads,
                                          params=params, **options)

    def fails(self, which, **options):
        with self.assertRaises(AssertionError) as cm:
            self.judge(which, **options)
        self.assertIn("FAIL", str(cm.exception))
        return str(cm.exception)

    def test_each_model_passes_under_its_preset(self):
        binary_or_skip(self)
        for case, (model, _) in md.CASES.items():
            with self.subTest(case=case):
                report = self.judge(case, model=model)
                self.assertIn("PASS", report)

    def test_each_model_passes_spelled_out(self):
        binary_or_skip(self)
        for case, (model, _) in md.CASES.items():
            with self.subTest(case=case):
                self.assertIn("PASS", self.judge(case, **SPELLED[case]))

    def test_a_wrong_setting_or_a_neighbour_fails(self):
        binary_or_skip(self)
        for case, (model, _) in md.CASES.items():
            for wrong in WRONG[case]:
                with self.subTest(case=case, wrong=wrong):
                    options = {"model": model}
                    options.update(wrong)
                    self.fails(case, **options)

    def test_the_window_off_by_one_fails(self):
        binary_or_skip(self)
        for model, mask in OFF_BY_ONE.items():
            with self.subTest(model=model):
                options = dict(SPELLED[model])
                options["mask"] = mask
                self.fails(model, **options)

    def test_gemma2_without_its_softcap_fails(self):
        binary_or_skip(self)
        options = dict(SPELLED["gemma2-short"])
        options["extra_args"] = ["--norm", "none", "--scale", "0.0625"]
        self.fails("gemma2-short", **options)

    def test_each_field_report_fails_naming_the_field_and_element(self):
        """Each field report of issue 34 (md.BUGS), transcribed into its
        model's torch code, FAILs under the model's own preset, and the
        message names a field and the element where it is worst."""
        binary_or_skip(self)
        worst = re.compile(r"worst (o|dq|dk|dv|dq_weight|dk_weight|d_sinks)"
                           r"\[\d+(,\d+)*\]")
        for bug, (case, what) in md.BUGS.items():
            with self.subTest(bug=bug, what=what):
                message = self.fails(case, bug=bug, model=md.CASES[case][0])
                self.assertRegex(message, worst)
                if bug in DIAGNOSED:
                    self.assertIn("likely: " + DIAGNOSED[bug], message)

    def test_the_dumps_are_written(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            cmd = md.write("gpt-oss", d)
            self.assertIn("--model gpt-oss", cmd)
            for n in ("q", "k", "v", "dO", "sinks", "O", "dQ", "d_sinks"):
                self.assertTrue(os.path.exists(
                    os.path.join(d, "gpt-oss", n + ".npy")), n)
            cmd = md.write("modular-6591-sink-dropped", d)
            self.assertIn("--model gpt-oss", cmd)
            self.assertIn(os.path.join(d, "modular-6591-sink-dropped", "O.npy"),
                          cmd)


if __name__ == "__main__":
    main()
