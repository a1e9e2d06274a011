#!/usr/bin/env bash
# The benchmark (issue 8): builds bench/ in Release in its own build dir
# (build-bench/release), runs every f32 simd and blas registry entry beside
# the anchors (cblas_sgemm on the same GEMMs, the FMA peak, the torch peer),
# prints the side-by-side table and the goal verdicts, and writes
# out/bench/bench.csv and out/bench/bench.json. See bench/README.md.
#
#   ./bench.sh               full grid (~10-15 min on an idle 2-core box)
#   ./bench.sh --quick       d=64, n in {128, 512}, best simd target + blas
#                            (~2 min)
#   ./bench.sh --callgrind   instruction counts of one forward and one
#                            backward call of every entry (valgrind), table
#                            and out/bench/callgrind.{csv,json}
# Options: --rounds R (default 3), --reps K (default 2): R rounds, each one
#   process of qknorm-bench with K repetitions per benchmark in random
#   interleaved order, then the torch peer; R*K >= 5 samples per row.
#   --no-torch skips the peer; --install-torch apt-installs python3-torch
#   (the peer is optional: without torch its columns read "-").
#   --peer-omp-active: leave torch's OpenMP wait policy at its default (the
#   peer runs with OMP_WAIT_POLICY=PASSIVE otherwise; see bench/README.md).
#   --min-time S: seconds per repetition (default 0.05).
#   --head: build and measure a clean export of the committed HEAD
#   (git archive into build-bench/head-src) instead of the working tree, so
#   that others' uncommitted edits in a shared checkout cannot break or
#   change the run; the table names the commit either way.
#   Anything after "--" goes to qknorm-bench (e.g. -- --qk_entries='blas:*').
set -euo pipefail
cd "$(dirname "$0")"

mode=full rounds=3 reps=2 torch=1 install_torch=0 min_time=0.05 head=0
omp_wait=PASSIVE
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --callgrind) mode=callgrind ;;
    --rounds) rounds=$2; shift ;;
    --reps) reps=$2; shift ;;
    --min-time) min_time=$2; shift ;;
    --no-torch) torch=0 ;;
    --head) head=1 ;;
    --peer-omp-active) omp_wait= ;;
    --install-torch) install_torch=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

OUT=out/bench
mkdir -p "$OUT"
PY=/usr/bin/python3
SRC=. TAG=
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$head" = 1 ]; then
  SRC=build-bench/head-src TAG=head-
  # Export to a staging dir, then copy only the files that changed, so that
  # unchanged sources keep their mtimes and the build stays incremental.
  stage=build-bench/head-stage
  rm -rf "$stage" && mkdir -p "$stage" "$SRC"
  git archive HEAD | tar -x -C "$stage"
  (cd "$stage" && find . -type f) | while read -r f; do
    if ! cmp -s "$stage/$f" "$SRC/$f"; then
      mkdir -p "$(dirname "$SRC/$f")" && cp "$stage/$f" "$SRC/$f"  # mtime now: rebuilt
    fi
  done
  (cd "$SRC" && find . -type f) | while read -r f; do
    [ -e "$stage/$f" ] || rm -f "$SRC/$f"
  done
  rm -rf "$stage"
else
  git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
fi

if [ "$install_torch" = 1 ]; then
  # Optional peer only; never part of the test suite's dependencies.
  scripts/ensure_deps.sh python3-torch
fi

if [ "$mode" = callgrind ]; then
  command -v valgrind >/dev/null || { echo "bench.sh: valgrind not installed" >&2; exit 1; }
  # Valgrind 3.19 cannot execute AVX-512: this build compiles no AVX3 targets
  # (HWY_DISABLED_TARGETS = HWY_AVX3 | HWY_AVX3_DL = 384), and OpenBLAS
  # picks its kernels from valgrind's CPUID (Haswell here).
  BUILD=build-bench/${TAG}callgrind
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS=-DHWY_DISABLED_TARGETS=384 >/dev/null
  cmake --build "$BUILD" --target qknorm-callgrind -j"$(nproc)"
  DUMPS="$OUT/callgrind"
  rm -rf "$DUMPS" && mkdir -p "$DUMPS"
  shape_args=(--n=256 --d=64 --heads=2)
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 valgrind --tool=callgrind \
    --collect-atstart=no --callgrind-out-file="$DUMPS/callgrind.out.%p" \
    "$BUILD/bench/qknorm-callgrind" "${shape_args[@]}" "${extra[@]}" \
    2> "$DUMPS/valgrind.log" | sed 's/^/  /'
  exec $PY "$SRC/bench/report.py" callgrind --dumps "$DUMPS" --out-dir "$OUT" \
    --shape "B1 H2 n256 d64, qknorm g=12.32, OPENBLAS_NUM_THREADS=1"
