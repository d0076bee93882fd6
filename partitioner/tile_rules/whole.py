"""Ops run as one kernel over the whole tensor (data movement, gather and scatter, sort,
convolution, control flow), costed as the exchange that brings each result tile its block plus
the busiest tile's work on its block (`movement`)."""

from __future__ import annotations

import numpy as np

from lowering import Op, Value, apply_rule, op_cost, walk
from partitioner.context import MappingContext
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Task
from partitioner.tile_rules.common import Array, make_step, received_bytes, tile_share
from partitioner.tile_rules.movement import whole_work


def _region_flops(op: Op, ctx: MappingContext) -> int:
    """Work inside regions that run as code: a while body times its trips, the largest branch."""
    if op.name == "while":
        body = sum(op_cost(o).flops for o in walk(op.regions[1]))
        cond = sum(op_cost(o).flops for o in walk(op.regions[0]))
        return (body + cond) * _trip_count(op, ctx)
    if op.name == "case":
        return max(sum(op_cost(o).flops for o in walk(r)) for r in op.regions)
    return 0


def _trip_count(op: Op, ctx: MappingContext) -> int:
    """The trips of a counted loop (`while i < n` from a constant start), else 1."""
    cond = op.regions[0]
    compare = next((o for o in cond.ops if o.results == cond.outputs), None)
    if compare is None or compare.name != "compare" or compare.attrs["direction"] != "LT":
        return 1
    counter, limit = compare.operands
    if counter not in cond.inputs:
        return 1
    start = ctx.constant_of(op.operands[cond.inputs.index(counter)])
    bound = next(
        (o.attrs["value"] for o in cond.ops if o.results == (limit,) and o.name == "constant"),
        ctx.constant_of(limit),
    )
    if start is None or bound is None or np.size(start) != 1 or np.size(bound) != 1:
        return 1
    return max(1, int(bound) - int(start))


def whole_tensor_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    outs = tuple(ctx.linear(r) for r in op.results)
    count = len(op.operands)
    captured = inputs[count:]

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        env = dict(zip(captured, arrays[count:], strict=True))
        return tuple(apply_rule(op, list(arrays[:count]), op.attrs, env))

    return Task(op, inputs, layouts, outs, kernel, _whole_tensor_steps(op, outs, ctx))


def _whole_tensor_steps(op: Op, outs: tuple[Layout, ...], ctx: MappingContext) -> tuple:
    target = ctx.target
    tiles = max(o.tiles for o in outs)
    start = outs[0].start
    elements = sum(r.size for r in op.results)
    block = sum(o.block_elements for o in outs)
    blocks = sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
    received = received_bytes(op, blocks)
    cost = op_cost(op)
    flops = cost.flops + _region_flops(op, ctx)
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
