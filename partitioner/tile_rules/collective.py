"""Collectives over IPU-Links: a whole-tensor kernel whose superstep carries the ring's link
bytes and cycles and syncs only its group."""

from __future__ import annotations

import dataclasses

from lowering import Op, Value
from partitioner.context import MappingContext
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.tile_rules.whole import whole_tensor_tile_rule


def _collective_buffer(op: Op) -> int:
    """The buffer the ring closed form is stated for (see partitioner.links.ring_bytes)."""
    if op.name == "all_gather":
        return op.results[0].nbytes
    return op.operands[0].nbytes


def collective_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    task = whole_tensor_tile_rule(op, inputs, layouts, ctx)
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
