#!/usr/bin/env bash
# The main job: install missing packages, build (Release), and run
# qknorm-check's built-in default suite on every registry entry.
# Extra arguments go to qknorm-check (see `./run.sh --help`).
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure_deps.sh
BUILD=${QKNORM_BUILD_DIR:-build/release}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target qknorm-check -j"$(nproc)"
exec "$BUILD/cli/qknorm-check" "$@"
