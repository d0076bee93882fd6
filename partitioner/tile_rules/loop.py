"""Control flow on tiles: a `while` or `case` whose regions are scheduled like any program, op
by op with their own tile rules, as Poplar runs a `Repeat` or `Switch` of ordinary programs.

A counted loop (`lax.scan`, `fori_loop` with static bounds; `lowering.counted_trips`) costs its
trips times its body's supersteps, and its condition nothing: Poplar's `Repeat(n)` counts on the
tiles' control code. A loop whose trips are not known statically is charged one trip (stated in
docs/target.md). A body's code is stored once: its supersteps repeat identically, and identical
steps share their code (`code_memory`). The carried values keep the layouts the loop's operands
have; a body that leaves one elsewhere pays, every trip, the exchange that brings it back.

A `case` runs one branch; which one is known only at run time, so it costs its dearest branch
(by cycles) and holds, per tile, the most any branch holds.

The kernel is the op itself, run by the evaluator on logical arrays: where an element sits on
the tiles never changes its value (see `tile_rules`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from lowering import Graph, Op, Value, apply_rule, counted_trips, free_values
from partitioner.context import MappingContext
from partitioner.layout import Layout, tile_bytes
from partitioner.memory import region_bytes
from partitioner.program import Kernel, Program, Superstep, Task, TileBytes
from partitioner.tile_rules.common import Array, make_step


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
        if value in body.layouts and body.layouts[value] != layout
    )
    trips = counted_trips(op, ctx.producers)
    if trips is None:  # one trip, its condition tested on the tiles
        steps = cond.supersteps + body.supersteps + back
    else:
        steps = (body.supersteps + back) * trips
    held = _most([cond, body], ctx)
    kernel = _kernel(op, inputs)
    return Task(op, inputs, layouts, carried, kernel, steps, held, regions=(cond, body))


def case_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    branches = [_region_program(r, inputs, layouts, (), ctx) for r in op.regions]
    dearest = max(branches, key=lambda b: sum(s.cycles for s in b.supersteps))
    results = tuple(dearest.layouts.get(v) or ctx.linear(v) for v in dearest.outputs)
    results = tuple(
        layout if layout.shape == value.shape else ctx.linear(value)
        for layout, value in zip(results, op.results, strict=True)
    )
    held = _most(branches, ctx)
    return Task(
        op,
        inputs,
        layouts,
        results,
        _kernel(op, inputs),
        dearest.supersteps,
        held,
        regions=tuple(branches),
    )


def _region_program(
    region: Graph,
    inputs: tuple[Value, ...],
    layouts: tuple[Layout, ...],
    carried: tuple[Layout, ...],
    ctx: MappingContext,
) -> Program:
    """A region scheduled on the tiles: its inputs in the carried layouts, the values it captures
    where the program around it put them."""
    given = dict(zip(inputs, layouts, strict=True))
    given.update(zip(region.inputs, carried, strict=True))
    for value in free_values(region):
        given.setdefault(value, ctx.linear(value))
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
    tile = 0
    while tile < len(per_tile):
        end = tile
        while end + 1 < len(per_tile) and per_tile[end + 1] == per_tile[tile]:
            end += 1
        if per_tile[tile]:
            yield TileBytes(tile, end - tile + 1, int(per_tile[tile]), "region")
        tile = end + 1


def _kernel(op: Op, inputs: tuple[Value, ...]) -> Kernel:
    """The op on logical arrays: its operands, then the values its regions capture."""
    count = len(op.operands)
    captured = inputs[count:]

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        env = dict(zip(captured, arrays[count:], strict=True))
        return tuple(apply_rule(op, list(arrays[:count]), op.attrs, env))

    return kernel
