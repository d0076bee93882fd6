"""What every tile rule shares: the rule type, and a superstep from its figures."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lowering import Op, Value
from partitioner.cost.exchange import exchange_cycles
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Superstep, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext

TileRule = Callable[[Op, tuple[Value, ...], tuple[Layout, ...], MappingContext], Task]
Array = Any


def make_step(
    op: Op,
    name: str,
    target: Target,
    *,
    tiles: int,
    start: int = 0,
    flops: int = 0,
    compute_cycles: int = 0,
    busiest_bytes: int = 0,
    exchange_bytes: int = 0,
    kind: str = "compute",
) -> Superstep:
    return Superstep(
        name=f"{op.name}.{name}" if name else op.name,
        op=op.name,
        source=str(op.loc),
        tiles=tiles,
        flops=flops,
        exchange_bytes=exchange_bytes,
        compute_cycles=compute_cycles,
        exchange_cycles=exchange_cycles(target, busiest_bytes),
        sync_cycles=target.sync_cycles,
        start=start,
        busiest_tile_bytes=busiest_bytes,
        kind=kind,
    )


def relayout_step(op: Op, layout: Layout, target: Target) -> Superstep:
    """A result exchanged from the tiles that made it into `layout`, the one the ops after it
    read: each tile receives its block."""
    moved = tile_bytes(layout, op.results[0].dtype)
    return make_step(
        op,
        "relayout",
        target,
        tiles=layout.tiles,
        start=layout.start,
        busiest_bytes=moved,
        exchange_bytes=moved * layout.tiles,
    )


def tile_share(total: int, elements: int, block_elements: int) -> int:
    """The busiest tile's share of `total` work when it holds a full block of the elements."""
    return math.ceil(total * block_elements / max(1, elements))


def received_bytes(producer: Op | None, block_bytes: int) -> int:
    """Bytes a tile receives to hold `block_bytes` of a value `producer` makes: a broadcast is a
    view of its source in Poplar, so a tile receives at most the source; an iota's indices each
    tile makes itself."""
    if producer is not None and producer.name == "broadcast_in_dim":
        return min(block_bytes, producer.operands[0].nbytes)
    if producer is not None and producer.name == "iota":
        return 0
    return block_bytes


def permuted(value: Value, order: Sequence[int]) -> tuple[int, ...]:
    return tuple(value.shape[d] for d in order)
