#!/bin/bash -eu
# Builds the qknorm libFuzzer targets the OSS-Fuzz / ClusterFuzzLite way:
# honours $CC, $CXX, $CFLAGS, $CXXFLAGS (sanitizer and coverage flags, e.g.
# -fsanitize=address,fuzzer-no-link), $LIB_FUZZING_ENGINE (the engine to link,
# e.g. -fsanitize=fuzzer) and $OUT (where binaries and seed corpora go).
# Outside OSS-Fuzz every variable has a local default: Clang with
# ASan + UBSan (-fno-sanitize-recover=all) and libFuzzer.
#
# Writes $OUT/<target> and $OUT/<target>_seed_corpus.zip (OSS-Fuzz picks the
# zip up as the seed corpus) for every target listed by fuzz/CMakeLists.txt.
# Environment for local use: QKNORM_FUZZ_BUILD_DIR (default
# <repo>/build-fuzz/clang), QKNORM_FUZZ_CMAKE_ARGS (extra -D options, e.g.
# "-DQKNORM_ENABLE_SIMD=OFF"), JOBS (default 2), QKNORM_FUZZ_BUILD_ALL=1
# (build every target of the tree, the test suite too, not only the fuzzers:
# test.sh's sanitizer stage runs its tests in this same tree, so that the CI
# compiles the project with Clang and the sanitizers once, not twice) or
# =quick (the fuzzers and the targets of the quick tests only, the
# qknorm_quick_tests target: what that stage runs).
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CC=${CC:-clang}
export CXX=${CXX:-clang++}
sanitize="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all"
# Edge coverage (inline 8-bit counters, pc table) and both sanitizers on all
# code, but libFuzzer's comparison tracing (trace-cmp) only where the input
# is decoded or parsed: fuzz/CMakeLists.txt turns it back on there
# (QKNORM_FUZZ_TRACE_CMP). Elsewhere its hooks traced the int64 loop bounds
# of the numeric loops (kernels, oracle, judge): ~38% of an attention
# execution (perf, issue 32), no input bytes to solve for.
sanitize+=" -fno-sanitize-coverage=trace-cmp"
# Line tables only, as OSS-Fuzz's defaults: sanitizer reports and stack
# traces keep their file:line; the full -g's variable info cost ~8% of the
# Clang compile (simd/kernels.cc, 317 -> 290 CPU s, issue 32) and no report
# reads it (pass CFLAGS/CXXFLAGS with -g to debug a finding in gdb).
# -O1 everywhere, except where an execution spends its time when these are
# our own flags (no $CXXFLAGS given; under OSS-Fuzz its flags decide): see
# QKNORM_FUZZ_HOT_OPT in fuzz/CMakeLists.txt (issue 32, fuzz/README.md
# "Rate").
# With our own flags too: the SIMD library is compiled for AVX3, AVX2 and
# SSE4 only: SSE4's flags make it Highway's static target, so that the
# emulated EMU128 fallback (~450 of the kernels' CPU seconds under ASan,
# against ~23 for SSE4) can be left out, and SSSE3 is left out (SSE4 has
# its 4 lanes and runs the same kernel code): 6 fewer simd entries in every
# quick test and fuzz execution (fuzz/README.md, "Highway targets of the
# fuzz tree"). QKNORM_FUZZ_CMAKE_ARGS="-DQKNORM_SIMD_DISABLED_TARGETS=
# -DQKNORM_SIMD_BASELINE_FLAGS=" puts them back;
# QKNORM_FUZZ_CMAKE_ARGS=-DQKNORM_FUZZ_UNCOVERED_TARGETS=qknorm_simd drops
# the kernels' coverage instrumentation (measured, not taken: same section).
# The test executables' own sources at -O0 and without the coverage
# instrumentation (ASan and UBSan stay; CMakeLists.txt, QKNORM_TEST_TU_FLAGS,
# has the measurements): ~40-60% less of their compile, the same test times.
# LLVM's linker where it is installed (our flags only): an ASan test binary
# links in ~1.1 CPU s against ~2.6 with GNU ld (cli_sample_test, two
# rounds each), and the quick tree links 58 of them; the binaries are the
# same code.
# On a CPU without AVX-512 (Zen 3) AVX3 is not compiled either: its entries
# would be skipped at run time (~35 CPU s of the kernels' compile for
# nothing). Highway's AVX3 needs AVX-512 F, VL, DQ and BW.
simd_off="EMU128;SSSE3"
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
if [[ -n "$cpu_flags" ]]; then
  for f in avx512f avx512vl avx512dq avx512bw; do
    if [[ " ${cpu_flags#*:} " != *" $f "* ]]; then
      simd_off+=";AVX3"
      break
    fi
  done
