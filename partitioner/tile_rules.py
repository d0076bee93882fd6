"""Tile rules: how each op runs on tiles. One rule per op of the vocabulary.

A rule maps an op onto tiles and returns a `Task`: the layouts of its results, the supersteps it
costs, and a kernel that computes its results. There are five kinds:

- elementwise ops follow their operands' layout, and each tile applies the op to its block;
- dot_general is planned as PopLibs plans a matmul (`matmul_plan`): operands are exchanged into
  [B, M, K] and [B, K, N] blocks over a grid of tiles, each tile runs the dot of its blocks into
  f32 partials, and a K split is reduced across tiles in a second superstep;
- reduce runs in stages: each tile reduces its block, then partials are exchanged to the tiles
  that own the output and reduced again;
- views (reshape of a linearly mapped tensor, sharding annotations, barriers) cost nothing;
- every other op (data movement, gather and scatter, sort, convolution, control flow) runs as
  one kernel over the whole tensor, costed as an exchange that brings each result tile its block
  plus the op's work spread evenly over the result's tiles.

Kernels take and return tensors in logical order and compute every tile's share at once. Where
an element sits never changes its value, so an exchange moves nothing in the simulator, and
an elementwise op on all blocks is the op on the whole tensor. What a split can change is kept:
a matmul accumulates in PopLibs' partials type, and a reduction whose depth is split over tiles
adds each tile's run first, then the tiles' partials. Storing
tensors tile by tile instead made the simulator 1.3 to 1.7 times slower than `jax.jit` on a
GPT step (transposes and pads at every change of layout); in logical order it is within a few
percent on one IPU (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import VOCABULARY, Op, Value, apply_rule, op_cost, walk
from lowering.vocabulary import COLLECTIVES, CONTRACTIONS, ELEMENTWISE
from partitioner.context import MappingContext
from partitioner.layout import Layout, free_move, tile_bytes
from partitioner.matmul_plan import plan_matmul
from partitioner.program import Superstep, Task, TileBytes
from partitioner.target import Target

TileRule = Callable[[Op, tuple[Value, ...], tuple[Layout, ...], MappingContext], Task]
Array = Any


def _step(
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
) -> Superstep:
    return Superstep(
        name=f"{op.name}.{name}" if name else op.name,
        op=op.name,
        loc=op.loc,
        tiles=tiles,
        start=start,
        flops=flops,
        exchange_bytes=exchange_bytes,
        busiest_tile_bytes=busiest_bytes,
        compute_cycles=compute_cycles,
        exchange_cycles=target.exchange_cycles(busiest_bytes),
        sync_cycles=target.sync_cycles,
    )


def _per_tile(total: int, elements: int, block_elements: int) -> int:
    """The busiest tile's share of `total` work when it holds a full block of the elements."""
    return math.ceil(total * block_elements / max(1, elements))


# ---- elementwise ---------------------------------------------------------------------------


def _elementwise_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    result = op.results[0]
    if any(v.shape not in (result.shape, ()) for v in op.operands):
        return _whole_tensor_tile_rule(op, inputs, layouts, ctx)
    out = dataclasses.replace(_elementwise_layout(op, layouts, ctx), shape=result.shape)

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        # Each tile applies the op to its block: over all tiles, the op on the whole tensor.
        return tuple(apply_rule(op, list(arrays), op.attrs, {}))

    return Task(op, inputs, layouts, (out,), kernel, _elementwise_steps(op, layouts, out, ctx))


# Results that Poplar holds as views of a smaller tensor (broadcasts) or as constants: an
# elementwise op never takes its layout from them while another operand has one.
_VIEWS = frozenset({"broadcast_in_dim", "constant", "iota"})


def _producer(value: Value, ctx: MappingContext) -> str:
    op = ctx.producers.get(value)
    return op.name if op is not None else ""


