#!/usr/bin/env bash
# The FP8 forward beside the peers (fp8_bench.py), then Nsight Compute of the short non-causal forward (FA2 grid at
# L = 512: B = 32, 16k tokens, hidden 2048), bf16: waveboost's wgmma kernel (main) and SDPA cuDNN's, one call each.
set -uo pipefail
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -m pip install -q --no-deps .whl/*.whl > /tmp/wheels.log 2>&1 || tail -3 /tmp/wheels.log
t0=$(date +%s); mkdir -p /tmp/t
TARBALLS=.devrun bash benchmarks/build_trees.sh main || { cp /tmp/logs/* $OUT/; exit 1; }
echo "built $(( $(date +%s)-t0 )) s"
cat > /tmp/prof.py <<'PY'
import sys, torch
impl, d = sys.argv[1], int(sys.argv[2])
L, hidden = 512, 2048
B, H = 16384 // L, hidden // d
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, L, H, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
if impl == "wb":
    import waveboost
    f = lambda: waveboost.attention(q, k, v, causal=False, backend="wgmma")
    print(waveboost.plan(q, k, v, causal=False, backend="wgmma"))
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    def f():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=False)
for _ in range(5):
    f()
torch.cuda.synchronize()
torch.cuda.profiler.start()
f()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
PY
cd /tmp/src-main
export PYTHONPATH=/tmp/main
timeout 150 python3 benchmarks/fp8_bench.py --csv /tmp/t/fp8.csv > /tmp/t/fp8.txt 2>&1
echo "fp8 $(( $(date +%s)-t0 )) s"; tail -40 /tmp/t/fp8.txt
for impl in wb cudnn; do for d in 64 128; do
  n=$impl-d$d-noncausal-512
  timeout 150 ncu --set full --import-source no --profile-from-start off --launch-count 4 -o /tmp/t/$n python3 /tmp/prof.py $impl $d > /tmp/t/$n.log 2>&1
  tail -2 /tmp/t/$n.log
  ncu --import /tmp/t/$n.ncu-rep --page source --print-source sass --csv > /tmp/t/$n.csv 2>/dev/null
  python3 benchmarks/ncu_stalls.py /tmp/t/$n.csv 40 > /tmp/t/stalls-$n.txt 2>&1
  ncu --import /tmp/t/$n.ncu-rep --page details > /tmp/t/details-$n.txt 2>&1
  gzip -f /tmp/t/$n.csv; rm -f /tmp/t/$n.ncu-rep
  echo "== $n"; head -3 /tmp/t/stalls-$n.txt
  grep -E "^  [a-zA-Z_].*\(|^\s+(Duration|Executed Instructions |Issue Slots Busy|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Size|Grid Size|Dynamic Shared Memory Per Block|SM Busy|Compute \(SM\) Throughput|Memory Throughput|Waves Per SM)" /tmp/t/details-$n.txt | head -40
done; done
tar czf $OUT/prof.tgz -C /tmp/t .
echo "total $(( $(date +%s)-t0 )) s"
