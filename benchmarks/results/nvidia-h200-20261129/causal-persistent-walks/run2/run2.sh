#!/usr/bin/env bash
# Tree: lw (branch meas-local-walk: WB_FWD_VARIANT 6 / 7, the paired walk).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh lw || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-lw
export PYTHONPATH=/tmp/lw
( WB_FWD_VARIANT=6 timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 4 tests/test_wgmma_pipeline.py tests/test_gpu.py -k "wgmma or persistent or block" > /tmp/t/pytest-v6.log 2>&1; echo "rc $?" >> /tmp/t/pytest-v6.log ) &
( WB_FWD_VARIANT=7 timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 4 tests/test_wgmma_pipeline.py tests/test_gpu.py -k "wgmma or persistent or block" > /tmp/t/pytest-v7.log 2>&1; echo "rc $?" >> /tmp/t/pytest-v7.log ) &
wait
echo "pytest v6: $(grep -E 'passed|failed|error' /tmp/t/pytest-v6.log | tail -1)  v7: $(grep -E 'passed|failed|error' /tmp/t/pytest-v7.log | tail -1)"
grep -hE "^FAILED|^ERROR" /tmp/t/pytest-v6.log /tmp/t/pytest-v7.log | head -10
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = {}
for d, lq, lk, b, h, hk, variants in ((128, 512, 512, 4, 16, 4, "36"), (128, 1000, 1100, 2, 8, 8, "36"), (128, 2048, 2048, 2, 8, 2, "36"),
                                        (128, 8192, 8192, 1, 4, 4, "6"), (128, 3000, 2000, 1, 5, 1, "6"), (64, 512, 512, 4, 16, 4, "17"), (64, 3000, 2900, 1, 8, 2, "17"), (64, 700, 1500, 3, 4, 2, "17")):
    q = torch.randn(b, lq, h, d, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, lk, hk, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    os.environ["WB_FWD_VARIANT"] = "0"
    o0, l0 = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="wgmma")
    for var in variants:
        os.environ["WB_FWD_VARIANT"] = var
        o, l = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="wgmma")
        e = max((o.float() - o0.float()).abs().max().item(), (l - l0).abs().nan_to_num(0).max().item())
        worst[var] = max(worst.get(var, 0), e)
print("worst |variant - main| per variant:", worst)
PY
timeout 120 python3 /tmp/agree.py > /tmp/t/agree.txt 2>&1; tail -1 /tmp/t/agree.txt
echo "checked $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,3,4,6 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 1 --seqlens 512,1024,2048,3072,4096,6144,8192,16384 --rounds 6 --calls 4 > /tmp/t/abenv-d128.txt 2>&1
grep -A40 "^# paired" /tmp/t/abenv-d128.txt
echo "d128 $(( $(date +%s)-t0 )) s"
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,7 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 512,1024,2048,4096 --rounds 6 --calls 4 > /tmp/t/abenv-d64.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d64.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/run2.tgz -C /tmp/t .
