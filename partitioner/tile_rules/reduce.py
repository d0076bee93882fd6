"""reduce in stages: each tile reduces its block, then the partials go to the tiles that own
the output and are reduced again."""

from __future__ import annotations

import math

import numpy as np
from jax import lax

from lowering import Op, Value, apply_rule, op_cost
from partitioner.context import MappingContext
from partitioner.cost.compute import vector_cycles
from partitioner.cost.exchange import exchange_cycles
from partitioner.layout import Layout, free_move, tile_bytes
from partitioner.program import Superstep, Task
from partitioner.target import Target
from partitioner.tile_rules.common import Array, make_step, permuted


def _reduce_split(rows: int, depth: int, itemsize: int, target: Target) -> tuple[int, int]:
    """Tiles over kept elements (`rows`) first; spare tiles split the reduced ones (`depth`)
    when that is faster, counting the second stage's exchange and reduction."""
    tiles = target.tiles_per_ipu
    gp = max(1, min(tiles, rows))
    best = (0, 1)
    best_cycles = None
    gq = 1
    while gq <= max(1, min(tiles // gp, depth)):
        pb, qb = -(-rows // gp), -(-depth // gq)
        cycles = vector_cycles(target, pb * qb, np.dtype(np.float32))
        if gq > 1:
            cycles += exchange_cycles(target, gq * pb * itemsize) + target.sync_cycles
            cycles += vector_cycles(target, gq * pb, np.dtype(np.float32))
        if best_cycles is None or cycles < best_cycles:
            best, best_cycles = (gp, gq), cycles
        gq *= 2
    return best


def reduce_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    half = len(op.operands) // 2
    xs = op.operands[:half]
    dims = tuple(op.attrs["dimensions"])
    kept = [d for d in range(len(xs[0].shape)) if d not in dims]
    rows = math.prod(xs[0].shape[d] for d in kept)
    depth = math.prod(xs[0].shape[d] for d in dims)
    itemsize = max(v.dtype.itemsize for v in xs)
    gp, gq = _reduce_split(rows, depth, itemsize, ctx.target)
    order = (*kept, *dims)
    grids = [Layout(permuted(x, order), (rows, depth), (gp, gq)) for x in xs]
    outs = tuple(Layout(r.shape, (rows,), (gp,)) for r in op.results)

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        if gq == 1:  # each tile reduces whole rows
            return tuple(apply_rule(op, list(arrays), op.attrs, {}))
        inits = list(arrays[half:])
        staged = [
            _depth_split(x, order, rows, gq, init)
            for x, init in zip(arrays[:half], inits, strict=True)
        ]
        local = apply_rule(op, [*staged, *inits], {"dimensions": (2,)}, {})
        combined = apply_rule(op, [*local, *inits], {"dimensions": (1,)}, {})
        return tuple(c.reshape(r.shape) for c, r in zip(combined, op.results, strict=True))

    in_place = list(order) == sorted(order) and all(
        free_move(lay, grid) for lay, grid in zip(layouts[:half], grids, strict=True)
    )
    steps = _reduce_steps(op, grids, outs, gq, in_place, ctx.target)
    return Task(op, inputs, layouts, outs, kernel, steps)


def _depth_split(x: Array, order: tuple[int, ...], rows: int, gq: int, init: Array) -> Array:
    """`x` as [rows, gq, qb]: its kept elements, then the reduced ones cut into the gq tiles'
    runs of qb, the last run padded with the reduction's initial value."""
    if list(order) != sorted(order):
        x = lax.transpose(x, order)
    x = x.reshape(rows, -1)
    depth = x.shape[1]
    qb = -(-depth // gq)
    if qb * gq != depth:
        x = lax.pad(x, init.astype(x.dtype), [(0, 0, 0), (0, qb * gq - depth, 0)])
    return x.reshape(rows, gq, qb)


def _reduce_steps(
    op: Op,
    grids: list[Layout],
    outs: tuple[Layout, ...],
    gq: int,
    in_place: bool,
    target: Target,
) -> tuple[Superstep, ...]:
    xs = op.operands[: len(grids)]
    received = (
        0 if in_place else sum(tile_bytes(g, x.dtype) for g, x in zip(grids, xs, strict=True))
    )
    block = grids[0].block_elements * len(grids)
    dtype = xs[0].dtype
    steps = [
        make_step(
            op,
            "local",
            target,
            tiles=grids[0].tiles,
            flops=op_cost(op).flops,
            compute_cycles=vector_cycles(target, block, dtype),
            busiest_bytes=received,
            exchange_bytes=received * grids[0].tiles,
        )
    ]
    if gq > 1:
        partial = gq * sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
        steps.append(
            make_step(
                op,
                "combine",
                target,
                tiles=outs[0].tiles,
                flops=gq * outs[0].block_elements * outs[0].tiles,
                compute_cycles=vector_cycles(target, gq * outs[0].block_elements, dtype),
                busiest_bytes=partial,
                exchange_bytes=partial * outs[0].tiles,
            )
        )
    return tuple(steps)
