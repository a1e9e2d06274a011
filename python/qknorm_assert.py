"""Assertions for PyTorch (or any numpy) tests: judge QKNorm attention and
ScaleNorm results with `qknorm-check compare` (issue 17, part 6).

    from qknorm_assert import assert_qknorm_attention, assert_scalenorm

    out = my_qknorm_attention(q, k, v, g)          # torch tensors
    out.backward(d_o)
    assert_qknorm_attention(q, k, v, g, out, mask="causal",
                            grads={"dO": d_o, "dQ": q.grad, "dK": k.grad,
                                   "dV": v.grad, "dg": g.grad})

    y = my_scalenorm(x, g)
    y.backward(d_y)
    assert_scalenorm(x, g, y, grads={"dy": d_y, "dx": x.grad, "dg": g.grad})

Each call writes the tensors into a temporary directory in the format
compare reads (cli/README.md: .npy files named by tensor; one .safetensors
file when any tensor is bfloat16, which numpy lacks: its values go through
float32, exactly, and are stored as BF16 bits; write_safetensors), runs
`qknorm-check compare` and

- returns the report (stdout) when every judged element passes;
- raises AssertionError carrying the report when something FAILs;
- raises QKNormInputError (a ValueError) on an input error (compare's exit
  2 or 3: a NaN input, mismatched shapes or dtypes, a missing tensor, a bad
  option), with compare's message naming the tensor and the rule.

Tensors may be numpy arrays, Python scalars, or anything with
.detach()/.cpu()/.numpy() (torch tensors; torch itself is never imported).
None entries of `grads` are skipped (a parameter that got no gradient).

The binary: the `qknorm_check` option, else $QKNORM_CHECK, else
`qknorm-check` on PATH. Options (keyword arguments):
  eps, variant, formulation, compute, contract
                compare's --eps, --variant, --formulation, --compute,
                --contract (a compute contract: "storage", "pv_acc=f16",
                ...; cli/README.md)
  model         compare's --model: a model preset (qknorm/formulation.h:
                "qwen3", "gemma3-local", "gpt-oss", ...): its formulation,
                RoPE, sliding window, softcap and sinks (their values from
                params={"sinks": ...})
  params        attention only: {"q_weight": ..., "k_weight": ...,
                "q_bias": ..., "k_bias": ...} of a formulation
  extra_args    further compare arguments, a list of strings
  qknorm_check  path of the binary
  workdir       write the dump there and keep it (default: a temporary
                directory, removed afterwards)
  timeout       seconds (default 300)

Standard library and numpy only.
"""

import json
import os
import shutil
import struct
import subprocess
import tempfile

import numpy as np

__all__ = ["assert_qknorm_attention", "assert_scalenorm", "QKNormInputError",
           "find_qknorm_check", "write_safetensors"]

# qknorm-check's exit status (cli/app.h).
_EXIT_PASS, _EXIT_FAIL, _EXIT_USAGE, _EXIT_INPUT = 0, 1, 2, 3

_ST_DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
              np.dtype(np.float16): "F16"}

# Gradient names (case-insensitive aliases) -> compare's tensor name and
# side (inputs: the upstream gradient; outputs: the judged gradients).
_ATTENTION_GRADS = {
    "do": ("dO", "in"), "d_o": ("dO", "in"), "grad_o": ("dO", "in"),
    "grad_out": ("dO", "in"), "dout": ("dO", "in"),
    "dq": ("dQ", "out"), "grad_q": ("dQ", "out"),
    "dk": ("dK", "out"), "grad_k": ("dK", "out"),
    "dv": ("dV", "out"), "grad_v": ("dV", "out"),
    "dg": ("dg", "out"), "grad_g": ("dg", "out"),
    "dq_weight": ("dq_weight", "out"), "dk_weight": ("dk_weight", "out"),
    "dq_bias": ("dq_bias", "out"), "dk_bias": ("dk_bias", "out"),
    "d_sinks": ("d_sinks", "out"), "dsinks": ("d_sinks", "out"),
    "grad_sinks": ("d_sinks", "out"),
}
_SCALENORM_GRADS = {
    "dy": ("dy", "in"), "d_y": ("dy", "in"), "grad_y": ("dy", "in"),
    "dx": ("dx", "out"), "d_x": ("dx", "out"), "grad_x": ("dx", "out"),
    "dg": ("dg", "out"), "grad_g": ("dg", "out"),
}
_PARAMS = ("q_weight", "k_weight", "q_bias", "k_bias", "sinks")
_FLAGS = {"eps": "--eps", "variant": "--variant",
          "formulation": "--formulation", "compute": "--compute",
          "contract": "--contract", "rope": "--rope", "model": "--model"}
