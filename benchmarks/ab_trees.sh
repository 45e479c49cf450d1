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
arch="${CUDAARCHS:-90}"
build() {  # build DIR SITE LOG
  (cd "$1" && python3 -m pip install -q --no-build-isolation --no-deps --target "$2" . -Cbuild-dir="$2-build" \
      -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" > "$3" 2>&1) || { echo "build of $1 failed: $3"; tail -5 "$3"; exit 1; }
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
python3 - "$out/ab.txt" <<'PY'
import math, statistics, sys
times = {}
for line in open(sys.argv[1]):
    tree, *cell, ms = line.split()
    times.setdefault((tree, tuple(cell)), []).append(float(ms))
cells = sorted({c for _, c in times})
med, best = [], []
print("pass backend dtype D L causal | old ms | new ms (medians) | old / new | of the best rounds")
for c in cells:
    o, n = times.get(("old", c)), times.get(("new", c))
    if o and n:
        med.append(statistics.median(o) / statistics.median(n))
        best.append(min(o) / min(n))
        print(" ".join(c), f"| {statistics.median(o):.4f} | {statistics.median(n):.4f} | {med[-1]:.3f} | {best[-1]:.3f}")
geo = lambda r: math.exp(sum(map(math.log, r)) / len(r))
if med:
    print(f"medians: geomean old / new {geo(med):.4f}, min {min(med):.3f}, max {max(med):.3f} over {len(med)} cells")
    print(f"best rounds: geomean old / new {geo(best):.4f}, min {min(best):.3f}, max {max(best):.3f}")
PY
