#!/bin/bash
# Per preset (issue 16): PyTorch dumps the formulation as its model's code
# runs it (torch_formulation_dump.py), qknorm-check compare --formulation
# judges it: the dump must PASS and its deliberately wrong variant FAIL.
# Usage: torch_formulations.sh QKNORM_CHECK [WORKDIR]
# Exit 77 (ctest SKIP_RETURN_CODE) when /usr/bin/python3 has no torch.
set -u
tool=${1:?usage: torch_formulations.sh QKNORM_CHECK [WORKDIR]}
work=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
python=${QKNORM_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
export OPENBLAS_NUM_THREADS=1
status=0
for preset in paper qwen3 gemma3 olmo2 timm vit22b chameleon ngpt; do
  for mode in right wrong; do
    dir="$work/$preset-$mode"
    flag=(); [ $mode = wrong ] && flag=(--wrong)
    "$python" "$here/torch_formulation_dump.py" "$dir" --preset "$preset" \
      "${flag[@]}" || exit 1
    ins=(); outs=()
    for n in q k v g dO q_weight k_weight q_bias k_bias; do
      [ -f "$dir/$n.npy" ] && ins+=("$dir/$n.npy")
    done
    for n in O dQ dK dV dg dq_weight dk_weight dq_bias dk_bias; do
      [ -f "$dir/$n.npy" ] && outs+=("$dir/$n.npy")
    done
    "$tool" compare --formulation "$preset" --mask causal --inputs "${ins[@]}" \
      --outputs "${outs[@]}" > "$dir.log" 2>&1
    rc=$?
    want=0; [ $mode = wrong ] && want=1
    if [ $rc -ne $want ]; then
      echo "$preset $mode: expected exit $want, got $rc"; tail -20 "$dir.log"
      status=1
    else
      echo "$preset $mode: exit $rc as expected ($(grep -o 'margin [0-9.e+-]*' "$dir.log" | head -1))"
    fi
  done
done
[ $status -eq 0 ] && echo "torch formulations: OK (every preset's dump PASSes, its wrong dump FAILs)"
exit $status
