#!/usr/bin/env bash
# whole GPU suite on main; ncu of the causal wgmma backward (16k, D128) beside FlashAttention-3's
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
TARBALLS=${TARBALLS:?folder of new.tgz} bash benchmarks/build_trees.sh new || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
( cd /tmp/src-new && PYTHONPATH=/tmp/new timeout 320 python3 -m pytest -q -p no:cacheprovider -o addopts="" -n 8 tests > /tmp/t/pytest-all.log 2>&1; echo "pytest exit $?" >> /tmp/t/pytest-all.log )
tail -3 /tmp/t/pytest-all.log; grep -E "^(FAILED|ERROR)" /tmp/t/pytest-all.log | head
echo "suite $(( $(date +%s)-t0 )) s"
cat > /tmp/fa3.py <<'PY'
import jax, jax.numpy as jnp
from flash_attn3_jax import flash_mha
B, L, H, D = 1, 16384, 16, 128
ks = jax.random.split(jax.random.PRNGKey(0), 4)
q, k, v, do = (jax.random.normal(kk, (B, L, H, D), jnp.bfloat16) for kk in ks)
f = jax.jit(jax.grad(lambda q, k, v: (flash_mha(q, k, v, is_causal=True).astype(jnp.float32) * do).sum(), argnums=(0, 1, 2)))
for _ in range(2):
    jax.block_until_ready(f(q, k, v))
PY
prof() {
  local n=$1; shift
  timeout 120 ncu --set full --import-source no "$@" > /tmp/t/$n.log 2>&1
  ncu --import /tmp/t/$n.ncu-rep --page source --print-source sass --csv > /tmp/t/$n.csv 2>/dev/null
  python3 benchmarks/ncu_stalls.py /tmp/t/$n.csv 60 > /tmp/t/stalls-$n.txt 2>&1
  ncu --import /tmp/t/$n.ncu-rep --page details > /tmp/t/details-$n.txt 2>&1
  gzip -f /tmp/t/$n.csv; rm -f /tmp/t/$n.ncu-rep
  echo "$n: $(( $(date +%s)-t0 )) s"; head -4 /tmp/t/stalls-$n.txt; grep -E "^\s+(Duration|Executed Instructions |Issue Slots Busy|Registers Per Thread)" /tmp/t/details-$n.txt | head -6
}
PYTHONPATH=/tmp/new prof ours-causal-16k -k regex:flash_bwd_wgmma_ws_kernel --launch-skip 1 --launch-count 1 -o /tmp/t/ours-causal-16k \
  python3 /tmp/src-new/benchmarks/ab_time.py x --pass bwd --backend wgmma --dtypes bf16 --head-dims 128 --seqlens 16384 --causal 1 --repeats 1
prof fa3-causal-16k -k regex:FlashAttnBwdSm90 --launch-skip 1 --launch-count 1 -o /tmp/t/fa3-causal-16k python3 /tmp/fa3.py
PYTHONPATH=/tmp/new timeout 100 python3 benchmarks/backward_bench.py --no-charts --plain --pass bwd --head-dims 64,128 --causal both --seqlens 1024,4096,16384 --impls waveboost_mma,sdpa_flash --out /tmp/t/bwd-mma-flash > /tmp/t/bwd-mma-flash.txt 2>&1
echo "mma-flash rc $? $(( $(date +%s)-t0 )) s"; grep -E "^\| L=" /tmp/t/bwd-mma-flash/summary.md | cut -d'|' -f2,3,4,5
tar czf $OUT/c5.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
