#!/usr/bin/env bash
# Builds the trees of an A/B side by side on one GPU machine: for each NAME, the `git archive` tarball
# $TARBALLS/NAME.tgz unpacked into /tmp/src-NAME and installed by pip into /tmp/NAME (build folder
# /tmp/build-NAME, log /tmp/logs/build-NAME.log), all at once, for CUDAARCHS (default 90). A tree is
# then used with PYTHONPATH=/tmp/NAME. Prints what failed and exits 1 if any tree did not build.
#
#   TARBALLS=DIR bash benchmarks/build_trees.sh NAME...
set -uo pipefail
: "${TARBALLS:?a folder with the git archive tarballs NAME.tgz}"
arch="${CUDAARCHS:-90}"
mkdir -p /tmp/logs
for n in "$@"; do
  mkdir -p "/tmp/src-$n" && tar xzf "$TARBALLS/$n.tgz" -C "/tmp/src-$n"
  python3 -m pip install -q --no-build-isolation --no-deps --target "/tmp/$n" -Cbuild-dir="/tmp/build-$n" "/tmp/src-$n" \
      -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" > "/tmp/logs/build-$n.log" 2>&1 &
done
wait
status=0
for n in "$@"; do
  if [ ! -d "/tmp/$n/waveboost" ]; then
    echo "$n build failed"
    tail -20 "/tmp/logs/build-$n.log"
    status=1
  fi
done
exit $status
