"""PyTorch integration: ``waveboost::attention`` as a custom op, and a GQA/MQA attention module.

``waveboost.torch.attention`` goes through ``torch.ops.waveboost.attention``, registered with
``torch.library.custom_op`` and a fake (meta) implementation, so ``torch.compile(fullgraph=True)``
traces it without a graph break and ``torch.library.opcheck`` passes. The op runs on
``torch.cuda.current_stream()`` of the tensors' device, allocates its outputs with the caching
allocator and never synchronizes, so it can be captured in a CUDA graph (``torch.cuda.graph``).

Forward only: the op has no backward. Calling it on tensors that require grad works (the outputs
do not require grad); differentiate through it and autograd raises.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import _api

__all__ = ["MultiheadAttention", "attention", "attention_varlen", "attention_with_kvcache"]


@torch.library.custom_op(
    "waveboost::attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, bool causal, float? softmax_scale, str backend) -> (Tensor, Tensor)",
)
def _attention_op(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float | None, backend: str
) -> tuple[Tensor, Tensor]:
    # The DLPack route: outputs from torch.empty (the caching allocator, or a CUDA graph's
    # private pool under capture), kernel on torch.cuda.current_stream(q.device).
    return _api.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, backend=backend)


@_attention_op.register_fake
def _attention_fake(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float | None, backend: str
) -> tuple[Tensor, Tensor]:
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (batch, seqlen_q, heads, head_dim); got shape {tuple(q.shape)}")
    batch, seqlen_q, heads, _ = q.shape
    # Contiguous, like the real implementation's torch.empty (empty_like would copy q's strides).
    return q.new_empty(q.shape), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


def _no_backward(ctx, grad_out: Tensor, grad_lse: Tensor):
    raise NotImplementedError(
        "waveboost::attention is forward-only: it has no backward. Run it under torch.no_grad() or "
        "torch.inference_mode(), or use torch.nn.functional.scaled_dot_product_attention for training."
    )


# An explicit autograd registration whose backward raises: forward calls on tensors that
# require grad are fine, and differentiating through the op fails with a message saying why.
_attention_op.register_autograd(_no_backward)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """``waveboost.attention`` for PyTorch tensors, through the ``waveboost::attention`` custom op.

    Same arguments and conventions as ``waveboost.attention`` (BSHD layout, GQA/MQA, bottom-right
    causal mask) less ``out=``: the op allocates its outputs, which is what lets ``torch.compile``
    and CUDA graphs reason about it. ``lse`` is always computed (float32 (batch, heads, seqlen_q),
    a small fraction of the work) and returned when ``return_lse`` is true.
    """
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    out, lse = torch.ops.waveboost.attention(q, k, v, bool(causal), softmax_scale, backend)
    return (out, lse) if return_lse else out


class MultiheadAttention(nn.Module):
    """Multi-head attention with grouped-query (GQA) and multi-query (MQA) heads.

    Projections are ``nn.Linear`` layers; the attention itself is ``waveboost.torch.attention``
    on the (batch, seqlen, heads, head_dim) views of the projections, so no transposes or copies
    sit between the projections and the kernel. ``num_kv_heads`` = ``num_heads`` is ordinary
    multi-head attention, 1 is MQA, anything in between that divides ``num_heads`` is GQA.

    Forward only (see the module docstring): use it for inference.
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
    if q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor (total_q, heads, head_dim); got shape {tuple(q.shape)}")
    total_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((heads, total_q), dtype=torch.float32)


_attention_varlen_op.register_autograd(_no_backward)


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
