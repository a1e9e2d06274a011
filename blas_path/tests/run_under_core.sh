#!/usr/bin/env bash
# Runs a blas test binary under one forced OpenBLAS kernel core (issue 14):
#   run_under_core.sh CORE COREPROBE BINARY [ARGS...]
# The blas entries' numbers depend on the core OpenBLAS picks at run time
# (DYNAMIC_ARCH; OPENBLAS_CORETYPE forces one), and users run on every core
# their CPU supports, so ctest reruns the blas suite under each of them.
# OpenBLAS accepts any core name it knows, even one whose instructions the
# CPU lacks (e.g. Bulldozer's FMA4 on Zen), so the instruction sets each core
# needs are checked here first: exit 77 (ctest SKIP) when the CPU lacks one.
# COREPROBE (blas_corename) then says which core OpenBLAS runs under the
# forced name: a core OpenBLAS silently replaced (it falls back to its own
# choice for a name it does not build) fails instead of passing under
# another name.
set -euo pipefail
core=$1
probe=$2
shift 2
case "$core" in
  # /proc/cpuinfo flag names; pni is SSE3.
  Prescott) need="sse2 pni" ;;
  Nehalem) need="sse2 pni ssse3 sse4_1 sse4_2" ;;
  Sandybridge) need="sse4_2 avx" ;;
  Haswell | Zen) need="avx avx2 fma" ;;
  SkylakeX) need="avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl" ;;
  Cooperlake) need="avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl avx512_bf16" ;;
  *)
    echo "run_under_core.sh: no instruction-set list for core '$core'" >&2
    exit 2
    ;;
esac
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2 || true) "
if [[ -z "${flags// /}" ]]; then
  echo "SKIP: no x86 'flags' line in /proc/cpuinfo (core $core is x86-64)"
  exit 77
fi
for f in $need; do
  if [[ "$flags" != *" $f "* ]]; then
    echo "SKIP: this CPU lacks $f, which OpenBLAS core $core needs"
    exit 77
  fi
done
# The core OpenBLAS runs without this script (its own choice on this CPU,
# or the OPENBLAS_CORETYPE the caller set) is the one every other blas test
# (labels blas and property) runs under already: rerunning the same
# binaries under it repeated their work (issue 32: Cooperlake on our Zen 4
# machines, ~24 s of the ctest stage's CPU), so it is skipped here.
# Zen's and Cooperlake's f32 and f64 results are bitwise Haswell's and
# SkylakeX's (blas_path/tests/CMakeLists.txt): a native Zen or Cooperlake
# counts as its twin.
own=$("$probe")
case "${own,,}" in
  zen) own=Haswell ;;
  cooperlake) own=SkylakeX ;;
esac
if [[ "${own,,}" == "${core,,}" ]]; then
  echo "SKIP: core $core (or its bitwise twin) is the one OpenBLAS runs" \
       "here unforced; the blas and property tests already ran under it"
  exit 77
fi
export OPENBLAS_CORETYPE=$core
got=$("$probe")
if [[ "${got,,}" != "${core,,}" ]]; then
  echo "FAIL: OPENBLAS_CORETYPE=$core, but OpenBLAS runs core $got"
  exit 1
fi
echo "OpenBLAS core: $got (forced)"
exec "$@"
