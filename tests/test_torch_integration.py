"""waveboost.torch: the waveboost::attention custom op and the GQA/MQA module.

CPU tests run wherever PyTorch is installed (any build); GPU tests check what only a GPU shows:
torch.compile with Inductor on CUDA, opcheck on CUDA tensors, CUDA-graph capture and replay with
new inputs, a non-default stream, and a second GPU index.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="waveboost.torch needs PyTorch")

import waveboost
import waveboost.torch as wbt
from reference import attention_ref, rel_err

OP = torch.ops.waveboost.attention.default
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _qkv(b, lq, lk, h, hkv, d, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)
    return mk(b, lq, h, d), mk(b, lk, hkv, d), mk(b, lk, hkv, d)


def _check_vs_reference(out, lse, q, k, v, causal, scale=None, tol=1e-10):
    ref, ref_lse = attention_ref(q.cpu().double().numpy(), k.cpu().double().numpy(), v.cpu().double().numpy(),
                                 causal=causal, softmax_scale=scale)
    assert rel_err(out.cpu().double().numpy(), ref) < tol
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.cpu().numpy()[finite], ref_lse[finite], rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isneginf(lse.cpu().numpy()), np.isneginf(ref_lse))


# ---------------------------------------------------------------------------------------------
# CPU: the op's registration, fake implementation, compile and the module.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_op_matches_reference_cpu(causal, group):
    q, k, v = _qkv(2, 37, 53 if causal else 29, 8, 8 // group, 32)
    out, lse = wbt.attention(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (2, 8, 37) and lse.dtype == torch.float32
    _check_vs_reference(out, lse, q, k, v, causal)
    assert torch.equal(wbt.attention(q, k, v, causal=causal), out)


def test_op_accepts_bhsd_views_and_scale_cpu():
    qs, ks, vs = (t.transpose(1, 2).contiguous() for t in _qkv(1, 19, 23, 4, 2, 16))
    q, k, v = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)  # BSHD views of BHSD storage
    out, lse = wbt.attention(q, k, v, softmax_scale=0.3, return_lse=True)
    _check_vs_reference(out, lse, q, k, v, False, scale=0.3)


def test_plain_attention_takes_tensor_views_torch_can_export_wrongly():
    # Tensors reach the module as DLPack capsules from torch's exporter, which hands over a lazily
    # negated view's storage without its negation, and cannot export sparse tensors at all.
    q, k, v = _qkv(1, 11, 13, 4, 2, 16)
    out = waveboost.attention(torch._neg_view(q), k, torch._neg_view(v), backend="cpu")
    assert torch.equal(out, waveboost.attention(-q, k, -v, backend="cpu"))
    k_grad = k.clone().requires_grad_()
    assert torch.equal(waveboost.attention(q, k_grad, v, backend="cpu"), waveboost.attention(q, k, v, backend="cpu"))
    with pytest.raises(ValueError, match=r"k must be a dense \(strided\) tensor; got layout torch.sparse_coo"):
        waveboost.attention(q, k.to_sparse(), v)
    with pytest.raises(ValueError, match=r"out must be a plain tensor; got a lazily negated view"):
        waveboost.attention(q, k, v, out=torch._neg_view(torch.empty_like(q)))


@pytest.mark.parametrize(
    "dtype,causal,scale,backend",
    [(torch.float64, True, None, "auto"), (torch.float32, False, 0.25, "cpu"), (torch.float32, True, None, "cpu")],
)
def test_opcheck_cpu(dtype, causal, scale, backend):
    q, k, v = _qkv(2, 17, 23, 4, 2, 16, dtype=dtype)
    result = torch.library.opcheck(OP, (q, k, v, causal, scale, backend), test_utils=OPCHECK_UTILS)
    assert result == {name: "SUCCESS" for name in OPCHECK_UTILS}


def test_opcheck_registration_with_inputs_that_require_grad():
    # The registration checks must hold for inputs that require grad (the autograd checks with a
    # backward run in tests/test_backward.py).
    q, k, v = (t.requires_grad_() for t in _qkv(1, 9, 9, 2, 1, 8))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    assert torch.library.opcheck(OP, (q, k, v, True, None, "auto"), test_utils=utils) == dict.fromkeys(utils, "SUCCESS")


def test_fake_implementation_shapes_on_meta():
    q = torch.empty(3, 11, 8, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(3, 5, 2, 64, device="meta", dtype=torch.bfloat16)
    out, lse = wbt.attention(q, k, k, causal=True, return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (3, 8, 11) and lse.dtype == torch.float32


@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
def test_module_matches_reference_cpu(num_kv_heads):
    torch.manual_seed(0)
    module = wbt.MultiheadAttention(64, 8, num_kv_heads, causal=True, dtype=torch.float64)
    x = torch.randn(2, 21, 64, dtype=torch.float64)
    context = torch.randn(2, 30, 64, dtype=torch.float64)
    with torch.no_grad():
        for source in (None, context):
            got = module(x, source)
            src = x if source is None else source
            q = module.q_proj(x).view(2, 21, 8, 8).numpy()
            k = module.k_proj(src).view(2, src.shape[1], num_kv_heads, 8).numpy()
            v = module.v_proj(src).view(2, src.shape[1], num_kv_heads, 8).numpy()
            attn, _ = attention_ref(q, k, v, causal=True)
            expected = module.out_proj(torch.from_numpy(attn).reshape(2, 21, 64))
            assert got.shape == (2, 21, 64)
            assert rel_err(got.numpy(), expected.numpy()) < 1e-10


def test_module_rejects_bad_head_counts():
    with pytest.raises(ValueError, match=r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"):
        wbt.MultiheadAttention(64, 8, 3)
    with pytest.raises(ValueError, match=r"embed_dim \(60\) must be a positive multiple of num_heads \(8\)"):
        wbt.MultiheadAttention(60, 8)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_cpu(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = wbt.MultiheadAttention(64, 8, 2, causal=True).eval()
    compiled = torch.compile(module, fullgraph=True, backend=backend)  # fullgraph: a graph break raises
    with torch.no_grad():
        for seqlen in (33, 47):  # a second shape: the fake implementation under dynamic shapes
            x = torch.randn(2, seqlen, 64)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-6)


def test_compile_traces_the_op_into_the_graph():
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    q, k, v = _qkv(1, 9, 9, 2, 1, 8, dtype=torch.float32)
    fn = torch.compile(lambda q, k, v: wbt.attention(q, k, v, causal=True) * 2, backend=backend, fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), wbt.attention(q, k, v, causal=True) * 2)
    assert len(graphs) == 1
    targets = {n.target for n in graphs[0].graph.nodes}
    assert torch.ops.waveboost.attention in targets or torch.ops.waveboost.attention.default in targets


def _graph_recorder(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    return backend


def _calls_the_op(gm):
    return any(n.target in (torch.ops.waveboost.attention, OP) for n in gm.graph.nodes)


def test_compile_fullgraph_traces_waveboost_attention_into_the_op_cpu():
    # waveboost.attention itself (the DLPack route outside compile) takes the custom op under Dynamo.
    torch._dynamo.reset()
    graphs = []
    q, k, v = _qkv(2, 13, 17, 4, 2, 16, dtype=torch.float32)
    fn = torch.compile(lambda q, k, v: waveboost.attention(q, k, v, causal=True, return_lse=True),
                       backend=_graph_recorder(graphs), fullgraph=True)
    out, lse = fn(q, k, v)
    expected, expected_lse = waveboost.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    assert len(graphs) == 1 and _calls_the_op(graphs[0])


# ---------------------------------------------------------------------------------------------
# FP8 (float8_e4m3fn): the op's arguments, fake implementation and refusals, which the CPU can show
# (the kernel runs on Hopper: tests/test_fp8_gpu.py).
# ---------------------------------------------------------------------------------------------

def _fp8_qkv(device="cpu"):
    return tuple(t.to(torch.float8_e4m3fn) for t in _qkv(2, 9, 11, 4, 2, 128, dtype=torch.float32, device=device))


def test_fp8_compile_fullgraph_traces_the_op_cpu():
    torch._dynamo.reset()
    graphs = []
    q, k, v = _fp8_qkv()
    sk = torch.full((2, 2), 0.5)
    for route in (waveboost.attention, wbt.attention):
        fn = torch.compile(lambda q, k, v, sk: route(q, k, v, causal=True, q_descale=2.0, k_descale=sk),
                           backend=_graph_recorder(graphs), fullgraph=True)  # a graph break would raise
        # Traced without a break; running the graph reaches the kernel call, which the CPU refuses.
        with pytest.raises(ValueError, match=r"backend 'cpu' supports float32 and float64 on the CPU; "
                                             r"got float8_e4m3fn"):
            fn(q, k, v, sk)
        assert _calls_the_op(graphs[-1])
    assert len(graphs) == 2


def test_fp8_fake_implementation_gives_bfloat16_on_meta():
    q, k, v = (torch.empty(s, device="meta", dtype=torch.float8_e4m3fn) for s in ((3, 11, 8, 128), (3, 5, 2, 128),
                                                                                   (3, 5, 2, 128)))
    out, lse = wbt.attention(q, k, v, return_lse=True, q_descale=0.5, v_descale=torch.ones(3, 2, device="meta"))
    assert out.device.type == "meta" and out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (3, 8, 11) and lse.dtype == torch.float32


@pytest.mark.parametrize("route", ["attention", "op"])
def test_fp8_inputs_that_require_grad_raise(route):
    # Meta tensors: the op's fake implementation runs, then autograd's recording refuses FP8.
    q, k, v = (torch.empty(s, device="meta", dtype=torch.float8_e4m3fn) for s in ((1, 7, 2, 128), (1, 9, 1, 128),
                                                                                   (1, 9, 1, 128)))
    call = waveboost.attention if route == "attention" else wbt.attention
    with pytest.raises(NotImplementedError, match=r"float8_e4m3fn attention has no backward pass.*torch.no_grad"):
        call(q, k.requires_grad_(), v)
    with pytest.raises(NotImplementedError, match=r"float8_e4m3fn attention has no backward pass"):
        call(q, k.detach(), v, v_descale=torch.ones(1, 1, device="meta", requires_grad=True))
    with torch.no_grad():  # nothing recorded: the op runs (here its fake implementation)
        assert wbt.attention(q, k, v).dtype == torch.bfloat16


@pytest.mark.parametrize("route", ["attention", "op"])
def test_fp8_refusals_name_the_argument_cpu(route):
    call = waveboost.attention if route == "attention" else wbt.attention
    q, k, v = _fp8_qkv()
    q32, k32, v32 = _qkv(2, 9, 11, 4, 2, 128, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"q_descale, k_descale and v_descale apply to float8_e4m3fn inputs; "
                                         r"q has dtype torch.float32"):
        call(q32, k32, v32, v_descale=2.0)
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, heads_kv\) = \(2, 2\) or one "
                                         r"element; got shape \(2, 4\)"):
        call(q, k, v, k_descale=torch.ones(2, 4))
    with pytest.raises(TypeError, match=r"q_descale must have dtype float32; got float16"):
        call(q, k, v, q_descale=torch.ones(2, 2, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"v_descale must be a float or a float32 torch array like q; got numpy.ndarray"):
        call(q, k, v, v_descale=np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"q_descale must be finite; got nan"):
        call(q, k, v, q_descale=float("nan"))
    with pytest.raises(ValueError, match=r"float8_e4m3fn q, k, v run on the 'wgmma' backend .* got backend 'mma'"):
        call(q, k, v, backend="mma")
    with pytest.raises(TypeError, match=r"k has dtype bfloat16 but q has float8_e4m3fn"):
        call(q, k.to(torch.bfloat16), v)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

CUDA_BACKENDS = [b for b in waveboost.BACKENDS if b != "cpu"]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _skip_unless_runs(q, k, v, backend):
    """Paths differ in the devices and dtypes they take; this file tests plumbing, not coverage."""
    try:
        waveboost.resolve_backend(q, k, v, causal=True, backend=backend)
    except ValueError as e:
        pytest.skip(f"backend {backend!r} cannot run these inputs here: {e}")


def _cuda_qkv(b=2, lq=200, lk=300, h=8, hkv=2, d=128, dtype=torch.float16, device="cuda", seed=0):
    return _qkv(b, lq, lk, h, hkv, d, dtype=dtype, device=device, seed=seed)


def _check_gpu_result(out, lse, q, k, v, causal):
    """Plumbing check: finite, and close to the float64 reference (kernel accuracy is test_gpu's job)."""
    assert torch.isfinite(out).all()
    ref, ref_lse = attention_ref(q.cpu().double().numpy(), k.cpu().double().numpy(), v.cpu().double().numpy(),
                                 causal=causal)
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    assert rel_err(out.cpu().double().numpy(), ref) < tol
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.cpu().numpy()[finite], ref_lse[finite], rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dname", ["fp16", "bf16", "fp32"])
def test_opcheck_gpu(dname):
    dtype = {"fp32": torch.float32, **HALF}[dname]
    q, k, v = _cuda_qkv(lq=65, lk=90, dtype=dtype)
    for causal in (False, True):
        result = torch.library.opcheck(OP, (q, k, v, causal, None, "auto"), test_utils=OPCHECK_UTILS)
        assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS")


@pytest.mark.gpu
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_gpu(mode, num_kv_heads):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = wbt.MultiheadAttention(1024, 8, num_kv_heads, causal=True, device="cuda", dtype=torch.bfloat16).eval()
    compiled = torch.compile(module, fullgraph=True, mode=mode)
    with torch.no_grad():
        for seqlen in (128, 128, 200):  # reduce-overhead records its CUDA graph on a repeat call
            x = torch.randn(2, seqlen, 1024, device="cuda", dtype=torch.bfloat16)
            got = compiled(x).clone()
            expected = module(x)
            torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["op", "attention"])
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_cuda_graph_capture_and_replay(backend, route):
    """Capture fails loudly on a synchronizing call or an allocation outside the graph's pool."""
    static_q, static_k, static_v = _cuda_qkv(seed=1)
    _skip_unless_runs(static_q, static_k, static_v, backend)
    static_out = torch.empty_like(static_q)

    def call():
        if route == "op":
            return wbt.attention(static_q, static_k, static_v, causal=True, return_lse=True, backend=backend)
        return waveboost.attention(static_q, static_k, static_v, causal=True, out=static_out, return_lse=True,
                                   backend=backend)

    side = torch.cuda.Stream()  # warm up off the default stream, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_lse = call()

    for seed in (2, 3):
        q, k, v = _cuda_qkv(seed=seed)
        for static, new in ((static_q, q), (static_k, k), (static_v, v)):
            static.copy_(new)
        graph.replay()
        expected_out, expected_lse = waveboost.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        torch.cuda.synchronize()
        assert torch.equal(graph_out, expected_out) and torch.equal(graph_lse, expected_lse)
        _check_gpu_result(graph_out, graph_lse, q, k, v, True)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_op_on_non_default_stream(backend):
    q, k, v = _cuda_qkv(dtype=torch.bfloat16)
    _skip_unless_runs(q, k, v, backend)
    expected = wbt.attention(q, k, v, causal=True, backend=backend)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got, lse = wbt.attention(q, k, v, causal=True, return_lse=True, backend=backend)
    stream.synchronize()
    assert torch.equal(got, expected)
    _check_gpu_result(got, lse, q, k, v, True)


