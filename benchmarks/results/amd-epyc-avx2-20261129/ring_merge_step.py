"""The ring's per-step merge, waveboost.distributed._merge_into (in place: mul_ then addcmul_ on the
accumulator's rows), against the expression form it replaced (four temporaries of the accumulator's size):
fp32 accumulator 1 x 4096 x 32 x 128, a bf16 step output, torch on the CPU, 2 threads, medians of 7 calls,
twice in turn.

    python benchmarks/results/amd-epyc-avx2-20261129/ring_merge_step.py
"""
import statistics
import time

import torch

from waveboost.distributed import _merge_into


def expression_form(acc_out, acc_lse, out, lse, rows):
    old_lse = acc_lse[:, :, rows]
    new_lse = torch.logaddexp(old_lse, lse)
    ref = torch.where(torch.isneginf(new_lse), torch.zeros_like(new_lse), new_lse)
    w_old = torch.exp(old_lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    acc_out[:, rows] = acc_out[:, rows] * w_old + out.to(acc_out.dtype) * w_new
    acc_lse[:, :, rows] = new_lse


def main():
    torch.set_num_threads(2)
    b, length, heads, dim = 1, 4096, 32, 128
    g = torch.Generator().manual_seed(0)
    acc, acc_lse = torch.randn(b, length, heads, dim, generator=g), torch.randn(b, heads, length, generator=g)
    out, lse = torch.randn(b, length, heads, dim, generator=g).bfloat16(), torch.randn(b, heads, length, generator=g)
    rows = slice(0, length)
    a1, l1, a2, l2 = acc.clone(), acc_lse.clone(), acc.clone(), acc_lse.clone()
    expression_form(a1, l1, out, lse, rows)
    _merge_into(a2, l2, out, lse, rows)
    print(f"max |difference|: out {(a1 - a2).abs().max().item():.3g}, lse {(l1 - l2).abs().max().item():.3g}")
    for name, f in (("expression", expression_form), ("in place", _merge_into)) * 2:
        times = []
        for _ in range(7):
            a, la = acc.clone(), acc_lse.clone()
            t = time.perf_counter()
            f(a, la, out, lse, rows)
            times.append(time.perf_counter() - t)
        print(f"{name}: {statistics.median(times) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
