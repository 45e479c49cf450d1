#!/usr/bin/env bash
# Tree: branch meas-d64-192-persistent (or main + meas-d64-192-persistent.patch): head dim 64's 192-row blocks on the
# persistent grid, WB_FWD_VARIANT read per call (1: non-causal, walk kGrid; 2 / 3: causal, dealt / heaviest first;
# 4: as 2 with causal calls from 2048 rows in 192-row blocks).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh p192 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-p192
export PYTHONPATH=/tmp/p192
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = {}
for lq, lk, b, h, hk, causal, variants in ((2048, 2048, 4, 16, 4, False, "1"), (4500, 4200, 1, 12, 3, False, "1"),
        (8192, 8192, 1, 8, 8, True, "23"), (4500, 4200, 1, 12, 3, True, "234"), (2100, 2600, 2, 8, 2, True, "4"), (3000, 2000, 2, 8, 2, True, "4")):
    q = torch.randn(b, lq, h, 64, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(b, lk, hk, 64, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
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
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 0 --seqlens 2048,4096,8192,16384 --rounds 6 --calls 4 > /tmp/t/abenv-nc.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-nc.txt
python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,2,3,4 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 64 --causal 1 --seqlens 2048,3072,4096,6144,8192,16384 --rounds 6 --calls 4 > /tmp/t/abenv-c.txt 2>&1
grep -A20 "^# paired" /tmp/t/abenv-c.txt
echo "total $(( $(date +%s)-t0 )) s"
tar czf $OUT/p192.tgz -C /tmp/t .
