#!/usr/bin/env bash
# A/B main vs new: mma backward (stmatrix), wgmma backward (uniform warpgroup), wgmma deterministic
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
t0=$(date +%s)
TARBALLS=${TARBALLS:?folder of main.tgz and new.tgz} bash benchmarks/build_trees.sh main new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
ab() {  # name rounds args...
  local name=$1 rounds=$2; shift 2
  for tree in main new; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >/dev/null || echo "warm $tree failed"; done
  for r in $(seq $rounds); do
    order="main new"; [ $((r % 2)) = 0 ] && order="new main"
    for tree in $order; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >> $OUT/ab-$name.txt; done
  done
  echo "== $name ($(( $(date +%s)-t0 )) s)"; python3 benchmarks/ab_table.py $OUT/ab-$name.txt
}
ab mma 3 --backend mma --pass bwd --head-dims 64,128 --seqlens 1024,4096
ab wgmma 3 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384
ab wgmma-det 2 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096 --deterministic
echo "total $(( $(date +%s)-t0 )) s"
