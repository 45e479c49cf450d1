"""The kernel registry: the generated files agree with the table in src/cuda/kernels.py, the
compiled module exports the table (waveboost.kernels()), every row runs on a GPU that meets its
requirements (parametrized from the table), and waveboost.plan() names the kernel and split-KV
pieces a call launches."""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import waveboost

ROOT = pathlib.Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "src" / "cuda" / "kernels.py"


def _table_module():
    spec = importlib.util.spec_from_file_location("waveboost_kernel_table", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_files_match_the_table():
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_check_notices_a_stale_file(tmp_path, monkeypatch):
    table = _table_module()
    # The generator writing into a scratch tree: --check fails before, passes after, and fails
    # again on an edited file or one left over from an older table.
    monkeypatch.setattr(table, "GENERATED", tmp_path / "generated")
    monkeypatch.setattr(table, "SM80_GENERATED", tmp_path / "sm80" / "generated")
    monkeypatch.setattr(table, "CC90_GENERATED", tmp_path / "cc90" / "generated")
    monkeypatch.setattr(table, "SM90_GENERATED", tmp_path / "sm90" / "generated")
    assert table.main(["--check"]) == 1
    assert table.main([]) == 0 and table.main(["--check"]) == 0
    edited = tmp_path / "generated" / "kernel_table.inc"
    edited.write_text(edited.read_text() + "// edited\n")
    assert table.main(["--check"]) == 1
    assert table.main([]) == 0
    (tmp_path / "generated" / "old_kernel.cu").write_text("")
    assert table.main(["--check"]) == 1
    assert table.main([]) == 0 and table.main(["--check"]) == 0
    assert not (tmp_path / "generated" / "old_kernel.cu").exists()


def _table_rows(groups: set) -> set:
    table = _table_module()
    rows = set()
    for k in table.kernels():
        if k.group not in groups:
            continue
        rows.add((k.name, k.f.backend, k.f.passes, k.f.variant, table.DTYPES[k.dtype][2], k.head_dim))
    return rows


def test_kernels_export_the_compiled_table():
    rows = waveboost.kernels()
    if not waveboost.info()["cuda_compiled"]:
        assert rows == []
        return
    numbers = [int("".join(ch for ch in a.split("-")[0] if ch.isdigit()))
               for a in waveboost.info()["cuda_architectures"].split(",")]
    # Every architecture builds the "" group; 80 and up the kernels that need 8.0, 90 and up those that need
    # 9.0; 90 the sm_90a ones.
    groups = ({""} | ({"sm80"} if any(n >= 80 for n in numbers) else set()) |
              ({"cc90"} if any(n >= 90 for n in numbers) else set()) | ({"sm90a"} if 90 in numbers else set()))
    assert {(r["name"], r["backend"], r["pass"], r["variant"], r["dtype"], r["head_dim"]) for r in rows} == \
        _table_rows(groups)
    for r in rows:  # the rows that need 8.0 are those of the groups built from 80 up
        assert (r["min_compute_capability"] >= 80) == (r["name"] in {k.name for k in _table_module().kernels()
                                                                       if k.group in ("sm80", "cc90", "sm90a")})
    assert len({r["name"] for r in rows}) == len(rows)
    for r in rows:
        assert r["backend"] in waveboost.BACKENDS
        assert r["min_compute_capability"] >= 0
        assert r["max_compute_capability"] is None or r["max_compute_capability"] >= r["min_compute_capability"]
        assert r["smem_bytes"] is None or r["smem_bytes"] > 0
        assert r["vector_elements"] in (0, 4, 8, 16) and (r["vector_elements"] == 0 or 16 % r["vector_elements"] == 0)


def test_plan_on_the_cpu():
    q = np.random.default_rng(0).standard_normal((1, 9, 2, 16)).astype(np.float32)
    assert waveboost.plan(q, q, q) == {"backend": "cpu", "kernel": "cpu", "num_splits": 1, "merge": "",
                                        "persistent": False}
    with pytest.raises(ValueError, match="backend 'mma'"):
        waveboost.plan(q, q, q, backend="mma")
    with pytest.raises(TypeError, match="causal"):
        waveboost.plan(q, q, q, causal="yes")


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_plan_takes_every_framework(framework):
    module = pytest.importorskip(framework)
    q = np.random.default_rng(1).standard_normal((2, 5, 2, 8)).astype(np.float32)
    x = module.from_numpy(q) if framework == "torch" else module.numpy.asarray(q)
    if framework == "jax" and x.devices().pop().platform != "cpu":
        x = module.device_put(x, module.devices("cpu")[0])
    assert waveboost.plan(x, x, x, causal=True) == {"backend": "cpu", "kernel": "cpu", "num_splits": 1, "merge": "",
                                                    "persistent": False}


# ---------------------------------------------------------------------------
# GPU: every row of the table, and the plan of split calls
# ---------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch", reason="the GPU tests drive the kernels through PyTorch")


def _gpu_rows():
    return waveboost.kernels()


def _row_id(r):
    return r["name"]


def _device_cc(torch):
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


# Shapes that reach each kind of row: (batch, seqlen_q, seqlen_k, heads, heads_kv). The general
# wgmma kernel runs what the TMA kernel does not take: split-KV calls (a small grid, long keys).
SHAPES = {
    # At least 2048 query rows (head dim 64 runs the TMA kernel from there); 272 blocks: unsplit below 544 SMs.
    ("wgmma", "tma"): (2, 2100, 1777, 8, 2),
    ("wgmma", ""): (1, 64, 4097, 1, 1),
    # 64 query rows per kv head; K/V shared by the batch (a batch stride of 0, which TMA cannot
    # describe): the cp.async kernel on every device.
    ("decode", ""): (3, 1, 1500, 64, 1),
    ("decode", "tma"): (3, 1, 1500, 16, 4),
}
DEFAULT_SHAPE = (2, 97, 258, 4, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("row", _gpu_rows(), ids=_row_id)
def test_every_kernel_of_the_table_runs(row):
    torch = _torch()
    from reference import attention_ref_torch as reference

    cc = _device_cc(torch)
    if cc < row["min_compute_capability"] or (row["max_compute_capability"] or cc) < cc:
        pytest.skip(f"{row['name']} needs compute capability {row['min_compute_capability']}"
                    f"..{row['max_compute_capability']}; this GPU has {cc}")
    dtype = getattr(torch, row["dtype"])
    b, lq, lk, h, hkv = SHAPES.get((row["backend"], row["variant"]), DEFAULT_SHAPE)
    d = row["head_dim"]
    g = torch.Generator(device="cuda").manual_seed(sum(map(ord, row["name"])))
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda").to(dtype)  # noqa: E731
    q, k, v = mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)
    if (row["backend"], row["variant"]) == ("decode", ""):
        k, v = k[:1].expand_as(k), v[:1].expand_as(v)
    scale = 1 / math.sqrt(d)
    if row["pass"] == "forward":
        plan = waveboost.plan(q, k, v, causal=True, backend=row["backend"])
        assert plan["kernel"] == row["name"], plan
        out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=row["backend"])
        ref, ref_lse = reference(q, k, v, True, scale)
        if row["dtype"] == "float8_e4m3fn":  # P V rounds P to e4m3: the bound of tests/test_fp8_gpu.py
            tol = 3e-2 * max(1.0, ref.abs().max().item())
        else:
            naive, _ = reference(q, k, v, True, scale, dtype=dtype)
            tol = 1e-5 if dtype == torch.float32 else 2 * (naive.double() - ref).abs().max().item() + 2e-3
        err = (out.double() - ref).abs().max().item()
        assert err <= (tol * ref.abs().max().item() if dtype == torch.float32 else tol), (err, tol)
        # Rows that see no key (causal, seqlen_q > seqlen_k) have LSE -inf in both.
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
        finite = torch.isfinite(ref_lse)
        assert (lse.double() - ref_lse)[finite].abs().max().item() < 1e-3 * ref_lse[finite].abs().max().item()
        return
    dout = mk(b, lq, h, d)
    out, lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend="naive")
    dq, dk, dv = waveboost.attention_backward(dout, q, k, v, out, lse, causal=True, backend=row["backend"])
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    ref_out, _ = reference(*leaves, True, scale)
    ref_grads = torch.autograd.grad(ref_out, leaves, dout.double())
    same = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    same_out, _ = reference(*same, True, scale, dtype=dtype)
    same_grads = torch.autograd.grad(same_out, same, dout)
    for name, got, r, base in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_grads, same_grads):
        err = (got.double() - r).abs().max().item()
        bound = 2 * (base.double() - r).abs().max().item() + 2e-3 * max(1.0, r.abs().max().item())
        assert err <= bound, (name, err, bound)


