"""Decode probe: GPU time per decode step of waveboost beside SDPA cuDNN, on the same shapes, by one method.

    python benchmarks/decode_probe.py [--impls wb_blhd,wb_bhld,sdpa_cudnn,amax] [--tag T] [--peak-gbs G]
                                      [--shapes BxLxHxHKV,...] [--page-size P] [--head-dim D] [--seqlen-q N]
                                      [--backend B] [--kernels]

Prints one JSON line per shape (bf16, head dim 128 or --head-dim, one query per sequence or --seqlen-q):
microseconds per step and %
of peak HBM bandwidth (K/V cache bytes / time) for
  wb_blhd     waveboost.attention_with_kvcache on a (batch, L, heads_kv, D) cache (the usual layout);
  wb_bhld     the same call on head-major (batch, heads_kv, L, D) storage viewed as (batch, L, heads_kv, D):
              each head's keys contiguous, as SDPA reads its cache;
  sdpa_cudnn  torch SDPA's cuDNN backend on the head-major cache (enable_gqa);
  amax        torch.amax over K and V: a plain reduction reading the same bytes.
With --page-size, wb_blhd reads a paged cache instead: pages of P keys (num_pages, P, heads_kv, D) at
shuffled page ids through a block table (the other impls are unchanged).
Each is timed as a CUDA graph of 20 steps over distinct cache copies (together > 150 MB, so HBM is read,
not L2), the median of 15 replays; with --kernels, wb_blhd_kernels gives each kernel's mean device time per
step (eager calls under torch.profiler: the decode kernel, the combine, the zeroing of the arrival counters).
Environment variables of the decode launcher (e.g. WAVEBOOST_DECODE_BLOCKS_PER_SM) apply as usual; run one
process per setting.
"""
import argparse
import json

import torch

import waveboost
from waveboost.bench.hardware import peak_bandwidth
from waveboost.bench.impls import paged_cache

from decode_bench import _graph_step_us, _kernel_us, copies_for  # this script's folder

SHAPES = ((16, 8192, 32, 8), (64, 4096, 64, 8), (128, 2048, 32, 8), (1, 32768, 32, 8), (1, 2048, 32, 8),
          (32, 8192, 32, 1))  # (batch, KV length, heads, kv heads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impls", default="wb_blhd,wb_bhld,sdpa_cudnn,amax")
    ap.add_argument("--tag", default="")
    ap.add_argument("--peak-gbs", type=float, default=None,
                    help="default: the suite's peak for this device (waveboost.bench.hardware.peak_bandwidth)")
    ap.add_argument("--page-size", type=int, default=0, help="wb_blhd on a paged cache of pages of this many keys")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--backend", default="auto", help="waveboost's backend for wb_blhd and wb_bhld")
    ap.add_argument("--kernels", action="store_true",
                    help="also each kernel's mean device time per wb_blhd step (torch.profiler, eager calls)")
    ap.add_argument("--seqlen-q", type=int, default=1,
                    help="queries per sequence (over 1: causal, bottom-right, waveboost's layouts only)")
    ap.add_argument("--shapes", default="", help="batch x KV length x heads x kv heads, comma-separated "
                    "(default: " + ",".join("x".join(map(str, s)) for s in SHAPES) + ")")
    args = ap.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    impls = args.impls.split(",")
    peak, _ = peak_bandwidth("cuda", torch.cuda.get_device_name(), args.peak_gbs, torch.cuda.current_device())
    if peak is None:
        ap.error(f"no peak bandwidth known for {torch.cuda.get_device_name()!r}; give --peak-gbs")
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.seqlen_q > 1 and any(i in impls for i in ("sdpa_cudnn", "amax")):
        ap.error("--seqlen-q over 1 times wb_blhd and wb_bhld only (SDPA's causal mask is top-left)")
    causal = args.seqlen_q > 1
    for batch, keys, heads, heads_kv in shapes:
        d = args.head_dim
        kv_bytes = 2 * batch * keys * heads_kv * d * 2
        copies = copies_for(kv_bytes)

        def cache(*shape):
            return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
        q = cache(batch, args.seqlen_q, heads, d)
        lengths = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)
        res = {"shape": [batch, keys, heads, heads_kv], "tag": args.tag}
        if d != 128 or args.seqlen_q != 1:
            res.update(head_dim=d, seqlen_q=args.seqlen_q)
        if args.backend != "auto":
            res["backend"] = args.backend
        head_major = [(cache(batch, heads_kv, keys, d), cache(batch, heads_kv, keys, d)) for _ in range(copies)]
        if "wb_bhld" in impls:
            views = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in head_major]
            res["wb_bhld"] = _graph_step_us(
                torch, lambda i: waveboost.attention_with_kvcache(q, *views[i % copies], lengths, causal=causal,
                                                                  out=out, backend=args.backend))
        if "sdpa_cudnn" in impls:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qh = q.transpose(1, 2)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                res["sdpa_cudnn"] = _graph_step_us(torch, lambda i: torch.nn.functional.scaled_dot_product_attention(
                    qh, *head_major[i % copies], enable_gqa=True))
        if "amax" in impls:
            res["amax"] = _graph_step_us(
                torch, lambda i: (head_major[i % copies][0].amax(), head_major[i % copies][1].amax()))
        del head_major
        if "wb_blhd" in impls:
            usual = [(cache(batch, keys, heads_kv, d), cache(batch, keys, heads_kv, d)) for _ in range(copies)]
            table = None
            if not args.page_size:
                plan = waveboost.plan(q, usual[0][0], usual[0][1], causal=causal, backend=args.backend)
                res["splits"] = plan["num_splits"]
                if args.backend == "auto":
                    res["backend"] = plan["backend"]
            else:
                res["page_size"] = args.page_size
                if keys % args.page_size:
                    ap.error(f"--page-size {args.page_size} must divide the KV length {keys}")
                paged = [paged_cache(k, v, args.page_size) for k, v in usual]  # one table (fixed seed) for all
                usual, table = [(k, v) for k, v, _ in paged], paged[0][2]
                del paged

            def step(i=0):
                waveboost.attention_with_kvcache(q, *usual[i % copies], lengths, block_table=table, causal=causal,
                                                 out=out, backend=args.backend)
            res["wb_blhd"] = _graph_step_us(torch, step)
            if args.kernels:
                res["wb_blhd_kernels"] = _kernel_us(torch, step)
            del usual
        for key in [k for k in res if isinstance(res[k], float)]:
            res[key + "_pct"] = round(100 * kv_bytes / res[key] / 1e3 / peak, 1)
            res[key] = round(res[key], 2)
        print(json.dumps(res), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
