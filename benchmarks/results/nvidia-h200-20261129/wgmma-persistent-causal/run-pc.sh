#!/usr/bin/env bash
# Next session: main + persistent-causal.patch (persistent causal form WB_FWD_VARIANT=1, ping-pong turns =2, both =3)
# as .devrun/var.tgz (git archive of a branch with the patch applied); carry .devrun. ~5 min.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh var || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
for vv in 2 3; do
( cd /tmp/src-var && WB_FWD_VARIANT=$vv PYTHONPATH=/tmp/var timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_gpu.py tests/test_registry.py -k "wgmma or persistent or plan or block" > /tmp/t/pytest-v$vv.log 2>&1; echo "pytest rc $?" >> /tmp/t/pytest-v$vv.log ) &
done
wait
for vv in 2 3; do echo "v$vv: $(tail -2 /tmp/t/pytest-v$vv.log | tr '\n' ' ')"; done
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck synccheck; do
  ( cd /tmp/src-var && WB_FWD_VARIANT=3 PYTHONPATH=/tmp/var timeout 200 compute-sanitizer --tool $tool --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only > /tmp/t/$tool-v3.txt 2>&1 ) &
done
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in memcheck racecheck synccheck; do echo "$f-v3: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases' /tmp/t/$f-v3.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
for run in a b; do
  PYTHONPATH=/tmp/var python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2,3 --backend wgmma --pass fwd --dtypes bf16 --head-dims 128 --causal both --seqlens 2048,4096,8192,16384 --rounds 15 --calls 4 > /tmp/t/abenv-$run.txt 2>&1
  echo "== run $run ($(( $(date +%s)-t0 )) s)"; grep -A14 "^# paired" /tmp/t/abenv-$run.txt
done
tar czf $OUT/pc.tgz -C /tmp/t .
