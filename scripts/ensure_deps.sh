#!/usr/bin/env bash
# Installs the Debian 12 packages qknorm needs, skipping apt-get entirely when
# `dpkg -s` reports every one already installed. Run as root (or with sudo).
# Usage: scripts/ensure_deps.sh [extra-package ...]
set -euo pipefail

PACKAGES=(
  g++ cmake ninja-build pkg-config   # toolchain (GCC 12, CMake 3.25)
  libhwy-dev                         # Google Highway 1.0.3: SIMD kernels
  libopenblas-dev                    # OpenBLAS 0.3.21: BLAS path
  libgtest-dev                       # GoogleTest
  librapidcheck-dev                  # rapidcheck: property tests
  libbenchmark-dev                   # Google Benchmark: bench/
  libcli11-dev                       # CLI11: qknorm-check option parsing
  nlohmann-json3-dev                 # nlohmann-json: --json reports
  libfmt-dev                         # fmt: report formatting
  gnuplot-nox                        # gnuplot: sweep plots (PNG)
  python3                            # /usr/bin/python3: bench/report.py and
                                     # its test, the torch round-trip test
                                     # (which skips without torch)
  clang clang-14 libclang-rt-14-dev  # Clang 14 (clang, clang++) + libFuzzer/
                                     # sanitizer runtimes: fuzz and sanitizer
                                     # stages
  "$@"
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "ensure_deps: all ${#PACKAGES[@]} packages present, skipping apt-get"
  exit 0
fi

echo "ensure_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
