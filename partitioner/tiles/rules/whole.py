"""Ops run as one kernel over the whole tensor (data movement, gather and scatter, sort,
windows, the shard ops of per-IPU programs), costed as the exchange that brings each result
tile its block plus the busiest tile's work on its block (`movement`)."""

from __future__ import annotations

from lowering import Op, Value, apply_rule, op_cost
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Kernel, Task
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array, make_step, received_bytes, tile_share
from partitioner.tiles.rules.movement import whole_work


def whole_tensor_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    outs = tuple(ctx.linear(r) for r in op.results)
    return Task(
        op, inputs, layouts, outs, whole_kernel(op, inputs), _whole_tensor_steps(op, outs, ctx)
    )


def whole_kernel(op: Op, inputs: tuple[Value, ...]) -> Kernel:
    """The op itself on logical arrays: its operands, then the values its regions capture."""
    count = len(op.operands)
    captured = inputs[count:]

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        env = dict(zip(captured, arrays[count:], strict=True))
        return tuple(apply_rule(op, list(arrays[:count]), op.attrs, env))

    return kernel


def _whole_tensor_steps(op: Op, outs: tuple[Layout, ...], ctx: MappingContext) -> tuple:
    target = ctx.target
    target = ctx.target
    tiles = max(o.tiles for o in outs)
    # A variadic op (a combined all-reduce) has its widest result's tiles from its first
    # result's start, moved back where that would run past the IPU's last tile.
    start = min(outs[0].start, target.tiles_per_ipu - tiles)
    elements = sum(r.size for r in op.results)
    block = sum(o.block_elements for o in outs)
    blocks = sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
    received = received_bytes(op, blocks)
    cost = op_cost(op)
    flops = cost.flops
    per_tile = tile_share(flops, elements, block)
    compute, kind = whole_work(op, block, per_tile, target)
    step = make_step(
        op,
        "",
        target,
        tiles=tiles,
        start=start,
        flops=flops,
        compute_cycles=compute,
        busiest_bytes=received,
        exchange_bytes=received * tiles,
        kind=kind,
    )
    return (step,)
