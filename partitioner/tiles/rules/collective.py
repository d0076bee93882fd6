"""Collectives over IPU-Links: a whole-tensor kernel whose superstep carries the ring's link
cycles, syncs only its group, and records the collective for the report."""

from __future__ import annotations

import dataclasses

from lowering import Op, Value
from partitioner.cost.links import collective_buffer
from partitioner.layout import Layout
from partitioner.program import Task, collective_step
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.whole import whole_tensor_tile_rule


def collective_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    task = whole_tensor_tile_rule(op, inputs, layouts, ctx)
    if ctx.links is None:
        raise ValueError(f"{op.name} needs a mesh of IPUs to run on")
    axes = tuple(op.attrs["axes"])
    ring = ctx.links.ring(op.name, axes, collective_buffer(op))
    (on_chip,) = task.supersteps
    why = f"{op.attrs.get('why', '')}; over {ring.route}"
    step = collective_step(on_chip, op.name, axes, ctx.links.group(axes), ring, why)
    return dataclasses.replace(task, supersteps=(step,))