@pytest.mark.gpu
def test_second_gpu_index():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs a second CUDA device")
    q, k, v = _cuda_qkv(dtype=torch.float16, device="cuda:1")
    torch.cuda.set_device(0)
    # Device 0 current, tensors on device 1: the call runs on device 1's current stream.
    out, lse = wbt.attention(q, k, v, causal=True, return_lse=True)
    assert torch.cuda.current_device() == 0, "the call must restore the caller's current device"
    stream = torch.cuda.Stream(device="cuda:1")
    stream.wait_stream(torch.cuda.current_stream("cuda:1"))
    with torch.cuda.stream(stream):  # a non-default stream of device 1
        out_side = waveboost.attention(q, k, v, causal=True)
    stream.synchronize()
    torch.cuda.synchronize("cuda:1")
    assert out.device == torch.device("cuda:1") and lse.device == torch.device("cuda:1")
    assert torch.equal(out, out_side)
    _check_gpu_result(out, lse, q, k, v, True)
    # A small grid with long keys: on Hopper, wgmma's split-KV and its workspace pool on device 1.
    q, k, v = _cuda_qkv(b=1, lq=64, lk=3000, h=2, hkv=1, dtype=torch.float16, device="cuda:1")
    out, lse = wbt.attention(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize("cuda:1")
    assert torch.cuda.current_device() == 0
    _check_gpu_result(out, lse, q, k, v, True)


@pytest.mark.gpu
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dname", ["fp16", "bf16"])
def test_module_gpu(dname, num_kv_heads):
    torch.manual_seed(0)
    module = wbt.MultiheadAttention(512, 8, num_kv_heads, causal=True, device="cuda", dtype=HALF[dname]).eval()
    x = torch.randn(2, 300, 512, device="cuda", dtype=HALF[dname])
    with torch.no_grad():
        got = module(x)
        q = module.q_proj(x).view(2, 300, 8, 64)
        k = module.k_proj(x).view(2, 300, num_kv_heads, 64)
        v = module.v_proj(x).view(2, 300, num_kv_heads, 64)
        attn, _ = attention_ref(q.cpu().double().numpy(), k.cpu().double().numpy(), v.cpu().double().numpy(),
                                causal=True)
        expected = module.out_proj(torch.from_numpy(attn).to("cuda", HALF[dname]).reshape(2, 300, 512))
    assert rel_err(got.float().cpu().numpy(), expected.float().cpu().numpy()) < 2e-2
