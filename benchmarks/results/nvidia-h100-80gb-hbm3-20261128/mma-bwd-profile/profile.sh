#!/bin/bash
# Why the mma backward runs at 0.70-0.82x SDPA flash's: the same cell (bf16, D128, L4k, FA2 grid) under ncu,
# ours (flash_bwd_mma) beside FA2's (torch's flash backward kernel), a few throughput metrics each.
cd "${REPO:-.}"
mkdir -p /tmp/logs
python3 -m pip install -q --no-build-isolation --no-deps . -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 > /tmp/logs/build.log 2>&1 || { tail -30 /tmp/logs/build.log; exit 1; }
M=gpu__time_duration.sum,sm__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_long_scoreboard,l1tex__t_bytes.sum,dram__bytes.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic
timeout 200 ncu --metrics $M -k regex:flash_bwd_mma --launch-skip 1 --launch-count 1 python3 benchmarks/ab_time.py x --pass bwd --backend mma --dtypes bf16 --head-dims 128 --seqlens 4096 --causal 0 --repeats 1 > $OUT/ncu-ours.txt 2>&1
cat > /tmp/fa2.py <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, L, D = 4, 16, 4096, 128
q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v); o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
timeout 200 ncu --metrics $M -k regex:"flash_bwd_dq_dk_dv|flash_bwd" --launch-skip 1 --launch-count 1 python3 /tmp/fa2.py > $OUT/ncu-fa2.txt 2>&1
grep -E "flash_bwd|duration|inst_executed|hmma|wavefronts|conflicts|warps_active|stalled|bytes|registers|shared_mem" $OUT/ncu-ours.txt $OUT/ncu-fa2.txt | cut -c1-200
