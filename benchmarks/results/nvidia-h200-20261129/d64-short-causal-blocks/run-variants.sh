#!/usr/bin/env bash
# Tree: branch meas-d64-blocks (WB_FWD_VARIANT 7 / 8: head dim 64's 64-row blocks over 64-key tiles, 3 / 4 blocks per SM).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh pb || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-pb
export PYTHONPATH=/tmp/pb
( WB_FWD_VARIANT=7 timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests/test_wgmma_pipeline.py tests/test_gpu.py -k "wgmma or persistent or block" > /tmp/t/pytest-v7.log 2>&1; echo "rc $?" >> /tmp/t/pytest-v7.log ) &
( WB_FWD_VARIANT=7 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/memcheck-v7.txt 2>&1; echo "rc $?" >> /tmp/t/memcheck-v7.txt ) &
wait
echo "pytest v7: $(tail -2 /tmp/t/pytest-v7.log | tr '\n' ' ')"
echo "memcheck v7: $(grep -h 'ERROR SUMMARY\|^run_cases\|^rc' /tmp/t/memcheck-v7.txt | tr '\n' ' ')"
echo "checked $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,7,8 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal both --seqlens 512,1024,2048 --rounds 8 --calls 4 > /tmp/t/abenv.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/pb.tgz -C /tmp/t .
