#!/usr/bin/env bash
# Tree: branch fp8-persistent (or main + fp8-persistent.patch): the e4m3 forward on the persistent grid where
# WB_FWD_VARIANT=1 (read per call). Checks with the variant on, then ab_env against the one-block form.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh f8p || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-f8p
export PYTHONPATH=/tmp/f8p
( WB_FWD_VARIANT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_fp8_gpu.py > /tmp/t/pytest-v1.log 2>&1; echo "rc $?" >> /tmp/t/pytest-v1.log ) &
( WB_FWD_VARIANT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/memcheck-v1.txt 2>&1; echo "rc $?" >> /tmp/t/memcheck-v1.txt ) &
( WB_FWD_VARIANT=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool racecheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/racecheck-v1.txt 2>&1; echo "rc $?" >> /tmp/t/racecheck-v1.txt ) &
wait
echo "pytest v1: $(grep -E 'passed|failed|error' /tmp/t/pytest-v1.log | tail -1)"
grep -E "^FAILED|^ERROR" /tmp/t/pytest-v1.log | head
for f in memcheck racecheck; do echo "$f v1: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' /tmp/t/$f-v1.txt | tr '\n' ' ')"; done
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = 0.0
for b, lq, lk, h, hk in ((4, 1000, 700, 16, 4), (8, 512, 512, 16, 16), (2, 4096, 4096, 16, 4), (1, 8300, 8200, 4, 4)):
    for causal in (False, True):
        q, k, v = (torch.randn(b, n, hh, 128, generator=g, device="cuda").to(torch.float8_e4m3fn)
                   for n, hh in ((lq, h), (lk, hk), (lk, hk)))
        os.environ["WB_FWD_VARIANT"] = "0"
        o0, l0 = waveboost.attention(q, k, v, causal=causal, return_lse=True)
        os.environ["WB_FWD_VARIANT"] = "1"
        o1, l1 = waveboost.attention(q, k, v, causal=causal, return_lse=True)
        e = max((o1.float() - o0.float()).abs().max().item(), (l1 - l0).abs().nan_to_num(0).max().item())
        worst = max(worst, e)
        print(b, lq, lk, causal, e)
print("worst |persistent - one block per query block|:", worst)
PY
timeout 120 python3 /tmp/agree.py > /tmp/t/agree.txt 2>&1; tail -1 /tmp/t/agree.txt
echo "checked $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1 --backend wgmma --pass fwd --dtypes e4m3 --head-dims 128 --causal both --seqlens 512,1024,2048,4096,8192,16384 --rounds 8 --calls 4 > /tmp/t/abenv.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/f8p.tgz -C /tmp/t .
