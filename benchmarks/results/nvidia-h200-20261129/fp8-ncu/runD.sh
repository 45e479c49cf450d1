#!/usr/bin/env bash
# Nsight Compute of the e4m3 forward (head dim 128, L = 8192, B = 2, H = 16, non-causal: the persistent grid) and of
# cuDNN's FP8 attention (through JAX) on the same shape, one launch each.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
t0=$(date +%s); T=$OUT
git -C . log -1 --format=%h 2>/dev/null
TARBALLS=.devrun bash benchmarks/build_trees.sh main || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cat > /tmp/prof8.py <<'PY'
import math, sys, torch
impl, L, causal = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
D, H = 128, 16
B = 16384 // L
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, L, H, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
if impl == "wb":
    import waveboost
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    f = lambda: waveboost.attention(q8, k8, v8, causal=causal)
    print(waveboost.plan(q8, k8, v8, causal=causal))
    sync = torch.cuda.synchronize
else:
    import jax, jax.numpy as jnp
    from jax._src.cudnn import fused_attention_stablehlo as fa
    params = {name: jnp.ones((1, 1, 1, 1), jnp.float32) for name in fa.fp8_params_keys}
    mask = fa.MaskType.CAUSAL if causal else fa.MaskType.NO_MASK
    fn = jax.jit(lambda q, k, v: fa.dot_product_attention(q, k, v, scale=1 / math.sqrt(D), mask_type=mask,
                                                          use_fp8=True, fp8_params=params)[0])
    jq, jk, jv = (jnp.asarray(x.float().cpu().numpy()).astype(jnp.float8_e4m3fn) for x in (q, k, v))
    f = lambda: fn(jq, jk, jv).block_until_ready()
    sync = lambda: None
for _ in range(5):
    f()
sync(); torch.cuda.synchronize()
torch.cuda.profiler.start()
f()
sync(); torch.cuda.synchronize()
torch.cuda.profiler.stop()
PY
cd /tmp/src-main; export PYTHONPATH=/tmp/main
for impl in wb cudnn; do
  n=$impl-e4m3-noncausal-8192
  timeout 200 ncu --set full --import-source no --profile-from-start off --launch-count 3 -o /tmp/$n python3 /tmp/prof8.py $impl 8192 0 > $T/$n.log 2>&1
  tail -2 $T/$n.log
  ncu --import /tmp/$n.ncu-rep --page source --print-source sass --csv > /tmp/$n.csv 2>/dev/null
  python3 benchmarks/ncu_stalls.py /tmp/$n.csv 40 > $T/stalls-$n.txt 2>&1
  ncu --import /tmp/$n.ncu-rep --page details > $T/details-$n.txt 2>&1
  ncu --import /tmp/$n.ncu-rep --page raw --csv > /tmp/raw-$n.csv 2>/dev/null; gzip -c /tmp/raw-$n.csv > $T/raw-$n.csv.gz
  gzip -c /tmp/$n.csv > $T/$n.csv.gz
  echo "== $n"; head -3 $T/stalls-$n.txt
  grep -E "^  [a-zA-Z_].*\(|^\s+(Duration|Executed Instructions |Issue Slots Busy|Registers Per Thread|Block Size|Grid Size|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|Executed Ipc Active)" $T/details-$n.txt | head -24
done
echo "total $(( $(date +%s)-t0 )) s"
