#!/bin/bash
# per-instruction ncu stall tables: the mma backward of main (D64, D128) and of mma-bwd-addresses (D128), and
# FlashAttention-2's backward (SDPA flash), bf16 4k keys non-causal. All tables in one tarball.
cd "${REPO:-.}"
start=$(date +%s)
TARBALLS=${TARBALLS:?folder of the git archive tarballs} bash benchmarks/build_trees.sh main addr || exit 1
echo "built: $(( $(date +%s) - start )) s"
mkdir -p /tmp/t
prof() {  # name, D, tree (or fa2)
  local n=$1 D=$2 tree=$3 H=$((2048 / $2))
  if [ "$tree" = fa2 ]; then
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
    timeout 80 ncu --set full --import-source no -k regex:"flash_bwd_dq_dk_dv" --launch-skip 1 --launch-count 1 -o /tmp/t/$n python3 /tmp/fa2.py > /tmp/t/$n.log 2>&1
  else
    PYTHONPATH=/tmp/$tree timeout 80 ncu --set full --import-source no -k regex:flash_bwd_mma_kernel --launch-skip 1 --launch-count 1 -o /tmp/t/$n \
      python3 /tmp/src-$tree/benchmarks/ab_time.py x --pass bwd --backend mma --dtypes bf16 --head-dims $D --seqlens 4096 --causal 0 --repeats 1 > /tmp/t/$n.log 2>&1
  fi
  ncu --import /tmp/t/$n.ncu-rep --page source --print-source sass --csv > /tmp/t/$n.csv 2>/dev/null
  python3 benchmarks/ncu_stalls.py /tmp/t/$n.csv 60 > /tmp/t/stalls-$n.txt 2>&1
  ncu --import /tmp/t/$n.ncu-rep --page details > /tmp/t/details-$n.txt 2>&1
  gzip -f /tmp/t/$n.csv
  rm -f /tmp/t/$n.ncu-rep
  echo "$n: $(( $(date +%s) - start )) s"; head -3 /tmp/t/stalls-$n.txt
}
prof ours-d128 128 main
prof addr-d128 128 addr
prof fa2-d128 128 fa2
prof ours-d64 64 main
prof fa2-d64 64 fa2
tar czf $OUT/ncu-tables.tgz -C /tmp/t .
ls -la $OUT
echo "end: $(( $(date +%s) - start )) s"