_OTHER_OPTIONS = ("params", "extra_args", "qknorm_check", "workdir", "timeout")


class QKNormInputError(ValueError):
    """compare refused the input (exit 2 or 3); .report holds its message."""

    def __init__(self, message, report="", returncode=None):
        super().__init__(message)
        self.report = report
        self.returncode = returncode


def find_qknorm_check(path=None):
    """The qknorm-check binary: `path`, else $QKNORM_CHECK, else PATH."""
    for candidate in (path, os.environ.get("QKNORM_CHECK")):
        if candidate:
            if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
                raise FileNotFoundError(
                    f"qknorm-check: {candidate} is not an executable file")
            return candidate
    found = shutil.which("qknorm-check")
    if found is None:
        raise FileNotFoundError(
            "qknorm-check not found: pass qknorm_check=PATH, set QKNORM_CHECK, "
            "or put qknorm-check on PATH (build it with cmake --build BUILD "
            "--target qknorm-check)")
    return found


def _as_array(name, t):
    """(contiguous numpy array, is_bf16) of a tensor, array or scalar."""
    if hasattr(t, "detach"):
        t = t.detach()
    if hasattr(t, "cpu"):
        t = t.cpu()
    bf16 = str(getattr(t, "dtype", "")) in ("torch.bfloat16", "bfloat16")
    if bf16 and hasattr(t, "float"):
        t = t.float()  # numpy has no bfloat16; every bf16 value is a float32
    if hasattr(t, "numpy") and not isinstance(t, (np.ndarray, np.generic)):
        t = t.numpy()
    a = np.asarray(t)
    if bf16:
        a = a.astype(np.float32)
    elif a.dtype.kind in "biu":
        a = a.astype(np.float64)  # e.g. g given as an int
    elif a.dtype not in _ST_DTYPES:
        raise QKNormInputError(
            f"{name}: dtype {a.dtype} is not float64, float32, float16 or "
            "bfloat16")
    return np.ascontiguousarray(a), bf16


def _bf16_bits(name, a):
    bits = a.view(np.uint32)
    if np.any(bits & 0xFFFF):
        raise QKNormInputError(f"{name}: values are not bfloat16")
    return (bits >> 16).astype("<u2")


def write_safetensors(path, tensors):
    """Writes name -> tensor (numpy array, scalar or torch tensor) as one
    .safetensors file, the format compare reads; bfloat16 tensors are stored
    as BF16 (cli/examples/torch_qknorm_dump.py writes its dumps with it)."""
    _write_safetensors(path, {n: _as_array(n, t) for n, t in tensors.items()})


def _write_safetensors(path, tensors):
    """tensors: name -> (array, is_bf16)."""
    header, blob = {}, b""
    for name, (a, bf16) in tensors.items():
        data = (_bf16_bits(name, a) if bf16
                else a.astype(a.dtype.newbyteorder("<"))).tobytes()
        header[name] = {"dtype": "BF16" if bf16 else _ST_DTYPES[a.dtype],
                        "shape": list(a.shape),
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def _split_grads(grads, table, what):
    ins, outs = {}, {}
    for key, t in (grads or {}).items():
        if t is None:
            continue
        entry = table.get(str(key).lower())
        if entry is None:
            raise QKNormInputError(
                f"grads: '{key}' is not a {what} gradient name (one of "
                f"{', '.join(sorted(table))})")
        name, side = entry
        (ins if side == "in" else outs)[name] = t
    return ins, outs


def _run(inputs, outputs, flags, options):
    unknown = set(options) - set(_FLAGS) - set(_OTHER_OPTIONS)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    binary = find_qknorm_check(options.get("qknorm_check"))
    args = list(flags)
    for opt, flag in _FLAGS.items():
        if options.get(opt) is not None:
            value = options[opt]
            args += [flag, repr(float(value)) if opt == "eps" else str(value)]
    args += [str(a) for a in options.get("extra_args") or []]
    arrays = {}
    for name, t in list(inputs.items()) + list(outputs.items()):
        arrays[name] = _as_array(name, t)
    workdir = options.get("workdir")
    tmp = None
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="qknorm_assert_")
        workdir = tmp
    else:
        os.makedirs(workdir, exist_ok=True)
    try:
        if any(bf16 for _, bf16 in arrays.values()):
            path = os.path.join(workdir, "dump.safetensors")
            _write_safetensors(path, arrays)
            in_specs, out_specs = [path], [path]
        else:
            specs = {}
            for name, (a, _) in arrays.items():
                path = os.path.join(workdir, name + ".npy")
                np.save(path, a)
                specs[name] = f"{name}={path}"
            in_specs = [specs[n] for n in inputs]
            out_specs = [specs[n] for n in outputs]
        cmd = ([binary, "compare"] + args + ["--inputs"] + in_specs +
               ["--outputs"] + out_specs)
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=options.get("timeout", 300))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    report = p.stdout + p.stderr
    if p.returncode == _EXIT_PASS:
        return p.stdout
    where = ("" if tmp is None else
             " (pass workdir=DIR to keep the dump and rerun the command)")
    if p.returncode == _EXIT_FAIL:
        raise AssertionError(
            f"qknorm-check compare: FAIL{where}\n{' '.join(cmd)}\n{report}")
    if p.returncode in (_EXIT_USAGE, _EXIT_INPUT):
        raise QKNormInputError(
            f"qknorm-check compare refused the input (exit {p.returncode}): "
            f"{p.stderr.strip() or p.stdout.strip()}", report, p.returncode)
    raise RuntimeError(
        f"qknorm-check compare exited with {p.returncode}{where}\n"
        f"{' '.join(cmd)}\n{report}")


