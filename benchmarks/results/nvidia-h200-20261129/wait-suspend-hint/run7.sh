#!/usr/bin/env bash
# Trees: main (89895da) and hint (branch wait-hint: the mbarrier try_wait with a suspend-time hint), A/B in
# alternating processes (benchmarks/ab_time.py), then a short test run of the hint tree.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh main hint || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-hint
F="--backend wgmma --pass fwd --dtypes bf16 --head-dims 64,128 --causal both --seqlens 512,1024,4096,16384 --repeats 15"
W="--backend wgmma --pass bwd --dtypes bf16 --head-dims 128 --causal both --seqlens 1024,4096,16384 --repeats 10"
for tree in main hint; do PYTHONPATH=/tmp/$tree python3 benchmarks/ab_time.py $tree $F > /dev/null; done
for r in 1 2 3 4; do
  order="main hint"; [ $((r % 2)) = 0 ] && order="hint main"
  for tree in $order; do
    PYTHONPATH=/tmp/$tree timeout 60 python3 benchmarks/ab_time.py $tree $F >> /tmp/t/ab-fwd.txt
    PYTHONPATH=/tmp/$tree timeout 60 python3 benchmarks/ab_time.py $tree $W >> /tmp/t/ab-bwd.txt
  done
  echo "round $r $(( $(date +%s)-t0 )) s"
done
python3 benchmarks/ab_table.py /tmp/t/ab-fwd.txt | tee /tmp/t/table-fwd.txt
python3 benchmarks/ab_table.py /tmp/t/ab-bwd.txt | tee /tmp/t/table-bwd.txt
export PYTHONPATH=/tmp/hint
timeout 75 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_wgmma_pipeline.py tests/test_backward_gpu.py -k "wgmma" -x > /tmp/t/pytest-hint.log 2>&1; echo "rc $?" >> /tmp/t/pytest-hint.log
echo "pytest hint: $(grep -E 'passed|failed|error' /tmp/t/pytest-hint.log | tail -2 | tr '\n' ' ')"
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/run7.tgz -C /tmp/t .
