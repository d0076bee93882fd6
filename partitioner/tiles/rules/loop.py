"""Control flow on tiles: a `while` or `case` whose regions are scheduled like any program, op
by op with their own tile rules, as Poplar runs a `Repeat` or `Switch` of ordinary programs.

A counted loop (`lax.scan`, `fori_loop` with static bounds; `lowering.counted_trips`) costs its
trips times its body's supersteps, and its condition nothing: Poplar's `Repeat(n)` counts on the
tiles' control code. A loop whose trips are not known statically is charged one trip and the
test that ends it, each trip testing its condition (stated in docs/target.md), until a run has
counted them (`trip_steps`: that many trips and the last test). A body's code is stored once:
its supersteps repeat identically, and identical steps share their code (`code_memory`). The
carried values keep the layouts the loop's operands have; a body that leaves one elsewhere pays,
every trip, the exchange that brings it back.

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


def while_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    carried = layouts[: len(op.operands)]
    cond_graph, body_graph = op.regions
    cond = _region_program(cond_graph, inputs, layouts, carried, ctx)
    body = _region_program(body_graph, inputs, layouts, carried, ctx)
    back = tuple(
        _carry_back(op, value, layout, ctx)
        for value, layout in zip(body_graph.outputs, carried, strict=True)
        if body.layouts[value] != layout
    )
    trips = counted_trips(op, ctx.producers)
    if trips is None:  # one trip until a run counts them, its condition tested on the tiles
        steps = (cond.supersteps + body.supersteps + back) + cond.supersteps
    else:
        steps = (body.supersteps + back) * trips
    held = _most([cond, body], ctx)
    kernel = whole_kernel(op, inputs)
    return Task(op, inputs, layouts, carried, kernel, steps, held, regions=(cond, body))


def trip_steps(task: Task, trips: int) -> tuple[Superstep, ...]:
    """A loop of unknown trips (one trip and the test that ends it, as `while_tile_rule` charges
    it) run `trips` times: each trip tests its condition, runs its body and brings its carried
    values back, and one last test ends the loop."""
    exit_test = len(task.regions[0].supersteps)
    one_trip = task.supersteps[: len(task.supersteps) - exit_test]
    return one_trip * trips + task.supersteps[len(one_trip) :]


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


def _carry_back(op: Op, value: Value, carried: Layout, ctx: MappingContext) -> Superstep:
    """The exchange that returns a carried value the body left elsewhere to its loop layout:
    every tile of that layout receives its block."""
    moved = tile_bytes(carried, value.dtype)
    return make_step(
        op,
        "carry",
        ctx.target,
        tiles=carried.tiles,
        start=carried.start,
        busiest_bytes=moved,
        exchange_bytes=moved * carried.tiles,
        kind="copy",
    )


def _most(branches: list[Program], ctx: MappingContext) -> tuple[TileBytes, ...]:
    """Per tile, the most any region's own tensors and temporaries hold at their peak, while it
    runs (its inputs and captures the program around it holds)."""
    peaks = [region_bytes(b, ctx.target) for b in branches]
    return tuple(_runs(np.max(np.stack(peaks), axis=0)))


def _runs(per_tile: np.ndarray) -> Iterator[TileBytes]:
    """Per-tile bytes as runs of equal bytes on consecutive tiles."""
    edges = [0, *(np.flatnonzero(np.diff(per_tile)) + 1), len(per_tile)]
    for start, stop in itertools.pairwise(edges):
        if per_tile[start]:
            yield TileBytes(int(start), int(stop - start), int(per_tile[start]), "region")
