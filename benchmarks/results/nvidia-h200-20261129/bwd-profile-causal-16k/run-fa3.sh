#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); mkdir -p /tmp/t
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/t/wheels.log 2>&1 || tail -3 /tmp/t/wheels.log
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
n=fa3-causal-16k
timeout 200 ncu --set full --import-source no --kernel-name-base demangled -k regex:FlashAttnBwdSm90 --launch-skip 1 --launch-count 1 -o /tmp/t/$n python3 /tmp/fa3.py > /tmp/t/$n.log 2>&1
tail -3 /tmp/t/$n.log
ncu --import /tmp/t/$n.ncu-rep --page source --print-source sass --csv > /tmp/t/$n.csv 2>/dev/null
python3 benchmarks/ncu_stalls.py /tmp/t/$n.csv 60 > /tmp/t/stalls-$n.txt 2>&1
ncu --import /tmp/t/$n.ncu-rep --page details > /tmp/t/details-$n.txt 2>&1
gzip -f /tmp/t/$n.csv; rm -f /tmp/t/$n.ncu-rep
head -4 /tmp/t/stalls-$n.txt; grep -E "^\s+(Duration|Executed Instructions |Issue Slots Busy|Registers Per Thread|Achieved Occupancy|Block Size|Grid Size|Dynamic Shared)" /tmp/t/details-$n.txt | head -10
tar czf $OUT/c6.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
