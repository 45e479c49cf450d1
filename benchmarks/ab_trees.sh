#!/usr/bin/env bash
# A/B of two builds of waveboost on one GPU, interleaved: another revision's files in OLD_DIR (made with
# `git archive REV | tar -x -C DIR`, then carried to the GPU machine) against this tree. Both are built
# for CUDAARCHS (default 90); benchmarks/ab_time.py (only the stable API) times each in turn, ROUNDS
# times old, new, old, new, ...; the table at the end has the best of the rounds per cell and old / new.
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
arch="${CUDAARCHS:-90}"
build() {  # build DIR SITE LOG
  (cd "$1" && python3 -m pip install -q --no-build-isolation --no-deps --target "$2" . -Cbuild-dir="$2-build" \
      -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" > "$3" 2>&1) || { echo "build of $1 failed: $3"; tail -5 "$3"; exit 1; }
}
build "$old" /tmp/ab-old-site "$out/build-old.log" &
build . /tmp/ab-new-site "$out/build-new.log"
wait $! || exit 1
for r in $(seq "$rounds"); do
  for tree in old new; do
    PYTHONPATH=/tmp/ab-$tree-site python3 benchmarks/ab_time.py "$tree" "$@" >> "$out/ab.txt" || exit 1
  done
done
python3 - "$out/ab.txt" <<'PY'
import math, sys
best = {}
for line in open(sys.argv[1]):
    tree, *cell, ms = line.split()
    key = (tree, tuple(cell))
    best[key] = min(best.get(key, math.inf), float(ms))
cells = sorted({c for _, c in best})
ratios = []
print("pass backend dtype D L causal | old ms | new ms | old / new")
for c in cells:
    o, n = best.get(("old", c)), best.get(("new", c))
    if o and n:
        ratios.append(o / n)
        print(" ".join(c), f"| {o:.4f} | {n:.4f} | {o / n:.3f}")
if ratios:
    print(f"geomean old / new {math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f} over {len(ratios)} cells")
PY
