"""Runs in each process of the ring-attention tests (tests/test_distributed.py): every
configuration against single-process attention on the full sequence, results to a JSON file."""

from __future__ import annotations

import itertools
import json
import math
import os

import torch
import torch.distributed as dist


def full_attention(q, k, v, causal, scale):
    """Plain differentiable attention (bottom-right causal, GQA), the reference for values and gradients."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


def run(rank: int, world: int, port: int, out_dir: str, with_backward: bool, backend: str = "gloo") -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank}"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.set_num_threads(1)
    import waveboost
    from waveboost.distributed import ring_attention, shard_sequence, unshard_sequence

    if backend == "gloo" and with_backward:
        record_schedule(rank, out_dir)
    results = []
    dtypes = (torch.float64, torch.float32) if device == "cpu" else (torch.bfloat16, torch.float16)
    head_dim = 16 if device == "cpu" else 128
    configs = itertools.product((False, True), ("zigzag", "contiguous"), ("ring", "allgather"),
                                ((4, 4), (4, 2), (4, 1)), dtypes)
    for causal, layout, strategy, (heads, heads_kv), dtype in configs:
        gen = torch.Generator().manual_seed(1234)  # the same full sequence on every rank
        length, batch = (8 if device == "cpu" else 200) * world, 2
        q = torch.randn(batch, length, heads, head_dim, generator=gen, dtype=torch.float64)
        k = torch.randn(batch, length, heads_kv, head_dim, generator=gen, dtype=torch.float64)
        v = torch.randn(batch, length, heads_kv, head_dim, generator=gen, dtype=torch.float64)
        dout = torch.randn(batch, length, heads, head_dim, generator=gen, dtype=torch.float64)
        dlse = torch.randn(batch, heads, length, generator=gen, dtype=torch.float64)
        scale = 0.3
        shard = lambda x, dim=1: shard_sequence(x, rank, world, layout=layout, dim=dim)  # noqa: E731
        ql, kl, vl = (shard(x).to(device, dtype).requires_grad_(with_backward) for x in (q, k, v))
        out, lse = ring_attention(ql, kl, vl, causal=causal, softmax_scale=scale, layout=layout, strategy=strategy,
                                  return_lse=True)
        out, lse = out.cpu(), lse.cpu()
        refq, refk, refv = (x.clone().requires_grad_(with_backward) for x in (q, k, v))
        ref_out, ref_lse = full_attention(refq, refk, refv, causal, scale)
        errors = {
            "out": (out.double() - shard(ref_out)).abs().max().item() / shard(ref_out).abs().max().item(),
            "lse": (lse.double() - shard(ref_lse, 2)).abs().max().item(),
        }
        if dtype in (torch.float16, torch.bfloat16):
            # The single call on the whole sequence in the same dtype: the ring may lose at most
            # about as much again (FlashAttention's rule: 2x a plain implementation's error).
            single = waveboost.attention(*(x.to(device, dtype) for x in (q, k, v)), causal=causal,
                                         softmax_scale=scale).cpu()
            errors["single_out"] = (shard(single).double() - shard(ref_out)).abs().max().item() / \
                shard(ref_out).abs().max().item()
        if with_backward:
            loss = (out.double() * shard(dout)).sum() + (lse.double() * shard(dlse, 2)).sum()
            loss.backward()
            ref_loss = (ref_out * dout).sum() + (ref_lse * dlse).sum()
            ref_loss.backward()
            for name, mine, ref in (("dq", ql, refq), ("dk", kl, refk), ("dv", vl, refv)):
                expected = shard(ref.grad)
                errors[name] = (mine.grad.cpu().double() - expected).abs().max().item() / expected.abs().max().item()
            if dtype in (torch.float16, torch.bfloat16):
                full = [x.to(device, dtype) for x in (q, k, v)]
                s_out, s_lse = waveboost.attention(*full, causal=causal, softmax_scale=scale, return_lse=True)
                grads = waveboost.attention_backward(dout.to(device, dtype), *full, s_out, s_lse, causal=causal,
                                                     softmax_scale=scale, dlse=dlse.to(device, torch.float32))
                for name, grad, ref in zip(("dq", "dk", "dv"), grads, (refq, refk, refv)):
                    expected = shard(ref.grad)
                    errors["single_" + name] = (shard(grad.cpu()).double() - expected).abs().max().item() / \
                        expected.abs().max().item()
        results.append({"causal": causal, "layout": layout, "strategy": strategy, "heads": heads,
                        "heads_kv": heads_kv, "dtype": str(dtype), "errors": errors})

    # The layout helpers round-trip on every rank.
    x = torch.arange(2 * 4 * world).reshape(2, 4 * world)
    for layout in ("zigzag", "contiguous"):
        gathered = [shard_sequence(x, r, world, layout=layout) for r in range(world)]
        assert torch.equal(unshard_sequence(gathered, layout=layout), x)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def record_schedule(rank: int, out_dir: str) -> None:
    """Records the order of transfers and attention calls of ring_attention (forward and backward)
    through instrumented communication: which transfers are in flight during each call, what
    travels (shapes, dtypes), and which strategy "auto" took. To schedule{rank}.json."""
    import waveboost.distributed as wd

    log, in_flight, counter = [], set(), [0]

    class Requests:
        def __init__(self, requests, key):
            self.requests, self.key = requests, key

        def wait(self):
            for request in self.requests:
                request.wait()
            in_flight.discard(self.key)

    class Logged(wd._Ring):
        def shift(self, tensor, tag=0):
            buffer, requests = super().shift(tensor, tag)
            counter[0] += 1
            key = (tag, counter[0])
            in_flight.add(key)
            log.append(["shift", tag, list(tensor.shape), str(tensor.dtype)])
            return buffer, [Requests(requests, key)]

        def all_gather_sequence(self, x, layout):
            log.append(["gather", list(x.shape), str(x.dtype)])
            return super().all_gather_sequence(x, layout)

    attend, backward_call = wd._attend, wd._backward_call

    def logged_attend(*args):
        log.append(["attend", sorted({tag for tag, _ in in_flight})])
        return attend(*args)

    def logged_backward(*args):
        log.append(["backward", sorted({tag for tag, _ in in_flight})])
        return backward_call(*args)

    original = wd._Ring, wd._attend, wd._backward_call
    wd._Ring, wd._attend, wd._backward_call = Logged, logged_attend, logged_backward
    results = {}
    gen = torch.Generator().manual_seed(5)
    try:
        for name, heads, heads_kv, strategy in (("ring_gqa", 4, 1, "ring"), ("auto_gqa", 8, 1, "auto"),
                                                ("auto_mha", 4, 4, "auto")):
            log.clear()
            q = torch.randn(1, 8, heads, 16, generator=gen, dtype=torch.float32, requires_grad=True)
            k = torch.randn(1, 8, heads_kv, 16, generator=gen, dtype=torch.float32, requires_grad=True)
            v = torch.randn(1, 8, heads_kv, 16, generator=gen, dtype=torch.float32, requires_grad=True)
            out = wd.ring_attention(q, k, v, causal=False, strategy=strategy)
            log.append(["forward done"])
            out.sum().backward()
            results[name] = list(log)
    finally:
        wd._Ring, wd._attend, wd._backward_call = original
    with open(os.path.join(out_dir, f"schedule{rank}.json"), "w") as f:
        json.dump(results, f)
