"""waveboost::attention_varlen and waveboost::attention_with_kvcache as PyTorch custom ops:
opcheck, torch.compile(fullgraph=True) with the in-place cache update, CUDA-graph capture."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import waveboost  # noqa: E402
import waveboost.torch as wbt  # noqa: E402
from reference import cu_seqlens  # noqa: E402

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _decode_inputs(device="cpu", dtype=torch.float32, page_size=None):
    g = torch.Generator().manual_seed(0)
    batch, max_len, heads, heads_kv = 3, 32, 4, 2
    head_dim = 16 if device == "cpu" else 64  # CUDA's decode path specializes head dims 64 and 128
    q = torch.randn(batch, 1, heads, head_dim, generator=g, dtype=dtype)
    k_new = torch.randn(batch, 1, heads_kv, head_dim, generator=g, dtype=dtype)
    v_new = torch.randn(batch, 1, heads_kv, head_dim, generator=g, dtype=dtype)
    lengths = torch.tensor([0, 5, 30], dtype=torch.int32)
    if page_size is None:
        k_cache = torch.randn(batch, max_len, heads_kv, head_dim, generator=g, dtype=dtype)
        v_cache = torch.randn(batch, max_len, heads_kv, head_dim, generator=g, dtype=dtype)
        table = None
    else:
        pages = batch * max_len // page_size + 2
        k_cache = torch.randn(pages, page_size, heads_kv, head_dim, generator=g, dtype=dtype)
        v_cache = torch.randn(pages, page_size, heads_kv, head_dim, generator=g, dtype=dtype)
        table = torch.randperm(pages, generator=g)[: pages - 2].reshape(batch, -1).to(torch.int32)
    move = (lambda t: None if t is None else t.to(device))
    return tuple(move(t) for t in (q, k_cache, v_cache, lengths, table, k_new, v_new))


@pytest.mark.parametrize("page_size", [None, 8], ids=["contiguous", "paged"])
def test_opcheck_kvcache(page_size):
    q, kc, vc, lengths, table, kn, vn = _decode_inputs(page_size=page_size)
    op = torch.ops.waveboost.attention_with_kvcache.default
    result = torch.library.opcheck(op, (q, kc, vc, lengths, table, kn, vn, True, None, "auto"),
                                   test_utils=OPCHECK_UTILS)
    assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


def test_opcheck_varlen():
    g = torch.Generator().manual_seed(1)
    cu_q, cu_k = (torch.from_numpy(cu_seqlens(x)) for x in ([3, 0, 5], [4, 2, 9]))
    q = torch.randn(8, 4, 16, generator=g)
    k, v = torch.randn(15, 2, 16, generator=g), torch.randn(15, 2, 16, generator=g)
    op = torch.ops.waveboost.attention_varlen.default
    result = torch.library.opcheck(op, (q, k, v, cu_q, cu_k, 5, 9, True, None, None, None, "auto"),
                                   test_utils=OPCHECK_UTILS)
    assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


@pytest.mark.parametrize("backend,page_size", [("aot_eager", None), ("aot_eager", 8), ("inductor", 8)])
def test_compile_fullgraph_decode_step_updates_the_cache(backend, page_size):
    torch._dynamo.reset()
    q, kc, vc, lengths, table, kn, vn = _decode_inputs(page_size=page_size)
    kc_eager, vc_eager = kc.clone(), vc.clone()

    def step(q, kc, vc, lengths, table, kn, vn):
        out = wbt.attention_with_kvcache(q, kc, vc, lengths, block_table=table, k_new=kn, v_new=vn, causal=True)
        return out * 2 + 1

    compiled = torch.compile(step, fullgraph=True, backend=backend)  # a graph break raises
    got = compiled(q, kc, vc, lengths, table, kn, vn)
    want = step(q, kc_eager, vc_eager, lengths, table, kn, vn)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(kc, kc_eager) and torch.equal(vc, vc_eager)  # the in-place append happened under compile
    if page_size is None:
        assert torch.equal(kc[1, 5], kn[1, 0])


def test_compile_fullgraph_varlen():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    cu_q, cu_k = (torch.from_numpy(cu_seqlens(x)) for x in ([3, 1, 6], [4, 0, 9]))
    q = torch.randn(10, 4, 16, generator=g)
    k, v = torch.randn(13, 1, 16, generator=g), torch.randn(13, 1, 16, generator=g)
    fn = torch.compile(lambda q, k, v: wbt.attention_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=6, max_seqlen_k=9,
                                                            causal=True) + 1, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(q, k, v), waveboost.attention_varlen(q, k, v, cu_q, cu_k, causal=True) + 1)


def test_fake_shapes():
    q, kc, vc, lengths, table, kn, vn = _decode_inputs()
    out, lse = wbt.attention_with_kvcache(q, kc, vc, lengths, return_lse=True)
    assert out.shape == q.shape and lse.shape == (3, 4, 1) and lse.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), waveboost.attention_with_kvcache(q, kc, vc, lengths).numpy())


@pytest.mark.gpu
def test_cuda_graph_decode_step():
    q, kc, vc, lengths, table, kn, vn = _decode_inputs("cuda", torch.bfloat16, page_size=16)
    try:
        waveboost.attention_with_kvcache(q, kc.clone(), vc.clone(), lengths, block_table=table, k_new=kn, v_new=vn)
    except ValueError as e:
        pytest.skip(f"no CUDA backend runs a paged decode here: {e}")
    kc_ref, vc_ref = kc.clone(), vc.clone()
    want = wbt.attention_with_kvcache(q, kc_ref, vc_ref, lengths, block_table=table, k_new=kn, v_new=vn)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture
        wbt.attention_with_kvcache(q, kc.clone(), vc.clone(), lengths, block_table=table, k_new=kn, v_new=vn)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = wbt.attention_with_kvcache(q, kc, vc, lengths, block_table=table, k_new=kn, v_new=vn)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_varlen_fake_raises_the_eager_argument_errors():
    """Traced (fake) calls refuse what the eager call refuses, with its messages (one shared helper)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(7, 4, 16), torch.empty(9, 2, 16)
        cu = torch.empty(3, dtype=torch.int32)
        op = torch.ops.waveboost.attention_varlen
        with pytest.raises(ValueError, match="cu_seqlens_k is required without block_table"):
            op(q, k, k, cu, None, None, None, False, None, None, None, "auto")
        with pytest.raises(ValueError, match="q must be a 3-D tensor"):
            op(q[None], k, k, cu, cu, None, None, False, None, None, None, "auto")
