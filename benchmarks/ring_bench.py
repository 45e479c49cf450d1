"""Context-parallel scaling: waveboost.distributed.ring_attention on N GPUs against one GPU.

    torchrun --nproc-per-node 2 benchmarks/ring_bench.py [--seqlens 65536,131072,262144] [--out DIR]

For each total sequence length (bf16, head dim 128, 32 query heads, 8 KV heads, batch 1, causal by
default), every rank times, with CUDA events after warm-up (median):
- ``one_gpu``: waveboost.attention on the whole sequence on this rank's GPU alone;
- ``ring`` / ``allgather``: ring_attention on this rank's zigzag shard (each rank's time; the
  slowest rank's is reported);
- ``compute_only``: the ring's attention calls and merges without any communication (what the ring
  would take if transfers were free), and ``comm_only``: the ring's transfers alone;
- ``torch_cp``: PyTorch's context_parallel around SDPA (its ring, cuDNN/flash inside) in the same run.
Hidden communication = 1 - (ring - compute_only) / comm_only. Scaling = one_gpu / (N * ring).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist


def cuda_time_ms(fn, warmup=2, repeats=7):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def slowest(value: float) -> float:
    t = torch.tensor([value], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlens", default="65536,131072,262144")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    import waveboost
    from waveboost import distributed as wd

    causal = bool(args.causal)
    rows = []
    for total in (int(x) for x in args.seqlens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        shape_q = (1, total, args.heads, args.head_dim)
        shape_kv = (1, total, args.kv_heads, args.head_dim)
        q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, generator=gen)
        flops = 4 * args.heads * total * total * args.head_dim / (2 if causal else 1)
        row = {"seqlen": total, "world": world, "heads": args.heads, "kv_heads": args.kv_heads,
               "head_dim": args.head_dim, "causal": causal}
        row["one_gpu_ms"] = slowest(cuda_time_ms(lambda: waveboost.attention(q, k, v, causal=causal)))
        ql, kl, vl = (wd.shard_sequence(x, rank, world, layout="zigzag") for x in (q, k, v))
        for strategy in ("ring", "allgather"):
            row[f"{strategy}_ms"] = slowest(cuda_time_ms(
                lambda: wd.ring_attention(ql, kl, vl, causal=causal, layout="zigzag", strategy=strategy)))

        # The ring's compute without transfers, and its transfers without compute.
        ring = wd._Ring(None)
        kv = torch.stack((kl, vl)).contiguous()

        def compute_only():
            acc_out = torch.zeros(ql.shape, dtype=torch.float32, device="cuda")
            acc_lse = torch.full((1, args.heads, ql.shape[1]), -math.inf, dtype=torch.float32, device="cuda")
            for step in range(world):
                src = (rank - step) % world
                for rows_, keys, is_causal in wd._step_plan(rank, src, ql.shape[1], kl.shape[1], causal, "zigzag"):
                    out, lse = waveboost.attention(ql[:, rows_], kv[0][:, keys], kv[1][:, keys], causal=is_causal,
                                                   return_lse=True)
                    wd._merge_into(acc_out, acc_lse, out, lse, rows_)

        def comm_only():
            buf = kv
            for _ in range(world - 1):
                buf, requests = ring.shift(buf)
                wd._wait(requests)

        row["compute_only_ms"] = slowest(cuda_time_ms(compute_only))
        row["comm_only_ms"] = slowest(cuda_time_ms(comm_only))
        row["hidden_comm"] = (1 - (row["ring_ms"] - row["compute_only_ms"]) / row["comm_only_ms"]
                              if row["comm_only_ms"] > 0 else float("nan"))
        row["scaling_ring"] = row["one_gpu_ms"] / (world * row["ring_ms"])
        row["scaling_allgather"] = row["one_gpu_ms"] / (world * row["allgather_ms"])
        row["ring_tflops_per_gpu"] = flops / world / (row["ring_ms"] * 1e-3) / 1e12
        row["one_gpu_tflops"] = flops / (row["one_gpu_ms"] * 1e-3) / 1e12

        # PyTorch's own context parallelism around SDPA, on the same full tensors.
        try:
            import torch.nn.functional as F
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel

            mesh = init_device_mesh("cuda", (world,))
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            # Its SDPA path is given K/V repeated to the query heads (plain MHA).
            group = args.heads // args.kv_heads
            kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)

            # Inside the context the buffers are this rank's shards and SDPA runs torch's ring.
            bufs = [qt.clone(), kt.clone(), vt.clone()]
            with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
                row["torch_cp_ms"] = slowest(cuda_time_ms(
                    lambda: F.scaled_dot_product_attention(*bufs, is_causal=causal)))
        except Exception as e:  # reported, not hidden
            row["torch_cp_ms"] = float("nan")
            row["torch_cp_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        del q, k, v, ql, kl, vl, kv
        torch.cuda.empty_cache()

    if rank == 0:
        header = ("seqlen", "one_gpu_ms", "ring_ms", "allgather_ms", "compute_only_ms", "comm_only_ms",
                  "hidden_comm", "scaling_ring", "scaling_allgather", "torch_cp_ms")
        print(f"device: {torch.cuda.get_device_name()} x {world}, bf16, D={args.head_dim}, "
              f"heads {args.heads}/{args.kv_heads}, causal={causal}")
        print(" ".join(f"{h:>16}" for h in header))
        for row in rows:
            print(" ".join(f"{row[h]:>16.4g}" if isinstance(row[h], float) else f"{row[h]:>16}" for h in header))
            if "torch_cp_error" in row:
                print("  torch context_parallel failed:", row["torch_cp_error"])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "ring_scaling.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "world": world, "command": " ".join(sys.argv),
                           "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
