#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
python3 benchmarks/hbm_read_ceiling.py --peak-gbs 4800 > $OUT/hbm-read-ceiling.txt 2>&1; tail -3 $OUT/hbm-read-ceiling.txt
echo "probe $(( $(date +%s)-t0 )) s"
TARBALLS=${TARBALLS:?folder of main.tgz and new.tgz} bash benchmarks/build_trees.sh main new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > $OUT/pytest.log 2>&1; echo "pytest rc $?" >> $OUT/pytest.log )
tail -2 $OUT/pytest.log
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( cd /tmp/src-new && PYTHONPATH=/tmp/new compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > $OUT/$tool.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in memcheck racecheck synccheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' $OUT/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
ab() {
  local name=$1 rounds=$2; shift 2
  for tree in main new; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >/dev/null || echo "warm $tree failed"; done
  for r in $(seq $rounds); do
    order="main new"; [ $((r % 2)) = 0 ] && order="new main"
    for tree in $order; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree "$@" >> $OUT/ab-$name.txt; done
  done
  echo "== $name ($(( $(date +%s)-t0 )) s)"; python3 benchmarks/ab_table.py $OUT/ab-$name.txt | tail -1
}
ab wgmma 4 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384
ab wgmma-det 2 --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096 --deterministic
echo "total $(( $(date +%s)-t0 )) s"
