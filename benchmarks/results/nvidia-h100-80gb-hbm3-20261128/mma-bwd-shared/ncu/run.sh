#!/bin/bash
# The mma backward (FlashAttention-2's layout) beside FlashAttention-2's own kernel under ncu: bf16, 4k keys, head dims 128 and 64.
cd "${REPO:-.}"
mkdir -p /tmp/logs
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
echo "built: $(( $(date +%s) - start )) s"
M=gpu__time_duration.sum,sm__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_lg_throttle,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_ldsm.sum,dram__bytes.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic
for D in 128 64; do
H=$((2048 / D))
timeout 100 ncu --metrics $M -k regex:flash_bwd_mma_kernel --launch-skip 1 --launch-count 1 python3 benchmarks/ab_time.py x --pass bwd --backend mma --dtypes bf16 --head-dims $D --seqlens 4096 --causal 0 --repeats 1 > $OUT/ncu-ours-d$D.txt 2>&1
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
timeout 100 ncu --metrics $M -k regex:"flash_bwd_dq_dk_dv" --launch-skip 1 --launch-count 1 python3 /tmp/fa2.py > $OUT/ncu-fa2-d$D.txt 2>&1
echo "d$D done: $(( $(date +%s) - start )) s"
done
for D in 128 64; do echo "== D$D: metric | ours | FA2"; python3 - $OUT/ncu-ours-d$D.txt $OUT/ncu-fa2-d$D.txt <<'PY'
import sys, re
def read(f):
    d = {}
    for line in open(f):
        m = re.match(r"\s+(\S+)\s+(\S+)\s+([\d,.]+)\s*$", line)
        if m: d[m.group(1)] = m.group(3)
    return d
a, b = read(sys.argv[1]), read(sys.argv[2])
for k in a:
    print(f"{k[:70]:70s} {a[k]:>16s} {b.get(k, '-'):>16s}")
PY
done
