#!/usr/bin/env bash
# build d128w + xi, GPU checks on both side by side, then bitwise equality of the xi schedules
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); T=$OUT; ROOT=$PWD
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh d128w xi || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-d128w && PYTHONPATH=/tmp/d128w bash $ROOT/benchmarks/gpu_checks.sh $T/d128w > $T/d128w-checks.txt 2>&1 ) &
( cd /tmp/src-xi && PYTHONPATH=/tmp/xi bash $ROOT/benchmarks/gpu_checks.sh $T/xi > $T/xi-checks.txt 2>&1 ) &
wait
echo "== d128w"; cat $T/d128w-checks.txt; echo "== xi"; cat $T/xi-checks.txt
echo "checked $(( $(date +%s)-t0 )) s"
sed -n '/^cat > \/tmp\/same.py/,/^PY$/p' benchmarks/results/nvidia-h200-20261129/cross-item-output/run-cross.sh | sed '1d;$d' > /tmp/same.py
cd /tmp/src-xi && PYTHONPATH=/tmp/xi timeout 120 python3 /tmp/same.py > $T/same.txt 2>&1; tail -3 $T/same.txt
echo "total $(( $(date +%s)-t0 )) s"
