"""Context-parallel benchmark: waveboost.distributed.ring_attention on N ranks against one device.

    torchrun --nproc-per-node N -m waveboost.bench.distributed [options]
    python -m waveboost.bench --distributed N [options]        (starts the torchrun line above)

One process per GPU (NCCL), or per CPU share (gloo; each rank's CPU path gets cores / N threads).
Every cell (global sequence length, heads / KV heads, head dim, causal, layout, strategy, pass)
gives one row per implementation:

- time_ms: per timed call every rank measures its own time (barrier, then the call, then device
  sync); the slowest rank's time counts for that call, and time_ms is the median over calls.
- compute_only_ms: the same attention calls and merges with no transfer (every rank attends to
  its own K/V shard in place of the received ones); comm_only_ms: the same transfers (ring
  shifts in the ring's order and overlap, or all-gathers and reduces) with no attention.
- hidden_comm = (compute_only + comm_only - time) / comm_only, clipped to [0, 1]: the share of
  the communication time that the call hides under compute (1: all of it; 0: none, or
  overheads beyond both).
- comm_mb_per_rank: the bytes each rank receives in a call (K/V blocks, and in the backward the
  K/V again and the float32 K/V gradients: ring hops, or all-gathers and a reduce-scatter);
  comm_gbps = comm_mb_per_rank / comm_only_ms, the bandwidth the transfers reached.
- one_device_ms: waveboost.attention on the whole sequence, rank 0 alone (the other ranks idle),
  same pass; speedup = one_device / time; scaling = speedup / N (1.0 = ideal).
- the torch_cp rows: PyTorch's context_parallel around SDPA (its ring over SDPA's CUDA kernels;
  K/V repeated to the query heads, which its ring attention needs; zigzag = its head-tail load
  balancer, contiguous = none; ring = its "alltoall" rotation, allgather = "allgather") on the
  same inputs. It runs on CUDA only; elsewhere its rows say why they were skipped.

Each forward output is checked (rel_err: max |out - one device's| / max |one device's| over the
rank's rows, slowest rank) before it is timed. Rank 0 prints every row as it is measured and
rewrites context_parallel.csv and results.json after each one: an interrupted run keeps them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import statistics
import sys
import time
from datetime import datetime

from . import grid, report

PROG = "python -m waveboost.bench --distributed N"
COLUMNS = ["seqlen", "batch", "heads", "kv_heads", "head_dim", "dtype", "causal", "world", "backend", "impl",
           "layout", "strategy", "pass", "status", "reason", "rel_err", "calls", "time_ms", "fastest_rank_ms",
           "compute_only_ms", "comm_only_ms", "hidden_comm", "one_device_ms", "speedup", "scaling",
           "tflops_per_rank", "comm_mb_per_rank", "comm_gbps"]
DEFAULTS = {  # per device: a grid that fills the device in minutes
    "cuda": {"seqlens": "32768,65536,131072", "batch": 1, "heads": "32", "kv_heads": "8", "head_dims": "128",
             "dtype": "bfloat16", "repeats": 10, "budget_ms": 2000.0},
    "cpu": {"seqlens": "512,1024", "batch": 1, "heads": "4", "kv_heads": "2", "head_dims": "64",
            "dtype": "float32", "repeats": 5, "budget_ms": 300.0},
}
DTYPES = {"float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float32": "float32", "fp32": "float32", "float64": "float64", "fp64": "float64"}
PASSES = ("fwd", "fwdbwd")
WARMUP_CALLS = 1
MIN_CALLS = 3
TORCH_CP_PEER = "torch_cp"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda (NCCL, one GPU per rank) when torch sees enough GPUs, else cpu (gloo)")
    p.add_argument("--seqlens", help="global sequence lengths, multiples of 2N (cuda default 32768,65536,131072; "
                                     "cpu default 512,1024)")
    p.add_argument("--batch", type=int, help="batch (default 1)")
    p.add_argument("--heads", help="query heads, comma-separated (cuda default 32, cpu 4)")
    p.add_argument("--kv-heads", help="KV heads, comma-separated; each must divide the heads (cuda default 8, cpu 2)")
    p.add_argument("--head-dims", help="head dims, comma-separated (cuda default 128, cpu 64)")
    p.add_argument("--dtype", help="cuda default bfloat16, cpu float32")
    p.add_argument("--causal", choices=("0", "1", "both"), default="1", help="causal mask (default 1)")
    p.add_argument("--layouts", default="zigzag,contiguous", help="default zigzag,contiguous")
    p.add_argument("--strategies", default="ring,allgather", help="ring, allgather, auto (default ring,allgather)")
    p.add_argument("--passes", default="fwd,fwdbwd", help="fwd (forward) and/or fwdbwd (forward + backward)")
    p.add_argument("--peers", default=TORCH_CP_PEER, help=f"'{TORCH_CP_PEER}' or 'none' (default {TORCH_CP_PEER})")
    p.add_argument("--no-compute-split", action="store_true",
                   help="skip compute_only / comm_only (and so hidden_comm): a third of the time")
    p.add_argument("--repeats", type=int, help="most timed calls per measurement (cuda default 10, cpu 5)")
    p.add_argument("--budget-ms", type=float, help="time budget per measurement, at least 3 calls "
                                                   "(cuda default 2000, cpu 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="output folder (default bench-results/<device>-x<N>-<YYYYMMDD-HHMM>/context-parallel)")
    return p


def _ints(text: str, arg: str) -> list[int]:
    try:
        values = list(grid.parse_ints(str(text)))
    except ValueError:
        raise SystemExit(f"{arg}: expected comma-separated integers; got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"{arg}: expected positive integers; got {text!r}")
    return values


def _choices(text: str, allowed, arg: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in allowed]
    if not values or bad:
        raise SystemExit(f"{arg}: expected a comma-separated subset of {', '.join(allowed)}; got {text!r}")
    return values


# ---- launching ---------------------------------------------------------------------------------

def launch(argv: list[str]) -> int:
    """`python -m waveboost.bench --distributed N [options]`: starts N ranks under torchrun."""
    argv = list(argv)
    i = argv.index("--distributed")
    if i + 1 >= len(argv) or not argv[i + 1].isdigit() or int(argv[i + 1]) < 1:
        raise SystemExit("--distributed N: the number of ranks (processes; one per GPU on CUDA)")
    world = argv[i + 1]
    rest = argv[:i] + argv[i + 2:]
    if "-h" in rest or "--help" in rest:
        build_parser().print_help()
        return 0
    env = dict(os.environ)
    if "WAVEBOOST_NUM_THREADS" not in env:  # ranks on one CPU share its cores
        env["WAVEBOOST_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(world)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", world,
           "-m", "waveboost.bench.distributed", *rest]
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Replaced by torchrun: a signal (Ctrl-C, timeout) reaches it, and it stops the ranks.
    os.execvpe(cmd[0], cmd, env)


# ---- measuring ---------------------------------------------------------------------------------

class Bench:
    """The process group, device and timing rules shared by every measurement of a run."""

    def __init__(self, torch, dist, device: str, repeats: int, budget_s: float):
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.repeats, self.budget_s = repeats, budget_s

    def sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def reduce(self, values: list[float], op) -> list[float]:
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=op)
        return t.tolist()

    def _once(self, fn, here: bool) -> float:
        self.dist.barrier()
        self.sync()
        start = time.perf_counter()
        if here:
            fn()
        self.sync()
        return time.perf_counter() - start

    def time(self, fn, alone: bool = False) -> dict:
        """Times fn on every rank (alone: on rank 0 only, the others wait). Returns the median over
        calls of the slowest rank's time, the median of the fastest rank's, and the call count."""
        here = self.rank == 0 or not alone
        for _ in range(WARMUP_CALLS):
            self._once(fn, here)
        first = self._once(fn, here)
        slowest_first = self.reduce([first], self.dist.ReduceOp.MAX)[0]
        calls = int(max(MIN_CALLS, min(self.repeats, self.budget_s // max(slowest_first, 1e-9))))
        mine = [first] + [self._once(fn, here) for _ in range(calls - 1)]
        slow = self.reduce(mine, self.dist.ReduceOp.MAX)
        if alone:
            fast = slow
        else:
            fast = self.reduce(mine, self.dist.ReduceOp.MIN)
        return {"time_ms": statistics.median(slow) * 1e3, "fastest_rank_ms": statistics.median(fast) * 1e3,
                "calls": calls}


def _tolerance(dtype: str) -> float:
    return 2e-2 if dtype in ("float16", "bfloat16") else 1e-4


def _flops(seqlen: int, batch: int, heads: int, head_dim: int, causal: bool, backward: bool) -> float:
    fwd = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return fwd * (3.5 if backward else 1.0)  # backward: 2.5x the forward's matmuls


def _comm_bytes(strategy: str, backward: bool, world: int, kv_shard_elems: int, elem: int, acc_elem: int) -> int:
    """Bytes one rank receives in a call: K and V shards of the other ranks (ring: world - 1 hops;
    all-gather: the same shards at once); the backward sends them again and the float32 K/V
    gradients (ring: world hops; all-gather: a reduce-scatter of the full gradients)."""
    kv = 2 * kv_shard_elems
    total = (world - 1) * kv * elem
    if backward:
        total += (world - 1) * kv * elem + (world if strategy == "ring" else world - 1) * kv * acc_elem
    return total


def _hidden(total: float, compute: float, comm: float):
    if not comm > 0:
        return None
    return min(1.0, max(0.0, (compute + comm - total) / comm))


def _torch_cp_probe(torch, dist, device: str, mesh) -> str | None:
    """None when PyTorch's context_parallel runs SDPA here (tried on a small input on every rank), else why not."""
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
        from torch.distributed.tensor.experimental._attention import set_rotate_method  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch.distributed.tensor.experimental.context_parallel ({exc})"
    reason = None
    try:
        import torch.nn.functional as F
        from torch.distributed.tensor.experimental import context_parallel

        dtype = torch.bfloat16 if device != "cpu" else torch.float32
        bufs = [torch.randn(1, 2, 8 * dist.get_world_size(), 64, device=device, dtype=dtype) for _ in range(3)]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(*bufs, is_causal=True)
    except Exception as exc:  # the message says why: reported in every skipped row
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
    flags = torch.tensor([0.0 if reason is None else 1.0], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if reason is None and flags.item() > 0:
        reason = "failed on another rank"
    if reason is not None and device == "cpu":
        reason = (f"torch {torch.__version__}'s context_parallel shards SDPA's CUDA kernels (flash, efficient, "
                  f"cuDNN) only; on the CPU: {reason}")
    return reason


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit(f"{PROG}: start it with torchrun --nproc-per-node N -m waveboost.bench.distributed, or "
                         f"as {PROG}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device == "cuda" and gpus < local_world:
        raise SystemExit(f"--device cuda: {local_world} ranks on this node need {local_world} GPUs; {gpus} visible")
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and gpus >= local_world) else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    else:
        os.environ.setdefault("WAVEBOOST_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // local_world)))
        torch.set_num_threads(int(os.environ["WAVEBOOST_NUM_THREADS"]))
    kind = "cpu" if device == "cpu" else "cuda"
    d = DEFAULTS[kind]
    seqlens = _ints(args.seqlens or d["seqlens"], "--seqlens")
    heads_list = _ints(args.heads or d["heads"], "--heads")
    kv_list = _ints(args.kv_heads or d["kv_heads"], "--kv-heads")
    head_dims = _ints(args.head_dims or d["head_dims"], "--head-dims")
    batch = args.batch or d["batch"]
    dtype_name = DTYPES.get((args.dtype or d["dtype"]).lower())
    if dtype_name is None:
        raise SystemExit(f"--dtype: expected one of {', '.join(sorted(DTYPES))}; got {args.dtype!r}")
    if kind == "cpu" and dtype_name in ("float16", "bfloat16"):
        raise SystemExit("--dtype: the CPU path takes float32 and float64")
    causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    import waveboost.distributed as wd

    layouts = _choices(args.layouts, wd.RING_LAYOUTS, "--layouts")
    strategies = _choices(args.strategies, wd.RING_STRATEGIES, "--strategies")
    passes = _choices(args.passes, PASSES, "--passes")
    peers = [] if args.peers == "none" else _choices(args.peers, (TORCH_CP_PEER,), "--peers")

    if kind == "cuda":  # bound to this rank's GPU: barriers and collectives need no guess
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")
    import waveboost

    world, rank = dist.get_world_size(), dist.get_rank()
    for L in seqlens:
        if L % (2 * world):
            raise SystemExit(f"--seqlens: {L} is not a multiple of 2 x {world} ranks (the zigzag layout's chunks)")
    for h in heads_list:
        for hk in kv_list:
            if h % hk:
                raise SystemExit(f"--kv-heads: {hk} does not divide --heads {h}")
    bench = Bench(torch, dist, device, args.repeats or d["repeats"], (args.budget_ms or d["budget_ms"]) / 1e3)
    dtype = getattr(torch, dtype_name)

    mesh = None
    torch_cp_missing = None
    if peers:
        from torch.distributed.device_mesh import init_device_mesh

        try:
            mesh = init_device_mesh(kind, (world,))
            torch_cp_missing = _torch_cp_probe(torch, dist, device, mesh)
        except Exception as exc:
            torch_cp_missing = f"{type(exc).__name__}: {str(exc)[:200]}"

    env = report.environment(kind)
    stamp = datetime.now().astimezone()
    name = env["name"]
    out_dir = args.out or os.path.join("bench-results", f"{report.slug(name)}-x{world}-{stamp:%Y%m%d-%H%M}",
                                       "context-parallel")
    meta = {"tool": "waveboost.bench.distributed", "date": stamp.isoformat(timespec="seconds"),
            "command": f"torchrun --nproc-per-node {local_world} -m waveboost.bench.distributed " + shlex.join(argv),
            "world": world, "backend": dist.get_backend(), "environment": env,
            "settings": {"repeats": bench.repeats, "budget_ms": bench.budget_s * 1e3, "warmup_calls": WARMUP_CALLS,
                         "min_calls": MIN_CALLS, "seed": args.seed,
                         "waveboost_num_threads": os.environ.get("WAVEBOOST_NUM_THREADS")},
            "definitions": {
                "time_ms": "median over timed calls of the slowest rank's time per call",
                "hidden_comm": "(compute_only + comm_only - time) / comm_only, clipped to [0, 1]",
                "speedup": "one_device_ms / time_ms (one device: waveboost.attention on the whole sequence, "
                           "rank 0 alone)",
                "scaling": "speedup / world (1.0 = ideal)",
                "comm_gbps": "bytes one rank receives in a call (K/V blocks; backward: again, and their float32 "
                             "gradients) / comm_only time",
                "tflops_per_rank": "attention FLOPs of the whole sequence (causal: half; backward 2.5x the "
                                   "forward's) / world / time"},
            "torch_cp": torch_cp_missing or "available"}
    rows: list[dict] = []
    if rank == 0:
        print(f"{name} x {world} ranks ({dist.get_backend()}); waveboost {waveboost.__version__}, torch "
              f"{torch.__version__}" + (f", CPU path threads per rank: {os.environ.get('WAVEBOOST_NUM_THREADS')}"
                                        if kind == "cpu" else ""), flush=True)
        for key, text in meta["definitions"].items():
            print(f"  {key} = {text}", flush=True)
        if peers and torch_cp_missing:
            print(f"  {TORCH_CP_PEER} skipped: {torch_cp_missing}", flush=True)
        print(_line(None), flush=True)

    def emit(row: dict) -> None:
        rows.append(row)
        if rank == 0:
            print(_line(row), flush=True)
            meta["seconds"] = round(time.perf_counter() - started, 1)
            write_files(out_dir, meta, rows)

    started = time.perf_counter()
    failed = False
    for L in seqlens:
        for heads in heads_list:
            for kv_heads in kv_list:
                for head_dim in head_dims:
                    for causal in causals:
                        base = {"seqlen": L, "batch": batch, "heads": heads, "kv_heads": kv_heads,
                                "head_dim": head_dim, "dtype": dtype_name, "causal": causal, "world": world,
                                "backend": dist.get_backend()}
                        failed |= _run_shape(bench, wd, waveboost, base, dtype, layouts, strategies, passes, peers,
                                             mesh, torch_cp_missing, not args.no_compute_split, args.seed, emit)
    if rank == 0:
        meta["seconds"] = round(time.perf_counter() - started, 1)
        write_files(out_dir, meta, rows)
        print(f"{len(rows)} rows in {meta['seconds']} s; wrote context_parallel.csv, results.json to {out_dir}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


def _run_shape(bench, wd, waveboost, base, dtype, layouts, strategies, passes, peers, mesh, torch_cp_missing,
               split, seed, emit) -> bool:
    """Every layout, strategy, pass and implementation of one shape; True when a waveboost row is WRONG."""
    torch, dist = bench.torch, bench.dist
    device, rank, world = bench.device, bench.rank, bench.world
    L, B, H, HK, D, causal = (base[k] for k in ("seqlen", "batch", "heads", "kv_heads", "head_dim", "causal"))
    gen = torch.Generator(device=device).manual_seed(seed + L + 7 * H + 13 * D)  # the same sequence on every rank
    q = torch.randn(B, L, H, D, device=device, dtype=dtype, generator=gen)
    k = torch.randn(B, L, HK, D, device=device, dtype=dtype, generator=gen)
    v = torch.randn(B, L, HK, D, device=device, dtype=dtype, generator=gen)
    dout = torch.randn(B, L, H, D, device=device, dtype=dtype, generator=gen)
    for x in (q, k, v, dout):
        dist.broadcast(x, src=0)  # rank 0's draw, whatever the generators of the other devices do
    failed = False

    # One device: the whole sequence on rank 0 alone; its output is every row's reference.
    one = {}
    ref = torch.empty_like(q)
    for pas in passes:
        if pas == "fwd":
            if rank == 0:
                ref = waveboost.attention(q, k, v, causal=causal)
            one[pas] = bench.time(lambda: waveboost.attention(q, k, v, causal=causal), alone=True)["time_ms"]
        else:
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

            def fwdbwd():
                waveboost.attention(qg, kg, vg, causal=causal).backward(dout)
            one[pas] = bench.time(fwdbwd, alone=True)["time_ms"]
            del qg, kg, vg
    if "fwd" not in passes and rank == 0:
        ref = waveboost.attention(q, k, v, causal=causal)
    dist.broadcast(ref, src=0)

    def finish(row, measured, pas, compute=None, comm=None):
        row.update(measured)
        row["one_device_ms"] = one[pas]
        row["speedup"] = one[pas] / row["time_ms"]
        row["scaling"] = row["speedup"] / world
        row["tflops_per_rank"] = _flops(L, B, H, D, causal, pas == "fwdbwd") / world / (row["time_ms"] * 1e-3) / 1e12
        if compute is not None:
            row["compute_only_ms"], row["comm_only_ms"] = compute, comm
            row["hidden_comm"] = _hidden(row["time_ms"], compute, comm)
            nbytes = _comm_bytes(row["strategy"].split(":")[-1], pas == "fwdbwd", world, B * (L // world) * HK * D,
                                 q.element_size(), 8 if dtype == torch.float64 else 4)
            row["comm_mb_per_rank"] = nbytes / 2**20
            row["comm_gbps"] = nbytes / (comm * 1e-3) / 1e9 if comm > 0 else None
        emit(row)

    for layout in layouts:
        shard = lambda x: wd.shard_sequence(x, rank, world, layout=layout).contiguous()  # noqa: E731
        ql, kl, vl, dl, refl = (shard(x) for x in (q, k, v, dout, ref))
        for strategy in strategies:
            resolved = wd._resolve_strategy(strategy, world, ql.shape[1], kl.shape[1], H, HK)
            label = strategy if strategy == resolved else f"auto:{resolved}"
            out = wd.ring_attention(ql, kl, vl, causal=causal, layout=layout, strategy=strategy)
            err = _rel_err(torch, out, refl)
            err = bench.reduce([err], dist.ReduceOp.MAX)[0]
            ok = err <= _tolerance(base["dtype"])
            for pas in passes:
                row = {**base, "impl": "waveboost", "layout": layout, "strategy": label, "pass": pas,
                       "rel_err": err, "status": "ok" if ok else "WRONG"}
                if not ok:
                    row["reason"] = f"rel_err {err:.3g} > {_tolerance(base['dtype'])}"
                    failed = True
                    emit(row)
                    continue
                if pas == "fwd":
                    def call(comm):
                        wd._RingAttention.apply(ql, kl, vl, causal, None, layout, resolved, comm)
                    fn = lambda: call(wd._Ring(None))  # noqa: E731
                else:
                    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (ql, kl, vl))

                    def call(comm, qg=qg, kg=kg, vg=vg):
                        for x in (qg, kg, vg):
                            x.grad = None
                        out, _ = wd._RingAttention.apply(qg, kg, vg, causal, None, layout, resolved, comm)
                        out.backward(dl)
                    fn = lambda: call(wd._Ring(None))  # noqa: E731
                measured = bench.time(fn)
                compute = comm = None
                if split:
                    compute = bench.time(lambda: call(wd._NoTransfers(None)))["time_ms"]
                    comm = bench.time(lambda: wd._transfers_only(kl, vl, resolved, layout, pas == "fwdbwd",
                                                                 wd._Ring(None)))["time_ms"]
                finish(row, measured, pas, compute, comm)
        for strategy in (s for s in strategies if s != "auto"):
            if TORCH_CP_PEER not in peers:
                break
            for pas in passes:
                row = {**base, "impl": TORCH_CP_PEER, "layout": layout, "strategy": strategy, "pass": pas}
                if torch_cp_missing:
                    emit({**row, "status": "skipped", "reason": torch_cp_missing})
                    continue
                try:
                    measured, err = _time_torch_cp(bench, q, k, v, dout, refl, causal, layout, strategy, pas, mesh)
                except Exception as exc:  # reported in the row, not hidden
                    emit({**row, "status": "error", "reason": f"{type(exc).__name__}: {str(exc)[:200]}"})
                    continue
                row["rel_err"] = err
                ok = err <= _tolerance(base["dtype"])
                row["status"] = "ok" if ok else "WRONG"
                row["reason"] = f"K/V repeated to {H} heads" if HK != H else ""
                finish(row, measured, pas)
        del ql, kl, vl, dl, refl
    if device != "cpu":
        del q, k, v, dout, ref
        torch.cuda.empty_cache()
    return failed


def _rel_err(torch, out, ref) -> float:
    # float32 unless the inputs are float64: enough for the bounds checked, half the memory at long sequences.
    wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
    scale = ref.abs().max().item()
    return (out.to(wide) - ref.to(wide)).abs().max().item() / (scale if scale > 0 else 1.0)


def _time_torch_cp(bench, q, k, v, dout, refl, causal, layout, strategy, pas, mesh):
    """PyTorch's context_parallel around SDPA on the full inputs: (timing, rel_err of its forward)."""
    torch = bench.torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    group = q.shape[2] // k.shape[2]
    # SDPA's layout is (batch, heads, seqlen, head_dim); torch's ring takes no GQA: K/V repeated to the query heads.
    bufs = [q.transpose(1, 2).contiguous(), k.repeat_interleave(group, dim=2).transpose(1, 2).contiguous(),
            v.repeat_interleave(group, dim=2).transpose(1, 2).contiguous(), dout.transpose(1, 2).contiguous()]
    old_balance = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = layout == "zigzag"  # its head-tail balancer: chunks r and 2N-1-r
    set_rotate_method("alltoall" if strategy == "ring" else "allgather")
    try:
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(bufs)):
            qs, ks, vs, ds = bufs
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            err = _rel_err(torch, out.transpose(1, 2), refl)
            err = bench.reduce([err], bench.dist.ReduceOp.MAX)[0]
            if pas == "fwd":
                measured = bench.time(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal))
            else:
                qg, kg, vg = (x.detach().requires_grad_(True) for x in (qs, ks, vs))

                def fwdbwd():
                    for x in (qg, kg, vg):
                        x.grad = None
                    F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(ds)
                measured = bench.time(fwdbwd)
    finally:
        _cp_options.enable_load_balance = old_balance
    return measured, err


# ---- output ------------------------------------------------------------------------------------

def _fmt(value, spec: str = ".4g") -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, spec)
    return str(value)


