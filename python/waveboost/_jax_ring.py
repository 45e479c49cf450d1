"""Context parallelism for JAX: ring attention inside ``jax.shard_map`` (exported as
``waveboost.jax.ring_attention``).

The K/V shards travel around the mesh axis with ``jax.lax.ppermute``; each step attends the local
queries to the shard in hand through ``waveboost.jax.attention`` (the XLA FFI call) and merges the
partial result exactly through the LSE in float32. Which rows and keys a step computes depends on
the rank, a traced value inside ``shard_map``, so the three cases of a causal step (own shard,
an earlier rank's, a later rank's) are branches of one ``lax.switch``. The layouts are those of
``waveboost.distributed``: "zigzag" (rank r holds chunks r and 2N-1-r of 2N) or "contiguous".

Gradients come from JAX's autodiff of this forward: ``ppermute`` transposes to the reverse ring
and each step's attention differentiates through waveboost.jax.attention's own rule (where the
build has one).
"""

from __future__ import annotations

from typing import Optional

from . import _layout


def _merge(acc_out, acc_lse, out, lse):
    import jax.numpy as jnp

    new_lse = jnp.logaddexp(acc_lse, lse)
    ref = jnp.where(jnp.isneginf(new_lse), 0.0, new_lse)
    w_old = jnp.swapaxes(jnp.exp(acc_lse - ref), 1, 2)[..., None]
    w_new = jnp.swapaxes(jnp.exp(lse - ref), 1, 2)[..., None]
    return acc_out * w_old + out.astype(jnp.float32) * w_new, new_lse


def ring_attention(q, k, v, *, axis_name, causal: bool = False, softmax_scale: Optional[float] = None,
                   layout: str = "zigzag", return_lse: bool = False, backend: str = "auto"):
    """Exact attention over a sequence sharded along the mesh axis ``axis_name``; call inside
    ``jax.shard_map`` with q, k, v this device's (batch, local_seqlen, heads[_kv], head_dim) shards.

    Returns this device's rows of the output (q's dtype), or ``(out, lse)`` with lse float32
    (batch, heads, local_seqlen).
    """
    import jax
    import jax.numpy as jnp

    from . import jax as waveboost_jax

    _layout.check_layout(layout)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"q, k, v must be 4-D (batch, local_seqlen, heads, head_dim) with k and v of one shape; "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    batch, local_q, heads, head_dim = q.shape
    local_k = k.shape[1]
    if causal and local_q != local_k:
        raise ValueError(f"causal ring attention needs q and k shards of equal length; got {local_q} and {local_k}")
    if causal and layout == "zigzag" and local_q % 2 != 0:
        raise ValueError(f"layout 'zigzag' holds two chunks per device: the local sequence length must be even; "
                         f"got {local_q}")

    world = jax.lax.axis_size(axis_name)
    rank = jax.lax.axis_index(axis_name)
    perm = [(i, (i + 1) % world) for i in range(world)]

    def attend(qs, ks, vs, is_causal):
        return waveboost_jax.attention(qs, ks, vs, causal=is_causal, softmax_scale=softmax_scale, return_lse=True,
                                       backend=backend)

    def nothing():
        return (jnp.zeros((batch, local_q, heads, head_dim), q.dtype),
                jnp.full((batch, heads, local_q), -jnp.inf, jnp.float32))

    def step_result(src, ks, vs):
        if not causal:
            return attend(q, ks, vs, False)
        half_q, half_k = local_q // 2, local_k // 2

        def own():
            return attend(q, ks, vs, True)

        def earlier():
            if layout == "contiguous":
                return attend(q, ks, vs, False)
            return attend(q, ks[:, :half_k], vs[:, :half_k], False)

        def later():
            if layout == "contiguous":
                return nothing()
            out, lse = attend(q[:, half_q:], ks, vs, False)
            zeros, empty = nothing()
            return (zeros.at[:, half_q:].set(out), empty.at[:, :, half_q:].set(lse))

        index = jnp.where(src == rank, 0, jnp.where(src < rank, 1, 2))
        return jax.lax.switch(index, [own, earlier, later])

    acc_out = jnp.zeros((batch, local_q, heads, head_dim), jnp.float32)
    acc_lse = jnp.full((batch, heads, local_q), -jnp.inf, jnp.float32)
    ks, vs = k, v
    for step in range(world):
        src = (rank - step) % world
        out, lse = step_result(src, ks, vs)
        acc_out, acc_lse = _merge(acc_out, acc_lse, out, lse)
        if step + 1 < world:
            ks, vs = jax.lax.ppermute((ks, vs), axis_name, perm)
    out = acc_out.astype(q.dtype)
    return (out, acc_lse) if return_lse else out


def shard_sequence(x, rank: int, world_size: int, *, layout: str = "zigzag", axis: int = 1):
    """This device's shard of a full sequence (NumPy or JAX array, sequence along ``axis``)."""
    import jax.numpy as jnp

    return _layout.shard(x, rank, world_size, layout, axis, lambda parts, a: jnp.concatenate(parts, axis=a))


def unshard_sequence(shards, *, layout: str = "zigzag", axis: int = 1):
    """The full sequence from every device's shard, inverse of ``shard_sequence``."""
    import jax.numpy as jnp

    return _layout.unshard(shards, layout, axis, lambda parts, a: jnp.concatenate(parts, axis=a))
