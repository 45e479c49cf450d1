"""Merge probe: GPU time of waveboost.merge_attention_states on the shapes that context parallelism and
cascade attention merge, by part dtype, beside the same merge written in torch.

    python benchmarks/merge_probe.py [--tag T] [--peak-gbs G] [--shapes PxBxLxHxD,...] [--dtypes float32,bfloat16]

Prints one JSON line per (shape, part dtype): microseconds per merge, GB/s (the parts' O and LSE read
plus the output written) and % of peak HBM bandwidth, for
  waveboost  merge_attention_states(outs, lses, out=...) with outs (P, B, L, H, D) in the part dtype
             and lses (P, B, H, L) float32, out bf16;
  torch      the same merge in a few torch ops (max, exp, weighted sum in fp32, cast to bf16).
Each is timed as a CUDA graph of decode_bench.STEPS merges over distinct part copies (together over
150 MB where they fit, so HBM is read, not L2), the median of its replays.
"""
import argparse
import json

import torch

import waveboost
from waveboost.bench.hardware import peak_bandwidth

from decode_bench import _graph_step_us, copies_for  # this script's folder

# (parts, batch, L, heads, head_dim): ring shards of one long sequence (2-8 parts), a batch of
# prefix + suffix pairs (cascade), and the many small parts of a split decode step.
SHAPES = ((2, 1, 16384, 32, 128), (8, 1, 16384, 32, 128), (2, 16, 2048, 32, 128), (4, 4, 4096, 8, 64),
          (64, 8, 1, 32, 128))


def torch_merge(outs, lses, out):
    m = lses.amax(dim=0, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lses - m)  # (P, B, H, L)
    total = w.sum(dim=0)
    w = (w / total).permute(0, 1, 3, 2).unsqueeze(-1)  # (P, B, L, H, 1)
    out.copy_((outs.float() * w).sum(dim=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", default="")
    ap.add_argument("--peak-gbs", type=float, default=None)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--impls", default="waveboost,torch")
    ap.add_argument("--shapes", default="", help="parts x batch x L x heads x head_dim, comma-separated (default: "
                    + ",".join("x".join(map(str, s)) for s in SHAPES) + ")")
    args = ap.parse_args()
    if not set(args.impls.split(",")) <= {"waveboost", "torch"}:
        ap.error(f"--impls takes waveboost and torch; got {args.impls!r}")
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    peak, _ = peak_bandwidth("cuda", torch.cuda.get_device_name(), args.peak_gbs, torch.cuda.current_device())
    if peak is None:
        ap.error(f"no peak bandwidth known for {torch.cuda.get_device_name()!r}; give --peak-gbs")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for parts, b, length, h, d in shapes:
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            part_bytes = parts * b * length * h * d * dtype.itemsize + parts * b * h * length * 4
            moved = part_bytes + b * length * h * d * 2
            copies = copies_for(part_bytes)
            outs = [torch.randn(parts, b, length, h, d, generator=gen, device="cuda").to(dtype) for _ in range(copies)]
            lses = [3 * torch.randn(parts, b, h, length, generator=gen, device="cuda") for _ in range(copies)]
            out = torch.empty(b, length, h, d, device="cuda", dtype=torch.bfloat16)
            res = {"shape": [parts, b, length, h, d], "parts_dtype": dtype_name, "tag": args.tag}
            merges = {"waveboost": lambda i: waveboost.merge_attention_states(outs[i % copies], lses[i % copies],
                                                                             out=out),
                      "torch": lambda i: torch_merge(outs[i % copies], lses[i % copies], out)}
            for impl in args.impls.split(","):
                us = _graph_step_us(torch, merges[impl])
                res.update({impl: round(us, 2), impl + "_pct": round(100 * moved / us / 1e3 / peak, 1)})
            print(json.dumps(res), flush=True)
            del outs, lses


if __name__ == "__main__":
    main()
