#!/usr/bin/env bash
# Builds the libFuzzer targets with Clang (fuzz/build.sh: ASan + UBSan,
# -fno-sanitize-recover=all) and runs each for a bounded time, starting from
# its checked-in seed corpus. Fails (exit 1) on any finding: a crash, a
# sanitizer report, a failed check (abort), a leak, a timeout or an
# out-of-memory. Prints executions per target and where reproducers went.
#
# Usage: fuzz/run_ci.sh [seconds_per_target]     (default 60, or $FUZZ_SECONDS)
# Environment:
#   FUZZ_SECONDS      time budget per target
#   FUZZ_JOBS         parallel fuzzing processes per target (default 1)
#   FUZZ_TARGETS      space-separated subset (default: every target)
#   FUZZ_WORK_DIR     corpus/artifact directory (default <repo>/build-fuzz/ci)
#   QKNORM_FUZZ_CMAKE_ARGS, QKNORM_FUZZ_BUILD_DIR, OUT, CC, CXX: see build.sh
#   FUZZ_SKIP_BUILD=1 reuse the binaries already in $OUT
# Long local campaign (README.md): FUZZ_SECONDS=3600 FUZZ_JOBS=2 fuzz/run_ci.sh
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-${FUZZ_SECONDS:-60}}
jobs=${FUZZ_JOBS:-1}
work=${FUZZ_WORK_DIR:-$root/build-fuzz/ci}
export OUT=${OUT:-$root/build-fuzz/out}
mkdir -p "$(dirname "$work")"
if [[ "${FUZZ_SKIP_BUILD:-0}" != 1 ]]; then
  echo "== fuzz: building the fuzz targets (fuzz/build.sh)"
  if ! "$root/fuzz/build.sh" >"$work.build.log" 2>&1; then
    tail -n 30 "$work.build.log"
    echo "== fuzz: FAILED (build); log: $work.build.log"
    exit 1
  fi
fi
if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
elif [[ -f "$OUT/qknorm_fuzz_targets.txt" ]]; then
  mapfile -t targets <"$OUT/qknorm_fuzz_targets.txt"
else
  echo "== fuzz: FAILED: no $OUT/qknorm_fuzz_targets.txt (run fuzz/build.sh)"
  exit 1
fi

mkdir -p "$work"
status=0
summary=()
for t in "${targets[@]}"; do
  bin=$OUT/$t
  if [[ ! -x "$bin" ]]; then
    summary+=("$t: MISSING binary $bin")
    status=1
    continue
  fi
  corpus=$work/$t/corpus
  artifacts=$work/$t/artifacts/
  rm -rf "$artifacts"
  mkdir -p "$corpus" "$artifacts"
  log=$work/$t/fuzz.log
  echo "== fuzz: $t for ${seconds}s (jobs=$jobs)"
  # -timeout: one input running > 10 s is a finding (sizes are bounded, a
  # normal input takes milliseconds); -rss_limit_mb: the default 2 GiB.
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$artifacts")
  if [[ $jobs -gt 1 ]]; then args+=(-jobs="$jobs" -workers="$jobs"); fi
  (cd "$work/$t" &&
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
      "$bin" "${args[@]}" "$corpus" "$root/fuzz/corpus/$t" >"$log" 2>&1)
  rc=$?
  # With -jobs, each worker logs to fuzz-<n>.log in the working directory,
  # and the parent echoes those logs into its own: the statistics are read
  # from the worker logs alone (reading both counted every job twice).
  stats=$log
  if [[ $jobs -gt 1 ]]; then
    stats=$work/$t/workers.log
    cat "$work/$t"/fuzz-*.log >"$stats" 2>/dev/null
    rm -f "$work/$t"/fuzz-*.log
  fi
  execs=$(grep -E 'stat::number_of_executed_units' "$stats" | awk '{s += $2} END {print s + 0}')
  rate=$(grep -E 'stat::average_exec_per_sec' "$stats" | awk '{s += $2} END {print s + 0}')
  found=$(find "$artifacts" -type f | wc -l)
  if [[ $rc -ne 0 || $found -ne 0 ]]; then
    status=1
    summary+=("$t: FINDING (exit $rc), $execs execs; reproducers: $(find "$artifacts" -type f | tr '\n' ' ')")
    grep -m1 -A6 -E 'qknorm fuzz:|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" | head -n 12
    echo "   full log: $log"
  else
    summary+=("$t: OK, $execs execs in ${seconds}s (${rate} exec/s), corpus $(ls "$corpus" | wc -l) files")
  fi
done

echo "== fuzz summary"
for s in "${summary[@]}"; do echo "   $s"; done
if [[ $status -ne 0 ]]; then
  echo "== fuzz: FAILED (replay a reproducer with: build-fuzz/out/<target> FILE," \
       "or with the GCC replay binary <target>_replay FILE)"
  exit 1
fi
echo "== fuzz: OK"
