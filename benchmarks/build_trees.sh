#!/usr/bin/env bash
# Builds the trees of an A/B side by side on one GPU machine: for each NAME, the `git archive` tarball
# $TARBALLS/NAME.tgz unpacked into /tmp/src-NAME and installed by pip into /tmp/NAME (build folder
# /tmp/build-NAME, log /tmp/logs/build-NAME.log), all at once, for CUDAARCHS (default 90). A tree is
# then used with PYTHONPATH=/tmp/NAME. Prints what failed and exits 1 if any tree did not build.
#
#   TARBALLS=DIR bash benchmarks/build_trees.sh NAME...
#
# Sourced (`source benchmarks/build_trees.sh`), it only defines build_tree (benchmarks/ab_trees.sh).

# build_tree SRC SITE BUILD LOG: pip install of the source folder SRC into SITE (build folder BUILD,
# output to LOG) for CUDAARCHS (default 90).
build_tree() {
  python3 -m pip install -q --no-build-isolation --no-deps --target "$2" -Cbuild-dir="$3" "$1" \
      -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDAARCHS:-90}" > "$4" 2>&1
}
[ "${BASH_SOURCE[0]}" != "$0" ] && return 0

set -uo pipefail
: "${TARBALLS:?a folder with the git archive tarballs NAME.tgz}"
mkdir -p /tmp/logs
for n in "$@"; do
  # A tree of the same name from an earlier call on a warm machine goes first: pip --target does not
  # replace a package folder that exists (the build folder stays, for an incremental build).
  rm -rf "/tmp/src-$n" "/tmp/$n"
  mkdir -p "/tmp/src-$n" && tar xzf "$TARBALLS/$n.tgz" -C "/tmp/src-$n"
  build_tree "/tmp/src-$n" "/tmp/$n" "/tmp/build-$n" "/tmp/logs/build-$n.log" &
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
