"""Scheduling: a Graph on one IPU becomes a BSP Program.

The passes, in order: map the program's inputs linearly over the tiles, except those whose
first reader wants them in a layout of its own (a matmul's operands, `OPERAND_LAYOUTS`); then
for each op in program order, its tile rule (`tile_rules.TILE_RULES`) picks its result layouts,
its kernel and its supersteps, given the layouts its operands already have; an op equal to an
earlier one in everything its rule reads takes a copy of that one's task (`repeats`). The
result is one straight list of tasks, which the runtime runs in order and the cost model sums.
"""

from __future__ import annotations

from collections.abc import Mapping

from lowering import Graph, Op, Value, op_reads, producers
from partitioner.cost.links import LinkModel
from partitioner.layout import Layout
from partitioner.program import Program, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.repeats import Repeats
from partitioner.tiles.rules import OPERAND_LAYOUTS, TILE_RULES


def _create_for(
    op: Op, wanted: tuple[Layout | None, ...], unread: set[Value], layouts: dict[Value, Layout]
) -> None:
    """Inputs an op reads first are created in the layouts it wants, as Poplar creates a
    matmul's weights (`createMatMulInputRHS`) instead of mapping them linearly and moving them."""
    for value, layout in zip(op.operands, wanted, strict=True):
        if value in unread and layout is not None:
            layouts[value] = layout


def schedule(
    graph: Graph,
    target: Target,
    links: LinkModel | None = None,
    given: Mapping[Value, Layout] | None = None,
    made: Mapping[Value, Op] | None = None,
    reuse: bool = True,
) -> Program:
    """Maps every value of `graph` onto the tiles of one IPU and orders its supersteps; with a
    link model, collectives are costed over IPU-Links. A region is scheduled with its inputs and
    the values it captures `given` in the layouts they already have, `made` by the ops around.
    Repeated ops take copies of the first one's task (`repeats`); `reuse=False` runs every
    op's rule, the long way the copies are checked against."""
    given = given or {}
    reads = [op_reads(op) for op in graph.ops]
    makers = {**(made or {}), **producers(graph)}
    ctx = MappingContext(target, links=links, producers=makers)
    # Reads `makers`, not `ctx`: a context holding a function that holds it is a cycle, which
    # only Python's collector frees.
    ctx.region_scheduler = lambda region, inner: schedule(
        region, target, links, inner, makers, reuse
    )
    layouts = {value: ctx.linear(value) for value in graph.inputs if value not in given}
    layouts.update(given)
    unread = set(graph.inputs) - set(given)
    tasks: list[Task] = []
    repeats = Repeats(reuse)
    for op, values in zip(graph.ops, reads, strict=True):
        if op.name in OPERAND_LAYOUTS and unread.intersection(op.operands):
            _create_for(op, OPERAND_LAYOUTS[op.name](op, ctx), unread, layouts)
        unread.difference_update(values)
        task = repeats.task(
            TILE_RULES[op.name], op, values, tuple([layouts[v] for v in values]), ctx
        )
        layouts.update(zip(op.results, task.result_layouts, strict=True))
        tasks.append(task)
    return Program(
        inputs=graph.inputs,
        input_layouts=tuple(layouts[v] for v in graph.inputs),
        tasks=tuple(tasks),
        outputs=graph.outputs,
        layouts=layouts,
        tiles=target.tiles_per_ipu,
    )
