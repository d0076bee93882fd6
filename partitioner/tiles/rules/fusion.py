"""A fused elementwise chain (`lowering.fusion`): one superstep, as one map-expression vertex per
tile. The result takes the layout an elementwise op would give it from the chain's inputs, the
exchange brings each tile its block of the inputs that are not there, and each tile runs the
whole chain over its block (`cost.fused`)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence

from lowering import FUSION, Graph, Op, Value, interpret, members, op_cost, scalar_operand
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.fused import arithmetic_per_element, fused_cycles
from partitioner.layout import Layout
from partitioner.program import Kernel, Superstep, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array, TileRule
from partitioner.tiles.rules.elementwise import (
    block_step,
    blockwise_kernel,
    elementwise_layout,
    moved_bytes,
)
from partitioner.tiles.rules.reduce import reduce_tile_rule
from partitioner.tiles.rules.siblings import siblings_task


def fusion_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    reductions = sum(m.name == "reduce" for m in members(op))
    if reductions > 1:  # sibling reductions (`lowering.siblings`), planned together
        return siblings_task(op, inputs, layouts, ctx, _reduction_rule, f"fusion({label(op)})")
    if reductions:
        return _fused_reduce(op, inputs, layouts, ctx)
    root, *extras = op.results  # a chain may give out members' results besides its root's
    viewed = _viewed_as(op.operands, layouts, root.shape)
    out = elementwise_layout(op, viewed, ctx)
    # each result is stored as the chain writes it: the extras' stores count as loads do
    moved = [v.dtype for v in op.operands if not _scalar(v, ctx)] + [v.dtype for v in extras]
    cycles = fused_cycles(members(op), out.block_elements, moved, root.dtype, ctx.target)
    step = block_step(op, f"fusion({label(op)})", viewed, out, cycles, ctx)
    # the extras have the root's size (`lowering.fusion`), some in a shape of their own
    outs = tuple(dataclasses.replace(out, shape=v.shape) for v in op.results)
    return Task(op, inputs, layouts, outs, blockwise_kernel(op), (step,))


def _reduction_rule(part: Op) -> TileRule:
    return reduce_tile_rule if part.name == "reduce" else fusion_tile_rule


def _viewed_as(
    operands: tuple[Value, ...], layouts: tuple[Layout, ...], shape: tuple[int, ...]
) -> tuple[Layout, ...]:
    """Each operand of `shape`'s size laid out as a tensor of `shape`: a chain that reads
    through a reshape reads the same elements on the same tiles (a layout's view is a row-major
    reshape of its tensor, as `views.reshape_tile_rule` says)."""
    size = math.prod(shape)
    return tuple(
        dataclasses.replace(lay, shape=shape) if v.shape != shape and v.size == size else lay
        for v, lay in zip(operands, layouts, strict=True)
    )


def _fused_reduce(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """A reduction with its operand's chain as prologue: the reduction planned as if its
    operand lay where the chain's inputs lie, in their element type (a cast to float partials
    is the reduction's own), its first stage also running the chain over each tile's block
    and receiving what of the chain's inputs is not there; its last stage also running the
    epilogue (a scale by a scalar, a cast) over each tile's outputs as it writes them."""
    region = op.regions[0]
    at = next(i for i, m in enumerate(region.ops) if m.name == "reduce")
    chain, reduce, epilogue = region.ops[:at], region.ops[at], region.ops[at + 1 :]
    x, init = reduce.operands
    viewed = _viewed_as(op.operands, layouts, x.shape)
    lay = elementwise_layout(op, viewed, ctx, shape=x.shape)
    # the epilogue's operands are scalars, a vertex's parameters: nothing of theirs moves
    read = {v for m in (*chain, reduce) for v in m.operands}
    moved = [
        moved_bytes(v, lay_, lay, ctx) if inner in read else 0
        for v, lay_, inner in zip(op.operands, viewed, region.inputs, strict=True)
    ]
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
    rest = [dataclasses.replace(s, op=FUSION) for s in rest]
    steps = _with_epilogue([first, *rest], epilogue, planned.result_layouts[0], ctx.target)
    kernel = _fused_reduce_kernel(region, chain, reduce, epilogue, planned.kernel)
    # an epilogue may read the sums through a view: the same elements on the same tiles
    outs = tuple(
        dataclasses.replace(lay, shape=v.shape)
        for v, lay in zip(op.results, planned.result_layouts, strict=True)
    )
    return Task(op, inputs, layouts, outs, kernel, steps)


def _with_epilogue(
    steps: list[Superstep], epilogue: tuple[Op, ...], out: Layout, target: Target
) -> tuple[Superstep, ...]:
    """The reduction's stages, the last also applying the epilogue to each tile's outputs."""
    if not epilogue:
        return tuple(steps)
    last = steps[-1]
    steps[-1] = dataclasses.replace(
        last,
        compute_cycles=last.compute_cycles + _prologue_cycles(epilogue, out, target),
        flops=last.flops + sum(op_cost(m).flops for m in epilogue),
    )
    return tuple(steps)


def _fused_reduce_kernel(
    region: Graph, chain: tuple[Op, ...], reduce: Op, epilogue: tuple[Op, ...], planned: Kernel
) -> Kernel:
    """The prologue on the fusion's inputs, the planned reduction, then the epilogue."""
    x, init = reduce.operands
    head = Graph(inputs=region.inputs, outputs=(x,), ops=chain, name=FUSION)
    tail = Graph(
        inputs=(*region.inputs, reduce.results[0]),
        outputs=region.outputs,
        ops=epilogue,
        name=FUSION,
    )
    at = region.inputs.index(init)

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        (value,) = interpret(head, arrays)
        reduced = planned(value, arrays[at])
        return tuple(interpret(tail, (*arrays, *reduced))) if epilogue else reduced

    return kernel


def _prologue_cycles(chain: Sequence[Op], layout: Layout, target: Target) -> int:
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
    return scalar_operand(value, ctx.producers.get(value))