fi

BUILD=build-bench/${TAG}release
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DQKNORM_BUILD_BENCH=ON -DQKNORM_ENABLE_SIMD=ON -DQKNORM_ENABLE_BLAS=ON >/dev/null
cmake --build "$BUILD" --target qknorm-bench -j"$(nproc)"
BIN="$BUILD/bench/qknorm-bench"

if [ "$mode" = quick ]; then
  grid=(--qk_n=128,512 --qk_d=64 --qk_full_targets=1 --qk_sanity= --qk_formulations=)
  torch_grid=(--n 128,512 --d 64)
  [ "$rounds" = 3 ] && rounds=1
  [ "$reps" = 2 ] && reps=5
else
  grid=()
  torch_grid=()
fi
if [ $((rounds * reps)) -lt 5 ]; then
  echo "bench.sh: rounds x reps = $((rounds * reps)) < 5 samples" >&2
  exit 2
fi

have_torch=0
if [ "$torch" = 1 ] && $PY -c 'import torch' 2>/dev/null; then have_torch=1; fi
[ "$torch" = 1 ] && [ "$have_torch" = 0 ] &&
  echo "bench.sh: torch not importable by $PY: peer skipped (--install-torch)"

RAW="$OUT/raw"
rm -rf "$RAW" && mkdir -p "$RAW"
threads_list=1,2
for arg in "${extra[@]}"; do
  case "$arg" in --qk_threads=*) threads_list=${arg#--qk_threads=} ;; esac
done

run_torch() {  # round
  [ "$have_torch" = 1 ] || return 0
  for t in ${threads_list//,/ }; do
    echo "== round $1: torch peer, $t thread(s)"
    # ${omp_wait:+...}: no OMP_WAIT_POLICY at all with --peer-omp-active.
    env ${omp_wait:+OMP_WAIT_POLICY=$omp_wait} \
      OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t $PY "$SRC/bench/torch_peer.py" \
      --threads "$t" --reps "$reps" --min-time "$min_time" "${torch_grid[@]}" \
      --out "$RAW/torch_r$1_t$t.json" 2> "$RAW/torch_r$1_t$t.log"
  done
}
run_gb() {  # round
  echo "== round $1: qknorm-bench, $reps interleaved repetitions"
  "$BIN" "${grid[@]}" "${extra[@]}" \
    --benchmark_repetitions="$reps" \
    --benchmark_enable_random_interleaving=true \
    --benchmark_min_time="$min_time" \
    --benchmark_out="$RAW/gb_r$1.json" --benchmark_out_format=json \
    --benchmark_format=console --benchmark_display_aggregates_only=true \
    > "$RAW/gb_r$1.log" 2>&1 || { cat "$RAW/gb_r$1.log"; exit 1; }
}

start=$(date +%s)
for r in $(seq 1 "$rounds"); do
  # Alternate the order so that slow drifts of the shared machine's load do
  # not always land on the same side.
  if [ $((r % 2)) = 1 ]; then run_gb "$r"; run_torch "$r"; else run_torch "$r"; run_gb "$r"; fi
done
echo "== measured in $(( $(date +%s) - start )) s"

shopt -s nullglob
torch_files=("$RAW"/torch_r*.json)
$PY "$SRC/bench/report.py" bench --gb "$RAW"/gb_r*.json \
  ${torch_files[@]:+--torch "${torch_files[@]}"} --out-dir "$OUT" \
  --meta "commit=$commit" \
  "date=$(date -u +%FT%TZ)" "mode=$mode" "rounds=$rounds" "reps=$reps" \
  | tee "$OUT/table.txt"
