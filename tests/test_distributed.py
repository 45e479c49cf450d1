"""Context parallelism (waveboost.distributed.ring_attention, waveboost.jax.ring_attention) on the
CPU: several processes over gloo (torch) and several host devices (JAX), each shard's result
against attention over the whole sequence."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import waveboost  # noqa: E402

TESTS = os.path.dirname(__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, tmp_path, with_backward: bool, backend: str = "gloo"):
    import torch.multiprocessing as mp

    sys.path.insert(0, TESTS)
    import _ring_worker

    mp.start_processes(_ring_worker.run, args=(world, _free_port(), str(tmp_path), with_backward, backend),
                       nprocs=world, join=True, start_method="spawn")
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this torch build")
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_matches_full_sequence(world, tmp_path):
    with_backward = hasattr(waveboost, "attention_backward")
    results = _spawn(world, tmp_path, with_backward)
    failures = []
    for rank, rows in enumerate(results):
        assert len(rows) == 2 * 2 * 2 * 3 * 2
        for row in rows:
            for name, err in row["errors"].items():
                # The LSE is float32 whatever the inputs (waveboost's contract), and the merge
                # weights exp(lse_i - lse) carry its rounding: ~1e-7 relative even for float64.
                bound = 2e-6 if name in ("out", "lse") else 1e-5
                if not err <= bound:  # NaN fails too
                    failures.append(f"rank {rank} {row} {name}: {err:.3g} > {bound}")
        if with_backward:
            assert all({"dq", "dk", "dv"} <= set(row["errors"]) for row in rows)
    assert not failures, "\n".join(failures[:20])
    if with_backward:
        check_schedule(world, tmp_path)


@pytest.mark.gpu
def test_ring_attention_on_two_gpus_nccl(tmp_path):
    """bf16/fp16 over NCCL: the ring's error stays within twice the single-GPU call's (plus rounding)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices; {torch.cuda.device_count()} visible")
    with_backward = hasattr(waveboost, "attention_backward")
    results = _spawn(2, tmp_path, with_backward, backend="nccl")
    failures = []
    for rank, rows in enumerate(results):
        for row in rows:
            errs = row["errors"]
            for name in ("out", "dq", "dk", "dv"):
                if name not in errs:
                    continue
                bound = 2 * errs["single_" + name] + 2e-3
                if not errs[name] <= bound:
                    failures.append(f"rank {rank} {row} {name}: {errs[name]:.3g} > {bound:.3g}")
            if not errs["lse"] <= 1e-2:
                failures.append(f"rank {rank} {row} lse: {errs['lse']:.3g}")
    assert not failures, "\n".join(failures[:20])


def test_ring_attention_argument_errors():
    from waveboost.distributed import ring_attention, shard_sequence

    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)
    with pytest.raises(ValueError, match="layout"):
        shard_sequence(q, 0, 2, layout="spiral")
    with pytest.raises(ValueError, match="multiple of 4"):
        shard_sequence(torch.randn(1, 6, 2, 16), 0, 2, layout="zigzag")


JAX_SCRIPT = textwrap.dedent(
    """
    import os, sys, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={world}"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, {tests!r})
    from reference import attention_ref
    import waveboost.jax as wj
    from waveboost._layout import shard
    shard_numpy = lambda x, r, w, layout, axis=1: shard(x, r, w, layout, axis, lambda p, a: np.concatenate(p, axis=a))
    from jax.sharding import Mesh, PartitionSpec as P
    world = {world}
    mesh = Mesh(np.array(jax.devices()[:world]), ("sp",))
    rng = np.random.default_rng(7)
    failures = []
    for causal in (False, True):
        for layout in ("zigzag", "contiguous"):
            for heads, heads_kv in ((4, 4), (4, 1)):
                L = 8 * world
                q = rng.standard_normal((2, L, heads, 16))
                k = rng.standard_normal((2, L, heads_kv, 16))
                v = rng.standard_normal((2, L, heads_kv, 16))
                ref, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.3)
                # Shards laid out rank after rank, so that shard_map's even split hands rank r its shard.
                sharded = [np.concatenate([shard_numpy(x, r, world, layout) for r in range(world)], axis=1)
                           for x in (q, k, v)]
                fn = jax.shard_map(lambda a, b, c: wj.ring_attention(a, b, c, axis_name="sp", causal=causal,
                                                                     softmax_scale=0.3, layout=layout,
                                                                     return_lse=True),
                                   mesh=mesh, in_specs=(P(None, "sp"),) * 3, out_specs=(P(None, "sp"), P(None, None, "sp")))
                out, lse = jax.jit(fn)(*[jnp.asarray(x) for x in sharded])
                expected = np.concatenate([shard_numpy(ref, r, world, layout) for r in range(world)], axis=1)
                expected_lse = np.concatenate([shard_numpy(ref_lse, r, world, layout, axis=2) for r in range(world)], axis=2)
                err = np.abs(np.asarray(out) - expected).max()
                lse_err = np.abs(np.asarray(lse) - expected_lse).max()
                if not (err < 2e-6 and lse_err < 2e-6):
                    failures.append((causal, layout, heads, heads_kv, float(err), float(lse_err)))
    print(json.dumps(failures))
    """
)


