#!/usr/bin/env bash
# Tree: branch meas-short-causal (42b3a39, on c4a932f), variants.patch beside this script.
# 4: every non-causal head dim 128 call persistent (past 8192 keys); 5: head dim 64 causal 64-row blocks over
# 64-key tiles, 6: the same persistent.
# git archive meas-short-causal | gzip > .devrun/sc.tgz; carry [".devrun"]; ~5 min.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh sc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-sc
for vv in 3 6; do
( WB_FWD_VARIANT=$vv PYTHONPATH=/tmp/sc timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 4 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_gpu.py -k "wgmma or persistent or plan or block" > /tmp/t/pytest-v$vv.log 2>&1; echo "rc $?" >> /tmp/t/pytest-v$vv.log ) &
done
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for vv in 3 6; do for tool in memcheck racecheck synccheck; do
  ( WB_FWD_VARIANT=$vv PYTHONPATH=/tmp/sc timeout 250 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/$tool-v$vv.txt 2>&1; echo "rc $?" >> /tmp/t/$tool-v$vv.txt ) &
done; done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for vv in 3 6; do echo "pytest v$vv: $(tail -2 /tmp/t/pytest-v$vv.log | tr '\n' ' ')"; done
for f in /tmp/t/*check-v*.txt; do echo "$(basename $f): $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $f | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
for run in a b; do
  PYTHONPATH=/tmp/sc python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2,5,6 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64,128 --causal 1 --seqlens 512,1024,2048 --rounds 10 --calls 4 > /tmp/t/abenv-$run.txt 2>&1
  echo "== run $run ($(( $(date +%s)-t0 )) s)"; grep -A16 "^# paired" /tmp/t/abenv-$run.txt
done
PYTHONPATH=/tmp/sc python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,4 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 0 --seqlens 8192,16384 --rounds 10 --calls 2 > /tmp/t/abenv-v4.txt 2>&1
grep -A8 "^# paired" /tmp/t/abenv-v4.txt
tar czf $OUT/sc.tgz -C /tmp/t .
