#!/bin/bash
# merged main (plan-persistent + mma-bwd-epilogue + mma-bwd-dq-v2): whole GPU suite + sanitizer; then per-instruction
# ncu of the mma backward (ours) and FlashAttention-2's backward, bf16 4k non-causal, D 64 and 128.
cd "${REPO:-.}"
start=$(date +%s)
WHEELS=${WHEELS:?folder with the flash_attn3_jax and einops wheels} WORKERS=12 TEST_TIMEOUT=420 bash benchmarks/gpu_check.sh tests 2>&1 | tail -25
echo "check: $(( $(date +%s) - start )) s"
mkdir -p $OUT/ncu
for D in 64 128; do
H=$((2048 / D))
timeout 70 ncu --set full --import-source no -k regex:flash_bwd_mma_kernel --launch-skip 1 --launch-count 1 -o /tmp/ours$D \
  python3 benchmarks/ab_time.py x --pass bwd --backend mma --dtypes bf16 --head-dims $D --seqlens 4096 --causal 0 --repeats 1 > /tmp/ncu-ours$D.log 2>&1
ncu --import /tmp/ours$D.ncu-rep --page source --print-source sass --csv > /tmp/ours$D.csv 2>/dev/null
python3 benchmarks/ncu_stalls.py /tmp/ours$D.csv 40 > $OUT/ncu/stalls-ours-d$D.txt 2>&1
cat > /tmp/fa2.py <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, L, D = 4, $H, 4096, $D
q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v); o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
timeout 70 ncu --set full --import-source no -k regex:"flash_bwd_dq_dk_dv" --launch-skip 1 --launch-count 1 -o /tmp/fa2$D python3 /tmp/fa2.py > /tmp/ncu-fa2$D.log 2>&1
ncu --import /tmp/fa2$D.ncu-rep --page source --print-source sass --csv > /tmp/fa2$D.csv 2>/dev/null
python3 benchmarks/ncu_stalls.py /tmp/fa2$D.csv 40 > $OUT/ncu/stalls-fa2-d$D.txt 2>&1
for n in ours fa2; do ncu --import /tmp/$n$D.ncu-rep --page details > $OUT/ncu/details-$n-d$D.txt 2>&1; gzip -c /tmp/$n$D.csv > $OUT/ncu/sass-$n-d$D.csv.gz; done
echo "ncu d$D: $(( $(date +%s) - start )) s"
head -3 $OUT/ncu/stalls-ours-d$D.txt $OUT/ncu/stalls-fa2-d$D.txt
done
