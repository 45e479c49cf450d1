#!/usr/bin/env bash
# Tree xi (branch meas-cross-item): the persistent kernel's deferred output (default) and the output right after
# each item's key tiles (WB_FWD_VARIANT=1, the schedule main runs). Checks on the default, equality of the two,
# then ab_env (first value the base: 1, the immediate output).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s); T=$OUT; ROOT=$PWD  # this checkout: its benchmarks/gpu_checks.sh
TARBALLS=.devrun bash benchmarks/build_trees.sh xi || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-xi; export PYTHONPATH=/tmp/xi
bash $ROOT/benchmarks/gpu_checks.sh $T
echo "checked $(( $(date +%s)-t0 )) s"
cat > /tmp/same.py <<'PY'
import os, torch, waveboost
g = torch.Generator(device="cuda").manual_seed(11)
bad = 0; n = 0
for dt, d, shapes in ((torch.bfloat16, 128, ((4, 1000, 700, 16, 4), (2, 2500, 3100, 32, 1))), (torch.float16, 64, ((4, 1000, 900, 16, 4), (3, 650, 700, 24, 4))),
                      (torch.float8_e4m3fn, 128, ((4, 1000, 700, 16, 4), (8, 512, 512, 16, 16)))):
    for b, lq, lk, h, hk in shapes:
        for causal in (False, True):
            q = torch.randn(b, lq, h, d, generator=g, device="cuda").to(dt)
            k, v = (torch.randn(b, lk, hk, d, generator=g, device="cuda").to(dt) for _ in range(2))
            outs = []
            for var in ("0", "1"):
                os.environ["WB_FWD_VARIANT"] = var
                outs.append(waveboost.attention(q, k, v, causal=causal, return_lse=True, backend="wgmma"))
            same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1].nan_to_num(0), outs[1][1].nan_to_num(0))
            bad += not same; n += 1
print(f"deferred against immediate output: {n - bad} of {n} calls bitwise equal")
PY
timeout 120 python3 /tmp/same.py > $T/same.txt 2>&1; tail -1 $T/same.txt
timeout 240 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 1,0 --backend wgmma --pass fwd --dtypes bf16 --head-dims 64,128 --causal both --seqlens 512,1024,2048,4096 --rounds 6 --calls 4 > $T/abenv16.txt 2>&1
grep -A20 "^# paired" $T/abenv16.txt
timeout 120 python3 benchmarks/ab_env.py --env WB_FWD_VARIANT --values 1,0 --backend wgmma --pass fwd --dtypes e4m3 --head-dims 128 --causal both --seqlens 512,1024,2048,4096 --rounds 6 --calls 4 > $T/abenv8.txt 2>&1
grep -A12 "^# paired" $T/abenv8.txt
echo "total $(( $(date +%s)-t0 )) s"
