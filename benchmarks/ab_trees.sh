#!/usr/bin/env bash
# A/B of two builds of waveboost on one GPU, interleaved: another revision's files in OLD_DIR (made with
# `git archive REV | tar -x -C DIR`, then carried to the GPU machine) against this tree. Both are built
# for CUDAARCHS (default 90); benchmarks/ab_time.py (only the stable API) times each in turn: one
# discarded warm-up run of each, then ROUNDS rounds in alternating order (old new, new old, ...), so
# that neither build always runs first on a cooler GPU. The table at the end gives, per cell, the
# median over the rounds of each build and old / new of those medians (and of the best rounds).
#
#   bash benchmarks/ab_trees.sh OLD_DIR ROUNDS [ab_time.py options, e.g. --backend mma --pass bwd]
#
# Logs and ab.txt go to $OUT (or ./ab-logs).
set -uo pipefail
old=$1
rounds=$2
shift 2
out="${OUT:-ab-logs}"
mkdir -p "$out"
source "$(dirname "$0")/build_trees.sh"  # build_tree
build() {  # build DIR SITE LOG
  build_tree "$1" "$2" "$2-build" "$3" || { echo "build of $1 failed: $3"; tail -5 "$3"; exit 1; }
}
build "$old" /tmp/ab-old-site "$out/build-old.log" &
build . /tmp/ab-new-site "$out/build-new.log"
wait $! || exit 1
for tree in old new; do
  PYTHONPATH=/tmp/ab-$tree-site python3 benchmarks/ab_time.py "$tree" "$@" > /dev/null || exit 1
done
for r in $(seq "$rounds"); do
  order="old new"
  [ $((r % 2)) = 0 ] && order="new old"
  for tree in $order; do
    PYTHONPATH=/tmp/ab-$tree-site python3 benchmarks/ab_time.py "$tree" "$@" >> "$out/ab.txt" || exit 1
  done
done
python3 benchmarks/ab_table.py "$out/ab.txt"
