"""One step's cost: the supersteps in the order they run (a phased program's exposed streaming
before each phase), its collectives, its phases and the totals the report shows.

Every figure was fixed when the program was scheduled and phased; this module only gathers and
adds them. The records are the schedule's own (`Superstep`, `CollectiveCost`, `PhaseCost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lowering import CONTRACTIONS, SourceLoc
from partitioner.cost.compute import amp_flops_per_cycle
from partitioner.cost.links import CollectiveCost
from partitioner.memory.liveness import PhaseBounds
from partitioner.phases.plan import PhasePlan
from partitioner.phases.streaming import (
    NO_IO_BUFFERS,
    IOBuffers,
    PhaseCost,
    PhaseStream,
    io_buffers,
    phase_costs,
)
from partitioner.program import Program, Superstep
from partitioner.step.host import HostTransfers
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class StepCost:
    """What one step of the per-IPU program costs; byte totals are per IPU."""

    supersteps: tuple[Superstep, ...]
    collectives: tuple[CollectiveCost, ...]
    phases: tuple[PhaseCost, ...]
    total_cycles: int
    flops: int
    exchange_bytes: int  # over the on-chip exchange
    link_bytes: int  # over IPU-Links: collectives and replicated tensor sharding's gathers
    streaming_bytes: int  # to and from streaming memory
    peak_flops_per_cycle: int  # per tile, at the precision of the largest contraction
    host_bytes: int = 0  # to and from the host
    host: HostTransfers | None = None  # what was hidden of them and what charged
    io_buffers: IOBuffers = NO_IO_BUFFERS  # a phased program's IO tiles' streaming buffers

    @property
    def notes(self) -> tuple[str, ...]:
        """What the step's figures assume of its IO, one line each: host transfers hidden
        behind compute, a tensor streamed through the IO tiles in pieces."""
        lines = (self.host.note() if self.host else "", self.io_buffers.note())
        return tuple(line for line in lines if line)


def matmul_dtype(program: Program) -> np.dtype:
    """The precision that sets the peak rate: that of the program's largest contraction."""
    dots = [t.op for t in program.tasks if t.op.name in CONTRACTIONS]
    if not dots:
        return np.dtype(np.float32)
    return max(dots, key=lambda op: op.results[0].size).operands[0].dtype


def _stream_step(phase: PhaseCost, tiles: int) -> Superstep:
    """A phase's streaming as a superstep: its exposed cycles, on the tiles that stream."""
    return Superstep(
        name=f"{phase.name}: stream",
        op="stream_copy",
        source=str(SourceLoc()),
        tiles=tiles,
        flops=0,
        exchange_bytes=phase.streaming_bytes,
        compute_cycles=0,
        exchange_cycles=0,
        sync_cycles=0,
        sync_group="streaming",
        link_cycles=phase.stream_cycles - phase.overlapped_cycles,
        kind="stream",
    )


def _in_order(
    program: Program, bounds: PhaseBounds | None, phases: Sequence[PhaseCost], target: Target
) -> list[Superstep]:
    if bounds is None:
        return list(program.supersteps)
    stream_tiles = target.io_tiles or target.tiles_per_ipu
    steps: list[Superstep] = []
    for phase, (a, b) in zip(phases, bounds.bounds, strict=True):
        steps.append(_stream_step(phase, stream_tiles))
        steps += [s for task in program.tasks[a:b] for s in task.supersteps]
    return steps


def step_cost(
    program: Program,
    bounds: PhaseBounds | None,
    phases: Sequence[PhaseCost],
    target: Target,
    host: HostTransfers | None = None,
    buffers: IOBuffers = NO_IO_BUFFERS,
) -> StepCost:
    """The cost of one step of `program` on `target` (its compute tiles), phased by `bounds`,
    between its transfers from and to the host; `buffers` are its IO tiles'."""
    steps = tuple(_in_order(program, bounds, phases, target))
    if host is not None:
        steps = (host.inputs, *steps, host.outputs)
    collectives = tuple(s.collective for s in program.supersteps if s.collective is not None)
    return StepCost(
        supersteps=steps,
        collectives=collectives,
        phases=tuple(phases),
        total_cycles=sum(s.cycles for s in steps),
        flops=sum(s.flops for s in steps),
        exchange_bytes=sum(s.exchange_bytes for s in steps if s.kind not in ("stream", "host")),
        link_bytes=sum(c.bytes_per_ipu for c in collectives) + sum(p.link_bytes for p in phases),
        streaming_bytes=sum(p.streaming_bytes for p in phases),
        peak_flops_per_cycle=amp_flops_per_cycle(target, matmul_dtype(program)),
        host_bytes=sum(s.exchange_bytes for s in steps if s.kind == "host"),
        host=host,
        io_buffers=buffers,
    )


def program_cost(
    program: Program,
    plan: PhasePlan | None,
    phase_peaks: Sequence[int],
    streams: Sequence[PhaseStream],
    target: Target,
    host: HostTransfers,
) -> StepCost:
    """The step's cost of `program`: phased by `plan`, each phase's compute and its streams
    (`phases.streaming`), between the host's transfers. The IO tiles' buffers stay allocated
    through every phase, so each phase's fullest tile is at least an IO tile."""
    if plan is None:
        return step_cost(program, None, (), target, host)
    compute = [
        sum(step.cycles for task in program.tasks[a:b] for step in task.supersteps)
        for a, b in plan.bounds.bounds
    ]
    buffers = io_buffers(streams, target.phase_io_tiles, target.bytes_per_tile)
    peaks = [max(peak, buffers.bytes_per_tile) for peak in phase_peaks]
    phases = phase_costs(plan.names, compute, streams, peaks, target)
    return step_cost(program, plan.bounds, phases, target, host, buffers)