_TABLE = [("seqlen", 8), ("H/Hkv", 6), ("D", 4), ("causal", 6), ("layout", 10), ("strategy", 14), ("impl", 9),
          ("pass", 6), ("status", 7), ("time_ms", 10), ("compute", 10), ("comm", 10), ("hidden", 7), ("GB/s", 7),
          ("1dev_ms", 10), ("scaling", 7), ("rel_err", 8)]


def _line(row: dict | None) -> str:
    if row is None:
        return " ".join(f"{name:>{width}}" for name, width in _TABLE)
    cells = [row["seqlen"], f"{row['heads']}/{row['kv_heads']}", row["head_dim"], int(row["causal"]), row["layout"],
             row["strategy"], row["impl"], row["pass"], row["status"], row.get("time_ms"),
             row.get("compute_only_ms"), row.get("comm_only_ms"), row.get("hidden_comm"), row.get("comm_gbps"), row.get("one_device_ms"),
             row.get("scaling"), row.get("rel_err")]
    specs = {12: ".2f", 13: ".3g", 15: ".3f", 16: ".2g"}
    text = " ".join(f"{_fmt(c, specs.get(i, '.4g')):>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, _TABLE)))
    if row["status"] == "skipped":
        text += "  (why: above)"
    elif row["status"] != "ok" and row.get("reason"):
        text += f"  ({row['reason']})"
    return text


def write_files(out_dir: str, meta: dict, rows: list[dict]) -> list[str]:
    """context_parallel.csv and results.json in out_dir (rewritten whole: cheap, and always complete)."""
    os.makedirs(out_dir, exist_ok=True)
    path_csv = os.path.join(out_dir, "context_parallel.csv")
    with open(path_csv + ".tmp", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([report.csv_value(row.get(c)) for c in COLUMNS])
    os.replace(path_csv + ".tmp", path_csv)
    path_json = os.path.join(out_dir, "results.json")
    with open(path_json + ".tmp", "w") as f:
        json.dump({**meta, "columns": COLUMNS, "rows": rows}, f, indent=1, default=str)
    os.replace(path_json + ".tmp", path_json)
    return [path_csv, path_json]


if __name__ == "__main__":
    sys.exit(main())
