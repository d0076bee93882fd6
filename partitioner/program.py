"""The BSP program: tasks (one per IR op) made of supersteps, as the runtime and the cost
report see it.

A superstep is Poplar's unit of execution: an exchange (tiles receive the data they need), a sync
and a compute set (every working tile runs its vertex). Its cycles are fixed at scheduling time
by the formulas of `partitioner.cost`; nothing here is ever measured. A task is one op's work:
the kernel that computes its results (tensors in logical order, see `tile_rules`), its
operands' and results' layouts, and the temporaries it holds on tiles while it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lowering import Op, Value
from partitioner.cost.links import CollectiveCost, Ring
from partitioner.layout import Layout


@dataclass(frozen=True, slots=True)
class Superstep:
    """Exchange, sync, compute: what one step costs and which op and line it serves.

    The cost report's supersteps are these records themselves. Its figures are the fields that
    compare; where on the chip the step runs and the collective it carries are the schedule's
    (memory and code are counted from them) and are not part of the report."""

    name: str
    op: str
    source: str  # the user's file:line
    tiles: int  # tiles that compute, from `start`
    flops: int
    exchange_bytes: int  # bytes moved over the on-chip exchange, all tiles together
    compute_cycles: int
    exchange_cycles: int
    sync_cycles: int
    sync_group: str = "ipu"
    link_cycles: int = 0  # a collective's ring over IPU-Links (GlobalExchange), or streaming
    kind: str = "compute"  # or "copy" (on-tile copies), "collective", "stream", "host"
    start: int = field(default=0, compare=False)
    busiest_tile_bytes: int = field(default=0, compare=False)  # bytes the busiest tile receives
    collective: CollectiveCost | None = field(default=None, compare=False)

    @property
    def cycles(self) -> int:
        return self.compute_cycles + self.exchange_cycles + self.sync_cycles + self.link_cycles


def collective_step(
    base: Superstep,
    kind: str,
    axes: tuple[str, ...],
    group_size: int,
    ring: Ring,
    why: str,
    buffer_bytes: int = 0,
) -> Superstep:
    """`base`, the collective's work on the chip, as the superstep of a `kind` collective over
    `axes` of a `buffer_bytes` buffer: the ring's link cycles, a sync of its group alone (GSP),
    and its record for the report. Every collective step is made here, whoever inserts it."""
    name = f"{kind}({','.join(axes)})"
    record = CollectiveCost(
        kind=kind,
        axes=axes,
        group_size=group_size,
        bytes_per_ipu=ring.bytes_per_ipu,
        cycles=ring.link_cycles + ring.sync_cycles,
        op=name,
        source=base.source,
        why=why,
        buffer_bytes=buffer_bytes,
    )
    return dataclasses.replace(
        base,
        name=name,
        sync_cycles=ring.sync_cycles,
        sync_group="+".join(axes),
        link_cycles=ring.link_cycles,
        kind="collective",
        collective=record,
    )


R = TypeVar("R")
T = TypeVar("T")


def per_record(records: Iterable[R], fn: Callable[[R], T]) -> list[T]:
    """`[fn(r) for r in records]`, `fn` called once per distinct record object: a model's
    repeated layers share their tasks' superstep records (`tiles.repeats`), GPT-3's 43,000
    supersteps half as many objects. Each record is held until the end, so no id is reused."""
    done: dict[int, tuple[R, T]] = {}
    out = []
    for record in records:
        hit = done.get(id(record))
        if hit is None:
            hit = done[id(record)] = (record, fn(record))
        out.append(hit[1])
    return out


@dataclass(frozen=True, slots=True)
class TileBytes:
    """`bytes_per_tile` bytes on each of the tiles `start .. start + tiles - 1`."""

    start: int
    tiles: int
    bytes_per_tile: int
    what: str = ""


Kernel = Callable[..., tuple[Any, ...]]


# The tasks that start and end a loop laid out inline (`phases.loops`).
LOOP_BEGIN, LOOP_END = "loop_begin", "loop_end"
LOOP_MARKERS = frozenset({LOOP_BEGIN, LOOP_END})


@dataclass(frozen=True, slots=True, eq=False)
class Task:
    """One op on tiles: its inputs (operands, then values its regions capture), its kernel and
    its supersteps."""

    op: Op
    inputs: tuple[Value, ...]
    input_layouts: tuple[Layout, ...]
    result_layouts: tuple[Layout, ...]
    kernel: Kernel
    supersteps: tuple[Superstep, ...] = ()
    temporaries: tuple[TileBytes, ...] = ()
    # For views: result i shares the storage of input aliases[i] (None: storage of its own).
    aliases: tuple[int | None, ...] = ()
    # For control flow: the programs of its regions (a loop's body, every branch), whose code
    # the tiles store once however often they run.
    regions: tuple[Program, ...] = ()
    # A loop's body task laid out inline (`phases.loops`): its supersteps are this many trips'.
    trips: int = 1

    @property
    def reads(self) -> tuple[Value, ...]:
        """The values the task reads on the tiles: its inputs, but nothing for the markers of
        a loop laid out inline, which pass the loop's values on in place (`phases.loops`)."""
        return () if self.op.name in LOOP_MARKERS else self.inputs


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    """A whole program on one IPU: input layouts, tasks in order, output values."""

    inputs: tuple[Value, ...]
    input_layouts: tuple[Layout, ...]
    tasks: tuple[Task, ...]
    outputs: tuple[Value, ...]
    layouts: dict[Value, Layout]
    tiles: int
    # Inputs that stay on the IPUs between steps (resident, or returned updated): the host
    # never sends them, so no loop streams them from it a slice per trip (`streamed_inputs`).
    on_device: frozenset[Value] = frozenset()

    @property
    def supersteps(self) -> tuple[Superstep, ...]:
        return tuple(step for task in self.tasks for step in task.supersteps)
