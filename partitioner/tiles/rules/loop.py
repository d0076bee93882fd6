"""Control flow on tiles: a `while` or `case` whose regions are scheduled like any program, op
by op with their own tile rules, as Poplar runs a `Repeat` or `Switch` of ordinary programs.

A counted loop (`lax.scan`, `fori_loop` with static bounds; `lowering.counted_trips`) costs its
trips times its body's supersteps, and its condition nothing: Poplar's `Repeat(n)` counts on the
tiles' control code. A loop whose trips are not known statically is charged one trip and the
test that ends it, each trip testing its condition (stated in docs/target.md), until a run has
counted them (`trip_steps`: that many trips and the last test). A body's code is stored once:
its supersteps repeat identically, and identical steps share their code (`code_memory`). The
carried values live where the body leaves them, as Poplar creates a loop's tensors by cloning
what its body makes (an accumulator takes its gradient's layout): an operand laid out otherwise
is copied in once, before the loop; a value the body still leaves elsewhere (its layout moved by
the new inputs) pays, every trip, the exchange that brings it back. A value the body passes on
unchanged keeps its storage, and the body updates the others in place where it can.

A `case` runs one branch; which one is known only at run time, so it costs its dearest branch
(by cycles) and holds, per tile, the most any branch holds.

The kernel is the op itself, run by the evaluator on logical arrays: where an element sits on
the tiles never changes its value (see `tile_rules`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from lowering import Graph, Op, Value, counted_trips
from partitioner.layout import Layout, tile_bytes
from partitioner.memory.tiles import region_bytes
from partitioner.program import Program, Superstep, Task, TileBytes
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import make_step
from partitioner.tiles.rules.whole import whole_kernel

# The names of the steps that copy an operand into its loop layout, once, and that bring a
# value the body left elsewhere back, every trip.
CARRY_IN, CARRY_BACK = "while.carry in", "while.carry"


def while_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    entry = layouts[: len(op.operands)]
    cond_graph, body_graph = op.regions
    carried = entry
    body = _region_program(body_graph, inputs, layouts, carried, ctx)
    settled = tuple(body.layouts[v] for v in body_graph.outputs)
    if settled != carried:  # the loop's tensors where its body leaves them
        carried = settled
        body = _region_program(body_graph, inputs, layouts, carried, ctx)
    cond = _region_program(cond_graph, inputs, layouts, carried, ctx)
    into = tuple(
        _carry(op, "carry in", value, layout, ctx)
        for value, old, layout in zip(op.operands, entry, carried, strict=True)
        if old != layout
    )
    back = tuple(
        _carry(op, "carry", value, layout, ctx)  # named "while.carry"
        for value, layout in zip(body_graph.outputs, carried, strict=True)
        if body.layouts[value] != layout
    )
    trips = counted_trips(op, ctx.producers)
    if trips is None:  # one trip until a run counts them, its condition tested on the tiles
        steps = into + (cond.supersteps + body.supersteps + back) + cond.supersteps
    else:
        steps = into + (body.supersteps + back) * trips
    held = _most([cond, body], ctx, body)
    kernel = whole_kernel(op, inputs)
    # A value the body passes on unchanged (a scan's stacked inputs, a model's weights) comes
    # out of the loop in the storage it went in with.
    through = tuple(
        i if o == v else None
        for i, (o, v) in enumerate(zip(body_graph.outputs, body_graph.inputs, strict=True))
    )
    return Task(
        op, inputs, layouts, carried, kernel, steps, held, aliases=through, regions=(cond, body)
    )


def trip_steps(task: Task, trips: int) -> tuple[Superstep, ...]:
    """A loop of unknown trips (one trip and the test that ends it, as `while_tile_rule` charges
    it) run `trips` times: each trip tests its condition, runs its body and brings its carried
    values back, and one last test ends the loop."""
    steps = task.supersteps
    into = sum(1 for s in steps if s.name == CARRY_IN)  # the operands copied in, first
    exit_test = len(task.regions[0].supersteps)
    one_trip = steps[into : len(steps) - exit_test]
    return steps[:into] + one_trip * trips + steps[len(steps) - exit_test :]


def case_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    branches = [_region_program(r, inputs, layouts, (), ctx) for r in op.regions]
    dearest = max(branches, key=lambda b: sum(s.cycles for s in b.supersteps))
    results = tuple(dearest.layouts[v] for v in dearest.outputs)
    held = _most(branches, ctx)
    kernel = whole_kernel(op, inputs)
    return Task(
        op, inputs, layouts, results, kernel, dearest.supersteps, held, regions=tuple(branches)
    )


def _region_program(
    region: Graph,
    inputs: tuple[Value, ...],
    layouts: tuple[Layout, ...],
    carried: tuple[Layout, ...],
    ctx: MappingContext,
) -> Program:
    """A region scheduled on the tiles: its inputs in the carried layouts, the values it captures
    (among the op's `inputs`, as the scheduler reads them) where the program around it put them."""
    given = dict(zip(inputs, layouts, strict=True))
    given.update(zip(region.inputs, carried, strict=True))
    return ctx.schedule_region(region, given)


def _carry(op: Op, name: str, value: Value, carried: Layout, ctx: MappingContext) -> Superstep:
    """The exchange that brings a carried value to its loop layout: every tile of that layout
    receives its block (an operand once, before the loop; a value the body left elsewhere,
    every trip)."""
    moved = tile_bytes(carried, value.dtype)
    return make_step(
        op,
        name,
        ctx.target,
        tiles=carried.tiles,
        start=carried.start,
        busiest_bytes=moved,
        exchange_bytes=moved * carried.tiles,
        kind="copy",
    )


def _most(
    branches: list[Program], ctx: MappingContext, body: Program | None = None
) -> tuple[TileBytes, ...]:
    """Per tile, the most any region's own tensors and temporaries hold at their peak, while it
    runs (its inputs and captures the program around it holds); a loop's `body` updates the
    loop's tensors in place where it can."""
    peaks = [region_bytes(b, ctx.target, loop=b is body) for b in branches]
    return tuple(_runs(np.max(np.stack(peaks), axis=0)))


def _runs(per_tile: np.ndarray) -> Iterator[TileBytes]:
    """Per-tile bytes as runs of equal bytes on consecutive tiles."""
    edges = [0, *(np.flatnonzero(np.diff(per_tile)) + 1), len(per_tile)]
    for start, stop in itertools.pairwise(edges):
        if per_tile[start]:
            yield TileBytes(int(start), int(stop - start), int(per_tile[start]), "region")
