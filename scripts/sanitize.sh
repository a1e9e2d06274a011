#!/usr/bin/env bash
# Builds the whole qknorm suite with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DQKNORM_SANITIZE=ON: -fsanitize=address,undefined -fno-sanitize-recover=all)
# in its own build directory and runs ctest on it. Exits non-zero if the build
# fails, if any test fails, or if a sanitizer reports anything (every report
# aborts the test process, so it shows up as a failed test).
#
# Usage: scripts/sanitize.sh [extra cmake -D options...]
# Environment:
#   QKNORM_ASAN_WITH_FUZZ=1 the tree of the libFuzzer targets instead
#                          (test.sh's stage 2): fuzz/build.sh builds the
#                          fuzzers and the targets the label's tests run
#                          (every target unless the label is quick) with its flags (ASan + UBSan + libFuzzer's
#                          coverage instrumentation, -O1, assertions on) into
#                          <repo>/build-fuzz/clang and the fuzzers into
#                          build-fuzz/out, so the fuzz stage reuses them
#                          instead of compiling the project a second time
#                          (each Clang sanitizer build takes 6-9 minutes on 2
#                          cores; the instrumentation costs this stage's tests
#                          about 1.8x their time). Extra cmake options go
#                          through QKNORM_FUZZ_CMAKE_ARGS there; the
#                          QKNORM_ASAN_BUILD_TYPE and _BUILD_DIR below and
#                          QKNORM_FUZZ_BUILD_DIR are not read.
#   QKNORM_ASAN_BUILD_DIR  build directory          (default: <repo>/build-asan-clang)
#   QKNORM_ASAN_LABEL      ctest label to run; empty runs every test
#                          (default: quick; the full suite is slow under ASan)
#   QKNORM_ASAN_BUILD_TYPE CMAKE_BUILD_TYPE          (default: RelWithDebInfo)
#   JOBS                   parallel build/test jobs  (default: 2)
#   QKNORM_SANITIZE_SUBSET 1 (default): the statistical verdict sweeps that
#                          have a sanitizer subset judge it (below); 0: all
#   QKNORM_SANITIZE_CC, QKNORM_SANITIZE_CXX
#                          compilers (default: clang-14, clang++-14; CC and
#                          CXX from the environment are not read, so an
#                          inherited CC=gcc cannot turn this into a GCC stage)
# Why Clang: the ctest stage builds with GCC 12 (Release), so this stage
# builds everything with the other compiler of the project. Clang-only
# defects exist: issue 14's blas:f32 NaN gradients came from Clang's code for
# the AVX-512 row kernels at -O1 with sanitizers (row_kernels-inl.h), which
# no GCC build showed. The tree's simd entries are AVX3, AVX2 and SSE4
# (fuzz/README.md, "Highway targets of the fuzz tree").
# Example, leaving backends out of a local run:
#   scripts/sanitize.sh -DQKNORM_ENABLE_SIMD=OFF -DQKNORM_ENABLE_BLAS=OFF
# Exit status: 0 passed; 1 a test failed, a sanitizer reported or no test
# ran; 3 the configure or the build failed (test.sh then lets the fuzz stage
# build on its own).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
with_fuzz=${QKNORM_ASAN_WITH_FUZZ:-0}
build=${QKNORM_ASAN_BUILD_DIR:-$root/build-asan-clang}
if [[ "$with_fuzz" == 1 ]]; then build=$root/build-fuzz/clang; fi
label=${QKNORM_ASAN_LABEL-quick}
build_type=${QKNORM_ASAN_BUILD_TYPE:-RelWithDebInfo}
jobs=${JOBS:-2}

# Every sanitizer report is fatal; leaks are reported (LeakSanitizer is part
# of ASan on x86-64 Linux).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_invalid_pointer_pairs=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

export CC=${QKNORM_SANITIZE_CC:-clang-14} CXX=${QKNORM_SANITIZE_CXX:-clang++-14}
# This stage is for memory safety and UB on every code path, not for the
# verdicts' statistics: a few statistical verdict sweeps judge a fixed
# subset of their cases here, never none (tests/test_support.h,
# sanitize_subset; README.md, "What ./test.sh runs", lists them and the
# tests that run the same code on the rest). The GCC stage runs them whole;
# QKNORM_SANITIZE_SUBSET=0 runs them whole here too.
export QKNORM_SANITIZE_SUBSET=${QKNORM_SANITIZE_SUBSET:-1}

start=$(date +%s)
log=$build/sanitize.log
mkdir -p "$build"

if [[ "$with_fuzz" == 1 ]]; then
  echo "== sanitize: building $build with fuzz/build.sh (ASan+UBSan+libFuzzer coverage, ${label:-every} targets, $CXX, -j$jobs)"
  if [[ $# -gt 0 ]]; then
    echo "== sanitize: FAILED: with QKNORM_ASAN_WITH_FUZZ=1, pass cmake options in QKNORM_FUZZ_CMAKE_ARGS"
    exit 3
  fi
  # Label quick (the CI): the fuzzers and what the quick tests run
  # (qknorm_quick_tests, CMakeLists.txt), not the full sweeps and tools.
  build_what=1
  if [[ "$label" == quick ]]; then build_what=quick; fi
  if ! QKNORM_FUZZ_BUILD_ALL=$build_what QKNORM_FUZZ_BUILD_DIR="$build" JOBS="$jobs" \
      "$root/fuzz/build.sh" >"$log" 2>&1; then
    grep -E 'error|Error' "$log" | head -n 40 || true
    echo "== sanitize: FAILED (build); full log: $log"
    exit 3
  fi
else
  echo "== sanitize: configuring $build (ASan+UBSan, $build_type, $CXX)"
  if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="$build_type" \
      -DQKNORM_SANITIZE=ON -DQKNORM_BUILD_BENCH=OFF "$@" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "== sanitize: FAILED (configure); full log: $log"
    exit 3
  fi

  echo "== sanitize: building (-j$jobs)"
  if ! cmake --build "$build" -j "$jobs" >>"$log" 2>&1; then
    grep -E 'error|Error' "$log" | head -n 40 || true
    echo "== sanitize: FAILED (build); full log: $log"
    exit 3
  fi
fi

echo "== sanitize: built in $(( $(date +%s) - start ))s"
# The tests' order in a fresh tree (test.sh's seed_ctest_costs says why).
costs=$build/Testing/Temporary/CTestCostData.txt
if [[ ! -f "$costs" && -f "$root/scripts/ctest_costs/asan.txt" ]]; then
  mkdir -p "$(dirname "$costs")" && cp "$root/scripts/ctest_costs/asan.txt" "$costs"
fi
ctest_args=(--test-dir "$build" --output-on-failure -j "$jobs" --timeout 1500)
if [[ -n "$label" ]]; then
  ctest_args+=(-L "$label")
fi
echo "== sanitize: ctest ${label:+-L $label}"
set +e
ctest "${ctest_args[@]}" 2>&1 | tee "$build/sanitize-ctest.log" | grep -vE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed'
rc=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - start ))
summary=$(grep -E 'tests passed|tests failed' "$build/sanitize-ctest.log" | tail -n 1 || true)
if [[ $rc -ne 0 ]]; then
  echo "== sanitize: FAILED: ${summary:-ctest exit $rc} (${elapsed}s); see $build/sanitize-ctest.log"
  exit 1
fi
if ! grep -qE '100% tests passed' "$build/sanitize-ctest.log"; then
  echo "== sanitize: FAILED: no tests ran (${elapsed}s)"
  exit 1
fi
echo "== sanitize: OK: ${summary} (${elapsed}s, label '${label:-<all>}')"
