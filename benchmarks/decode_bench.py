"""Decode, paged decode and variable-length decode: the serving presets of the benchmark suite.

    python benchmarks/decode_bench.py --out DIR [suite flags, e.g. --peak-gbs 3350 --impls 'waveboost_*,fa3*']
    python benchmarks/decode_bench.py --out DIR --merge-sweep

Runs `python -m waveboost.bench --preset P --cuda-graphs` for P = decode, paged and varlen into DIR/P:
one query per sequence (four, causal, for speculative verify) against KV caches of 2k-32k keys, bf16,
waveboost (auto and the decode backend) beside SDPA cuDNN / flash / efficient on dense caches, JAX cuDNN
and FlashAttention-3's kv-cache kernel (flash_attn3_jax.flash_mha_with_kvcache, the fastest of 1, 8 and
32 splits) where installed. waveboost and SDPA are timed by replaying a CUDA graph of one step (GPU time,
no host launch cost); JAX peers by a jitted loop of steps over enough cache copies to miss L2. GB/s counts
the K/V cache bytes read plus q and out; % of peak uses the device's HBM bandwidth (a table by GPU name,
else the driver's memory clock x bus width; --peak-gbs to give it). Flags given here replace the defaults.
--merge-sweep times the decode backend alone under each merge setting instead (see SWEEP_SETTINGS).
"""

import json
import math
import os
import statistics
import subprocess
import sys

from waveboost.bench import main

# --merge-sweep: GPU time per decode step of waveboost's decode backend alone under each setting of
# the split-KV merge and split count (WAVEBOOST_DECODE_COMBINE, WAVEBOOST_DECODE_BLOCKS_PER_SM), one
# process per setting (the variables are read once per process). (batch, KV length, heads, kv heads): the one-sequence
# cells, cells of 32 and 128 (batch, kv head) pairs, MQA and a cell of several waves, all bf16, head dim 128,
# one query per sequence.
SWEEP_SHAPES = ((1, 2048, 32, 8), (1, 8192, 32, 8), (1, 32768, 32, 8), (1, 2048, 64, 8), (4, 8192, 32, 8),
                (16, 8192, 32, 8), (32, 8192, 32, 1), (64, 4096, 64, 8))
SWEEP_SETTINGS = tuple(
    (f"{merge}, splits for {blocks} block{'s' if blocks > 1 else ''} per SM",
     {"WAVEBOOST_DECODE_COMBINE": env, "WAVEBOOST_DECODE_BLOCKS_PER_SM": str(blocks)})
    for merge, env in (("combine kernel", "kernel"), ("merge in kernel", "in-kernel")) for blocks in (2, 1)) + (
    ("default (16-row tiles: 1 block per SM, merge in kernel; 64-row tiles: 2, combine kernel)", {}),)
STEPS = 20  # decode steps per CUDA graph, each on its own copy of the cache while they fit 150 MB
REPLAYS = 15


def copies_for(nbytes: int) -> int:
    """Distinct copies of nbytes of inputs for the STEPS calls of a graph: enough to pass 150 MB
    together (so that HBM is read, not L2), at most one per step."""
    return min(STEPS, max(1, math.ceil(150e6 / nbytes)))


def _graph_step_us(torch, steps_fn):
    """Median GPU time (us) per step of a CUDA graph of STEPS calls steps_fn(i)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(STEPS):
            steps_fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(STEPS):
            steps_fn(i)
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / STEPS)
    return statistics.median(times)


def _kernel_us(torch, step):
    """Mean device time (us) per step of each kernel / memset a step runs, from the profiler."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total:
            out[e.key[:60]] = round(total / STEPS, 2)
    return out


