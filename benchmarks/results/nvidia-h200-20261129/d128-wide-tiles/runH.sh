#!/usr/bin/env bash
# Tree w16 (branch meas-d128-wide): head dim 128 16-bit non-causal 192-key tiles under WB_FWD_VARIANT 1 / 2.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT
TARBALLS=.devrun bash benchmarks/build_trees.sh w16 || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-w16; export PYTHONPATH=/tmp/w16
cat > /tmp/agree.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(7)
worst = {}
for dt in (torch.bfloat16, torch.float16):
    for b, lq, lk, h, hk in ((2, 1000, 9000, 4, 2), (1, 777, 8300, 4, 1), (3, 300, 650, 8, 8), (1, 4100, 4200, 2, 2)):
        q = torch.randn(b, lq, h, 128, generator=g, device="cuda").to(dt)
        k, v = (torch.randn(b, lk, hk, 128, generator=g, device="cuda").to(dt) for _ in range(2))
        os.environ["WB_FWD_VARIANT"] = "0"
        o0, l0 = waveboost.attention(q, k, v, return_lse=True, backend="wgmma")
        for var in "12":
            os.environ["WB_FWD_VARIANT"] = var
            o, l = waveboost.attention(q, k, v, return_lse=True, backend="wgmma")
            e = max((o.float() - o0.float()).abs().max().item(), (l - l0).abs().max().item())
            worst[var] = max(worst.get(var, 0), e)
print("worst |variant - main| (O, LSE) per variant:", worst)
PY
timeout 100 python3 /tmp/agree.py > $T/agree.txt 2>&1; tail -1 $T/agree.txt
timeout 200 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 0,1,2 --backend wgmma --pass fwd --dtypes bf16,fp16 --head-dims 128 --causal 0 --seqlens 2048,4096,8192,16384 --rounds 6 --calls 4 > $T/abenv.txt 2>&1
grep -A12 "^# paired" $T/abenv.txt
echo "total $(( $(date +%s)-t0 )) s"
