#!/usr/bin/env bash
# Every verdict and margin qknorm computes on its fixed inputs, written to one
# folder, so that a restructuring can be proven to change none of them:
#   scripts/verdict_snapshot.sh BUILD_DIR OUT_DIR
#   (after the change) scripts/verdict_snapshot.sh build/release /tmp/after
#   diff -r /tmp/before /tmp/after      # empty: nothing moved
# What it writes (every run is deterministic; no timings):
#   default.json   qknorm-check --no-timing --json (the default run), its
#                  measured costs removed
#   mutants.txt    qknorm-check mutants, its run-time line removed
#   power.csv/.dat qknorm-check power --out (every figure of the power table)
#   fuzz_<t>.log   each fuzz target's corpus replayed with
#                  QKNORM_FUZZ_VERDICT_LOG (one line per judged field:
#                  entry, case, verdict, margin and the naive's, %.17g)
# BUILD_DIR must hold a Release build of qknorm-check and the *_replay
# targets. Exit 0 when every piece was written.
set -euo pipefail
build=${1:?usage: verdict_snapshot.sh BUILD_DIR OUT_DIR}
out=${2:?usage: verdict_snapshot.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
check="$build/cli/qknorm-check"
"$check" --no-timing --json "$out/default.json.raw" >/dev/null || true
# --no-timing keeps the measured costs (the cost block, each case's seconds,
# the estimate): drop them, so that only verdicts and figures remain.
python3 - "$out/default.json.raw" "$out/default.json" <<'PY'
import json, sys
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items()
                if not ("second" in k or k in ("cost", "estimate", "timing"))}
    return [strip(v) for v in x] if isinstance(x, list) else x
json.dump(strip(json.load(open(sys.argv[1]))), open(sys.argv[2], "w"),
          indent=1, sort_keys=True)
PY
rm -f "$out/default.json.raw"
"$check" mutants 2>&1 | grep -v -E '^(run time|took|elapsed)|[0-9.]+ s( wall)?$' \
  >"$out/mutants.txt" || true
"$check" power --out "$out/power" >/dev/null 2>&1 || true
rm -f "$out/power.png" "$out/power.gp"  # the plot script names $out
for t in attention_fuzzer scalenorm_fuzzer; do
  rm -f "$out/fuzz_$t.log"
  QKNORM_FUZZ_VERDICT_LOG="$out/fuzz_$t.log" \
    "$build/fuzz/${t}_replay" "$root/fuzz/corpus/$t" 2>/dev/null >/dev/null
done
ls -l "$out"