@pytest.mark.gpu
def test_plan_names_the_tma_kernel_and_the_split():
    torch = _torch()
    if _device_cc(torch) != 90 or waveboost.kernels() == [] or not any(
            r["variant"] == "tma" for r in waveboost.kernels()):
        pytest.skip("the wgmma kernels run on compute capability 9.0 builds with sm_90a objects")
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    # A full grid: unsplit, on the TMA kernel; on its persistent grid unless WAVEBOOST_WGMMA_PERSISTENT=0 (read
    # once per process): non-causal, and causal from 8192 query rows or where the 128-row query blocks fill a
    # wave (1024 of them here).
    q, k = mk(4, 2048, 16, 128), mk(4, 2048, 16, 128)
    assert waveboost.plan(q, k, k, causal=True)["persistent"] == (os.environ.get("WAVEBOOST_WGMMA_PERSISTENT") != "0")
    q8k = mk(1, 8192, 16, 128)
    assert waveboost.plan(q8k, q8k, q8k, causal=True)["persistent"] == (os.environ.get("WAVEBOOST_WGMMA_PERSISTENT") != "0")
    assert waveboost.plan(q, k, k) == {"backend": "wgmma", "kernel": "wgmma_tma_hdim128_bf16", "num_splits": 1,
                                         "merge": "", "persistent": os.environ.get("WAVEBOOST_WGMMA_PERSISTENT") != "0"}
    # One block of query rows against 64 key tiles: split on any GPU with 2 SMs or more.
    q, k = mk(1, 64, 1, 64), mk(1, 8192, 1, 64)
    plan = waveboost.plan(q, k, k, backend="wgmma")
    assert plan["kernel"] == "wgmma_hdim64_bf16" and plan["num_splits"] > 1 and plan["merge"] == "combine-kernel", plan
    assert not plan["persistent"]
    # Decode on a dense cache: the TMA variant for tiles of 16, 32 and 64 rows; K/V that TMA cannot
    # describe (a batch stride of 0) take the cp.async kernel.
    q, k = mk(16, 1, 32, 128), mk(16, 4096, 8, 128)
    assert waveboost.plan(q, k, k, backend="decode")["kernel"] == "decode_tma_hdim128_bf16"
    q, k = mk(16, 1, 64, 128), mk(16, 4096, 1, 128)
    assert waveboost.plan(q, k, k, backend="decode")["kernel"] == "decode_tma_hdim128_bf16"
    k = k[:1].expand_as(k)
    assert waveboost.plan(q, k, k, backend="decode")["kernel"] == "decode_hdim128_bf16"
