#!/usr/bin/env bash
# The whole test suite: install missing packages, build (Release), run every
# ctest test. Set QKNORM_SOAK=1 for the long property-test soak (see
# property_tests/README.md).
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure_deps.sh
BUILD=${QKNORM_BUILD_DIR:-build/release}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
ctest --test-dir "$BUILD" -j"$(nproc)" --output-on-failure --timeout 1500
