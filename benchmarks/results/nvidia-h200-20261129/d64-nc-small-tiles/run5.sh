#!/usr/bin/env bash
# Tree: branch d64-nc-small-tiles: checks, then the forward FA2 grid beside the peers.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=.devrun bash benchmarks/build_trees.sh nc || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cd /tmp/src-nc
export PYTHONPATH=/tmp/nc
( timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 6 tests/test_wgmma_pipeline.py tests/test_registry.py tests/test_fp8_gpu.py tests/test_gpu.py -k "wgmma or persistent or block or plan or registry or fp8 or kernel" > /tmp/t/pytest.log 2>&1; echo "rc $?" >> /tmp/t/pytest.log ) &
cat > /tmp/rc_nc.py <<'PY'
import torch, waveboost
g = torch.Generator(device="cuda").manual_seed(3)
n = 0
for dt in (torch.bfloat16, torch.float16):
    for b, lq, lk, h, hk, persistent in ((4, 1000, 900, 16, 4, True), (6, 333, 129, 20, 4, True), (4, 700, 2300, 8, 2, False)):
        q = torch.randn(b, lq, h, 64, generator=g, device="cuda").to(dt)
        k, v = (torch.randn(b, lk, hk, 64, generator=g, device="cuda").to(dt) for _ in range(2))
        assert waveboost.plan(q, k, v, backend="wgmma")["persistent"] == persistent, (b, lq, lk)
        waveboost.attention(q, k, v, return_lse=True, backend="wgmma"); n += 1
torch.cuda.synchronize(); print(f"head dim 64 non-causal small tiles: {n} calls OK")
PY
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
( timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/memcheck.txt 2>&1; echo "rc $?" >> /tmp/t/memcheck.txt ) &
( timeout 200 compute-sanitizer --tool synccheck --print-limit 20 python3 tests/sanitize/run_cases.py --forward-only --wgmma-only > /tmp/t/synccheck.txt 2>&1; echo "rc $?" >> /tmp/t/synccheck.txt ) &
( timeout 200 compute-sanitizer --tool racecheck --print-limit 20 python3 /tmp/rc_nc.py > /tmp/t/racecheck.txt 2>&1; echo "rc $?" >> /tmp/t/racecheck.txt ) &
wait
unset PYTORCH_NO_CUDA_MEMORY_CACHING
echo "pytest: $(grep -E 'passed|failed|error' /tmp/t/pytest.log | tail -2 | tr '\n' ' ')"
grep -E "^FAILED|^ERROR" /tmp/t/pytest.log | head -10
for f in memcheck synccheck racecheck; do echo "$f: $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\|calls OK\|^rc\|Error' /tmp/t/$f.txt | tr '\n' ' ')"; done
echo "checked $(( $(date +%s)-t0 )) s"
B="python3 -m waveboost.bench --no-charts --plain --device cuda --preset fa2 --repeats 20 --budget-ms 100"
timeout 150 $B --dtypes bfloat16,float16 --pass fwd --head-dims 64,128 --impls waveboost_wgmma,sdpa_flash,sdpa_cudnn,jax_cudnn,fa3 --out /tmp/t/fwd > /tmp/t/fwd.log 2>&1
echo "fwd $(( $(date +%s)-t0 )) s"; grep "^|" /tmp/t/fwd/summary.md | sed -n '/^| cell/,$p' | cut -c1-160 | head -60
tar czf $OUT/nc.tgz -C /tmp/t .
