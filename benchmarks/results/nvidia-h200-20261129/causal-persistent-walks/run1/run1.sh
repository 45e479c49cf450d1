#!/usr/bin/env bash
# Trees: thr (branch d64-causal-threshold: checks), lw (branch meas-local-walk: WB_FWD_VARIANT A/B).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh thr lw || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-thr
export PYTHONPATH=/tmp/thr
( timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_gpu.py -k "wgmma or persistent or block" > /tmp/t/pytest-thr.log 2>&1; echo "rc $?" >> /tmp/t/pytest-thr.log ) &
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
( timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/memcheck-thr.txt 2>&1; echo "rc $?" >> /tmp/t/memcheck-thr.txt ) &
( timeout 200 compute-sanitizer --tool synccheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/synccheck-thr.txt 2>&1; echo "rc $?" >> /tmp/t/synccheck-thr.txt ) &
cat > /tmp/rc_thr.py <<'PY'
import torch, waveboost
g = torch.Generator(device="cuda").manual_seed(5)
n = 0
for b, lq, lk, h, hk in ((1, 4096, 4096, 2, 1), (1, 3000, 2500, 2, 2)):
    q = torch.randn(b, lq, h, 64, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, lk, hk, 64, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    waveboost.attention(q, k, v, causal=True, return_lse=True, backend="wgmma"); n += 1
torch.cuda.synchronize(); print(f"threshold shapes: {n} calls OK")
PY
( timeout 200 compute-sanitizer --tool racecheck --print-limit 20 python3 /tmp/rc_thr.py > /tmp/t/racecheck-thr.txt 2>&1; echo "rc $?" >> /tmp/t/racecheck-thr.txt ) &
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest thr: $(grep -E 'passed|failed|error' /tmp/t/pytest-thr.log | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" /tmp/t/pytest-thr.log | head -10
for f in memcheck synccheck racecheck; do echo "$f thr: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|calls OK\|^rc\|Error' /tmp/t/$f-thr.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-lw
export PYTHONPATH=/tmp/lw
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = {}
for d, lq, lk, b, h, hk, variants in ((128, 512, 512, 4, 16, 4, "234"), (128, 1000, 1100, 2, 8, 8, "234"), (128, 2048, 2048, 2, 8, 2, "34"),
                                        (128, 8192, 8192, 1, 4, 4, "5"), (64, 512, 512, 4, 16, 4, "1"), (64, 3000, 2900, 1, 8, 2, "1"), (64, 700, 1500, 3, 4, 2, "1")):
    q = torch.randn(b, lq, h, d, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, lk, hk, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    os.environ["WB_FWD_VARIANT"] = "0"
    o0, l0 = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="wgmma")
    for var in variants:
        os.environ["WB_FWD_VARIANT"] = var
        o, l = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="wgmma")
        e = max((o.float() - o0.float()).abs().max().item(), (l - l0).abs().nan_to_num(0).max().item())
        worst[var] = max(worst.get(var, 0), e)
        print(d, lq, lk, var, f"{e:.3g}", "plan", waveboost.plan(q, k, v, causal=True, backend="wgmma").get("persistent") if hasattr(waveboost, "plan") else "")
print("worst |variant - main| per variant:", worst)
PY
timeout 120 python3 /tmp/agree.py > /tmp/t/agree.txt 2>&1; tail -1 /tmp/t/agree.txt
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,2,3,4,5 --backend wgmma --pass fwd --dtypes bf16 --head-dims 128 --causal 1 --seqlens 512,1024,2048,4096,8192,16384 --rounds 6 --calls 4 > /tmp/t/abenv-d128.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d128.txt
echo "d128 $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 512,1024,2048,3072,4096 --rounds 6 --calls 4 > /tmp/t/abenv-d64.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d64.txt
echo "d64 $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WAVEBOOST_WGMMA_D64_ROWS --values 192,64 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 4096,5120,6144 --rounds 6 --calls 4 > /tmp/t/abenv-rows.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-rows.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/run1.tgz -C /tmp/t .
