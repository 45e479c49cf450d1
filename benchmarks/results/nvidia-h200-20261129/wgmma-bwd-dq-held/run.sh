#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=${TARBALLS:?folder of main.tgz and new.tgz} bash benchmarks/build_trees.sh main new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_backward_gpu.py tests/test_backward.py > /tmp/t/pytest.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest.log )
tail -2 /tmp/t/pytest.log
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck; do
  ( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 150 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --backward-only > /tmp/t/$tool.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in memcheck racecheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' /tmp/t/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
for tree in main new; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384 >/dev/null; done
for r in 1 2 3; do
  order="main new"; [ $((r % 2)) = 0 ] && order="new main"
  for tree in $order; do PYTHONPATH=/tmp/$tree timeout 60 python3 benchmarks/ab_time.py $tree --backend wgmma --pass bwd --head-dims 64,128 --seqlens 1024,4096,16384 >> /tmp/t/ab-wgmma.txt; done
  echo "round $r $(( $(date +%s)-t0 )) s"
  [ $(( $(date +%s)-t0 )) -gt 330 ] && break
done
python3 benchmarks/ab_table.py /tmp/t/ab-wgmma.txt
tar czf $OUT/c7.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
