"""Elementwise ops: the result takes an operand's layout, each tile applies the op to its
block, and the exchange brings what is not there already."""

from __future__ import annotations

import dataclasses

from lowering import Op, Value, apply_rule, op_cost
from partitioner.cost.vector import elementwise_cycles
from partitioner.layout import Layout, free_move
from partitioner.program import Kernel, Superstep, Task
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array, make_step, received_bytes
from partitioner.tiles.rules.whole import whole_tensor_tile_rule


def elementwise_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    result = op.results[0]
    if any(v.shape not in (result.shape, ()) for v in op.operands):
        return whole_tensor_tile_rule(op, inputs, layouts, ctx)
    out = elementwise_layout(op, layouts, ctx)
    if out.shape != result.shape:  # an operand of the same size seen as another shape
        out = dataclasses.replace(out, shape=result.shape)

    return Task(
        op, inputs, layouts, (out,), blockwise_kernel(op), _elementwise_steps(op, layouts, out, ctx)
    )


def blockwise_kernel(op: Op) -> Kernel:
    """Each tile applies the op (a fused chain too) to its block: over all tiles, the op on
    the whole tensor."""

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        return tuple(apply_rule(op, list(arrays), op.attrs, {}))

    return kernel


def block_step(
    op: Op, name: str, layouts: tuple[Layout, ...], out: Layout, cycles: int, ctx: MappingContext
) -> Superstep:
    """The one superstep of an op each tile runs on its block of `out`: the exchange brings
    each operand's block where it is not there already (`moved_bytes`)."""
    moved = sum(moved_bytes(v, lay, out, ctx) for v, lay in zip(op.operands, layouts, strict=True))
    step = make_step(
        op,
        "",
        ctx.target,
        tiles=out.tiles,
        start=out.start,
        flops=op_cost(op).flops,
        compute_cycles=cycles,
        busiest_bytes=moved,
        exchange_bytes=moved * out.tiles,
    )
    return dataclasses.replace(step, name=name) if name else step


# Results that Poplar holds as views of a smaller tensor (broadcasts) or as constants: an
# elementwise op never takes its layout from them while another operand has one.
_VIEWS = frozenset({"broadcast_in_dim", "constant", "iota"})


def _producer(value: Value, ctx: MappingContext) -> str:
    op = ctx.producers.get(value)
    return op.name if op is not None else ""


def moved_bytes(value: Value, layout: Layout, out: Layout, ctx: MappingContext) -> int:
    """Bytes the busiest tile receives to hold its block of `value` in the layout `out`: none if
    it is there already; a broadcast (a view in Poplar) brings at most its source."""
    if value.shape == ():
        return value.dtype.itemsize
    if layout == out or free_move(layout, out):
        return 0
    return received_bytes(ctx.producers.get(value), out.block_elements * value.dtype.itemsize)


def elementwise_layout(
    op: Op, layouts: tuple[Layout, ...], ctx: MappingContext, shape: tuple[int, ...] | None = None
) -> Layout:
    """The result takes the layout of a full-size operand, chosen as PopLibs'
    `createOutputForElementWiseOp` chooses: not a broadcast or constant, then the fewest
    elements on the fullest tile, then the most tiles; the first operand on a tie. With no
    full-size operand, a fresh linear layout. (`shape`: the size that counts as full, when it
    is not the result's: a fused reduction's operand.)"""
    result = op.results[0]
    shape = result.shape if shape is None else shape
    # by the layout's shape: a fused chain's operand read through a reshape is laid out as one
    full = [(v, lay) for v, lay in zip(op.operands, layouts, strict=True) if lay.shape == shape]
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
    # select's first operand is its predicate: the values' type sets the cost
    dtype = op.operands[-1].dtype if op.name == "select" else op.operands[0].dtype
    direction = op.attrs.get("direction", "") if op.name == "compare" else ""
    cycles = elementwise_cycles(
        op.name, out.block_elements, dtype, result.dtype, ctx.target, direction
    )
    return (block_step(op, "", layouts, out, cycles, ctx),)
