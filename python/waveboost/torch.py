"""PyTorch integration: ``waveboost::attention`` as a custom op, and a GQA/MQA attention module.

``waveboost.torch.attention`` goes through ``torch.ops.waveboost.attention``, registered with
``torch.library.custom_op`` and a fake (meta) implementation, so ``torch.compile(fullgraph=True)``
traces it without a graph break and ``torch.library.opcheck`` passes. The op runs on
``torch.cuda.current_stream()`` of the tensors' device, allocates its outputs with the caching
allocator and never synchronizes, so it can be captured in a CUDA graph (``torch.cuda.graph``).

Differentiable: the op's autograd formula saves q, k, v, out and lse and calls a second custom op,
``torch.ops.waveboost.attention_backward`` (also with a fake implementation), so
``torch.compile(fullgraph=True)`` traces forward and backward alike. A gradient flowing into the
returned lse is honoured (it adds ``dlse * P`` to the score gradient).

float8_e4m3fn q, k, v take the op's optional descale tensors (Hopper's ``wgmma`` forward, bfloat16
output); they have no backward, so autograd recording such a call raises.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import _api

__all__ = ["MultiheadAttention", "attention", "attention_varlen", "attention_with_kvcache",
           "scaled_dot_product_attention"]


@torch.library.custom_op(
    "waveboost::attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, bool causal, float? softmax_scale, str backend, Tensor? q_descale=None, "
    "Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor, Tensor)",
)
def _attention_op(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float | None, backend: str,
    q_descale: Tensor | None = None, k_descale: Tensor | None = None, v_descale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    # The DLPack route: outputs from torch.empty (the caching allocator, or a CUDA graph's
    # private pool under capture), kernel on torch.cuda.current_stream(q.device).
    # Detached: inside the op, autograd is this op's own formula, not the generic API's route.
    q, k, v = q.detach(), k.detach(), v.detach()
    q_descale, k_descale, v_descale = (None if d is None else d.detach() for d in (q_descale, k_descale, v_descale))
    return _api.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


@_attention_op.register_fake
def _attention_fake(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float | None, backend: str,
    q_descale: Tensor | None = None, k_descale: Tensor | None = None, v_descale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (batch, seqlen_q, heads, head_dim); got shape {tuple(q.shape)}")
    batch, seqlen_q, heads, _ = q.shape
    # Contiguous, like the real implementation's torch.empty (empty_like would copy q's strides);
    # bfloat16 for float8_e4m3fn inputs, as the real implementation allocates.
    out_dtype = torch.bfloat16 if _api._is_float8(q) else q.dtype
    return q.new_empty(q.shape, dtype=out_dtype), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------


@torch.library.custom_op(
    "waveboost::attention_backward",
    mutates_args=(),
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, bool causal, "
    "float? softmax_scale, bool deterministic, str backend) -> (Tensor, Tensor, Tensor)",
)
def _attention_backward_op(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Tensor | None, causal: bool,
    softmax_scale: float | None, deterministic: bool, backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    # Gradients arriving from autograd can be expanded views (e.g. of a sum's scalar gradient);
    # the kernels read rows with a unit last stride.
    if dout.dim() > 0 and dout.stride(-1) != 1:
        dout = dout.contiguous()
    if dlse is not None and dlse.dim() > 0 and dlse.stride(-1) != 1:
        dlse = dlse.contiguous()
    return _api.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, dlse=dlse,
                                   deterministic=deterministic, backend=backend)


@_attention_backward_op.register_fake
def _attention_backward_fake(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dlse: Tensor | None, causal: bool,
    softmax_scale: float | None, deterministic: bool, backend: str,
) -> tuple[Tensor, Tensor, Tensor]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, seqlen, heads, head_dim); got shape {tuple(x.shape)}")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, softmax_scale, backend = inputs[:6]
    if _api._is_float8(q):  # called only when autograd records the op: an input (or a descale) requires grad
        raise NotImplementedError(_api.fp8_no_backward(
            "autograd would record this call (an input requires grad, with grad mode on): detach the inputs or "
            "call under torch.no_grad() / torch.inference_mode()"))
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.softmax_scale, ctx.backend = causal, softmax_scale, backend
    # An output nobody differentiated arrives as None rather than zeros: no dlse term for an unused lse.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out: Tensor, grad_lse: Tensor):
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    # A forward-only backend named for the forward computes the gradient on the automatic choice.
    backend = ctx.backend if _api._waveboost.backend_has_backward(ctx.backend) else "auto"
    dq, dk, dv = torch.ops.waveboost.attention_backward(
        grad_out, q, k, v, out, lse, grad_lse, ctx.causal, ctx.softmax_scale,
        torch.are_deterministic_algorithms_enabled(), backend,
    )
    return dq, dk, dv, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    q_descale: Tensor | float | None = None,
    k_descale: Tensor | float | None = None,
    v_descale: Tensor | float | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """``waveboost.attention`` for PyTorch tensors, through the ``waveboost::attention`` custom op.

    Same arguments and conventions as ``waveboost.attention`` (BSHD layout, GQA/MQA, bottom-right
    causal mask) less ``out=``: the op allocates its outputs, which is what lets ``torch.compile``
    and CUDA graphs reason about it. ``lse`` is always computed (float32 (batch, heads, seqlen_q),
    a small fraction of the work) and returned when ``return_lse`` is true.

    Differentiable with respect to q, k and v (through ``out`` and ``lse``). The backward runs on
    ``backend`` when it has a backward pass and on ``"auto"`` otherwise (``simt``, ``wmma``);
    ``torch.use_deterministic_algorithms(True)`` selects the deterministic backward.

    FP8: float8_e4m3fn q, k, v with ``q_descale``, ``k_descale``, ``v_descale`` as in
    ``waveboost.attention`` (a float becomes a float32 (batch, heads_kv) tensor passed to the op);
    ``out`` is bfloat16. FP8 has no backward: a call that autograd would record (an input requires
    grad, grad mode on) raises ``NotImplementedError``.
    """
    softmax_scale = _api.check_softmax_scale(softmax_scale)
    return_lse = _api.check_flag(return_lse, "return_lse")
    descales = (q_descale, k_descale, v_descale)
    if _api.check_fp8(q, _api.check_backend(backend), descales):
        descales = _api.map_descales(descales, q, k, lambda d, arg, batch, heads_kv: _api._descale_array(
            "torch", d, q, batch, heads_kv, arg))
    out, lse = torch.ops.waveboost.attention(q, k, v, _api.check_flag(causal, "causal"), softmax_scale, backend,
                                             *descales)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# torch.nn.functional.scaled_dot_product_attention's calling convention
# ---------------------------------------------------------------------------------------------


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``'s arguments, layout and causal mask.

    Layout (batch, heads, seqlen, head_dim), SDPA's (not ``waveboost.attention``'s BSHD); the
    result is (batch, heads, seqlen_q, head_dim), a transposed view of a BSHD tensor, as SDPA's
    flash backend returns. ``is_causal`` follows SDPA's top-left alignment: query ``i`` sees keys
    ``j <= i`` whatever the lengths. waveboost's kernels align bottom-right, and the two agree
    exactly after these zero-copy rewrites: for ``seqlen_q < seqlen_k`` no query sees a key past
    ``seqlen_q - 1``, so the kernel runs on the first ``seqlen_q`` keys; for ``seqlen_q > seqlen_k``
    the first ``seqlen_k`` queries form a square causal block and the rest see every key, so the
    two parts run as separate calls and are concatenated. Query heads that outnumber key heads
    need ``enable_gqa=True``, as in SDPA (query head ``h`` reads key head ``h // (heads // heads_kv)``).

    Refused with ValueError: ``attn_mask`` (no arbitrary masks) and ``dropout_p`` > 0. Forward only.
    """
    if attn_mask is not None:
        raise ValueError("attn_mask must be None: waveboost computes unmasked or causal (is_causal=True) attention "
                         "only; use torch.nn.functional.scaled_dot_product_attention for other masks")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float; got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0: waveboost has no dropout (inference only); got {dropout_p}")
    is_causal = _api.check_flag(is_causal, "is_causal")
    enable_gqa = _api.check_flag(enable_gqa, "enable_gqa")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__module__}.{type(t).__qualname__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, heads, seqlen, head_dim) as for SDPA; "
                             f"got shape {tuple(t.shape)}")
    if key.shape != value.shape:
        raise ValueError(f"value has shape {tuple(value.shape)} but key has {tuple(key.shape)}; waveboost needs "
                         "them equal (value's head_dim must equal the query's)")
    if key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3]:
        raise ValueError(f"key has shape {tuple(key.shape)}; its batch and head_dim must match query's "
                         f"{tuple(query.shape)}")
    heads, heads_kv = query.shape[1], key.shape[1]
    if heads != heads_kv and not enable_gqa:
        raise ValueError(f"query has {heads} heads but key has {heads_kv}: pass enable_gqa=True for grouped-query "
                         "attention, as SDPA requires")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if not is_causal or seqlen_q == seqlen_k:
        out = attention(q, k, v, causal=is_causal, softmax_scale=scale)
    elif seqlen_q < seqlen_k:
        out = attention(q, k[:, :seqlen_q], v[:, :seqlen_q], causal=True, softmax_scale=scale)
    else:
        square = attention(q[:, :seqlen_k], k, v, causal=True, softmax_scale=scale)
        rest = attention(q[:, seqlen_k:], k, v, causal=False, softmax_scale=scale)
        out = torch.cat((square, rest), dim=1)
    return out.transpose(1, 2)


