#!/usr/bin/env bash
# Trees: f8p (branch fp8-persistent), wpp (branch ws-persistent-pick), p192 (branch meas-d64-192-persistent).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT; mkdir -p $T
TARBALLS=.devrun bash benchmarks/build_trees.sh f8p wpp p192 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
K='wgmma or persistent or block or plan or registry or fp8 or kernel'
# wpp: the full check set
( cd /tmp/src-wpp && PYTHONPATH=/tmp/wpp timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 5 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_fp8_gpu.py tests/test_gpu.py -k "$K" > $T/wpp-pytest.log 2>&1; echo "rc $?" >> $T/wpp-pytest.log ) &
( cd /tmp/src-wpp && PYTHONPATH=/tmp/wpp timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > $T/wpp-memcheck.txt 2>&1; echo "rc $?" >> $T/wpp-memcheck.txt ) &
# f8p: fp8 tests and the wgmma set with the variant on
( cd /tmp/src-f8p && WB_FWD_VARIANT=1 PYTHONPATH=/tmp/f8p timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 5 tests/test_wgmma_pipeline.py tests/test_fp8_gpu.py tests/test_gpu.py -k "$K" > $T/f8p-pytest-v1.log 2>&1; echo "rc $?" >> $T/f8p-pytest-v1.log ) &
( cd /tmp/src-f8p && WB_FWD_VARIANT=1 PYTHONPATH=/tmp/f8p timeout 240 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > $T/f8p-memcheck-v1.txt 2>&1; echo "rc $?" >> $T/f8p-memcheck-v1.txt ) &
( cd /tmp/src-f8p && WB_FWD_VARIANT=1 PYTHONPATH=/tmp/f8p timeout 240 compute-sanitizer --tool racecheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > $T/f8p-racecheck-v1.txt 2>&1; echo "rc $?" >> $T/f8p-racecheck-v1.txt ) &
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
for f in wpp-pytest.log f8p-pytest-v1.log; do echo "$f: $(grep -E 'passed|failed|error' $T/$f | tail -2 | tr '\n' ' ')"; grep -E "^FAILED|^ERROR" $T/$f | head -5; done
for f in wpp-memcheck.txt f8p-memcheck-v1.txt f8p-racecheck-v1.txt; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|^run_cases\|^rc' $T/$f | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-f8p; export PYTHONPATH=/tmp/f8p
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
timeout 100 python3 /tmp/agree.py > $T/f8p-agree.txt 2>&1; tail -1 $T/f8p-agree.txt
timeout 150 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1 --backend wgmma --pass fwd --dtypes e4m3 --head-dims 128 --causal both --seqlens 512,1024,2048,4096,8192,16384 --rounds 6 --calls 4 > $T/f8p-abenv.txt 2>&1
grep -A16 "^# paired" $T/f8p-abenv.txt
echo "total $(( $(date +%s)-t0 )) s"