def sweep_child() -> None:
    """Prints one JSON line per shape: the graph-timed step and the profiler's kernel times."""
    import torch

    import waveboost
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, lk, h, hkv in SWEEP_SHAPES:
        d = 128
        kv_bytes = 2 * b * lk * hkv * d * 2
        copies = copies_for(kv_bytes)
        caches = [tuple(torch.randn(b, lk, hkv, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
                  for _ in range(copies)]
        q = torch.randn(b, 1, h, d, generator=g, device="cuda").to(torch.bfloat16)
        lengths = torch.full((b,), lk, dtype=torch.int32, device="cuda")
        out = torch.empty_like(q)

        def step(i=0):
            kc, vc = caches[i % copies]
            waveboost.attention_with_kvcache(q, kc, vc, lengths, out=out, backend="decode")
        us = _graph_step_us(torch, step)
        plan = waveboost.plan(q, caches[0][0], caches[0][1], backend="decode")
        print(json.dumps({"shape": [b, lk, h, hkv], "us": round(us, 2), "gbs": round(kv_bytes / us / 1e3, 1),
                          "splits": plan["num_splits"], "merge": plan.get("merge", ""),
                          "kernels": _kernel_us(torch, step)}), flush=True)
        del caches
    # What the nodes of a split step cost on their own in a graph: a 64 B memset, and a
    # stream-ordered allocation + free (cupy issues the runtime calls into torch's capture).
    try:
        import cupy
        buf = torch.empty(16, dtype=torch.int32, device="cuda")
        rt = cupy.cuda.runtime

        def memset(i=0):
            rt.memsetAsync(buf.data_ptr(), 0, 64, torch.cuda.current_stream().cuda_stream)

        def alloc_free(i=0):
            stream = torch.cuda.current_stream().cuda_stream
            rt.freeAsync(rt.mallocAsync(1 << 20, stream), stream)
        nodes = {"memset 64 B": _graph_step_us(torch, memset),
                 "mallocAsync + freeAsync": _graph_step_us(torch, alloc_free),
                 "empty kernel": _graph_step_us(torch, lambda i=0: buf.add_(0))}
        print(json.dumps({"nodes_us": {k: round(v, 2) for k, v in nodes.items()}}), flush=True)
    except Exception as e:  # noqa: BLE001 - the node costs are extra information
        print(json.dumps({"nodes_us": f"not measured: {type(e).__name__}: {e}"}), flush=True)


def merge_sweep(out_dir: str) -> int:
    """Runs sweep_child under each setting; writes merge_sweep.csv and .log to out_dir."""
    import torch
    os.makedirs(out_dir, exist_ok=True)
    rows, log = [], []
    for name, env in SWEEP_SETTINGS:
        proc = subprocess.run([sys.executable, __file__, "--sweep-child"], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=240)
        log.append(f"## {name} {env}\n{proc.stdout}{proc.stderr[-2000:]}")
        print(log[-1], flush=True)
        if proc.returncode != 0:
            return proc.returncode
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            if "shape" in r:
                b, lk, h, hkv = r["shape"]
                kern = "; ".join(f"{k} {v}" for k, v in r["kernels"].items())
                rows.append(f'"{name}",{b},{lk},{h},{hkv},{r["splits"]},{r["merge"]},{r["us"]},{r["gbs"]},"{kern}"')
    with open(os.path.join(out_dir, "merge_sweep.csv"), "w") as f:
        f.write(f"# {torch.cuda.get_device_name()}; GPU time per step, CUDA graph of {STEPS} steps, median of "
                f"{REPLAYS} replays; bf16, head dim 128, 1 query\n")
        f.write("setting,batch,seqlen_k,heads,heads_kv,splits,merge,us_per_step,kv_gbs,kernels_us_per_step\n")
        f.write("\n".join(rows) + "\n")
    with open(os.path.join(out_dir, "merge_sweep.log"), "w") as f:
        f.write("\n".join(log))
    return 0


def run(argv: list[str]) -> int:
    out = "bench-results/decode"
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if "--sweep-child" in argv:
        sweep_child()
        return 0
    if "--merge-sweep" in argv:
        return merge_sweep(out)
    status = 0
    for preset in ("decode", "paged", "varlen"):
        status = max(status, main(["--preset", preset, "--cuda-graphs", "--out", os.path.join(out, preset)] + argv))
    return status


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
