"""Collectives over IPU-Links: a whole-tensor kernel whose superstep carries the ring's link
cycles, syncs only its group, and records the collective for the report."""

from __future__ import annotations

import dataclasses

from lowering import Op, Value
from partitioner.context import MappingContext
from partitioner.cost.links import CollectiveCost, collective_buffer
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.tile_rules.whole import whole_tensor_tile_rule


def collective_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    task = whole_tensor_tile_rule(op, inputs, layouts, ctx)
    if ctx.links is None:
        raise ValueError(f"{op.name} needs a mesh of IPUs to run on")
    axes = tuple(op.attrs["axes"])
    ring = ctx.links.ring(op.name, axes, collective_buffer(op))
    (on_chip,) = task.supersteps
    name = f"{op.name}({','.join(axes)})"
    record = CollectiveCost(
        kind=op.name,
        axes=axes,
        group_size=ctx.links.group(axes),
        bytes_per_ipu=ring.bytes_per_ipu,
        cycles=ring.link_cycles + ring.sync_cycles,
        op=name,
        source=on_chip.source,
        why=f"{op.attrs.get('why', '')}; over {ring.route}",
    )
    step = dataclasses.replace(
        on_chip,
        name=name,
        sync_cycles=ring.sync_cycles,
        sync_group="+".join(axes),
        link_cycles=ring.link_cycles,
        kind="collective",
        collective=record,
    )
    return dataclasses.replace(task, supersteps=(step,))
