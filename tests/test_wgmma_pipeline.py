"""The wgmma forward's two load pipelines: TMA producer (default) and cp.async.

The pipeline is chosen once per process (WAVEBOOST_WGMMA_PIPELINE), so the cp.async kernel's
unsplit blocks are checked by running the wgmma reference tests of test_gpu.py again in a
child process with WAVEBOOST_WGMMA_PIPELINE=cp.async; the default (TMA) runs in this one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))


def test_cp_async_pipeline_matches_reference():
    env = dict(os.environ, WAVEBOOST_WGMMA_PIPELINE="cp.async")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           os.path.join(HERE, "test_gpu.py"), "-k", "wgmma and matches_reference and not split"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=HERE)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail


def test_tma_pipeline_on_views_of_a_bigger_buffer():
    """K and V as strided views (row stride > head_dim, head stride from a wider buffer): the
    tensor map's strides, not a packed layout, must address them."""
    torch = pytest.importorskip("torch")
    import waveboost
    from reference import attention_ref_torch as reference

    g = torch.Generator(device="cuda")
    g.manual_seed(3)
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            big = torch.randn(2, 300, 6, d + 64, generator=g, device="cuda").to(dtype)
            q = torch.randn(2, 200, 4, d, generator=g, device="cuda").to(dtype)
            k = big[:, :, 1:3, 32:32 + d]
            v = big[:, :, 3:5, 16:16 + d]
            for causal in (False, True):
                out, lse = waveboost.attention(q, k, v, causal=causal, backend="wgmma", return_lse=True)
                ref, ref_lse = reference(q, k, v, causal, d ** -0.5)
                err = (out.double() - ref).abs().max().item()
                assert err < 2e-2, (dtype, d, causal, err)
                finite = torch.isfinite(ref_lse)
                assert (lse.double() - ref_lse)[finite].abs().max().item() < 1e-3


def test_tma_pipeline_head_dim_64_blocks_of_192_rows():
    """At head dim 64 the TMA kernel runs blocks of 192 query rows (three consumer warpgroups) from
    2048 query rows on, blocks of 128 rows below: both sides of the threshold,
    query lengths that leave a partial last block, causal with more and with fewer queries than keys
    (rows that see no key: zeros, LSE -inf), GQA, a negative scale, and varlen batches whose longest
    sequence crosses the threshold."""
    torch = pytest.importorskip("torch")
    import waveboost
    from reference import attention_ref_torch as reference

    g = torch.Generator(device="cuda")
    g.manual_seed(19)
    cases = [  # batch, heads, heads_kv, seqlen_q, seqlen_k, causal, scale, kernel expected
        (1, 4, 2, 2047, 600, False, None, "wgmma_tma_hdim64"),  # 128-row blocks
        (3, 4, 2, 700, 1500, True, -0.4, "wgmma_tma_hdim64"),  # 128-row blocks, causal
        (1, 8, 2, 2048, 2048, True, None, "wgmma_tma_hdim64"),
        (2, 3, 1, 2200, 1900, True, None, "wgmma_tma_hdim64"),  # 300 rows see no key
        (1, 6, 3, 2113, 2500, True, -0.2, "wgmma_tma_hdim64"),
        (2, 2, 1, 2305, 257, False, 0.3, "wgmma_tma_hdim64"),
    ]  # grids of at least half the SMs' worth of 128-row blocks on an H100: no split-KV
    for dtype in (torch.float16, torch.bfloat16):
        for b, h, hkv, lq, lk, causal, scale, kernel in cases:
            q = torch.randn(b, lq, h, 64, generator=g, device="cuda").to(dtype)
            k = torch.randn(b, lk, hkv, 64, generator=g, device="cuda").to(dtype)
            v = torch.randn(b, lk, hkv, 64, generator=g, device="cuda").to(dtype)
            s = 0.125 if scale is None else scale
            where = (dtype, b, h, hkv, lq, lk, causal, s)
            assert waveboost.plan(q, k, v, causal=causal, backend="wgmma")["kernel"].startswith(kernel), where
            out, lse = waveboost.attention(q, k, v, causal=causal, softmax_scale=s, backend="wgmma",
                                           return_lse=True)
            ref, ref_lse = reference(q, k, v, causal, s)
            assert torch.isfinite(out).all(), where
            assert (out.double() - ref).abs().max().item() < 2e-2, where
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse), finite), where
            assert (lse.double() - ref_lse)[finite].abs().max().item() < 1e-3, where
            if causal and lq > lk:
                assert out[:, : lq - lk].abs().max().item() == 0, where

    # Varlen: packed sequences of 2500, 0, 37 and 2049 query rows (max 2500: the 192-row kernel), and
    # of 1000, 1, 0 and 517 (max 1000: 128-row blocks).
    for lens_q, lens_k, causal in [([2500, 0, 37, 2049], [2600, 5, 0, 1500], c) for c in (False, True)] + [
            ([1000, 1, 0, 517], [1300, 200, 9, 0], c) for c in (False, True)]:
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
        q = torch.randn(sum(lens_q), 4, 64, generator=g, device="cuda").to(torch.bfloat16)
        k = torch.randn(sum(lens_k), 2, 64, generator=g, device="cuda").to(torch.bfloat16)
        v = torch.randn(sum(lens_k), 2, 64, generator=g, device="cuda").to(torch.bfloat16)
        out = waveboost.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k),
                                         causal=causal, backend="wgmma")
        for i in range(len(lens_q)):
            if lens_q[i] == 0:
                continue
            qs = q[cu_q[i]:cu_q[i + 1]][None]
            ks, vs = k[cu_k[i]:cu_k[i + 1]][None], v[cu_k[i]:cu_k[i + 1]][None]
            got = out[cu_q[i]:cu_q[i + 1]].double()
            if lens_k[i] == 0:
                assert got.abs().max().item() == 0, (i, causal)
                continue
            ref, _ = reference(qs, ks, vs, causal, 64 ** -0.5)
            assert (got - ref[0]).abs().max().item() < 2e-2, (i, causal)
