"""Context parallelism on torch.distributed: ring (and all-gather) attention over sequence shards.

Each rank holds a shard of the sequence of q, k and v, BSHD: (batch, local_seqlen, heads, head_dim).
``ring_attention`` returns this rank's rows of exact attention over the whole sequence.

Two ways to see every key:

- ``strategy="ring"``: K/V shards travel around the ring with ``batch_isend_irecv``; while one
  shard is in flight, attention runs on the one in hand. The partial results (out, lse) of each
  step are merged exactly through the LSE in float32.
- ``strategy="allgather"``: the K/V shards are gathered once (as Llama 3's context parallelism
  does) and each rank attends over the full keys. It moves the same bytes per rank as the ring but
  in one collective, not hidden under compute, and holds every rank's K/V at once; it pays off
  when K/V are small against Q (few KV heads).
- ``strategy="auto"`` takes ``allgather`` when the gathered K/V of all ranks are no larger than
  this rank's queries and output (``world * local_seqlen_k * heads_kv <= local_seqlen * heads``,
  e.g. 8 KV heads of 32 on up to 4 ranks), so that its extra memory stays within the local
  sequence's, else ``ring``.

Overlap. Every transfer is started before the attention of the block in hand and waited for
after it. On CUDA, NCCL runs point-to-point transfers on its own stream, which waits for the
work queued before the transfer and is waited for by the compute stream only where the received
block is used: the transfer of the next K/V block runs under the attention of the current one,
and in the backward the gradient of one block travels while the next block's gradients are
computed. Waiting blocks no host thread on CUDA. Only the K/V heads travel (GQA/MQA send
``heads_kv`` heads, never K/V repeated to the query heads).

Layouts. With ``layout="contiguous"`` rank r holds chunk r of N equal chunks. Causal attention
then gives the last rank N times the work of the first; ``layout="zigzag"`` splits the sequence
into 2N chunks and gives rank r chunks r and 2N-1-r, so every rank does the same work at every
ring step. ``shard_sequence`` and ``unshard_sequence`` convert a full sequence to and from either
layout.

Backward: ``loss.backward()`` through ``ring_attention`` runs the ring in reverse: the K/V shards
travel again and their gradients (float32) travel with them back to their owner; the query
gradient stays local. It needs ``waveboost.attention_backward`` for the tensors' device.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from . import _api, _layout

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "RING_LAYOUTS", "RING_STRATEGIES"]

RING_LAYOUTS = _layout.LAYOUTS
RING_STRATEGIES = ("auto", "ring", "allgather")


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------


def _cat(parts, dim):
    return torch.cat(parts, dim=dim)


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """This rank's shard of a full sequence ``x`` (sequence along ``dim``), in ``layout``.

    The sequence length must be a multiple of ``world_size`` (``2 * world_size`` for zigzag).
    """
    return _layout.shard(x, rank, world_size, layout, dim, _cat)


def unshard_sequence(shards: Sequence[torch.Tensor], *, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's shard (``shards[r]`` is rank r's), inverse of ``shard_sequence``."""
    return _layout.unshard(shards, layout, dim, _cat)


# ---------------------------------------------------------------------------
# Which (query rows, key rows, causal) a ring step computes
# ---------------------------------------------------------------------------


