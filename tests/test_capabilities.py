"""waveboost.capabilities() and the one list of backend names: the records agree with what calls
do, and every name comes from the compiled module."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import waveboost
from waveboost import _waveboost

FLAGS = ("causal", "gqa", "varlen", "seqused", "paged", "deterministic_backward")


def _record(name: str) -> dict:
    (record,) = [r for r in waveboost.capabilities() if r["backend"] == name]
    return record


def test_backend_names_come_from_the_compiled_module():
    assert waveboost.BACKENDS == tuple(_waveboost.backend_names())
    assert waveboost.BACKENDS[0] == "auto" and "cpu" in waveboost.BACKENDS
    assert len(set(waveboost.BACKENDS)) == len(waveboost.BACKENDS)


def _stub_literal(name: str) -> tuple:
    stub = pathlib.Path(waveboost.__file__).with_name("_api.pyi")
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == name:
            return tuple(ast.literal_eval(e) for e in node.value.slice.elts)
    pytest.fail(f"no {name} in _api.pyi")


def test_stub_backend_literals_list_every_backend():
    assert _stub_literal("BackendName") == waveboost.BACKENDS
    assert _stub_literal("ResolvedBackend") == tuple(b for b in waveboost.BACKENDS if b != "auto")


def test_unknown_backend_names_every_known_one():
    q = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError) as info:
        waveboost.resolve_backend(q, q, q, backend="nope")
    for name in waveboost.BACKENDS:
        assert repr(name) in str(info.value)


def test_cpu_backend_record():
    cpu = _record("cpu")
    assert cpu["device"] == "cpu" and cpu["available"] and cpu["reason"] is None
    assert cpu["passes"] == ["forward", "backward"]
    assert cpu["forward_dtypes"] == ["float32", "float64"]
    assert cpu["backward_dtypes"] == ["float32", "float64"]
    assert cpu["any_head_dim"] and cpu["head_dims"] == list(_waveboost.probed_head_dims())
    assert cpu["backward_head_dims"] == cpu["head_dims"]
    assert all(cpu[flag] for flag in FLAGS), cpu


def _stub_capability_keys() -> set:
    """The keys the stub (python/waveboost/_api.pyi) promises for a record."""
    stub = pathlib.Path(waveboost.__file__).with_name("_api.pyi")
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "Capability":
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)}
    pytest.fail("no Capability in _api.pyi")


def test_records_are_well_formed():
    records = waveboost.capabilities()
    keys = _stub_capability_keys()
    for r in records:
        assert set(r) == keys, r["backend"]
        assert r["device"] in ("cpu", "cuda") and isinstance(r["requires"], str) and r["requires"]
        assert set(r["head_dims"]) | set(r["backward_head_dims"]) <= set(_waveboost.probed_head_dims())
        if not r["available"]:
            assert r["reason"] and not r["passes"] and not r["head_dims"] and not r["backward_head_dims"]
            assert not any(r[f] for f in FLAGS)
    names = [r["backend"] for r in records]
    assert len(set(names)) == len(names) and "auto" not in names
    if not waveboost.info()["cuda_compiled"]:
        assert names == ["cpu"]


def test_every_listed_backend_is_accepted_by_backend_argument(rng):
    q = rng.standard_normal((1, 4, 2, 64)).astype(np.float32)
    for r in waveboost.capabilities():
        try:
            assert waveboost.resolve_backend(q, q, q, backend=r["backend"]) == r["backend"]
        except ValueError as e:  # refused for these tensors (e.g. host memory on a CUDA backend), not unknown
            assert "backend must be one of" not in str(e)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("head_dim", [7, 64, 96])
def test_cpu_record_agrees_with_calls(rng, dtype, head_dim):
    cpu = _record("cpu")
    q = rng.standard_normal((2, 5, 4, head_dim)).astype(dtype)
    k = rng.standard_normal((2, 9, 2, head_dim)).astype(dtype)
    expected = dtype in cpu["forward_dtypes"] and (cpu["any_head_dim"] or head_dim in cpu["head_dims"])
    if expected:
        assert waveboost.resolve_backend(q, k, k, causal=True, backend="cpu") == "cpu"
        out, lse = waveboost.attention(q, k, k, causal=cpu["causal"], return_lse=True, backend="cpu")
        assert np.isfinite(out).all()
        grads = waveboost.attention_backward(out, q, k, k, out, lse, causal=cpu["causal"],
                                             deterministic=cpu["deterministic_backward"], backend="cpu")
        assert dtype in cpu["backward_dtypes"] and all(np.isfinite(g).all() for g in grads)
    else:
        with pytest.raises(ValueError, match="backend 'cpu'"):
            waveboost.resolve_backend(q, k, k, backend="cpu")


def test_cpu_record_agrees_with_sequence_layouts(rng):
    cpu = _record("cpu")
    assert cpu["varlen"] and cpu["paged"] and cpu["seqused"]
    q = rng.standard_normal((7, 4, 16)).astype(np.float32)
    k = rng.standard_normal((9, 2, 16)).astype(np.float32)
    cu_q = np.array([0, 3, 7], np.int32)
    cu_k = np.array([0, 4, 9], np.int32)
    out = waveboost.attention_varlen(q, k, k, cu_q, cu_k, backend="cpu")
    assert np.isfinite(out).all()
    cache = rng.standard_normal((4, 8, 2, 16)).astype(np.float32)
    table = np.array([[0, 1], [2, 3]], np.int32)
    out = waveboost.attention_with_kvcache(rng.standard_normal((2, 1, 4, 16)).astype(np.float32), cache, cache,
                                           np.array([5, 16], np.int32), block_table=table, backend="cpu")
    assert np.isfinite(out).all()


def test_capabilities_rejects_a_bad_device():
    with pytest.raises(TypeError, match="device must be an int"):
        waveboost.capabilities("cuda")


@pytest.mark.gpu
def test_cuda_records_agree_with_resolve_backend():
    import torch

    for r in waveboost.capabilities():
        if r["device"] != "cuda":
            continue
        for dtype_name in ("float16", "bfloat16", "float32"):
            for head_dim in (64, 80):
                dtype = getattr(torch, dtype_name)
                q = torch.randn(2, 4, 4, head_dim, device="cuda", dtype=dtype)
                k = torch.randn(2, 64, 4, head_dim, device="cuda", dtype=dtype)
                # Every backend takes each listed dtype at each listed head dim (the lists are a product).
                runs = r["available"] and dtype_name in r["forward_dtypes"] and head_dim in r["head_dims"]
                if runs:
                    assert waveboost.resolve_backend(q, k, k, backend=r["backend"]) == r["backend"]
                    if r["causal"]:
                        assert waveboost.resolve_backend(q, k, k, causal=True, backend=r["backend"]) == r["backend"]
                else:
                    with pytest.raises(ValueError):
                        waveboost.resolve_backend(q, k, k, backend=r["backend"])
                if runs and dtype_name in r["backward_dtypes"] and head_dim in r["backward_head_dims"]:
                    assert waveboost.resolve_backend(q, k, k, backend=r["backend"], backward=True) == r["backend"]


def test_command_line_lists_every_record(capsys):
    from waveboost.__main__ import main

    assert main(["capabilities"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == [r["backend"] for r in waveboost.capabilities()]
    cpu = next(line for line in lines if line.startswith("cpu "))
    assert "forward float32,float64; backward float32,float64; head dims any;" in cpu and "paged" in cpu
