"""The pipelined step's cost as the report reads it (`pipelined_step_cost`): the pipeline's
fill, steady state and drain as one record each, made of what the stages' supersteps are made
of, then the slowest stage's update; FLOPs and bytes per IPU are the stages' mean."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from partitioner.cost.compute import amp_flops_per_cycle
from partitioner.cost.links import CollectiveCost
from partitioner.pipelines.schedule import PipelineCost
from partitioner.pipelines.stage_costs import streamed_cycles
from partitioner.pipelines.stage_program import stage_order
from partitioner.pipelines.stages import UPDATE, StageSplit
from partitioner.program import Program, Superstep
from partitioner.step.summary import StepCost, matmul_dtype
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class _Mix:
    """How the stages' per-micro-batch supersteps spend their cycles, and the tiles they use
    (cycle-weighted): what an aggregate of pipeline cycles is made of."""

    compute: float
    exchange: float
    sync: float
    link: float
    tiles: int

    @classmethod
    def of(cls, steps: Sequence[Superstep]) -> _Mix:
        total = sum(s.cycles for s in steps) or 1
        return cls(
            compute=sum(s.compute_cycles for s in steps) / total,
            exchange=sum(s.exchange_cycles for s in steps) / total,
            sync=sum(s.sync_cycles for s in steps) / total,
            link=sum(s.link_cycles for s in steps) / total,
            tiles=round(sum(s.tiles * s.cycles for s in steps) / total),
        )


def _pipeline_step(
    name: str,
    *,
    tiles: int = 0,
    compute: int = 0,
    exchange: int = 0,
    sync: int = 0,
    sync_group: str = "pipeline",
    link: int = 0,
    kind: str = "pipeline",
) -> Superstep:
    """A record of the pipeline's own: no op or line of the user's, its FLOPs and exchanged
    bytes counted in the step's totals instead."""
    return Superstep(
        name=name,
        op="pipeline",
        source="",
        tiles=tiles,
        flops=0,
        exchange_bytes=0,
        compute_cycles=compute,
        exchange_cycles=exchange,
        sync_cycles=sync,
        sync_group=sync_group,
        link_cycles=link,
        kind=kind,
    )


def _aggregate(
    name: str, cycles: Sequence[int], sends: Sequence[int], sync: int, mix: _Mix
) -> Superstep:
    """Pipeline cycles as one record: the stages' work, split as their supersteps split it,
    then their sends (over IPU-Links) and syncs."""
    send = sum(sends)
    syncs = sync * len(cycles)
    work = sum(cycles) - send - syncs
    exchange = round(work * mix.exchange)
    step_sync = round(work * mix.sync)
    link = round(work * mix.link)
    return _pipeline_step(
        name,
        tiles=mix.tiles,
        compute=work - exchange - step_sync - link,
        exchange=exchange,
        sync=syncs + step_sync,
        link=send + link,
    )


def _after(name: str, cycles: int, kind: str) -> Superstep:
    """Cycles of the update beyond its own supersteps: all on the links (or streaming)."""
    group = "streaming" if kind == "stream" else "pipeline"
    return _pipeline_step(name, sync_group=group, link=cycles, kind=kind)


def _cycle_records(cost: PipelineCost, program: Program, split: StageSplit) -> list[Superstep]:
    """The fill, the steady state and the drain (those that last), each one record."""
    count, n = len(cost.stages), cost.microbatches
    per_microbatch = [
        step
        for i, kind in enumerate(split.kind_of)
        if kind != UPDATE
        for step in program.tasks[i].supersteps
    ]
    mix = _Mix.of(per_microbatch)
    edges = [0, count - 1, count - 1 + n, len(cost.cycles)]
    names = ("pipeline fill", "pipeline steady state", "pipeline drain")
    return [
        _aggregate(
            f"{name} ({b - a} cycles)",
            cost.cycles[a:b],
            cost.send_cycles[a:b],
            cost.sync_cycles,
            mix,
        )
        for name, (a, b) in zip(names, itertools.pairwise(edges), strict=True)
        if b > a
    ]


def _update_records(
    cost: PipelineCost, program: Program, split: StageSplit, target: Target
) -> list[Superstep]:
    """The slowest stage's update: its supersteps in the order it runs them, then the
    gradients it receives from other stages and its optimizer state streamed."""
    slowest = max(cost.stages, key=lambda s: s.update_cycles)
    update = [
        step
        for i in stage_order(program, split, slowest.stage)
        if split.kind_of[i] == UPDATE
        for step in program.tasks[i].supersteps
    ]
    streamed = streamed_cycles(target, slowest.streaming_bytes // 2)
    received = slowest.update_cycles - sum(step.cycles for step in update) - streamed
    if received > 0:
        update.append(_after("update: gradients from other stages", received, "pipeline"))
    if streamed > 0:
        update.append(_after("update: optimizer state streamed", streamed, "stream"))
    return update


def _moved(
    cost: PipelineCost, program: Program, split: StageSplit
) -> tuple[tuple[CollectiveCost, ...], int, int]:
    """The step's collectives, and the bytes all stages exchange on chip and send over
    IPU-Links: per micro-batch work counted once per micro-batch, the update once."""
    n = cost.microbatches
    collectives: list[CollectiveCost] = []
    link = exchange = 0
    for i, task in enumerate(program.tasks):
        times = 1 if split.kind_of[i] == UPDATE else n
        for step in task.supersteps:
            exchange += times * step.exchange_bytes
            if step.collective is not None:
                collectives.append(step.collective)
                link += times * step.collective.bytes_per_ipu
    link += n * sum(s.send_bytes + s.return_bytes for s in cost.stages)
    return tuple(collectives), exchange, link


def pipelined_step_cost(
    cost: PipelineCost, program: Program, split: StageSplit, target: Target
) -> StepCost:
    """The step as the report reads it: the pipeline's fill, steady state and drain, then the
    slowest stage's update; FLOPs and bytes per IPU are the stages' mean."""
    count = len(cost.stages)
    collectives, exchange, link = _moved(cost, program, split)
    return StepCost(
        supersteps=(
            *_cycle_records(cost, program, split),
            *_update_records(cost, program, split, target),
        ),
        collectives=collectives,
        phases=(),
        total_cycles=cost.total_cycles,
        flops=sum(s.flops for s in cost.stages) // count,
        exchange_bytes=exchange // count,
        link_bytes=link // count,
        streaming_bytes=sum(s.streaming_bytes for s in cost.stages) // count,
        peak_flops_per_cycle=amp_flops_per_cycle(target, matmul_dtype(program)),
    )
