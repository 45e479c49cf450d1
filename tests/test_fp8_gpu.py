"""FP8 (float8_e4m3fn) forward on the wgmma backend, against the float64 reference of the dequantized inputs.

q, k, v are e4m3 values x / descale (per tensor or per batch and kv head), out bfloat16 or float16.
The kernel rounds P to e4m3 for the P V product (3 mantissa bits: up to 6% per probability), which
averages out over many keys but not in rows that see a few (causal rows near the top): the largest
output error measured on an H100 was 1.7% of max |reference| (0.055 at 3.3), the mean 1e-3 or less
(benchmarks/NOTES.md, "FP8 forward"); the bound below is about twice that. The LSE does not see P's
rounding (the row sums are fp32), only that of the e4m3 scores' accumulation in the tensor cores,
which keeps fewer bits than fp32 (measured up to 2.3e-4, relative to max(1, |LSE|)).
"""

from __future__ import annotations

import math

import pytest

import waveboost

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from reference import attention_ref_torch as reference, torch_from_jax  # noqa: E402

E4M3 = getattr(torch, "float8_e4m3fn", None)


def _hopper_fp8():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if E4M3 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    if torch.cuda.get_device_capability() != (9, 0) or not any(
            r["dtype"] == "float8_e4m3fn" for r in waveboost.kernels()):
        pytest.skip("the e4m3 kernel runs on compute capability 9.0 builds with sm_90a objects")


# Output error bound relative to max |reference| (values of unit scale), and the LSE's relative bound.
OUT_TOL = 3e-2
LSE_TOL = 1e-3


def _quantized(shape, scale, gen):
    """e4m3 values of N(0, 1) / scale and their exact dequantized float64 (times scale)."""
    x = torch.randn(*shape, generator=gen, device="cuda")
    s = scale if isinstance(scale, float) else scale[:, None, :, None]
    x8 = (x / s).to(E4M3)
    return x8, x8.double() * (s if isinstance(s, float) else s.double())


def _check(out, lse, ref, ref_lse, what):
    err = (out.double() - ref).abs().max().item()
    assert err <= OUT_TOL * max(1.0, ref.abs().max().item()), (what, err)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), what
    finite = torch.isfinite(ref_lse)
    if finite.any():
        lerr = ((lse.double() - ref_lse)[finite].abs() / ref_lse[finite].abs().clamp_min(1.0)).max().item()
        assert lerr <= LSE_TOL, (what, lerr)