def _moved_bytes(value: Value, layout: Layout, out: Layout, ctx: MappingContext) -> int:
    """Bytes the busiest tile receives to hold its block of `value` in the layout `out`: none if
    it is there already; a broadcast (a view in Poplar) brings at most its source."""
    if value.shape == ():
        return value.dtype.itemsize
    if layout == out or free_move(layout, out):
        return 0
    block = out.block_elements * value.dtype.itemsize
    producer = ctx.producers.get(value)
    if producer is not None and producer.name == "broadcast_in_dim":
        return min(block, producer.operands[0].nbytes)
    if producer is not None and producer.name == "iota":
        return 0  # each tile makes its own indices
    return block


def _elementwise_layout(op: Op, layouts: tuple[Layout, ...], ctx: MappingContext) -> Layout:
    """The result takes the layout of a full-size operand, chosen as PopLibs'
    `createOutputForElementWiseOp` chooses: not a broadcast or constant, then the fewest
    elements on the fullest tile, then the most tiles; the first operand on a tie. With no
    full-size operand, a fresh linear layout."""
    result = op.results[0]
    full = [
        (v, lay) for v, lay in zip(op.operands, layouts, strict=True) if v.shape == result.shape
    ]
    if not full:
        return ctx.linear(result)
    computed = [lay for v, lay in full if _producer(v, ctx) not in _VIEWS]
    return min(
        computed or [lay for _, lay in full], key=lambda lay: (lay.block_elements, -lay.tiles)
    )


def _elementwise_steps(
    op: Op, layouts: tuple[Layout, ...], out: Layout, ctx: MappingContext
) -> tuple[Superstep, ...]:
    result = op.results[0]
    block = out.block_elements
    moved = [_moved_bytes(v, lay, out, ctx) for v, lay in zip(op.operands, layouts, strict=True)]

    cost = op_cost(op)
    flops = _per_tile(cost.flops, result.size, block)
    special = _per_tile(cost.transcendentals, result.size, block)
    dtype = op.operands[0].dtype if op.operands else result.dtype
    cycles = ctx.target.vector_cycles(flops, dtype, special)
    step = _step(
        op,
        "",
        ctx.target,
        tiles=out.tiles,
        start=out.start,
        flops=cost.flops,
        compute_cycles=cycles,
        busiest_bytes=sum(moved),
        exchange_bytes=sum(moved) * out.tiles,
    )
    return (step,)


# ---- dot_general ---------------------------------------------------------------------------


def _dot_dims(op: Op) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    (lc, rc), (lb, rb) = op.attrs["dimension_numbers"]
    lhs, rhs = op.operands
    lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    return list(lb), lf, list(lc), list(rb), list(rc), rf


