"""One forward or backward call of the FA2 grid (bf16, batch 16384 / L, heads 2048 / D), repeated three
times after the forward that makes out and lse, for a profiler to pick one launch of:

    ncu --set full --import-source no -k regex:flash_bwd_wgmma_ws --launch-skip 1 --launch-count 1 -o bwd \\
        python benchmarks/profile_call.py bwd 128 4096 0
    ncu --import bwd.ncu-rep --page source --print-source sass --csv > bwd-sass.csv
    python benchmarks/ncu_stalls.py bwd-sass.csv

Arguments: fwd|bwd, head dim, L, causal (0/1), and optionally the backend (default wgmma).
"""
import sys

import torch

import waveboost


def main(argv):
    which, d, L, causal = argv[0], int(argv[1]), int(argv[2]), bool(int(argv[3]))
    backend = argv[4] if len(argv) > 4 else "wgmma"
    b, h = max(1, 16384 // L), max(1, 2048 // d)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, dout = (torch.randn(b, L, h, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
    out, lse = waveboost.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    for _ in range(3):
        if which == "bwd":
            waveboost.attention_backward(dout, q, k, v, out, lse, causal=causal, backend=backend)
        else:
            waveboost.attention(q, k, v, causal=causal, backend=backend)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