SHAPES = [  # batch, seqlen_q, seqlen_k, heads, heads_kv
    (2, 97, 258, 4, 2),
    (1, 1, 1, 1, 1),
    (3, 300, 129, 8, 8),
    (1, 640, 2000, 4, 1),
    (2, 128, 128, 2, 2),
    (1, 1000, 333, 6, 3),
    (2, 33, 0, 4, 2),  # no keys: zeros and LSE -inf
    (4, 1000, 700, 16, 4),  # 512 query blocks: several per block of a persistent grid; causal rows 0-299 see no key
    (1, 8200, 8300, 2, 1),  # 192-key tiles (long rows): 44 tiles, the last of 44 keys; rows not a multiple of 128
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_matches_float64(shape, causal):
    _hopper_fp8()
    b, lq, lk, h, hkv = shape
    g = torch.Generator(device="cuda").manual_seed(lq * 7 + lk)
    q8, q = _quantized((b, lq, h, 128), 1.0, g)
    k8, k = _quantized((b, lk, hkv, 128), 1.0, g)
    v8, v = _quantized((b, lk, hkv, 128), 1.0, g)
    assert waveboost.plan(q8, k8, v8, causal=causal)["kernel"] == "wgmma_fp8_hdim128_e4m3"
    out, lse = waveboost.attention(q8, k8, v8, causal=causal, return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    ref, ref_lse = reference(q, k, v, causal, 1 / math.sqrt(128))
    _check(out, lse, ref, ref_lse, shape)


def test_fp8_descales_per_head_and_per_tensor():
    _hopper_fp8()
    b, lq, lk, h, hkv = 2, 200, 700, 8, 2
    g = torch.Generator(device="cuda").manual_seed(5)
    # Per (batch, kv head) factors over two orders of magnitude: the e4m3 values stay in range.
    sq = torch.rand(b, hkv, generator=g, device="cuda") * 8 + 0.05
    sk = torch.rand(b, hkv, generator=g, device="cuda") * 8 + 0.05
    sv = torch.rand(b, hkv, generator=g, device="cuda") * 8 + 0.05
    rep = lambda s: s.repeat_interleave(h // hkv, dim=1)  # noqa: E731  (per query head, for q)
    q8, q = _quantized((b, lq, h, 128), rep(sq), g)
    k8, k = _quantized((b, lk, hkv, 128), sk, g)
    v8, v = _quantized((b, lk, hkv, 128), sv, g)
    for causal in (False, True):
        out, lse = waveboost.attention(q8, k8, v8, causal=causal, return_lse=True, q_descale=sq, k_descale=sk,
                                       v_descale=sv)
        ref, ref_lse = reference(q, k, v, causal, 1 / math.sqrt(128))
        _check(out, lse, ref, ref_lse, ("per head", causal))
    # Per tensor: floats and one-element tensors, and a negative softmax_scale.
    q8, q = _quantized((b, lq, h, 128), 0.5, g)
    k8, k = _quantized((b, lk, hkv, 128), 2.0, g)
    v8, v = _quantized((b, lk, hkv, 128), 0.25, g)
    out, lse = waveboost.attention(q8, k8, v8, softmax_scale=-0.07, return_lse=True, q_descale=0.5,
                                   k_descale=torch.tensor([2.0], device="cuda"), v_descale=torch.tensor(0.25,
                                                                                                        device="cuda"))
    ref, ref_lse = reference(q, k, v, False, -0.07)
    _check(out, lse, ref, ref_lse, "per tensor")


def test_fp8_out_float16_and_strided_inputs():
    _hopper_fp8()
    g = torch.Generator(device="cuda").manual_seed(9)
    b, lq, lk, h = 2, 150, 400, 4
    # (batch, heads, seqlen, head_dim) storage passed as BSHD views: strided rows and heads.
    q8, q = _quantized((b, h, lq, 128), 1.0, g)
    k8, k = _quantized((b, h, lk, 128), 1.0, g)
    v8, v = _quantized((b, h, lk, 128), 1.0, g)
    q8, k8, v8, q, k, v = (x.transpose(1, 2) for x in (q8, k8, v8, q, k, v))
    out = torch.full((b, lq, h, 128), float("nan"), device="cuda", dtype=torch.float16)
    got = waveboost.attention(q8, k8, v8, causal=True, out=out)
    assert got is out
    ref, _ = reference(q, k, v, True, 1 / math.sqrt(128))
    err = (out.double() - ref).abs().max().item()
    assert err <= OUT_TOL * max(1.0, ref.abs().max().item()), err


def test_fp8_refusals_name_the_argument():
    _hopper_fp8()
    mk = lambda *s, dtype=E4M3: torch.randn(*s, device="cuda").to(dtype)  # noqa: E731
    q, k = mk(1, 64, 2, 128), mk(1, 64, 2, 128)
    with pytest.raises(ValueError, match="mma"):
        waveboost.attention(q, k, k, backend="mma")
    with pytest.raises(ValueError, match="head_dim"):
        waveboost.attention(mk(1, 64, 2, 64), mk(1, 64, 2, 64), mk(1, 64, 2, 64))
    with pytest.raises(TypeError, match="out must be bfloat16 or float16"):
        waveboost.attention(q, k, k, out=torch.empty(1, 64, 2, 128, device="cuda"))
    with pytest.raises(ValueError, match="q_descale"):
        waveboost.attention(q, k, k, q_descale=torch.ones(3, 2, device="cuda"))
    with pytest.raises(ValueError, match="float8_e4m3fn inputs"):
        b = mk(1, 64, 2, 128, dtype=torch.bfloat16)
        waveboost.attention(b, b, b, v_descale=2.0)
    with pytest.raises(TypeError, match="k_descale"):
        waveboost.attention(q, k, k, k_descale=torch.ones(1, 2, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match="float8_e5m2|float8"):
        e5 = mk(1, 64, 2, 128, dtype=torch.float8_e5m2)
        waveboost.attention(e5, e5, e5)
    with pytest.raises(TypeError, match="float8_e4m3fn"):  # dense batches only
        cu = torch.tensor([0, 64], device="cuda", dtype=torch.int32)
        waveboost.attention_varlen(q[0], k[0], k[0], cu, cu, out=torch.empty(64, 2, 128, device="cuda",
                                                                             dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        cpu = q.cpu()
        waveboost.attention(cpu, cpu, cpu)
    with pytest.raises(TypeError, match="merge_attention_states"):
        waveboost.merge_attention_states(mk(2, 1, 64, 2, 128), torch.zeros(2, 1, 2, 64, device="cuda"),
                                         out=torch.empty(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16))


def test_fp8_from_jax_eager():
    _hopper_fp8()
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU here")
    key = jax.random.PRNGKey(3)
    q = jax.random.normal(key, (1, 130, 4, 128), jnp.float32).astype(jnp.float8_e4m3fn)
    k = jax.random.normal(jax.random.PRNGKey(4), (1, 300, 2, 128), jnp.float32).astype(jnp.float8_e4m3fn)
    out = waveboost.attention(q, k, k, causal=True, v_descale=0.5)
    assert out.dtype == jnp.bfloat16
    qt, kt = (_to_torch(jax, x).double() for x in (q, k))
    ref, _ = reference(qt, kt, kt * 0.5, True, 1 / math.sqrt(128))
    err = (_to_torch(jax, out).double() - ref).abs().max().item()
    assert err <= OUT_TOL * max(1.0, ref.abs().max().item()), err


# ---------------------------------------------------------------------------------------------
# JAX under jit: the XLA custom call (waveboost.jax.attention)
# ---------------------------------------------------------------------------------------------

def _jax_gpu():
    """jax, waveboost.jax and JAX's first GPU, or a skip saying what is missing."""
    _hopper_fp8()
    jax = pytest.importorskip("jax")
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("jax has no GPU here")
    import waveboost.jax as wbj

    if not wbj.ffi_available():
        pytest.skip("waveboost was built without the XLA FFI handlers (no jaxlib at build time)")
    return jax, wbj, gpus[0]


def _jax_quantized(jax, shape, scale, key, device):
    """e4m3 JAX values of N(0, 1) / scale on `device` (scale: a float, or a float32 (batch, heads) JAX array), and
    their exact dequantized float64 (times scale) as a torch CUDA tensor."""
    jnp = jax.numpy
    x = jax.device_put(jax.random.normal(key, shape, jnp.float32), device)
    x8 = (x / (scale if isinstance(scale, float) else scale[:, None, :, None])).astype(jnp.float8_e4m3fn)
    deq = _to_torch(jax, x8).double()
    return x8, deq * (scale if isinstance(scale, float) else _to_torch(jax, scale).double()[:, None, :, None])


def _jax_qkv(jax, gpu, shape, key, scales=(1.0, 1.0, 1.0)):
    """e4m3 q, k, v for `shape` (batch, seqlen_q, seqlen_k, heads, heads_kv), head dim 128, quantized with `scales`
    (see _jax_quantized), and their dequantized float64 torch tensors."""
    b, lq, lk, h, hkv = shape
    shapes = ((b, lq, h, 128), (b, lk, hkv, 128), (b, lk, hkv, 128))
    pairs = [_jax_quantized(jax, s, scale, k, gpu) for s, scale, k in zip(shapes, scales, jax.random.split(key, 3))]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def _to_torch(jax, x):
    """A float32 torch view of a JAX array's values (reference.torch_from_jax)."""
    return torch_from_jax(x.astype(jax.numpy.float32))


JAX_SHAPES = [  # batch, seqlen_q, seqlen_k, heads, heads_kv
    (2, 97, 258, 4, 2),
    (1, 1, 1, 1, 1),
    (3, 300, 129, 8, 8),
    (1, 640, 2000, 8, 1),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("descales", ["per-tensor", "per-head"])
@pytest.mark.parametrize("shape", JAX_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_jax_jit_matches_float64(shape, descales, causal):
    jax, wbj, gpu = _jax_gpu()
    jnp = jax.numpy
    b, lq, lk, h, hkv = shape
    keys = jax.random.split(jax.random.PRNGKey(lq * 7 + lk), 4)
    if descales == "per-head":
        # Per (batch, kv head) factors over two orders of magnitude, traced arguments of the jitted function.
        sq, sk, sv = (jax.device_put(jax.random.uniform(key, (b, hkv), jnp.float32) * 8 + 0.05, gpu)
                      for key in keys[1:])
        q_scale = jnp.repeat(sq, h // hkv, axis=1)  # per query head
        fn = jax.jit(lambda q, k, v, sq, sk, sv: wbj.attention(q, k, v, causal=causal, return_lse=True,
                                                               q_descale=sq, k_descale=sk, v_descale=sv))
        scales = (sq, sk, sv)
    else:
        # Python floats: constants of the jitted function, made float32 arrays there.
        sq, sk, sv = 0.5, 2.0, 0.25
        q_scale = sq
        fn = jax.jit(lambda q, k, v: wbj.attention(q, k, v, causal=causal, return_lse=True, q_descale=0.5,
                                                   k_descale=2.0, v_descale=0.25))
        scales = ()
    (q8, k8, v8), (q, k, v) = _jax_qkv(jax, gpu, shape, keys[0], (q_scale, sk, sv))
    out, lse = fn(q8, k8, v8, *scales)
    assert out.dtype == jnp.bfloat16 and out.shape == q8.shape and lse.shape == (b, h, lq)
    assert out.devices() == {gpu}
    ref, ref_lse = reference(q, k, v, causal, 1 / math.sqrt(128))
    _check(_to_torch(jax, out), _to_torch(jax, lse), ref, ref_lse, (shape, descales, causal))


def test_fp8_jax_vmap_matches_float64():
    jax, wbj, gpu = _jax_gpu()
    jnp = jax.numpy
    b, lq, lk, h, hkv = 2, 130, 301, 4, 2
    keys = jax.random.split(jax.random.PRNGKey(23), 7)
    (_, k8, v8), (_, k, v) = _jax_qkv(jax, gpu, (b, lq, lk, h, hkv), keys[0], (1.0, 1.0, 0.5))
    # Three q's, each with its own per-(batch, kv head) descales (mapped), k's and v's shared (broadcast).
    sqs = [jax.device_put(jax.random.uniform(key, (b, hkv), jnp.float32) * 4 + 0.1, gpu) for key in keys[1:4]]
    qs = [_jax_quantized(jax, (b, lq, h, 128), jnp.repeat(s, h // hkv, axis=1), key, gpu)
          for s, key in zip(sqs, keys[4:7])]
    fn = jax.jit(jax.vmap(lambda q, sq: wbj.attention(q, k8, v8, causal=True, return_lse=True, q_descale=sq,
                                                      v_descale=0.5)))
    out, lse = fn(jnp.stack([q8 for q8, _ in qs]), jnp.stack(sqs))
    assert out.shape == (3, b, lq, h, 128) and out.dtype == jnp.bfloat16 and lse.shape == (3, b, h, lq)
    for i, (_, q) in enumerate(qs):
        ref, ref_lse = reference(q, k, v, True, 1 / math.sqrt(128))
        _check(_to_torch(jax, out[i]), _to_torch(jax, lse[i]), ref, ref_lse, ("vmap", i))


def test_fp8_jax_jit_equals_the_eager_dlpack_route(monkeypatch):
    jax, wbj, gpu = _jax_gpu()
    jnp = jax.numpy
    keys = jax.random.split(jax.random.PRNGKey(21), 2)
    (q8, k8, v8), _ = _jax_qkv(jax, gpu, (2, 257, 1025, 8, 2), keys[0])
    sk = jax.device_put(jax.random.uniform(keys[1], (2, 2), jnp.float32) + 0.5, gpu)
    sv = jax.device_put(jnp.full((1,), 0.25, jnp.float32), gpu)  # one element: repeated over (batch, heads_kv)
    kwargs = dict(causal=True, return_lse=True, q_descale=0.5)
    jitted = jax.jit(lambda q, k, v, sk, sv: waveboost.attention(q, k, v, k_descale=sk, v_descale=sv, **kwargs))(
        q8, k8, v8, sk, sv)
    # Without the XLA handlers waveboost.attention takes the eager DLPack route (its own descale arrays).
    monkeypatch.setattr(wbj, "ffi_available", lambda: False)
    eager = waveboost.attention(q8, k8, v8, k_descale=sk, v_descale=sv, **kwargs)
    for got, expected in zip(jitted, eager):  # the same kernel on the same values: bitwise equal
        assert got.dtype == expected.dtype
        assert torch.equal(_to_torch(jax, got), _to_torch(jax, expected))


def test_fp8_jax_grad_raises():
    jax, wbj, gpu = _jax_gpu()
    jnp = jax.numpy
    keys = jax.random.split(jax.random.PRNGKey(22), 2)
    x = jax.device_put(jax.random.normal(keys[0], (1, 130, 4, 128), jnp.float32), gpu)
    k8, _ = _jax_quantized(jax, (1, 300, 2, 128), 1.0, keys[1], gpu)
    s = jax.device_put(jnp.full((1, 2), 0.5, jnp.float32), gpu)

    def loss(x, s):  # quantized inside: the gradient would flow through the FP8 call
        return wbj.attention(x.astype(jnp.float8_e4m3fn), k8, k8, causal=True, k_descale=s).astype(jnp.float32).sum()

    assert bool(jnp.isfinite(loss(x, s)))  # the forward runs
    for argnums in (0, 1):
        for transform in (lambda f: f, jax.jit):
            with pytest.raises(NotImplementedError, match=r"float8_e4m3fn attention has no backward pass"):
                transform(jax.grad(loss, argnums=argnums))(x, s)


def test_fp8_descale_on_another_device_is_refused():
    _hopper_fp8()
    q = torch.randn(1, 64, 2, 128, device="cuda").to(E4M3)
    with pytest.raises(ValueError, match=r"q_descale is on .* but q is on"):
        waveboost.attention(q, q, q, q_descale=torch.ones(1, 2))
    jax, wbj, gpu = _jax_gpu()
    jnp = jax.numpy
    q8 = jax.device_put(jnp.ones((1, 64, 2, 128), jnp.float8_e4m3fn), gpu)
    on_cpu = jax.device_put(jnp.ones((1, 2), jnp.float32), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match=r"k_descale is on .* but q is on"):
        wbj.attention(q8, q8, q8, k_descale=on_cpu)


# ---------------------------------------------------------------------------------------------
# PyTorch: torch.compile and the custom op
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["waveboost.attention", "waveboost.torch.attention"])
def test_fp8_torch_compile_fullgraph_matches_eager(route):
    _hopper_fp8()
    import waveboost.torch as wbt

    call = waveboost.attention if route == "waveboost.attention" else wbt.attention
    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(31)
    b, lq, lk, h, hkv = 2, 257, 1025, 8, 2
    q8, _ = _quantized((b, lq, h, 128), 1.0, g)
    k8, _ = _quantized((b, lk, hkv, 128), 1.0, g)
    v8, _ = _quantized((b, lk, hkv, 128), 1.0, g)
    sk = torch.rand(b, hkv, generator=g, device="cuda") + 0.5
    sv = torch.full((1,), 0.25, device="cuda")

    def fn(q, k, v, sk, sv):
        return call(q, k, v, causal=True, return_lse=True, q_descale=0.5, k_descale=sk, v_descale=sv)

    out, lse = torch.compile(fn, fullgraph=True)(q8, k8, v8, sk, sv)  # a graph break would raise
    expected, expected_lse = fn(q8, k8, v8, sk, sv)
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)  # the same kernel: bitwise


def test_fp8_opcheck():
    _hopper_fp8()
    import waveboost.torch  # noqa: F401  (registers torch.ops.waveboost, which this test reaches directly)
    g = torch.Generator(device="cuda").manual_seed(32)
    q8, _ = _quantized((2, 65, 4, 128), 1.0, g)
    k8, _ = _quantized((2, 90, 2, 128), 1.0, g)
    v8, _ = _quantized((2, 90, 2, 128), 1.0, g)
    s = torch.rand(2, 2, generator=g, device="cuda") + 0.5
    # test_schema is left out: its mutation check compares every input before and after the call with
    # torch.allclose, which has no float8_e4m3fn kernel. The schema itself is checked with the other
    # dtypes (tests/test_torch_integration.py).
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for causal, descales in ((False, (s, None, s)), (True, (None, None, None))):
        result = torch.library.opcheck(torch.ops.waveboost.attention.default,
                                       (q8, k8, v8, causal, None, "auto", *descales), test_utils=utils)
        assert result == dict.fromkeys(utils, "SUCCESS")
