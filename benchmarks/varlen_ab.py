"""Varlen prefill against the dense call on the same tokens, timed alternately in one process.

    python benchmarks/varlen_ab.py [BACKEND ...]      (default: wgmma auto)

bf16, 16 heads, (8, 2048, 16, D) dense against the same tensors packed to (16384, 16, D) through
attention_varlen (cu_seqlens and max_seqlen given, out= preallocated for both), D = 64 and 128,
causal or not. 20 rounds, each timing 5 calls of either by CUDA events; the rounds alternate which
of the two goes first (so neither gains from the clocks or the cache the other left), and each
ratio is of the medians. Prints one line per cell: backend, D, causal, the two medians, their ratio.
"""
from __future__ import annotations

import statistics
import sys

import torch

import waveboost
from varlen_bench import cu, time_ms  # benchmarks/, the script's folder

BATCH, SEQLEN, HEADS = 8, 2048, 16


def main(backends: list[str]) -> None:
    torch.manual_seed(0)
    for backend in backends:
        for d in (64, 128):
            for causal in (False, True):
                q4, k4, v4 = (torch.randn(BATCH, SEQLEN, HEADS, d, device="cuda", dtype=torch.bfloat16)
                              for _ in range(3))
                q3, k3, v3 = (x.reshape(BATCH * SEQLEN, HEADS, d) for x in (q4, k4, v4))
                cu_eq = cu([SEQLEN] * BATCH)
                o4, o3 = torch.empty_like(q4), torch.empty_like(q3)

                def dense():
                    waveboost.attention(q4, k4, v4, causal=causal, backend=backend, out=o4)

                def varlen():
                    waveboost.attention_varlen(q3, k3, v3, cu_eq, cu_eq, max_seqlen_q=SEQLEN, max_seqlen_k=SEQLEN,
                                               causal=causal, out=o3, backend=backend)

                for _ in range(3):
                    dense()
                    varlen()
                t_dense, t_varlen = [], []
                for r in range(20):
                    pair = ((t_dense, dense), (t_varlen, varlen)) if r % 2 else ((t_varlen, varlen), (t_dense, dense))
                    for times, fn in pair:
                        times.append(time_ms(fn, reps=1, warmup=0))  # one round: 5 calls
                md, mv = statistics.median(t_dense), statistics.median(t_varlen)
                print(f"{backend} D={d} causal={int(causal)} dense {md:.4f} ms varlen {mv:.4f} ms ratio {mv / md:.3f}",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["wgmma", "auto"])
