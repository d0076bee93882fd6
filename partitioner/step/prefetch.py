"""Which of a step's host transfers overlap its compute, as Graphcore's input pipelines run them
(docs/target.md, "Host transfers overlapped with compute").

A step is one run of the program: nothing runs before it to hide its first inputs behind, and
nothing after it to hide its last results behind (PopART preloads the next iteration of a loop
within a run, never the next run: its `ExchangeStrategy::OverlapStep` is "not supported"). Two
structures overlap within a step:

- a loop that reads an input a slice per trip (`streamed_inputs`: a scan over micro-batches, as
  a device-iterations or gradient-accumulation loop reads an infeed): Poplar prefetches each
  later slice while the trip before it runs (data-stream prefetch, on by default) into a buffer
  near the IPU, then copies it onto the tiles at the streaming rate (the `StreamCopyMid`, which
  blocks every tile when there are no IO tiles), so a later trip pays
  max(copy, host transfer - the trip's cycles); when that is more than sending everything at
  the start (trips shorter than a transfer's latency), everything is sent at the start;
- a phased program's IO tiles: they load the step's inputs while the tasks before the first
  that reads one compute, and send its results while the tasks after the last that makes one
  compute.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from lowering import Value
from partitioner.memory.liveness import per_trip_slices, streamed_inputs
from partitioner.program import Program, Task


@dataclass(frozen=True, slots=True)
class StreamedLoop:
    """The sent inputs one loop reads a slice per trip: the loop, how many slices (trips) it
    reads, the bytes of one trip's slices and the cycles of one trip."""

    loop: Task
    trips: int
    trip_bytes: int
    trip_cycles: int

    @property
    def later_bytes(self) -> int:
        """The bytes of every trip's slices but the first's: those prefetched."""
        return (self.trips - 1) * self.trip_bytes


def _slices(task: Task, value: Value) -> int:
    """How many slices `task`, a loop that reads `value` one dynamic slice per trip, reads."""
    return per_trip_slices(task.op, [task.inputs.index(value)])[1]


def streamed_loops(program: Program, sent: Collection[Value]) -> tuple[StreamedLoop, ...]:
    """The loops of `program` that read an input of `sent` a slice per trip, in program order;
    an input several loops read is charged to the first."""
    streamed = streamed_inputs(program) & set(sent)
    found: dict[int, list[Value]] = {}
    for value in sorted(streamed, key=lambda v: v.id):
        first = next(i for i, t in enumerate(program.tasks) if value in t.inputs)
        found.setdefault(first, []).append(value)
    loops = []
    for index in sorted(found):
        task, values = program.tasks[index], found[index]
        trips = max(_slices(task, v) for v in values)
        cycles = sum(s.cycles for s in task.supersteps) // trips
        loops.append(StreamedLoop(task, trips, sum(v.nbytes // trips for v in values), cycles))
    return tuple(loops)


def io_tile_slack(
    program: Program, sent: Collection[Value], returned: Collection[Value]
) -> tuple[int, int]:
    """The cycles a phased program's IO tiles have to load the step's `sent` inputs (before the
    first task that reads one) and to send its `returned` results (after the last task that
    makes one)."""
    cycles = [sum(s.cycles for s in task.supersteps) for task in program.tasks]
    sent, returned = set(sent), set(returned)
    readers = [i for i, t in enumerate(program.tasks) if sent.intersection(t.reads)]
    makers = [i for i, t in enumerate(program.tasks) if returned.intersection(t.op.results)]
    before = sum(cycles[: min(readers, default=0)])
    after = sum(cycles[max(makers, default=len(cycles) - 1) + 1 :])
    return before, after
