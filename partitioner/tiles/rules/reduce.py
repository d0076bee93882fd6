"""reduce in stages: each tile reduces its block, then the partials go to the tiles that own
the output and are reduced again.

PopLibs reduces where the operand lies (`popops::reduce` makes its first stage's partials on
the tiles that hold the input): when the operand's layout keeps the reduced dimensions apart
from the kept ones (a convolution's [N*H*W, C] output summed over N, H and W), each tile
reduces its own block and only the partials move. Otherwise the operand is exchanged into
a grid of its own, the kept elements over tiles first; the cheaper of the two is taken."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from jax import lax

from lowering import Op, Value, apply_rule, binary_op, op_cost
from partitioner.cost.amp import reduce_stages
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.vector import reduce_cycles
from partitioner.layout import Layout, free_move, tile_bytes
from partitioner.program import Superstep, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array, make_step, permuted


# Cached: a model's repeated layers reduce the same shapes thousands of times.
@functools.lru_cache(maxsize=16384)
def _reduce_split(
    rows: int, depth: int, dtype: np.dtype, operands: int, target: Target
) -> tuple[int, int]:
    """Tiles over kept elements (`rows`) first; spare tiles split the reduced ones (`depth`)
    when that is faster, counting the second stage's exchange and reduction."""
    tiles = target.tiles_per_ipu
    gp = max(1, min(tiles, rows))
    best = (0, 1)
    best_cycles = None
    gq = 1
    while gq <= max(1, min(tiles // gp, depth)):
        pb, qb = -(-rows // gp), -(-depth // gq)
        itemsize = operands * np.dtype(dtype).itemsize
        # each tile receives its block (unless it holds it already), then reduces it
        cycles = exchange_cycles(target, pb * qb * itemsize)
        cycles += reduce_cycles(pb, qb, dtype, True, operands, target)
        for stage in reduce_stages(gq):
            cycles += exchange_cycles(target, stage * pb * itemsize) + target.sync_cycles
            cycles += reduce_cycles(pb, stage, dtype, False, operands, target)
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
    order = (*kept, *dims)
    moved = _moved_plan(op, layouts[:half], order, rows, depth, ctx.target)
    placed = _placed_plan(op, layouts[:half], order, rows, depth, ctx.target)
    plan = moved if placed is None else min(moved, placed, key=_cycles)
    gq = plan.grids[0].grid[1]
    # the partials go to output tiles spread over the chip, not every reduction's to tile 0
    start = ctx.spread(plan.grids[0].grid[0])
    outs = tuple(Layout(r.shape, (rows,), (plan.grids[0].grid[0],), start) for r in op.results)
    first, *combine = plan.steps
    if plan is placed:
        first = dataclasses.replace(first, start=layouts[0].start)
    count = ctx.target.tiles_per_ipu
    steps = (
        first,
        *(dataclasses.replace(s, start=max(0, min(start, count - s.tiles))) for s in combine),
    )

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        if gq == 1 or not _order_matters(op):  # whole rows on each tile, or any order's sum
            return tuple(apply_rule(op, list(arrays), op.attrs, {}))
        inits = list(arrays[half:])
        pairs = zip(arrays[:half], inits, strict=True)
        if dims == tuple(range(dims[0], dims[0] + len(dims))):  # no transpose needed
            staged = [_runs_in_place(x, dims, gq, init) for x, init in pairs]
            at = dims[0]
        else:
            staged = [_depth_split(x, order, rows, gq, init) for x, init in pairs]
            at = 1
        local = apply_rule(op, [*staged, *inits], {"dimensions": (at + 1,)}, {})
        combined = apply_rule(op, [*local, *inits], {"dimensions": (at,)}, {})
        return tuple(c.reshape(r.shape) for c, r in zip(combined, op.results, strict=True))

    return Task(op, inputs, layouts, outs, kernel, steps)


@dataclass(frozen=True, slots=True)
class _Plan:
    grids: list[Layout]  # each operand as [kept, reduced] over (tiles, tiles)
    steps: tuple[Superstep, ...]


def _cycles(plan: _Plan) -> int:
    return sum(s.cycles for s in plan.steps)


def _moved_plan(
    op: Op,
    layouts: tuple[Layout, ...],
    order: tuple[int, ...],
    rows: int,
    depth: int,
    target: Target,
) -> _Plan:
    """The operands exchanged into a [kept, reduced] grid (`_reduce_split`), unless already so."""
    xs = op.operands[: len(layouts)]
    gp, gq = _reduce_split(rows, depth, xs[0].dtype, len(xs), target)
    grids = [Layout(permuted(x, order), (rows, depth), (gp, gq)) for x in xs]
    in_place = list(order) == sorted(order) and all(
        free_move(lay, grid) for lay, grid in zip(layouts, grids, strict=True)
    )
    # The reduced elements are innermost on a tile unless they stay where they are and some
    # kept dimension lies inside them (a sum over the batch of [batch, features]).
    kept = len(order) - len(op.attrs["dimensions"])
    contiguous = not in_place or list(order[:kept]) == list(range(kept))
    return _planned(op, grids, in_place, contiguous, target)


def _placed_plan(
    op: Op,
    layouts: tuple[Layout, ...],
    order: tuple[int, ...],
    rows: int,
    depth: int,
    target: Target,
) -> _Plan | None:
    """Each tile reduces the block it holds (`view_split`); None when the operands' layout
    mixes kept and reduced elements in one view dimension, or the operands differ."""
    if any(lay != layouts[0] for lay in layouts):
        return None
    xs = op.operands[: len(layouts)]
    split = view_split(layouts[0], xs[0].shape, frozenset(op.attrs["dimensions"]))
    if split is None:
        return None
    (pb, qb), (gp, gq), contiguous = split
    grids = [
        Layout(permuted(x, order), (rows, depth), (gp, gq), layouts[0].start, (pb, qb)) for x in xs
    ]
    return _planned(op, grids, True, contiguous, target)


def _planned(
    op: Op, grids: list[Layout], in_place: bool, contiguous: bool, target: Target
) -> _Plan:
    """The supersteps of reducing the operands as `grids` cut them, the outputs over the kept
    tiles."""
    (rows, _), (gp, gq) = grids[0].view, grids[0].grid
    outs = tuple(Layout(r.shape, (rows,), (gp,)) for r in op.results)
    return _Plan(grids, _reduce_steps(op, grids, outs, gq, in_place, contiguous, target))


def view_split(
    layout: Layout, shape: tuple[int, ...], dims: frozenset[int]
) -> tuple[tuple[int, int], tuple[int, int], bool] | None:
    """How a layout cuts a reduction: ((kept, reduced) elements per tile, (kept, reduced) tiles,
    whether the reduced elements are innermost), when each dimension of its view holds kept
    elements alone or reduced ones alone; None otherwise."""
    groups = _view_groups(layout.view, shape)
    if groups is None:
        return None
    block, per, tiles, kinds = layout.block, [1, 1], [1, 1], []
    for group, size, b, g in zip(groups, layout.view, block, layout.grid, strict=True):
        reduced = {d in dims for d in group}
        if len(reduced) > 1:
            return None
        if not group:
            continue
        side = int(reduced.pop())
        per[side] *= min(b, size)
        tiles[side] *= g
        kinds.append(side)
    contiguous = kinds == sorted(kinds)  # the reduced view dimensions after the kept ones
    return (per[0], per[1]), (tiles[0], tiles[1]), contiguous


def _view_groups(view: tuple[int, ...], shape: tuple[int, ...]) -> list[list[int]] | None:
    """The dimensions of `shape` (longer than one) each view dimension merges, in order; None
    when a view dimension splits one of them."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    groups: list[list[int]] = []
    at = 0
    for size in view:
        group: list[int] = []
        product = 1
        while product < size and at < len(dims):
            group.append(dims[at])
            product *= shape[dims[at]]
            at += 1
        if product != size and not (size == 1 and product == 1):
            return None
        groups.append(group)
    return groups if at == len(dims) else None


def _order_matters(op: Op) -> bool:
    """Whether splitting a reduction over tiles can change its value: a sum or product of
    floats rounds differently in another order; a max, a min or integer arithmetic does not
    (the runtime then reduces in one go, which is faster)."""
    combiner = binary_op(op.regions[0]) if op.regions else None
    floats = any(np.issubdtype(v.dtype, np.inexact) or v.dtype.kind == "V" for v in op.results)
    return floats and combiner not in ("maximum", "minimum")


def _runs_in_place(x: Array, dims: tuple[int, ...], gq: int, init: Array) -> Array:
    """`x` with its reduced dimensions, which lie next to each other, as [gq, qb]: the same
    runs as `_depth_split` makes (the reduced elements in row-major order, cut into the gq
    tiles' runs of qb, the last padded), without moving the kept elements."""
    first, stop = dims[0], dims[-1] + 1
    depth = math.prod(x.shape[first:stop])
    x = x.reshape(*x.shape[:first], depth, *x.shape[stop:])
    qb = -(-depth // gq)
    if qb * gq != depth:
        padding = [(0, 0, 0)] * x.ndim
        padding[first] = (0, qb * gq - depth, 0)
        x = lax.pad(x, init.astype(x.dtype), padding)
    return x.reshape(*x.shape[:first], gq, qb, *x.shape[first + 1 :])


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
    contiguous: bool,
    target: Target,
) -> tuple[Superstep, ...]:
    xs = op.operands[: len(grids)]
    received = (
        0 if in_place else sum(tile_bytes(g, x.dtype) for g, x in zip(grids, xs, strict=True))
    )
    pb, qb = grids[0].block[0], grids[0].block[1]
    dtype = xs[0].dtype
    local = reduce_cycles(pb, qb, dtype, contiguous, len(xs), target)
    steps = [
        make_step(
            op,
            "local",
            target,
            tiles=grids[0].tiles,
            flops=op_cost(op).flops,
            compute_cycles=local,
            busiest_bytes=received,
            exchange_bytes=received * grids[0].tiles,
        )
    ]
    # The partials combined in stages, as PopLibs plans a reduction of many partials
    # (`getMultiStageReducePlan`): each stage adds `depth` of them per output block.
    remaining = gq
    for depth in reduce_stages(gq):
        remaining = -(-remaining // depth)
        last = remaining == 1
        tiles = outs[0].tiles * remaining
        partial = depth * sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
        steps.append(
            make_step(
                op,
                "combine" if last else f"combine.stage{len(steps)}",
                target,
                tiles=tiles,
                flops=depth * outs[0].block_elements * tiles,
                compute_cycles=reduce_cycles(
                    outs[0].block_elements, depth, dtype, False, len(xs), target
                ),
                busiest_bytes=partial,
                exchange_bytes=partial * tiles,
            )
        )
    return tuple(steps)
