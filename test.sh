#!/usr/bin/env bash
# The whole test suite: install missing packages, build (Release), then
#   1. every ctest test (foundation, simd, blas and the blas suite under every
#      OpenBLAS core the CPU executes, property, mutants, cli, fuzz-corpus
#      replay), GCC 12;
#   2. the suite's quick label again, built with Clang 14 under ASan + UBSan
#      and libFuzzer's coverage instrumentation: the fuzz targets' own tree
#      (QKNORM_ASAN_WITH_FUZZ=1 scripts/sanitize.sh, which builds the
#      fuzzers too). It is for memory safety and UB on every code path, not
#      statistics: its simd entries are AVX3, AVX2 and SSE4 (SSSE3, SSE4's
#      lane count and code, and the emulated EMU128 fallback, whose compile
#      under ASan cost ~20x SSE4's, are not compiled there) and a
#      statistical verdict sweep may judge a subset of its cases
#      (QKNORM_SANITIZE_SUBSET);
#      README.md, "What ./test.sh runs", says what and why;
#   3. each libFuzzer target: its corpus replayed, then a fixed -seed and
#      -runs (fuzz/run_ci.sh; same counts every run, fuzz/README.md), with
#      the binaries stage 2 built (built here only if stage 2 did not run or
#      its build failed).
# Every stage runs; the script fails if any stage failed.
# QKNORM_SOAK=<n> multiplies the property cases (property_tests/README.md);
# QKNORM_TEST_STAGES="ctest" (or any subset of "ctest sanitize fuzz") limits
# the stages; FUZZ_SECONDS=<n> turns stage 3 into time-boxed random
# exploration (the long campaign, fuzz/README.md).
set -uo pipefail
cd "$(dirname "$0")"
scripts/ensure_deps.sh || exit 1
stages=${QKNORM_TEST_STAGES:-ctest sanitize fuzz}
BUILD=${QKNORM_BUILD_DIR:-build/release}
declare -A status
overall=0
# Per-stage wall and CPU time (user + sys of everything the stage ran,
# from bash's `times`, which counts waited-for descendants): the CI's time
# budget is read from these lines, and CPU seconds stay comparable when other
# jobs load the machine (issue 32).
times_file=$(mktemp)
trap 'rm -f "$times_file"' EXIT
# Writes the CPU seconds so far to $cpu_now. `times` must run in this shell
# (in a $(...) subshell it would report that subshell's own children).
cpu_seconds() {
  times >"$times_file"
  cpu_now=$(awk 'NR == 2 { s = 0
      for (i = 1; i <= 2; ++i) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] }
      printf "%.2f", s }' "$times_file")
}
clock_wall=$(date +%s)
cpu_seconds
clock_cpu=$cpu_now
# Prints "== time <what>: <wall> s wall, <cpu> s CPU" since the last call.
stage_time() {
  local wall cpu
  wall=$(date +%s)
  cpu_seconds
  cpu=$cpu_now
  echo "== time $1: $((wall - clock_wall)) s wall, $(awk -v a="$cpu" -v b="$clock_cpu" 'BEGIN { printf "%.0f", a - b }') s CPU (user+sys)"
  clock_wall=$wall
  clock_cpu=$cpu
}
stage_time "dependencies"
# A fresh clone has no Testing/Temporary/CTestCostData.txt, so ctest -j would
# start the tests in registration order and a long one could start last and
# run alone. scripts/ctest_costs/ holds the per-test seconds of a CI run
# (tests of 1 s or more; a test missing there counts 0 and starts late): it
# seeds a build directory that has none, and ctest keeps its own measurements
# from then on. Only the order depends on it, never what runs.
seed_ctest_costs() {
  local dest=$2/Testing/Temporary/CTestCostData.txt
  if [[ ! -f "$dest" && -f "$1" ]]; then
    mkdir -p "$(dirname "$dest")" && cp "$1" "$dest"
  fi
}


if [[ " $stages " == *" ctest "* ]]; then
  echo "== stage ctest: configure + build $BUILD"
  # The test executables' own sources at -O1 (CMakeLists.txt,
  # QKNORM_TEST_TU_FLAGS: ~20% less of their compile, the same test times).
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DQKNORM_TEST_TU_FLAGS=-O1 >/dev/null &&
     cmake --build "$BUILD" -j"$(nproc)"; then
    stage_time "ctest: configure + build"
    seed_ctest_costs scripts/ctest_costs/gcc.txt "$BUILD"
    ctest --test-dir "$BUILD" -j"$(nproc)" --output-on-failure --timeout 1500
    status[ctest]=$?
    stage_time "ctest: tests"
  else
    status[ctest]=1
    stage_time "ctest: configure + build (failed)"
  fi
fi
if [[ " $stages " == *" sanitize "* ]]; then
  echo "== stage sanitize: Clang 14, ASan + UBSan, ctest -L quick"
  QKNORM_ASAN_WITH_FUZZ=1 scripts/sanitize.sh
  status[sanitize]=$?
  stage_time "sanitize: build + tests"
fi
if [[ " $stages " == *" fuzz "* ]]; then
  if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    echo "== stage fuzz: libFuzzer targets, ${FUZZ_SECONDS} s each (campaign)"
  else
    echo "== stage fuzz: libFuzzer targets, corpus replay, fixed seed and runs"
  fi
  # Every registry entry (reference, simd on AVX3, AVX2 and SSE4, blas) is
  # in the fuzz build.
  # sanitize.sh exits 3 when its build failed; otherwise the fuzzers it
  # built (build-fuzz/out) are this commit's.
  if [[ -n "${status[sanitize]:-}" && "${status[sanitize]}" != 3 ]]; then
    FUZZ_SKIP_BUILD=1 fuzz/run_ci.sh
  else
    fuzz/run_ci.sh
  fi
  status[fuzz]=$?
  stage_time "fuzz"
fi

passed=0
failed=0
for s in "${!status[@]}"; do
  if [[ ${status[$s]} -eq 0 ]]; then
    echo "stage $s: passed"
    passed=$((passed + 1))
  else
    echo "stage $s: FAILED (exit ${status[$s]})"
    failed=$((failed + 1))
    overall=1
  fi
done
echo "stages: $passed passed, $failed failed"
exit $overall