def _step_plan(rank: int, src: int, local_q: int, local_k: int, causal: bool, layout: str):
    """The attention calls of the step where this rank holds the K/V shard of rank ``src``.

    A list of (query rows, key rows, causal) over the local shards. Non-causal: everything.
    Causal, contiguous: the own shard causally, earlier ranks' shards whole, later ones not at all.
    Causal, zigzag (chunks r and 2N-1-r): the own shard causally (local order is global order);
    an earlier rank's first chunk is seen whole by both local chunks and its second chunk by
    neither; a later rank's two chunks are seen whole by the local second chunk only.
    """
    every_q, every_k = slice(0, local_q), slice(0, local_k)
    if not causal:
        return [(every_q, every_k, False)]
    if src == rank:
        return [(every_q, every_k, True)]
    if layout == "contiguous":
        return [(every_q, every_k, False)] if src < rank else []
    if src < rank:
        return [(every_q, slice(0, local_k // 2), False)]
    return [(slice(local_q // 2, local_q), every_k, False)]


def _allgather_plan(rank: int, world: int, local_q: int, causal: bool, layout: str):
    """(query rows, number of leading global keys, causal) for attention over the gathered keys.

    A causal chunk c of length n sees the first (c + 1) n keys, which is the bottom-right
    aligned causal mask of those rows against that prefix.
    """
    if not causal:
        return [(slice(0, local_q), None, False)]
    n = local_q // _layout.chunks_per_rank(layout)
    return [(slice(i * n, (i + 1) * n), (c + 1) * n, True)
            for i, c in enumerate(_layout.chunk_ids(rank, world, layout))]


# ---------------------------------------------------------------------------
# Exact merging through the LSE
# ---------------------------------------------------------------------------


def _accumulator(x: torch.Tensor) -> torch.dtype:
    """Partial results are kept in float32 between steps (float64 for float64 inputs)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, rows: slice):
    """acc (float32) <- the exact merge of acc and a partial result over disjoint keys, on ``rows``."""
    old_lse = acc_lse[:, :, rows]
    new_lse = torch.logaddexp(old_lse, lse)
    # Rows that have seen no key yet keep lse -inf: weight 0 for both, not exp(-inf + inf).
    ref = torch.where(torch.isneginf(new_lse), torch.zeros_like(new_lse), new_lse)
    w_old = torch.exp(old_lse - ref).transpose(1, 2).unsqueeze(-1)
    w_new = torch.exp(lse - ref).transpose(1, 2).unsqueeze(-1)
    # In place on the accumulator's rows (a view): one pass to rescale, one to add the step's output
    # (read in its own dtype), where the expression form made four temporaries of the accumulator's size.
    acc_rows = acc_out[:, rows]
    acc_rows.mul_(w_old)
    acc_rows.addcmul_(out, w_new)
    acc_lse[:, :, rows] = new_lse


# ---------------------------------------------------------------------------
# Communication
# ---------------------------------------------------------------------------


class _Ring:
    """This rank's place in ``group`` and its transfers: a send-to-next / receive-from-previous
    shift for the ring, and the all-gather and reduce of the all-gather strategy."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world) if group is not None else (self.rank + 1) % self.world
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world) if group is not None else (self.rank - 1) % self.world

    def shift(self, tensor: torch.Tensor, tag: int = 0):
        """Starts sending ``tensor`` to the next rank and receiving the previous rank's into a new buffer.
        Transfers in flight at once carry distinct tags (gloo matches a receive by peer and tag).
        On one rank the tensor is its own neighbour's: nothing to send."""
        if self.world == 1:
            return tensor, []
        buffer = torch.empty_like(tensor)
        ops = [dist.P2POp(dist.isend, tensor, self.next, self.group, tag),
               dist.P2POp(dist.irecv, buffer, self.prev, self.group, tag)]
        return buffer, dist.batch_isend_irecv(ops)

    def all_gather_sequence(self, x: torch.Tensor, layout: str) -> torch.Tensor:
        return _all_gather_sequence(x, self.group, layout)

    def reduce_to_owners(self, full: torch.Tensor, layout: str) -> torch.Tensor:
        return _reduce_to_owners(full, self.group, layout)


class _NoTransfers(_Ring):
    """The same rank and world, no transfers: every "received" block is this rank's own (same
    shapes, same attention calls and merges). What the ring costs when communication is free."""

    def shift(self, tensor: torch.Tensor, tag: int = 0):
        return tensor, []

    def all_gather_sequence(self, x: torch.Tensor, layout: str) -> torch.Tensor:
        return torch.cat([x] * self.world, dim=1)

    def reduce_to_owners(self, full: torch.Tensor, layout: str) -> torch.Tensor:
        return shard_sequence(full, self.rank, self.world, layout=layout)


def _wait(requests) -> None:
    for request in requests:
        request.wait()


def _all_gather_sequence(x: torch.Tensor, group, layout: str) -> torch.Tensor:
    """Every rank's shard of ``x`` (sequence in dim 1), gathered and put in global order."""
    world = dist.get_world_size(group)
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous(), group=group)
    return unshard_sequence(shards, layout=layout, dim=1)


def _reduce_to_owners(full: torch.Tensor, group, layout: str) -> torch.Tensor:
    """Sums ``full`` (a gradient over the whole sequence, dim 1) over the ranks and returns this rank's shard."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    per_rank = [shard_sequence(full, r, world, layout=layout) for r in range(world)]
    stacked = torch.cat(per_rank, dim=1).contiguous()
    if dist.get_backend(group) == "nccl":
        mine = torch.empty_like(per_rank[0]).contiguous()
        dist.reduce_scatter_tensor(mine, stacked, group=group)
        return mine
    dist.all_reduce(stacked, group=group)  # gloo has no reduce-scatter
    return stacked.chunk(world, dim=1)[rank]


def _transfers_only(k: torch.Tensor, v: torch.Tensor, strategy: str, layout: str, backward: bool, comm: _Ring) -> None:
    """The transfers of one call (and of its backward) without any attention: the ring's shifts
    in the same order and overlap, or the all-gathers and reduces. Sets the time of communication
    alone against compute alone (``_NoTransfers``)."""
    if strategy == "allgather":
        for _ in range(2 if backward else 1):
            comm.all_gather_sequence(k, layout)
            comm.all_gather_sequence(v, layout)
        if backward:
            full = torch.zeros((k.shape[0], k.shape[1] * comm.world) + tuple(k.shape[2:]), dtype=_accumulator(k),
                               device=k.device)
            comm.reduce_to_owners(full, layout)
            comm.reduce_to_owners(full, layout)
        return
    kv = torch.stack((k, v)).contiguous()
    for _ in range(comm.world - 1):
        kv, requests = comm.shift(kv)
        _wait(requests)
    if not backward:
        return
    kv = torch.stack((k, v)).contiguous()
    dkv = torch.zeros(kv.shape, dtype=_accumulator(k), device=k.device)
    dkv_in_flight = None
    for step in range(comm.world):  # the schedule of _ring_backward
        if step + 1 < comm.world:
            incoming, kv_requests = comm.shift(kv)
        if dkv_in_flight is not None:
            dkv, dkv_requests = dkv_in_flight
            _wait(dkv_requests)
        dkv_in_flight = comm.shift(dkv, tag=1)
        if step + 1 < comm.world:
            _wait(kv_requests)
            kv = incoming
    _wait(dkv_in_flight[1])


# ---------------------------------------------------------------------------
# Forward and backward
# ---------------------------------------------------------------------------


def _attend(q, k, v, causal, scale):
    return _api.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)


def _ring_forward(q, k, v, causal, scale, layout, ring: _Ring):
    batch, local_q, heads, head_dim = q.shape
    acc_out = torch.zeros((batch, local_q, heads, head_dim), dtype=_accumulator(q), device=q.device)
    acc_lse = torch.full((batch, heads, local_q), -math.inf, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v)).contiguous()
    for step in range(ring.world):
        if step + 1 < ring.world:
            incoming, requests = ring.shift(kv)
        src = (ring.rank - step) % ring.world
        for rows, keys, is_causal in _step_plan(ring.rank, src, local_q, k.shape[1], causal, layout):
            out, lse = _attend(q[:, rows], kv[0][:, keys], kv[1][:, keys], is_causal, scale)
            _merge_into(acc_out, acc_lse, out, lse, rows)
        if step + 1 < ring.world:
            _wait(requests)
            kv = incoming
    return acc_out.to(q.dtype), acc_lse


def _allgather_forward(q, k, v, causal, scale, layout, comm: _Ring):
    k_full = comm.all_gather_sequence(k, layout)
    v_full = comm.all_gather_sequence(v, layout)
    outs, lses = [], []
    for rows, prefix, is_causal in _allgather_plan(comm.rank, comm.world, q.shape[1], causal, layout):
        keys = slice(0, prefix if prefix is not None else k_full.shape[1])
        out, lse = _attend(q[:, rows], k_full[:, keys], v_full[:, keys], is_causal, scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def _backward_call(dout, q, k, v, out, lse, dlse, causal, scale):
    return _api.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=scale, dlse=dlse)


def _ring_backward(dout, dlse, q, k, v, out, lse, causal, scale, layout, ring: _Ring):
    """Gradients through the ring: with the merged out and lse, the gradient of each step's block
    is the single-call backward of that block (its P is exp(S - lse) with the global lse).

    The gradient of the shard in hand follows the shard around the ring: at each step this rank
    computes its part of it, adds what the previous holders accumulated (received meanwhile) and
    sends the sum on, under the next step's compute. After the last step one more hop takes every
    gradient home."""
    local_q, local_k = q.shape[1], k.shape[1]
    dq = torch.zeros(q.shape, dtype=_accumulator(q), device=q.device)
    kv = torch.stack((k, v)).contiguous()
    dkv_in_flight = None
    for step in range(ring.world):
        if step + 1 < ring.world:
            incoming, kv_requests = ring.shift(kv)
        src = (ring.rank - step) % ring.world
        dkv = torch.zeros(kv.shape, dtype=_accumulator(q), device=q.device)
        for rows, keys, is_causal in _step_plan(ring.rank, src, local_q, local_k, causal, layout):
            grads = _backward_call(dout[:, rows], q[:, rows], kv[0][:, keys], kv[1][:, keys], out[:, rows],
                                   lse[:, :, rows], None if dlse is None else dlse[:, :, rows], is_causal, scale)
            dq[:, rows] += grads[0].to(dq.dtype)
            dkv[0][:, keys] += grads[1].to(dq.dtype)
            dkv[1][:, keys] += grads[2].to(dq.dtype)
        if dkv_in_flight is not None:  # the previous holders' part of this shard's gradient
            received, dkv_requests = dkv_in_flight
            _wait(dkv_requests)
            dkv += received
        dkv_in_flight = ring.shift(dkv, tag=1)
        if step + 1 < ring.world:
            _wait(kv_requests)
            kv = incoming
    dkv, dkv_requests = dkv_in_flight
    _wait(dkv_requests)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _allgather_backward(dout, dlse, q, k, v, out, lse, causal, scale, layout, comm: _Ring):
    k_full = comm.all_gather_sequence(k, layout)
    v_full = comm.all_gather_sequence(v, layout)
    dq = torch.zeros(q.shape, dtype=_accumulator(q), device=q.device)
    dk_full = torch.zeros(k_full.shape, dtype=_accumulator(q), device=q.device)
    dv_full = torch.zeros(v_full.shape, dtype=_accumulator(q), device=q.device)
    for rows, prefix, is_causal in _allgather_plan(comm.rank, comm.world, q.shape[1], causal, layout):
        keys = slice(0, prefix if prefix is not None else k_full.shape[1])
        grads = _backward_call(dout[:, rows], q[:, rows], k_full[:, keys], v_full[:, keys], out[:, rows],
                               lse[:, :, rows], None if dlse is None else dlse[:, :, rows], is_causal, scale)
        dq[:, rows] += grads[0].to(dq.dtype)
        dk_full[:, keys] += grads[1].to(dq.dtype)
        dv_full[:, keys] += grads[2].to(dq.dtype)
    dk = comm.reduce_to_owners(dk_full, layout)
    dv = comm.reduce_to_owners(dv_full, layout)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, strategy, comm):
        if strategy == "ring":
            out, lse = _ring_forward(q, k, v, causal, scale, layout, comm)
        else:
            out, lse = _allgather_forward(q, k, v, causal, scale, layout, comm)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (causal, scale, layout, strategy, comm)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, layout, strategy, comm = ctx.config
        if dout is None:
            dout = torch.zeros_like(out)
        dout = dout.contiguous() if dout.stride(-1) != 1 else dout
        if strategy == "ring":
            dq, dk, dv = _ring_backward(dout, dlse, q, k, v, out, lse, causal, scale, layout, comm)
        else:
            dq, dk, dv = _allgather_backward(dout, dlse, q, k, v, out, lse, causal, scale, layout, comm)
        return dq, dk, dv, None, None, None, None, None


def _resolve_strategy(strategy: str, world: int, local_q: int, local_k: int, heads: int, heads_kv: int) -> str:
    """"auto": all-gather when every rank's K/V together are no larger than this rank's queries
    and output (so the gathered buffer stays within the local sequence's memory), else the ring."""
    if not isinstance(strategy, str) or strategy not in RING_STRATEGIES:
        raise ValueError(f"strategy must be one of {RING_STRATEGIES}; got {strategy!r}")
    if strategy != "auto":
        return strategy
    return "allgather" if world * local_k * heads_kv <= local_q * heads else "ring"


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    layout: str = "zigzag",
    return_lse: bool = False,
    strategy: str = "auto",
):
    """Exact attention over a sequence sharded across the ranks of ``group``.

    Args:
        q: this rank's queries (batch, local_seqlen, heads, head_dim).
        k, v: this rank's keys and values (batch, local_seqlen_k, heads_kv, head_dim); every rank
            holds the same number of rows. GQA sends only the KV heads.
        group: a torch.distributed process group (default: the world).
        causal: causal over the *global* positions given by ``layout``; needs q and k shards of
            equal length.
        softmax_scale: multiplies q.k; defaults to 1 / sqrt(head_dim).
        layout: "zigzag" (rank r holds chunks r and 2N-1-r of 2N) or "contiguous" (chunk r of N).
            Only matters for causal attention; see ``shard_sequence``.
        return_lse: also return the float32 (batch, heads, local_seqlen) logsumexp over all keys;
            a gradient flowing into it is honoured.
        strategy: "ring", "allgather" or "auto" (see the module docstring).

    Returns:
        This rank's rows of the output (q's dtype), or ``(out, lse)``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention needs an initialized torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    _layout.check_layout(layout)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D torch.Tensor (batch, local_seqlen, heads, head_dim); got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal ring attention needs q and k shards of equal length; got {q.shape[1]} and "
                         f"{k.shape[1]}")
    if causal and q.shape[1] % _layout.chunks_per_rank(layout) != 0:
        raise ValueError(f"layout 'zigzag' holds two chunks per rank: the local sequence length must be even; "
                         f"got {q.shape[1]}")
    comm = _Ring(group)
    strategy = _resolve_strategy(strategy, comm.world, q.shape[1], k.shape[1], q.shape[2], k.shape[2])
    out, lse = _RingAttention.apply(q, k, v, causal, softmax_scale, layout, strategy, comm)
    return (out, lse) if return_lse else out