class MultiheadAttention(nn.Module):
    """Multi-head attention with grouped-query (GQA) and multi-query (MQA) heads.

    Projections are ``nn.Linear`` layers; the attention itself is ``waveboost.torch.attention``
    on the (batch, seqlen, heads, head_dim) views of the projections, so no transposes or copies
    sit between the projections and the kernel. ``num_kv_heads`` = ``num_heads`` is ordinary
    multi-head attention, 1 is MQA, anything in between that divides ``num_heads`` is GQA.

    Differentiable (see the module docstring): it trains like any other module.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        causal: bool = False,
        bias: bool = True,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})")
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        kv_dim = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """Self-attention over ``x`` (batch, seqlen, embed_dim), or cross-attention to ``context``
        (batch, seqlen_k, embed_dim) when given. Returns (batch, seqlen, embed_dim)."""
        source = x if context is None else context
        batch, seqlen_q, _ = x.shape
        seqlen_k = source.shape[1]
        q = self.q_proj(x).view(batch, seqlen_q, self.num_heads, self.head_dim)
        k = self.k_proj(source).view(batch, seqlen_k, self.num_kv_heads, self.head_dim)
        v = self.v_proj(source).view(batch, seqlen_k, self.num_kv_heads, self.head_dim)
        out = attention(q, k, v, causal=self.causal, backend=self.backend)
        return self.out_proj(out.reshape(batch, seqlen_q, self.embed_dim))

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"causal={self.causal}, backend={self.backend!r}")


# ---------------------------------------------------------------------------
# Serving: variable-length batches and KV-cache attention as custom ops.
# ---------------------------------------------------------------------------

@torch.library.custom_op(
    "waveboost::attention_varlen",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, int? max_seqlen_q, "
    "int? max_seqlen_k, bool causal, float? softmax_scale, Tensor? block_table, Tensor? seqused_k, str backend) "
    "-> (Tensor, Tensor)",
)
def _attention_varlen_op(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor | None, max_seqlen_q: int | None,
    max_seqlen_k: int | None, causal: bool, softmax_scale: float | None, block_table: Tensor | None,
    seqused_k: Tensor | None, backend: str,
) -> tuple[Tensor, Tensor]:
    return _api.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
        softmax_scale=softmax_scale, block_table=block_table, seqused_k=seqused_k, return_lse=True, backend=backend)


@_attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                           block_table, seqused_k, backend):
    # The eager call's argument rules, raised while tracing.
    _api.varlen_args(tuple(q.shape), cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k)
    total_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((heads, total_q), dtype=torch.float32)


def _no_varlen_backward(ctx, grad_out: Tensor, grad_lse: Tensor):
    raise NotImplementedError(
        "waveboost::attention_varlen has no backward yet (the backward pass runs on dense batches: "
        "waveboost.torch.attention). Run it under torch.no_grad() or torch.inference_mode()."
    )


# Differentiating through the op fails with a message saying why; forward calls on tensors that
# require grad are fine.
_attention_varlen_op.register_autograd(_no_varlen_backward)


@torch.library.custom_op(
    "waveboost::attention_with_kvcache",
    mutates_args=("k_cache", "v_cache"),
    schema="(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, Tensor? block_table, "
    "Tensor? k_new, Tensor? v_new, bool causal, float? softmax_scale, str backend) -> (Tensor, Tensor)",
)
def _attention_with_kvcache_op(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, block_table: Tensor | None,
    k_new: Tensor | None, v_new: Tensor | None, causal: bool, softmax_scale: float | None, backend: str,
) -> tuple[Tensor, Tensor]:
    return _api.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table=block_table, k_new=k_new, v_new=v_new, causal=causal,
        softmax_scale=softmax_scale, return_lse=True, backend=backend)


@_attention_with_kvcache_op.register_fake
def _attention_with_kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal,
                                 softmax_scale, backend):
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (batch, seqlen_q, heads, head_dim); got shape {tuple(q.shape)}")
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor | None,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    block_table: Tensor | None = None,
    seqused_k: Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """``waveboost.attention_varlen`` through the ``waveboost::attention_varlen`` custom op
    (``torch.compile(fullgraph=True)`` traces it; CUDA graphs capture it when ``max_seqlen_q`` and
    ``max_seqlen_k`` are given, since omitted ones are read from the device). No ``out=`` and no
    ``validate=``: call ``waveboost.attention_varlen`` for those."""
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    out, lse = torch.ops.waveboost.attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bool(causal), softmax_scale, block_table,
        seqused_k, backend)
    return (out, lse) if return_lse else out


def attention_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    *,
    block_table: Tensor | None = None,
    k_new: Tensor | None = None,
    v_new: Tensor | None = None,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """``waveboost.attention_with_kvcache`` through the ``waveboost::attention_with_kvcache``
    custom op, which declares that it writes ``k_cache`` and ``v_cache`` (the ``k_new``/``v_new``
    append), so ``torch.compile`` orders it correctly with other uses of the caches. Nothing is
    read on the host: a decode step can be captured in a CUDA graph."""
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    out, lse = torch.ops.waveboost.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, bool(causal), softmax_scale, backend)
    return (out, lse) if return_lse else out
