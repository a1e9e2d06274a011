#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz entry point: the project's own fuzz/build.sh
# (the OSS-Fuzz build contract: $CC, $CXX, $CFLAGS, $CXXFLAGS,
# $LIB_FUZZING_ENGINE, $OUT, $WORK), which writes every target, its
# <target>_seed_corpus.zip and <target>.options to $OUT.
#
# The base image's CXXFLAGS select libc++; the distribution's C++ libraries
# the targets link (Highway, fmt) are built against libstdc++, so the targets
# use libstdc++ too.
export CXXFLAGS="${CXXFLAGS//-stdlib=libc++/}"
"$SRC/qknorm/fuzz/build.sh"

# The fuzzers run in the base-runner image, which has none of the
# distribution's libraries: copy each shared library a target needs, other
# than the C runtime's own, into $OUT/lib and point the target there
# (OSS-Fuzz's documented way for runtime dependencies).
mkdir -p "$OUT/lib"
while read -r t; do
  ldd "$OUT/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
  patchelf --set-rpath '$ORIGIN/lib' "$OUT/$t"
done <"$OUT/qknorm_fuzz_targets.txt"
