"""Sibling reductions (`lowering.siblings`): a fusion of several reductions of one tensor over
the same dimensions, planned together as popops' `reduceMany` runs them.

Each reduction is planned as it would be alone (its prologue, its stages, its epilogue), its
outputs on the same tiles as the others' (`MappingContext.one_place`). Then the k-th stages of
all of them are one superstep: each tile runs a vertex per reduction in the same compute set
(their cycles add) and receives in one exchange what they need (the exchange's fixed overhead
and the sync are paid once): in the first stage the tensor they share, once (the most any of
them receives: an assumption where their chains read different tensors besides), in later
stages every reduction's partials (their bytes add). When the plans have different numbers
of stages (their operands' types differ), the reductions run one after the other, as apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from lowering import FUSION, Graph, Op, Value
from partitioner.cost.exchange import exchange_cycles
from partitioner.layout import Layout
from partitioner.program import Kernel, Superstep, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.common import Array, TileRule


def siblings_task(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext,
    rule: Callable[[Op], TileRule], name: str,
) -> Task:  # fmt: skip
    """The fusion `op` of sibling reductions as one task: each reduction planned by its own
    `rule(part)`, the stages run together; `name` the fusion's (its members)."""
    parts = reductions(op)
    position = {v: i for i, v in enumerate(op.operands)}
    reads = [[position[v] for v in part.operands] for part in parts]
    with ctx.one_place():
        tasks = [
            rule(part)(part, part.operands, tuple(layouts[i] for i in at), ctx)
            for part, at in zip(parts, reads, strict=True)
        ]
    steps = together([t.supersteps for t in tasks], name, ctx.target)
    return Task(
        op,
        inputs,
        layouts,
        tuple(lay for t in tasks for lay in t.result_layouts),
        _kernel([t.kernel for t in tasks], reads),
        steps,
        temporaries=tuple(temp for t in tasks for temp in t.temporaries),
    )


def reductions(op: Op) -> list[Op]:
    """The fusion's reductions each as an op of its own on the fusion's operands it reads: a
    fusion of its members, or the bare reduce."""
    region = op.regions[0]
    outer = dict(zip(region.inputs, op.operands, strict=True))
    ends = dict(zip(region.outputs, op.results, strict=True))
    parts: list[Op] = []
    members: list[Op] = []
    for member in region.ops:
        members.append(member)
        done = [v for v in member.results if v in ends]
        if done:
            parts.append(_part(members, done[0], ends[done[0]], outer))
            members = []
    return parts


def _part(members: list[Op], inner: Value, result: Value, outer: dict[Value, Value]) -> Op:
    made = {v for m in members for v in m.results}
    read = tuple(dict.fromkeys(v for m in members for v in m.operands if v not in made))
    root = members[-1]
    if len(members) == 1:
        return dataclasses.replace(
            root, operands=tuple(outer[v] for v in root.operands), results=(result,)
        )
    region = Graph(inputs=read, outputs=(inner,), ops=tuple(members), name=FUSION)
    names = tuple(m.name for m in members)
    return Op(
        FUSION, tuple(outer[v] for v in read), (result,), {"members": names}, (region,), root.loc
    )


def together(
    plans: Sequence[tuple[Superstep, ...]], name: str, target: Target
) -> tuple[Superstep, ...]:
    """The reductions' stages, the k-th of each in one superstep; one plan after the other
    when their stages differ in number."""
    if len({len(plan) for plan in plans}) > 1:
        return tuple(step for plan in plans for step in plan)
    steps = zip(*plans, strict=True)
    return tuple(_one_step(group, name, target, k == 0) for k, group in enumerate(steps))


def _one_step(
    group: tuple[Superstep, ...], name: str, target: Target, first_stage: bool
) -> Superstep:
    """The stages `group` as one superstep. What the first stage receives is the tensor the
    reductions share (and their chains' inputs), brought once for all of them: the most any of
    them receives; each later stage receives every reduction's partials."""
    first = group[0]
    total = max if first_stage else sum
    received = total(s.busiest_tile_bytes for s in group)
    start = min(s.start for s in group)
    stop = max(s.start + s.tiles for s in group)
    return dataclasses.replace(
        first,
        name=f"{name}.{first.name.split('.', 1)[-1]}",
        op=FUSION,
        tiles=stop - start,
        start=start,
        flops=sum(s.flops for s in group),
        exchange_bytes=total(s.exchange_bytes for s in group),
        compute_cycles=sum(s.compute_cycles for s in group),
        busiest_tile_bytes=received,
        exchange_cycles=exchange_cycles(target, received),
    )


def _kernel(kernels: list[Kernel], reads: list[list[int]]) -> Kernel:
    """Each reduction's kernel on the fusion's inputs it reads, their results in order."""

    def kernel(*arrays: Array) -> tuple[Array, ...]:
        out: list[Array] = []
        for each, at in zip(kernels, reads, strict=True):
            out += each(*(arrays[i] for i in at))
        return tuple(out)

    return kernel
