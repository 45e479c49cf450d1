#!/usr/bin/env bash
# Tree: main: forward + backward at head dim 128 (bf16) beside the peers.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh main || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-main
export PYTHONPATH=/tmp/main
B="python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --repeats 20 --budget-ms 100"
timeout 110 $B --dtypes bfloat16 --pass fwdbwd --head-dims 128 --impls waveboost_auto,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/train > /tmp/t/train.log 2>&1
echo "train $(( $(date +%s)-t0 )) s"; grep "^|" /tmp/t/train/summary.md | sed -n '/^| cell/,$p' | cut -c1-160 | head -20
tar czf $OUT/train.tgz -C /tmp/t .
