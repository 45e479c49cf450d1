#!/usr/bin/env bash
# Trees: tidy (branch ws-tidy: checks), ncs (branch meas-nc-short: WB_FWD_VARIANT A/B).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh tidy ncs || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-tidy
export PYTHONPATH=/tmp/tidy
( timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_fp8_gpu.py tests/test_gpu.py -k "wgmma or persistent or block or plan or registry or fp8 or kernel" > /tmp/t/pytest-tidy.log 2>&1; echo "rc $?" >> /tmp/t/pytest-tidy.log ) &
( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/memcheck-tidy.txt 2>&1; echo "rc $?" >> /tmp/t/memcheck-tidy.txt ) &
wait
echo "pytest tidy: $(grep -E 'passed|failed|error' /tmp/t/pytest-tidy.log | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" /tmp/t/pytest-tidy.log | head -10
echo "memcheck tidy: $(grep -h 'ERROR SUMMARY\|^run_cases\|^rc' /tmp/t/memcheck-tidy.txt | tr '\n' ' ')"
echo "checked $(( $(date +%s)-t0 )) s"
cd /tmp/src-ncs
export PYTHONPATH=/tmp/ncs
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = {}
for d, lq, lk, b, h, hk, causal, variants in ((64, 512, 512, 4, 16, 4, False, "1245"), (64, 1000, 1100, 2, 8, 8, False, "1245"), (64, 700, 300, 8, 32, 4, False, "1245"),
        (64, 1500, 1500, 4, 16, 4, True, "5"), (64, 3000, 2900, 1, 8, 2, True, "5"), (128, 600, 900, 8, 16, 4, False, "6"), (128, 1000, 1000, 4, 16, 16, False, "6")):
    q = torch.randn(b, lq, h, d, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, lk, hk, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    os.environ["WB_FWD_VARIANT"] = "0"
    o0, l0 = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="wgmma")
    for var in variants:
        os.environ["WB_FWD_VARIANT"] = var
        o, l = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="wgmma")
        e = max((o.float() - o0.float()).abs().max().item(), (l - l0).abs().nan_to_num(0).max().item())
        worst[var] = max(worst.get(var, 0), e)
print("worst |variant - main| per variant:", worst)
PY
timeout 120 python3 /tmp/agree.py > /tmp/t/agree.txt 2>&1; tail -1 /tmp/t/agree.txt
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2,4,5 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 0 --seqlens 512,1024,1536 --rounds 6 --calls 4 > /tmp/t/abenv-d64nc.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d64nc.txt
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,5 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 512,1024,2048,3072,4096 --rounds 6 --calls 4 > /tmp/t/abenv-d64c.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d64c.txt
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,6 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 0 --seqlens 512,1024 --rounds 6 --calls 4 > /tmp/t/abenv-d128nc.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-d128nc.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/run4.tgz -C /tmp/t .
