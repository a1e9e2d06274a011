#!/usr/bin/env python3
"""Cross-checks `qknorm-check power`'s assert_close rule against torch.

qknorm-check power applies torch.testing.assert_close's default rule
(|actual - expected| <= atol + rtol |expected|, the dtype's default rtol/atol)
in C++. This script confirms, on arrays the tool dumps with --torch-dump, that
torch.testing.assert_close itself gives the same verdict and the same number
of mismatched elements.

Usage:
  power_assert_close_check.py QKNORM_CHECK [WORKDIR]
      runs `QKNORM_CHECK power --quick` over f32, bf16 and f16 with
      --torch-dump WORKDIR (default: a fresh temporary directory), then checks
  power_assert_close_check.py --dir DIR
      checks an existing dump (DIR/manifest.json)

Each dumped array pair is float64 .npy: the entry's stored output (exactly
representable in its dtype) and the oracle. The actual is cast to its dtype
(exact) and the expected stays float64, so assert_close(actual, expected,
check_dtype=False) uses the actual dtype's defaults, as the tool does.

Exit status: 0 every verdict agrees, 1 a disagreement (or a bad dump),
77 /usr/bin/python3 has no torch (ctest SKIP_RETURN_CODE).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("SKIP: this python has no torch/numpy (apt-get install python3-torch)")
    sys.exit(77)


def torch_verdict(actual, expected):
    """(close, mismatched elements) from torch.testing.assert_close."""
    try:
        torch.testing.assert_close(actual, expected, check_dtype=False)
        return True, 0
    except AssertionError as e:
        m = re.search(r"Mismatched elements: (\d+) / (\d+)", str(e))
        if m:
            return False, int(m.group(1))
        if actual.numel() == 1:
            return False, 1
        raise


def check(directory):
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    if not manifest:
        print("power_assert_close_check: empty manifest")
        return 1
    bad = 0
    for entry in manifest:
        a = np.load(os.path.join(directory, entry["actual"]))
        e = np.load(os.path.join(directory, entry["expected"]))
        dtype = getattr(torch, entry["dtype"])
        actual = torch.from_numpy(a).to(dtype)
        back = actual.double().numpy()
        same = (back == a) | (np.isnan(back) & np.isnan(a))
        if not same.all():
            print(f"{entry['name']}: actual not representable in {entry['dtype']}")
            bad += 1
            continue
        close, mismatches = torch_verdict(actual, torch.from_numpy(e))
        agree = (close == entry["cpp_close"]
                 and mismatches == entry["cpp_mismatches"])
        status = "agree" if agree else "DISAGREE"
        print(f"{entry['name']:<36} {entry['dtype']:<8} torch: "
              f"{'close' if close else 'not close'} ({mismatches} mismatched)"
              f"  qknorm-check: {'close' if entry['cpp_close'] else 'not close'}"
              f" ({entry['cpp_mismatches']})  {status}")
        bad += not agree
    verdicts = {x["cpp_close"] for x in manifest}
    print(f"{len(manifest) - bad} of {len(manifest)} arrays agree "
          f"(verdicts seen: {sorted(verdicts)}); torch {torch.__version__}")
    return 0 if bad == 0 else 1


def main(argv):
    if len(argv) >= 2 and argv[0] == "--dir":
        return check(argv[1])
    if not argv:
        print(__doc__)
        return 1
    tool = argv[0]
    work = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="qknorm_power_")
    cmd = [tool, "power", "--quick", "--trials", "1", "--precision", "f32",
           "--precision", "bf16", "--precision", "f16", "--dist", "zerorows",
           "--dist", "mixedv", "--torch-dump", work]
    # Exit 1 (missed targets) is expected; 2 and up are errors.
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
    if rc not in (0, 1):
        print(f"power_assert_close_check: {' '.join(cmd)} exited {rc}")
        return 1
    return check(work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
