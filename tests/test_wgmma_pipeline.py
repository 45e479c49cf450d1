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