def assert_qknorm_attention(q, k, v, g, out, grads=None, mask=None, **options):
    """Judges `out` (and the gradients in `grads`) of QK-normalized attention
    on q, k, v [B,H,N,D] (or [H,N,D], [N,D]) and the scalar g by
    `qknorm-check compare`.

    grads: {"dO": upstream gradient, "dQ", "dK", "dV", "dg" (and a
    formulation's "dq_weight", ...): the gradients to judge}; dO is needed
    when any gradient is given. mask: compare's --mask text ("causal",
    "pad:L1,L2,...", "causal+pad", a sliding window "window:LEFT,RIGHT",
    e.g. "causal+window:127,0"; None: no mask). rope: compare's --rope
    text (attention.h, Rope: "64,half,after,theta=1000000"; None: no
    rotation). Attention sinks (gpt-oss): params={"sinks": one value per
    query head}, and grads={"d_sinks": ...} to judge their gradient. g may be None for a
    fixed-scale formulation. Returns the report on PASS; raises
    AssertionError (FAIL) or QKNormInputError (bad input)."""
    inputs = {"q": q, "k": k, "v": v}
    if g is not None:
        inputs["g"] = g
    for name, t in (options.pop("params", None) or {}).items():
        if name not in _PARAMS:
            raise QKNormInputError(
                f"params: '{name}' is not one of {', '.join(_PARAMS)}")
        if t is not None:
            inputs[name] = t
    grad_in, grad_out = _split_grads(grads, _ATTENTION_GRADS, "attention")
    inputs.update(grad_in)
    outputs = {"O": out}
    outputs.update(grad_out)
    flags = ["--kind", "attention"]
    if mask is not None:
        if not isinstance(mask, str):
            raise TypeError("mask must be compare's --mask text: none, causal, "
                            "pad, pad:L1,L2,..., window:LEFT,RIGHT, joined "
                            "with +")
        flags += ["--mask", mask]
    return _run(inputs, outputs, flags, options)


def assert_scalenorm(x, g, y, grads=None, **options):
    """Judges ScaleNorm's `y` = g x / max(||x||, eps) per row (x [..., dim],
    the leading dims the rows; and the gradients in `grads`) by
    `qknorm-check compare`.

    grads: {"dy": upstream gradient, "dx", "dg": the gradients to judge}; dy
    is needed when dx or dg is given. eps defaults to ScaleNorm's 1e-5.
    Returns the report on PASS; raises AssertionError (FAIL) or
    QKNormInputError (bad input)."""
    if "params" in options:
        raise TypeError("params: ScaleNorm has no formulation parameters")
    grad_in, grad_out = _split_grads(grads, _SCALENORM_GRADS, "ScaleNorm")
    inputs = {"x": x, "g": g}
    inputs.update(grad_in)
    outputs = {"y": y}
    outputs.update(grad_out)
    return _run(inputs, outputs, ["--kind", "scalenorm"], options)
