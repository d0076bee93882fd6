"""Collectives and halo exchanges over IPU-Links: a whole-tensor kernel whose superstep
carries the link cycles (a ring's, or one step of it each way for a halo), syncs only its group,
and records the transfer for the report."""

from __future__ import annotations

import dataclasses

from lowering import Op, Value
from partitioner.cost.links import collective_buffer, halo_edges
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Task, collective_step
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import make_step
from partitioner.tiles.rules.whole import whole_kernel, whole_tensor_tile_rule


def collective_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    task = whole_tensor_tile_rule(op, inputs, layouts, ctx)
    if ctx.links is None:
        raise ValueError(f"{op.name} needs a mesh of IPUs to run on")
    axes = tuple(op.attrs["axes"])
    buffer = collective_buffer(op)
    ring = ctx.links.ring(op.name, axes, buffer)
    (on_chip,) = task.supersteps
    why = f"{op.attrs.get('why', '')}; over {ring.route}"
    step = collective_step(on_chip, op.name, axes, ctx.links.group(axes), ring, why, buffer)
    return dataclasses.replace(task, supersteps=(step,))


def halo_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """A halo exchange: the edge rows go to the neighbouring IPUs over IPU-Links
    (`LinkModel.halo`), and the extended block lands on the tiles of its result, each tile
    receiving its block as a gathering collective's result does (nothing is computed)."""
    return _to_neighbours(op, inputs, layouts, ctx, halo_edges(op), "to the neighbours")


def permute_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """A collective permute (`jax.lax.ppermute` in a shard_map): each IPU sends its whole
    block to one other, one direction's links carrying it, as one step of a halo exchange
    (docs/target.md, "Collectives a shard_map writes")."""
    sent = op.operands[0].nbytes
    return _to_neighbours(op, inputs, layouts, ctx, (sent, 0), "to each IPU's target")


def _to_neighbours(
    op: Op,
    inputs: tuple[Value, ...],
    layouts: tuple[Layout, ...],
    ctx: MappingContext,
    edges: tuple[int, int],
    where: str,
) -> Task:
    if ctx.links is None:
        raise ValueError(f"{op.name} needs a mesh of IPUs to run on")
    (result,) = op.results
    out = ctx.linear(result)
    block = tile_bytes(out, result.dtype)
    on_chip = make_step(
        op,
        "",
        ctx.target,
        tiles=out.tiles,
        start=out.start,
        busiest_bytes=block,
        exchange_bytes=block * out.tiles,
    )
    axes = tuple(op.attrs["axes"])
    ring = ctx.links.halo(axes, *edges)
    why = f"{op.attrs.get('why', '')}; {where} over {ring.route}"
    step = collective_step(on_chip, op.name, axes, ctx.links.group(axes), ring, why)
    return Task(op, inputs, layouts, (out,), whole_kernel(op, inputs), (step,))


def manual_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    # The partitioner inlines a shard_map's body into the per-IPU program before tiles.
    raise ValueError(f"a manual_computation at {op.loc} reached the tiles without being inlined")
