"""mma against wgmma where the grid is small: the data behind backend "auto"'s grid rule.

Both paths give each block 128 query rows of one (batch, head); mma fits two blocks on an SM,
wgmma one. This times both (and SDPA's flash and cuDNN kernels) at head dim 64, fp16, over
batch * heads and sequence lengths whose grids run from one block to several waves, with CUDA
events around each call after an L2 flush, median of the repeats.

    python benchmarks/small_grid_sweep.py [--repeats 40] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import waveboost

BLOCK_M = 128  # query rows per block, both paths


def median_ms(fn, repeats, flush):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    d = args.head_dim
    rows = []
    print(f"{torch.cuda.get_device_name(0)}, {sms} SMs, head_dim {d}, fp16; times in us")
    print(f"{'B*H':>5} {'L':>5} {'causal':>6} {'blocks':>6} {'mma':>8} {'wgmma':>8} {'mma/wgmma':>9} "
          f"{'flash':>8} {'cudnn':>8}")
    for causal in (False, True):
        for bh in (1, 2, 4, 8, 16, 32, 64, 128):
            for seqlen in (128, 256, 512, 1024, 1536):
                b, h = (1, bh) if bh <= 16 else (bh // 16, 16)
                q, k, v = (torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.float16) for _ in range(3))
                row = {"bh": bh, "seqlen": seqlen, "causal": causal, "blocks": bh * -(-seqlen // BLOCK_M)}
                for backend in ("mma", "wgmma"):
                    row[backend] = 1e3 * median_ms(
                        lambda: waveboost.attention(q, k, v, causal=causal, backend=backend), args.repeats, flush)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(kernel):
                            row[name] = 1e3 * median_ms(
                                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                args.repeats, flush)
                    except RuntimeError:
                        row[name] = float("nan")
                rows.append(row)
                print(f"{bh:>5} {seqlen:>5} {str(causal):>6} {row['blocks']:>6} {row['mma']:>8.1f} "
                      f"{row['wgmma']:>8.1f} {row['mma'] / row['wgmma']:>9.2f} {row['flash']:>8.1f} "
                      f"{row['cudnn']:>8.1f}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
