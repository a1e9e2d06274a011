#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz entry point: the project's own fuzz/build.sh
# (the OSS-Fuzz build contract: $CC, $CXX, $CFLAGS, $CXXFLAGS,
# $LIB_FUZZING_ENGINE, $OUT, $WORK), which writes every target and its
# <target>_seed_corpus.zip to $OUT.
#
# The base image's CXXFLAGS select libc++; the distribution's C++ libraries
# the targets link (Highway, fmt) are built against libstdc++, so the targets
# use libstdc++ too.
export CXXFLAGS="${CXXFLAGS//-stdlib=libc++/}"
exec "$SRC/qknorm/fuzz/build.sh"
