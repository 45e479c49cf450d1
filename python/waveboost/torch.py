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

__all__ = ["MultiheadAttention", "attention", "scaled_dot_product_attention"]


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
    softmax_scale = _api.check_softmax_scale(softmax_scale)
    return_lse = _api.check_flag(return_lse, "return_lse")
    out, lse = torch.ops.waveboost.attention(q, k, v, _api.check_flag(causal, "causal"), softmax_scale,
                                             _api.check_backend(backend))
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