@pytest.mark.parametrize("world", [2, 4])
def test_jax_ring_attention_on_host_devices(world):
    pytest.importorskip("jax")
    import waveboost.jax as wj

    if not wj.ffi_available():
        pytest.skip("waveboost.jax.attention needs the XLA FFI handlers (built with jaxlib's headers)")
    script = JAX_SCRIPT.format(world=world, tests=TESTS)
    # Host devices even where a GPU is present: the mesh needs `world` devices and the reference is float64.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def check_schedule(world: int, tmp_path) -> None:
    """Every attention call of the ring but the last step's runs with the next K/V block in flight;
    in the backward, the K/V block and the previous block's gradient travel under each step's
    gradients. Only the KV heads travel (GQA), and "auto" gathers for few KV heads, else rings.
    (Recorded by _ring_worker.record_schedule.)"""
    for rank in range(world):
        logs = json.load(open(tmp_path / f"schedule{rank}.json"))
        log = logs["ring_gqa"]
        split = log.index(["forward done"])
        forward, backward = log[:split], log[split + 1:]
        kv_shape = [2, 1, 8, 1, 16]  # (k and v, batch, local seqlen, 1 KV head, head dim)
        assert [e[1] for e in forward if e[0] == "attend"] == [[0]] * (world - 1) + [[]]
        assert [e[1] for e in backward if e[0] == "backward"] == [[0]] + [[0, 1]] * (world - 2) + [[1]]
        shifts = [e for e in log if e[0] == "shift"]
        assert [e for e in shifts if e[1] == 0] == [["shift", 0, kv_shape, "torch.float32"]] * (2 * (world - 1))
        assert [e for e in shifts if e[1] == 1] == [["shift", 1, kv_shape, "torch.float32"]] * world
        gathered = [e for e in logs["auto_gqa"] if e[0] == "gather"]  # 8 heads, 1 KV head: world <= 8 gathers
        assert gathered and all(e[1] == [1, 8, 1, 16] for e in gathered)
        assert not any(e[0] == "shift" for e in logs["auto_gqa"])
        assert any(e[0] == "shift" for e in logs["auto_mha"])
        assert not any(e[0] == "gather" for e in logs["auto_mha"])


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this torch build")
def test_ring_attention_on_one_rank(tmp_path):
    """A group of one rank: the ring's shifts (forward and backward) send nothing; the result is one call's."""
    from waveboost.distributed import ring_attention

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(2, 8, h, 16, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
        expected = waveboost.attention(q, k, v, causal=True)
        for strategy in ("ring", "allgather"):
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            out = ring_attention(*leaves, causal=True, strategy=strategy)
            assert (out - expected).abs().max().item() < 1e-6
            if hasattr(waveboost, "attention_backward"):
                out.sum().backward()
                ref = [x.clone().requires_grad_(True) for x in (q, k, v)]
                waveboost.attention(*ref, causal=True).sum().backward()
                for mine, theirs in zip(leaves, ref):
                    assert (mine.grad - theirs.grad).abs().max().item() < 1e-6
    finally:
        dist.destroy_process_group()


def test_auto_strategy_by_volume():
    from waveboost.distributed import _resolve_strategy

    # All-gather while every rank's K/V together fit in this rank's q and out: world * Lk * Hkv <= Lq * H.
    assert _resolve_strategy("auto", 2, 1024, 1024, 32, 8) == "allgather"
    assert _resolve_strategy("auto", 4, 1024, 1024, 32, 8) == "allgather"
    assert _resolve_strategy("auto", 8, 1024, 1024, 32, 8) == "ring"
    assert _resolve_strategy("auto", 2, 1024, 1024, 32, 32) == "ring"
    assert _resolve_strategy("auto", 2, 1024, 4096, 32, 8) == "ring"  # longer K/V shards than Q
    for strategy in ("ring", "allgather"):
        assert _resolve_strategy(strategy, 8, 1024, 1024, 32, 1) == strategy
    with pytest.raises(ValueError, match="strategy must be one of"):
        _resolve_strategy("tree", 2, 8, 8, 4, 4)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this torch build")
def test_distributed_bench_end_to_end(tmp_path):
    """`python -m waveboost.bench --distributed 2` on gloo: torchrun, 2 ranks, every layout and
    strategy, forward and forward+backward, rows written by rank 0."""
    import csv

    if not hasattr(waveboost, "attention_backward"):
        pytest.skip("the forward+backward rows need waveboost.attention_backward")
    out = tmp_path / "cp"
    cmd = [sys.executable, "-m", "waveboost.bench", "--distributed", "2", "--device", "cpu", "--seqlens", "64",
           "--heads", "4", "--kv-heads", "2", "--head-dims", "16", "--causal", "1", "--strategies",
           "ring,allgather,auto", "--repeats", "3", "--budget-ms", "1", "--out", str(out)]
    env = dict(os.environ, WAVEBOOST_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hidden_comm = (compute_only + comm_only - time) / comm_only" in done.stdout
    rows = list(csv.DictReader(open(out / "context_parallel.csv")))
    ours = [r for r in rows if r["impl"] == "waveboost"]
    assert len(ours) == 2 * 3 * 2  # layouts x strategies x passes
    assert {(r["layout"], r["pass"]) for r in ours} == {(lay, p) for lay in ("zigzag", "contiguous")
                                                         for p in ("fwd", "fwdbwd")}
    assert {r["strategy"] for r in ours} == {"ring", "allgather", "auto:allgather"}  # 2 * 8 * 2 <= 8 * 4
    for r in ours:
        assert r["status"] == "ok", r
        assert r["world"] == "2" and r["backend"] == "gloo"
        for name in ("time_ms", "fastest_rank_ms", "compute_only_ms", "comm_only_ms", "one_device_ms", "comm_gbps"):
            assert float(r[name]) > 0, (name, r)
        assert float(r["fastest_rank_ms"]) <= float(r["time_ms"])
        assert 0.0 <= float(r["hidden_comm"]) <= 1.0, r
        assert float(r["scaling"]) == pytest.approx(float(r["one_device_ms"]) / float(r["time_ms"]) / 2, rel=1e-4)
        assert 0.0 <= float(r["rel_err"]) <= 1e-4
        assert int(r["calls"]) >= 3
        # One rank receives the other's K and V shards (32 rows, 2 KV heads, head dim 16, float32) per pass
        # through them; the ring's backward sends their gradients 2 hops (home again), the reduce-scatter 1.
        kv_mb = 2 * 32 * 2 * 16 * 4 / 2**20
        passes = 1 if r["pass"] == "fwd" else (4 if r["strategy"] == "ring" else 3)
        assert float(r["comm_mb_per_rank"]) == pytest.approx(kv_mb * passes, rel=1e-4)
    # The peer: PyTorch's context_parallel runs where SDPA's CUDA kernels do; here it says why not.
    peers = [r for r in rows if r["impl"] == "torch_cp"]
    assert len(peers) == 2 * 2 * 2 and all(r["status"] in ("ok", "skipped") for r in peers)
    assert all(r["reason"] for r in peers if r["status"] == "skipped")
    meta = json.load(open(out / "results.json"))
    assert meta["world"] == 2 and len(meta["rows"]) == len(rows)
