"""Sequence layouts for context parallelism, framework-free: which chunks of a sequence each rank
holds, and sharding / unsharding of any array that slices like NumPy (NumPy, PyTorch, JAX).

"contiguous": rank r of N holds chunk r of N equal chunks. "zigzag": the sequence is cut into 2N
chunks and rank r holds chunks r and 2N-1-r, so under a causal mask every rank has the same work.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: Any) -> None:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")


def chunks_per_rank(layout: str) -> int:
    return 2 if layout == "zigzag" else 1


def chunk_ids(rank: int, world: int, layout: str) -> Tuple[int, ...]:
    """The chunks of the full sequence a rank holds, in the order it holds them."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _slice(x: Any, axis: int, start: int, stop: int) -> Any:
    return x[(slice(None),) * axis + (slice(start, stop),)]


def shard(x: Any, rank: int, world: int, layout: str, axis: int, concatenate: Callable) -> Any:
    """Rank ``rank``'s shard of the full sequence ``x`` (sequence along ``axis``)."""
    check_layout(layout)
    pieces = world * chunks_per_rank(layout)
    length = x.shape[axis]
    if length % pieces != 0:
        raise ValueError(f"the sequence length ({length}) must be a multiple of {pieces} for layout {layout!r} "
                         f"on {world} ranks")
    n = length // pieces
    parts = [_slice(x, axis, c * n, (c + 1) * n) for c in chunk_ids(rank, world, layout)]
    return parts[0] if len(parts) == 1 else concatenate(parts, axis)


def unshard(shards: Sequence[Any], layout: str, axis: int, concatenate: Callable) -> Any:
    """The full sequence from every rank's shard (``shards[r]`` is rank r's)."""
    check_layout(layout)
    world = len(shards)
    per_rank = chunks_per_rank(layout)
    ordered: List[Optional[Any]] = [None] * (world * per_rank)
    for r, piece in enumerate(shards):
        n = piece.shape[axis] // per_rank
        for i, c in enumerate(chunk_ids(r, world, layout)):
            ordered[c] = _slice(piece, axis, i * n, (i + 1) * n)
    return concatenate(ordered, axis)