fi
hot_opt=()
if [[ -z "${CXXFLAGS:-}" ]]; then
  hot_opt=(-DQKNORM_FUZZ_HOT_OPT=-O2 "-DQKNORM_SIMD_DISABLED_TARGETS=$simd_off"
           "-DQKNORM_SIMD_BASELINE_FLAGS=-mssse3;-msse4.1;-msse4.2;-mpclmul;-maes"
           "-DQKNORM_TEST_TU_FLAGS=-O0;-fno-sanitize=fuzzer-no-link")
  if command -v ld.lld >/dev/null; then
    hot_opt+=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld
              -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld
              -DCMAKE_MODULE_LINKER_FLAGS=-fuse-ld=lld)
  fi
fi
CFLAGS=${CFLAGS:-"-O1 -gline-tables-only -fno-omit-frame-pointer $sanitize"}
CXXFLAGS=${CXXFLAGS:-"-O1 -gline-tables-only -fno-omit-frame-pointer $sanitize"}
LIB_FUZZING_ENGINE=${LIB_FUZZING_ENGINE:-"-fsanitize=fuzzer"}
OUT=${OUT:-$src/build-fuzz/out}
build=${QKNORM_FUZZ_BUILD_DIR:-${WORK:+$WORK/qknorm-fuzz}}
build=${build:-$src/build-fuzz/clang}

mkdir -p "$OUT" "$build"
# Ninja where it is installed and the tree is new (a tree keeps its
# generator): with Make's -j2 the sanitizer build of simd/kernels.cc (every
# Highway target in one file, ~300 s under ASan) tended to start late and
# run alone at the end; Ninja starts it early (the same tree, on 2 cores of
# a Zen 3: 607 s with Make in a CI run, 453 s with Ninja in another).
generator=()
if command -v ninja >/dev/null && [[ ! -f "$build/CMakeCache.txt" ]]; then
  generator=(-G Ninja)
fi
# CMAKE_BUILD_TYPE "Fuzz" adds no flags of its own: $CXXFLAGS decide the
# optimization level, as OSS-Fuzz expects.
# shellcheck disable=SC2086
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Fuzz \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_C_FLAGS="$CFLAGS" -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DQKNORM_BUILD_FUZZ=ON -DQKNORM_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" \
  -DQKNORM_BUILD_BENCH=OFF "${hot_opt[@]}" ${QKNORM_FUZZ_CMAKE_ARGS:-}
if [[ "${QKNORM_FUZZ_BUILD_ALL:-0}" == 1 ]]; then
  cmake --build "$build" -j "${JOBS:-2}"
elif [[ "${QKNORM_FUZZ_BUILD_ALL:-0}" == quick ]]; then
  cmake --build "$build" -j "${JOBS:-2}" --target qknorm_quick_tests qknorm_fuzzers
else
  cmake --build "$build" -j "${JOBS:-2}" --target qknorm_fuzzers
fi
mapfile -t targets <"$build/fuzz/targets.txt"

for t in "${targets[@]}"; do
  cp "$build/fuzz/$t" "$OUT/$t"
  # libFuzzer flags of a target, the OSS-Fuzz way ($OUT/<target>.options,
  # which OSS-Fuzz and ClusterFuzzLite read; run_ci.sh reads it too).
  rm -f "$OUT/$t.options"
  if [[ -f "$src/fuzz/$t.options" ]]; then cp "$src/fuzz/$t.options" "$OUT/"; fi
  if command -v zip >/dev/null; then
    rm -f "$OUT/${t}_seed_corpus.zip"
    (cd "$src/fuzz/corpus/$t" && zip -q -r "$OUT/${t}_seed_corpus.zip" .)
  fi
done
printf '%s\n' "${targets[@]}" >"$OUT/qknorm_fuzz_targets.txt"
echo "fuzz/build.sh: built ${targets[*]} into $OUT"
