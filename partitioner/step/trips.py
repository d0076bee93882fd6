"""Loops whose cost rests on an assumption, and the step's cost once a run has counted them.

A `while` whose trips only a run knows is charged one trip (`tiles/rules/loop.py`) until the
runtime has counted the trips it made; `open_loops` lists them, for the compile's warning and
the report's caveat. A counted loop past `lowering.unroll_limit`, on a program that unrolls its
loops (many IPUs, phases, a pipeline), stays one op: `limited_loops` lists those.

`counted_cost` re-sums the step with the trips a run counted: each counted loop's supersteps
become that many trips and the test that ends it, and the totals, phases and hidden host
transfers follow. Nothing is re-partitioned or re-scheduled: one trip's supersteps were fixed
when the loop was scheduled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from lowering import Op, Value, counted_trips, producers, unroll_limit
from partitioner.memory.tiles import TileMemory
from partitioner.mesh import Mesh
from partitioner.phases.plan import PhasePlan
from partitioner.phases.streaming import PhaseStream
from partitioner.program import Program, Task
from partitioner.step.host import HostIO, step_transfers
from partitioner.step.summary import StepCost, program_cost
from partitioner.target import Target
from partitioner.tiles.rules.loop import trip_steps


class Costed(Protocol):
    """What `counted_cost` reads of a build (`passes.Built`, which this layer cannot name)."""

    @property
    def mesh(self) -> Mesh: ...
    @property
    def target(self) -> Target: ...
    @property
    def program(self) -> Program: ...
    @property
    def plan(self) -> PhasePlan | None: ...
    @property
    def memory(self) -> TileMemory: ...
    @property
    def streams(self) -> tuple[PhaseStream, ...]: ...
    @property
    def cost(self) -> StepCost: ...


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """A `while` whose trips only a run knows. `top`: the step runs it itself, and the runtime
    counts its trips (named by its first result); a loop inside another op's region is charged
    one trip each time that region runs, counted or not."""

    op: Op
    top: bool

    @property
    def key(self) -> Value:
        return self.op.results[0]


def open_loops(program: Program, graph_made: Mapping[Value, Op]) -> tuple[OpenLoop, ...]:
    """The program's loops of unknown trips, at any depth, in program order; `graph_made` maps
    each value of the program's graph to the op that makes it."""
    return tuple(_open(program, graph_made, top=True))


def _open(program: Program, made: Mapping[Value, Op], top: bool) -> Iterator[OpenLoop]:
    for task in program.tasks:
        if task.op.name == "while" and counted_trips(task.op, made) is None:
            yield OpenLoop(task.op, top)
        for region, graph in zip(task.regions, task.op.regions, strict=False):
            yield from _open(region, {**made, **producers(graph)}, top=False)


def unfissioned_loops(program: Program, made: Mapping[Value, Op]) -> tuple[tuple[Op, str], ...]:
    """A phased program's counted loops that stay one task (the others are laid out inline,
    phase-major: `phases.loops`), each with why."""
    why = "a value it carries is read and rewritten in different phases"
    return tuple(
        (t.op, why)
        for t in program.tasks
        if t.op.name == "while" and counted_trips(t.op, made) is not None
    )


def limited_loops(program: Program, made: Mapping[Value, Op]) -> tuple[tuple[Op, str], ...]:
    """The program's counted loops that `lowering.unroll_loops` left whole at its limit, each
    with why (`lowering.unroll_limit`)."""
    found = ((t.op, unroll_limit(t.op, made)) for t in program.tasks if t.op.name == "while")
    return tuple((op, why) for op, why in found if why is not None)


def with_trips(program: Program, trips: Mapping[Value, int]) -> Program:
    """`program` with each loop named in `trips` (by its first result) charged that many trips."""
    tasks = tuple(
        _counted(task, trips[task.op.results[0]])
        if task.op.results and task.op.results[0] in trips
        else task
        for task in program.tasks
    )
    return dataclasses.replace(program, tasks=tasks)


def _counted(task: Task, trips: int) -> Task:
    return dataclasses.replace(task, supersteps=trip_steps(task, trips))


def counted_cost(built: Costed, trips: Mapping[Value, int]) -> StepCost:
    """The step's cost of `built` (one program, not pipelined) with the loops in `trips`
    charged the trips a run counted: the same summary `build` makes."""
    program = with_trips(built.program, trips)
    sent, returned = built.cost.supersteps[0], built.cost.supersteps[-1]
    # the same transfers as built, with what its loops hide
    io = (
        built.cost.host.io
        if built.cost.host is not None
        else HostIO(sent.exchange_bytes, returned.exchange_bytes)
    )
    # A phased program's IO tiles hide the transfers behind its compute, which the trips change.
    host = step_transfers(io, program, built.mesh, built.target, built.plan is not None)
    memory = built.memory
    return program_cost(program, built.plan, memory.phase_peaks, built.streams, built.target, host)
