#!/usr/bin/env bash
# A property soak with its size counted: runs every registry property of
# qknorm_property_test (the `property` ctest label's entry tests) with
# QKNORM_SOAK=<mult> (fresh random seeds; mult x each property's cases) in
# <shards> parallel gtest shards, and prints the generated cases run (the sum
# of each test's recorded cases_run), the tests run and the failures, with
# each failure's message (its RC_PARAMS reproduce string) saved in OUT.
#   scripts/soak.sh BUILD_DIR MULT [SHARDS=nproc] [OUT=/tmp/qknorm-soak]
set -euo pipefail
build=${1:?usage: soak.sh BUILD_DIR MULT [SHARDS] [OUT]}
mult=${2:?usage: soak.sh BUILD_DIR MULT [SHARDS] [OUT]}
shards=${3:-$(nproc)}
out=${4:-/tmp/qknorm-soak}
bin=$build/property_tests/qknorm_property_test
[ -x "$bin" ] || { echo "soak.sh: $bin not built" >&2; exit 2; }
mkdir -p "$out"
pids=()
for ((i = 0; i < shards; i++)); do
  QKNORM_SOAK=$mult GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
    "$bin" --gtest_filter='Registry/*' --gtest_output="json:$out/shard$i.json" \
    > "$out/shard$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
python3 - "$out" "$shards" <<'PY'
import json, sys, glob
out, shards = sys.argv[1], int(sys.argv[2])
tests = cases = 0
failures = []
for f in sorted(glob.glob(out + "/shard*.json")):
    for suite in json.load(open(f))["testsuites"]:
        for t in suite["testsuite"]:
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                continue
            tests += 1
            cases += int(t.get("cases_run", 0))
            if t.get("failures"):
                failures.append((suite["name"] + "." + t["name"],
                                 t["failures"][0]["failure"]))
print(f"soak: {tests} property tests, {cases} generated cases, "
      f"{len(failures)} failed")
for name, msg in failures:
    print(f"FAIL {name}\n{msg}\n")
sys.exit(1 if failures else 0)
PY
