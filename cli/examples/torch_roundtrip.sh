#!/bin/bash
# The README's round trip: PyTorch dumps a QKNorm attention, qknorm-check
# compare judges it. Usage: torch_roundtrip.sh QKNORM_CHECK [WORKDIR]
# Exit 77 (ctest SKIP_RETURN_CODE) when /usr/bin/python3 has no torch.
# Checks: the float32 npy dump PASSes, the float64 safetensors dump PASSes,
# a dump with O scaled by 1.01 FAILs (exit 1), and torch's own bfloat16
# autograd (intermediates rounded to bf16) FAILs our f32-compute contract but
# PASSes under --compute storage (cli/README.md).
set -u
tool=${1:?usage: torch_roundtrip.sh QKNORM_CHECK [WORKDIR]}
work=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
python=${QKNORM_PYTHON:-/usr/bin/python3}  # override only to test the skip path
if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
# torch links OpenBLAS; keep the run small and deterministic on 2 cores.
export OPENBLAS_NUM_THREADS=1
py() { "$python" "$here/torch_qknorm_dump.py" "$@"; }
status=0
py "$work/f32" --dtype float32 --causal || exit 1
"$tool" compare --mask causal --inputs "$work"/f32/{q,k,v,g,dO}.npy \
  --outputs "$work"/f32/{O,dQ,dK,dV,dg}.npy || { echo "round trip f32: expected PASS"; status=1; }
py "$work/f64" --dtype float64 --format safetensors || exit 1
"$tool" compare --inputs "$work/f64/dump.safetensors" --outputs "$work/f64/dump.safetensors" ||
  { echo "round trip f64 safetensors: expected PASS"; status=1; }
py "$work/wrong" --dtype float32 --wrong || exit 1
"$tool" compare --inputs "$work"/wrong/{q,k,v,g,dO}.npy --outputs "$work"/wrong/O.npy
rc=$?
if [ $rc -ne 1 ]; then echo "round trip wrong O: expected FAIL (exit 1), got $rc"; status=1; fi
py "$work/bf16" --dtype bfloat16 --format safetensors --shape 1,4,64,64 || exit 1
"$tool" compare --inputs "$work/bf16/dump.safetensors" --outputs "$work/bf16/dump.safetensors" >/dev/null
rc=$?
if [ $rc -ne 1 ]; then echo "round trip bf16, --compute f32: expected FAIL (exit 1), got $rc"; status=1; fi
"$tool" compare --compute storage --inputs "$work/bf16/dump.safetensors" \
  --outputs "$work/bf16/dump.safetensors" ||
  { echo "round trip bf16, --compute storage: expected PASS"; status=1; }
[ $status -eq 0 ] && echo "torch round trip: OK (f32 npy PASS, f64 safetensors PASS, wrong O FAIL, bf16 FAIL / PASS under --compute storage)"
exit $status
