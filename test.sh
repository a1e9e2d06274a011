#!/usr/bin/env bash
# The whole test suite: install missing packages, build (Release), then
#   1. every ctest test (foundation, simd, blas and the blas suite under every
#      OpenBLAS core the CPU executes, property, mutants, cli, fuzz-corpus
#      replay), GCC 12;
#   2. the suite's quick label again, built with Clang 14 under ASan + UBSan
#      and libFuzzer's coverage instrumentation: the fuzz targets' own tree
#      (QKNORM_ASAN_WITH_FUZZ=1 scripts/sanitize.sh, which builds the
#      fuzzers too);
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

if [[ " $stages " == *" ctest "* ]]; then
  echo "== stage ctest: configure + build $BUILD"
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
     cmake --build "$BUILD" -j"$(nproc)"; then
    ctest --test-dir "$BUILD" -j"$(nproc)" --output-on-failure --timeout 1500
    status[ctest]=$?
  else
    status[ctest]=1
  fi
fi
if [[ " $stages " == *" sanitize "* ]]; then
  echo "== stage sanitize: Clang 14, ASan + UBSan, ctest -L quick"
  QKNORM_ASAN_WITH_FUZZ=1 scripts/sanitize.sh
  status[sanitize]=$?
fi
if [[ " $stages " == *" fuzz "* ]]; then
  if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    echo "== stage fuzz: libFuzzer targets, ${FUZZ_SECONDS} s each (campaign)"
  else
    echo "== stage fuzz: libFuzzer targets, corpus replay, fixed seed and runs"
  fi
  # Every registry entry (reference, simd on every attainable target with
  # Clang's EMU128 fallback, blas) is in the fuzz build.
  # sanitize.sh exits 3 when its build failed; otherwise the fuzzers it
  # built (build-fuzz/out) are this commit's.
  if [[ -n "${status[sanitize]:-}" && "${status[sanitize]}" != 3 ]]; then
    FUZZ_SKIP_BUILD=1 fuzz/run_ci.sh
  else
    fuzz/run_ci.sh
  fi
  status[fuzz]=$?
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