def _dot_general_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    lhs, rhs = op.operands
    result = op.results[0]
    lb, lf, lc, rb, rc, rf = _dot_dims(op)
    size = lambda v, dims: math.prod(v.shape[d] for d in dims)  # noqa: E731
    big_b, big_m, big_k, big_n = size(lhs, lb), size(lhs, lf), size(lhs, lc), size(rhs, rf)
    exact = not np.issubdtype(result.dtype, np.floating) and result.dtype.kind != "V"
    partial_dtype = result.dtype if exact else np.dtype(np.float32)
    plan = plan_matmul(big_b, big_m, big_n, big_k, lhs.dtype, partial_dtype.itemsize, ctx.target)
    grid_l = Layout(_permuted(lhs, lb + lf + lc), (big_b, big_m, big_k), (plan.b, plan.m, plan.k))
    grid_r = Layout(_permuted(rhs, rb + rc + rf), (big_b, big_k, big_n), (plan.b, plan.k, plan.n))
    out = Layout(result.shape, (big_b, big_m, big_n), (plan.b, plan.m, plan.n))
    contract = _contraction(op, partial_dtype)

    def kernel(lhs_array: Array, rhs_array: Array) -> tuple[Array, ...]:
        return (lax.convert_element_type(contract(lhs_array, rhs_array), result.dtype),)

    steps = _dot_steps(op, plan, grid_l, grid_r, out, partial_dtype, ctx.target)
    # With a serial split, each loop iteration receives and holds one chunk of K at a time.
    temps = (
        TileBytes(0, plan.tiles, tile_bytes(grid_l, lhs.dtype) // plan.serial, "lhs blocks"),
        TileBytes(0, plan.tiles, tile_bytes(grid_r, rhs.dtype) // plan.serial, "rhs blocks"),
        TileBytes(0, plan.tiles, tile_bytes(out, partial_dtype), "partial sums"),
    )
    return Task(op, inputs, layouts, (out,), kernel, steps, temps)


def _permuted(value: Value, order: Sequence[int]) -> tuple[int, ...]:
    return tuple(value.shape[d] for d in order)


def _contraction(op: Op, partial_dtype: np.dtype) -> Callable[..., Array]:
    """Both supersteps of a planned matmul as one contraction: each tile (b, m, n, k) multiplies
    its blocks into partials of `partial_dtype` (PopLibs' partials type, f32 for floats) and
    the k tiles' partials are summed. Over all tiles these are the sums of one `dot_general`
    with f32 accumulation; the cost model charges the steps, the simulator needs the values."""
    attrs = {**op.attrs, "preferred_element_type": partial_dtype}

    def contract(left: Array, right: Array) -> Array:
        if left.dtype.itemsize < partial_dtype.itemsize and partial_dtype.kind == "f":
            # XLA:CPU has no bf16 x bf16 -> f32 dot; widening first is exact.
            left = lax.convert_element_type(left, partial_dtype)
            right = lax.convert_element_type(right, partial_dtype)
        return apply_rule(op, [left, right], attrs, {})[0]

    return contract


def _dot_steps(
    op: Op,
    plan: Any,
    grid_l: Layout,
    grid_r: Layout,
    out: Layout,
    partial: np.dtype,
    target: Target,
) -> tuple[Superstep, ...]:
    lhs, rhs = op.operands
    received = tile_bytes(grid_l, lhs.dtype) + tile_bytes(grid_r, rhs.dtype)
    block_flops = 2 * math.prod(out.block) * grid_l.block[2]
    compute = target.matmul_cycles(block_flops, lhs.dtype)
    compute += (plan.serial - 1) * target.compute_set_overhead_cycles
    flops = op_cost(op).flops
    steps = [
        _step(
            op,
            "matmul",
            target,
            tiles=plan.tiles,
            flops=flops,
            compute_cycles=compute,
            busiest_bytes=received,
            exchange_bytes=received * plan.tiles,
        )
    ]
    if plan.k > 1:
        partials = plan.k * tile_bytes(out, partial)
        steps.append(
            _step(
                op,
                "reduce_partials",
                target,
                tiles=out.tiles,
                flops=plan.k * math.prod(out.block) * out.tiles,
                compute_cycles=target.vector_cycles(plan.k * out.block_elements, partial),
                busiest_bytes=partials,
                exchange_bytes=partials * out.tiles,
            )
        )
    return tuple(steps)


# ---- reduce --------------------------------------------------------------------------------


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
        cycles = target.vector_cycles(pb * qb, np.dtype(np.float32))
        if gq > 1:
            cycles += target.exchange_cycles(gq * pb * itemsize) + target.sync_cycles
            cycles += target.vector_cycles(gq * pb, np.dtype(np.float32))
        if best_cycles is None or cycles < best_cycles:
            best, best_cycles = (gp, gq), cycles
        gq *= 2
    return best


def _reduce_tile_rule(
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
    grids = [Layout(_permuted(x, kept + list(dims)), (rows, depth), (gp, gq)) for x in xs]
    outs = tuple(Layout(r.shape, (rows,), (gp,)) for r in op.results)
    order = (*kept, *dims)

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

    in_place = list(kept + list(dims)) == sorted(kept + list(dims)) and all(
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
        _step(
            op,
            "local",
            target,
            tiles=grids[0].tiles,
            flops=op_cost(op).flops,
            compute_cycles=target.vector_cycles(block, dtype),
            busiest_bytes=received,
            exchange_bytes=received * grids[0].tiles,
        )
    ]
    if gq > 1:
        partial = gq * sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
        steps.append(
            _step(
                op,
                "combine",
                target,
                tiles=outs[0].tiles,
                flops=gq * outs[0].block_elements * outs[0].tiles,
                compute_cycles=target.vector_cycles(gq * outs[0].block_elements, dtype),
                busiest_bytes=partial,
                exchange_bytes=partial * outs[0].tiles,
            )
        )
    return tuple(steps)


# ---- views, annotations, constants ---------------------------------------------------------


def _reshape_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    source = layouts[0]
    if len(source.view) != 1:
        return _whole_tensor_tile_rule(op, inputs, layouts, ctx)
    # A reshape keeps the row-major order, so a linearly mapped tensor stays where it is.
    shape = op.results[0].shape
    out = dataclasses.replace(source, shape=shape)
    return Task(op, inputs, layouts, (out,), lambda x: (x.reshape(shape),), aliases=(0,))


def _identity_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    count = len(op.operands)
    return Task(
        op,
        inputs,
        layouts,
        layouts[:count],
        lambda *tiles: tiles[:count],
        aliases=tuple(range(count)),
    )


def _constant_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    value = op.attrs["value"]
    out = ctx.linear(op.results[0])
    ctx.constants[op.results[0]] = value
    return Task(op, inputs, layouts, (out,), lambda: (jnp.asarray(value),))


# ---- ops run as one kernel over the whole tensor -------------------------------------------


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


def _whole_tensor_tile_rule(
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
    received = sum(tile_bytes(o, r.dtype) for o, r in zip(outs, op.results, strict=True))
    if op.name == "broadcast_in_dim":  # each tile receives the source once, then copies
        received = min(received, op.operands[0].nbytes)
    if op.name in ("iota",):
        received = 0
    cost = op_cost(op)
    flops = cost.flops + _region_flops(op, ctx)
    per_tile = _per_tile(flops, elements, block)
    dtype = op.operands[0].dtype if op.operands else op.results[0].dtype
    if op.name in CONTRACTIONS:
        compute = target.matmul_cycles(per_tile, dtype)
    else:
        special = _per_tile(cost.transcendentals, elements, block)
        compute = target.vector_cycles(max(per_tile, block), dtype, special)
    step = _step(
        op,
        "",
        target,
        tiles=tiles,
        start=start,
        flops=flops,
        compute_cycles=compute,
        busiest_bytes=received,
        exchange_bytes=received * tiles,
    )
    return (step,)


# ---- collectives over IPU-Links -------------------------------------------------------------


def _collective_buffer(op: Op) -> int:
    """The buffer the ring closed form is stated for (see partitioner.links.ring_bytes)."""
    if op.name == "all_gather":
        return op.results[0].nbytes
    return op.operands[0].nbytes


def _collective_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    task = _whole_tensor_tile_rule(op, inputs, layouts, ctx)
    if ctx.links is None:
        raise ValueError(f"{op.name} needs a mesh of IPUs to run on")
    axes = tuple(op.attrs["axes"])
    cost = ctx.links.cost(op.name, axes, _collective_buffer(op))
    (on_chip,) = task.supersteps
    step = dataclasses.replace(
        on_chip,
        name=f"{op.name}({','.join(axes)})",
        sync_cycles=cost.sync_cycles,
        sync_group="+".join(axes),
        link_bytes=cost.bytes_per_ipu,
        link_cycles=cost.link_cycles,
        kind="collective",
        axes=axes,
        route=cost.route,
        why=str(op.attrs.get("why", "")),
    )
    return dataclasses.replace(task, supersteps=(step,))


_SPECIAL: dict[str, TileRule] = {
    **{name: _collective_tile_rule for name in COLLECTIVES},
    "dot_general": _dot_general_tile_rule,
    "reduce": _reduce_tile_rule,
    "reshape": _reshape_tile_rule,
    "constant": _constant_tile_rule,
    "sharding_constraint": _identity_tile_rule,
    "optimization_barrier": _identity_tile_rule,
}

TILE_RULES: dict[str, TileRule] = {
    name: _SPECIAL.get(
        name, _elementwise_tile_rule if name in ELEMENTWISE else _whole_tensor_tile_rule
    )
    for name in sorted(VOCABULARY)
}
