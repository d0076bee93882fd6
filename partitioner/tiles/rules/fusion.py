"""A fused elementwise chain (`lowering.fusion`): one superstep, as one map-expression vertex per
tile. The result takes the layout an elementwise op would give it from the chain's inputs, the
exchange brings each tile its block of the inputs that are not there, and each tile runs the
whole chain over its block (`cost.fused`)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from lowering import FUSION, Graph, Op, Value, interpret, members, op_cost
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.fused import arithmetic_per_element, fused_cycles
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array
from partitioner.tiles.rules.elementwise import (
    block_step,
    blockwise_kernel,
    elementwise_layout,
    moved_bytes,
)
from partitioner.tiles.rules.reduce import reduce_tile_rule


def fusion_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    if members(op)[-1].name == "reduce":
        return _fused_reduce(op, inputs, layouts, ctx)
    out = elementwise_layout(op, layouts, ctx)
    loaded = [v.dtype for v in op.operands if not _scalar(v, ctx)]
    cycles = fused_cycles(members(op), out.block_elements, loaded, op.results[0].dtype, ctx.target)
    step = block_step(op, f"fusion({label(op)})", layouts, out, cycles, ctx)
    return Task(op, inputs, layouts, (out,), blockwise_kernel(op), (step,))


def _fused_reduce(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """A reduction with its operand's chain as prologue: the reduction planned as if its
    operand lay where the chain's inputs lie, in their element type (a cast to float partials
    is the reduction's own), its first stage also running the chain over each tile's block
    and receiving what of the chain's inputs is not there."""
    region = op.regions[0]
    *chain, reduce = region.ops
    x, init = reduce.operands
    lay = elementwise_layout(op, layouts, ctx, shape=x.shape)
    moved = [moved_bytes(v, lay_, lay, ctx) for v, lay_ in zip(op.operands, layouts, strict=True)]
    tensors = [v for v in op.operands if v.shape == x.shape and not _scalar(v, ctx)]
    loaded = min((v.dtype for v in tensors), key=lambda t: t.itemsize, default=x.dtype)
    stand_in = Value(-1, x.shape, loaded)
    planned = reduce_tile_rule(
        dataclasses.replace(reduce, operands=(stand_in, init)),
        (stand_in, init),
        (lay, ctx.linear(init)),
        ctx,
    )
    first, *rest = planned.supersteps
    received = first.busiest_tile_bytes + sum(moved)
    first = dataclasses.replace(
        first,
        name=f"fusion({label(op)}).{first.name.split('.', 1)[-1]}",
        op=FUSION,
        compute_cycles=first.compute_cycles + _prologue_cycles(chain, lay, ctx.target),
        busiest_tile_bytes=received,
        exchange_bytes=first.exchange_bytes + sum(moved) * first.tiles,
        exchange_cycles=exchange_cycles(ctx.target, received),
        flops=first.flops + sum(op_cost(m).flops for m in chain),
    )
    inner = Graph(inputs=region.inputs, outputs=(x,), ops=tuple(chain), name=FUSION)
    at = region.inputs.index(init)

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        (value,) = interpret(inner, arrays)
        return planned.kernel(value, arrays[at])

    rest = [dataclasses.replace(s, op=FUSION) for s in rest]
    return Task(op, inputs, layouts, planned.result_layouts, kernel, (first, *rest))


def _prologue_cycles(chain: list[Op], layout: Layout, target: Target) -> int:
    """The chain's arithmetic over a tile's block, feeding the reduction's loads: its loads
    and stores are the reduction's own."""
    workers = target.threads_per_tile
    per_worker = math.ceil(layout.block_elements / workers)
    return workers * math.ceil(per_worker * arithmetic_per_element(chain, target))


def label(op: Op) -> str:
    """The members of a fusion, in order, repeats counted: `convert, multiply x2, add`."""
    counts = Counter(m.name for m in members(op))
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def _scalar(value: Value, ctx: MappingContext) -> bool:
    """A scalar, or a broadcast of one: held in a register, not loaded per element."""
    if value.size == 1:
        return True
    made = ctx.producers.get(value)
    return made is not None and made.name == "broadcast_in_dim" and made.operands[0].size == 1
