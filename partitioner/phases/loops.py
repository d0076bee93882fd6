"""Loops in phases, as PopXL runs gradient accumulation: phase-major.

A counted loop at the top of a phased program (a scan over micro-batches, however many) is laid
out inline (`inline_loops`): a `loop_begin` task that starts the loop's carried values (its
results are the body's inputs, in the operands' storage), the body's tasks once, each charged
its trips (their supersteps repeated), and a `loop_end` task that hands the last trip's values
on. The phases then cut the body like any program, in a segment of its own (`segments`): a phase
inside a loop runs its share of the body for every trip before the next phase starts, as PopXL
runs an `ops.repeat` over the micro-batches inside each phase. So a phase loads its weights
once, keeps a carried value (an accumulator) on chip through its trips, and streams the
activations made in the body trip by trip (`per_trip`: the streaming model charges them trips
times).

That order runs trip t of a later phase after trip t + 1 of an earlier one, which is right when
no carried value feeds an earlier phase than the one that rewrites it: each is read and
rewritten within one phase, or passed on unchanged (`fissionable`). A loop that fails keeps its
trips in one task, in one phase. Nothing of this changes a value: the runtime runs each loop
itself (`rerolled` puts the loop's task back).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from lowering import Op, Value, counted_trips, loop_counter
from partitioner.memory.liveness import PhaseBounds, storage_owners
from partitioner.program import LOOP_BEGIN, LOOP_END, Program, Task
from partitioner.tiles.rules.loop import CARRY_BACK, CARRY_IN

BEGIN, END = LOOP_BEGIN, LOOP_END


@dataclass(frozen=True, slots=True, eq=False)
class LoopSpan:
    """A loop laid out inline: its `loop_begin` and `loop_end` tasks' indices, its trips, the
    loop's own task (which the runtime runs), the values its body's tasks make, and the two
    markers' ops (to find them again after the phases reorder the tasks)."""

    begin: int
    end: int
    trips: int
    task: Task
    inner: frozenset[Value]
    markers: tuple[Op, Op]

    def body(self, program: Program) -> list[int]:
        """The indices of the body's tasks: those between the markers that make the body's
        values (the phases may have put other work there, charged once)."""
        tasks = program.tasks
        return [
            i for i in range(self.begin + 1, self.end) if self.inner.issuperset(tasks[i].op.results)
        ]


def inline_loops(
    program: Program, skip: Collection[Op] = ()
) -> tuple[Program, tuple[LoopSpan, ...]]:
    """The program with each counted top-level loop (but those of `skip`) laid out inline,
    and where they lie."""
    made = {v: t.op for t in program.tasks for v in t.op.results}
    tasks: list[Task] = []
    layouts = dict(program.layouts)
    spans = []
    for task in program.tasks:
        looped = task.op.name == "while" and task.op not in skip
        trips = counted_trips(task.op, made) if looped else None
        if not trips:
            tasks.append(task)
            continue
        body = task.regions[1]
        begin = len(tasks)
        start, stop = _begin(task, body), _end(task, body, trips)
        tasks.append(start)
        tasks += [_repeated(t, trips, f"{task.op.loc.scope}/body") for t in body.tasks]
        tasks.append(stop)
        layouts.update(body.layouts)
        inner = frozenset(v for t in body.tasks for v in t.op.results)
        markers = (start.op, stop.op)
        spans.append(LoopSpan(begin, len(tasks) - 1, trips, task, inner, markers))
    if not spans:
        return program, ()
    return dataclasses.replace(program, tasks=tuple(tasks), layouts=layouts), tuple(spans)


def located(program: Program, spans: Sequence[LoopSpan]) -> tuple[LoopSpan, ...] | None:
    """The spans where the phases' order put their markers; None if some body task left its
    loop's markers (the loop cannot run phase-major)."""
    at = {id(t.op): i for i, t in enumerate(program.tasks)}
    found = []
    for span in spans:
        begin, end = (at[id(op)] for op in span.markers)
        moved = dataclasses.replace(span, begin=begin, end=end)
        if len(moved.body(program)) != len(span.task.regions[1].tasks):
            return None
        found.append(moved)
    return tuple(found)


def _begin(task: Task, body: Program) -> Task:
    """The loop's start: its operands become the body's inputs, in their storage, after the
    steps that copy operands into their loop layouts."""
    op = task.op
    count = len(op.operands)
    into = tuple(s for s in task.supersteps if s.name == CARRY_IN)
    marker = Op(BEGIN, op.operands, body.inputs, {}, (), op.loc)
    return Task(
        marker,
        task.inputs[:count],
        task.input_layouts[:count],
        tuple(body.layouts[v] for v in body.inputs),
        _identity,
        into,
        aliases=tuple(range(count)),
    )


def _end(task: Task, body: Program, trips: int) -> Task:
    """The loop's end: the last trip's outputs become its results; the steps that bring values
    the body left elsewhere back, every trip."""
    op = task.op
    back = tuple(s for s in task.supersteps if s.name == CARRY_BACK)  # every trip's
    marker = Op(END, body.outputs, op.results, {"trips": trips}, (), op.loc)
    return Task(
        marker,
        body.outputs,
        tuple(body.layouts[v] for v in body.outputs),
        task.result_layouts,
        _identity,
        back,
        aliases=tuple(range(len(body.outputs))),
    )


def _identity(*arrays):  # the markers' kernels: never run (`rerolled`)
    return arrays


def _repeated(task: Task, trips: int, scope: str) -> Task:
    """A body's task charged its trips, its scope behind the loop's (`jit(step)/while/body/
    layer0/...`, as `lowering.unroll_loops` names its copies), so named scopes find it."""
    op = task.op
    if not op.loc.scope.startswith("jit("):
        loc = dataclasses.replace(op.loc, scope=f"{scope}/{op.loc.scope}")
        op = dataclasses.replace(op, loc=loc)
    return dataclasses.replace(task, op=op, supersteps=task.supersteps * trips, trips=trips)


def rerolled(program: Program, spans: Sequence[LoopSpan]) -> Program:
    """The program the runtime runs: each inline loop replaced by the loop's own task, after
    any other work the phases put between its markers (which never reads the loop's values)."""
    if not spans:
        return program
    tasks: list[Task] = []
    at = 0
    for span in sorted(spans, key=lambda s: s.begin):
        tasks += program.tasks[at : span.begin]
        body = set(span.body(program))
        tasks += [program.tasks[i] for i in range(span.begin + 1, span.end) if i not in body]
        tasks.append(span.task)
        at = span.end + 1
    tasks += program.tasks[at:]
    return dataclasses.replace(program, tasks=tuple(tasks))


def fissionable(program: Program, span: LoopSpan, bounds: PhaseBounds) -> bool:
    """Whether every carried value is rewritten in the phase that reads it (or passed on as it
    is; the trip counter, which each phase's repeat keeps for itself), so that phase-major
    order computes what the loop computes."""
    begin, end = program.tasks[span.begin], program.tasks[span.end]
    read: dict[Value, set[int]] = {}  # the phases of each value's readers in the body
    made: dict[Value, int] = {}  # the phase of the body task that makes each value
    for i in span.body(program):
        task = program.tasks[i]
        for value in task.inputs:
            read.setdefault(value, set()).add(bounds.phase_of(i))
        made.update(dict.fromkeys(task.op.results, bounds.phase_of(i)))
    counter = loop_counter(span.task.op)
    for index, (inner, out) in enumerate(zip(begin.op.results, end.op.operands, strict=True)):
        if inner == out or index == counter:  # each phase's repeat counts its own trips
            continue
        phases = read.get(inner, set()) | ({made[out]} if out in made else set())
        if len(phases) > 1:
            return False
    return True


def per_trip(program: Program, bounds: PhaseBounds, spans: Sequence[LoopSpan]) -> dict[Value, int]:
    """The storages each trip of a loop fills anew (its body's values, but those that hold what
    the last trip hands on, in place or not), with the loop's trips: streamed, each is streamed
    that many times."""
    if not spans:
        return {}
    owners = storage_owners(program, bounds)
    found: dict[Value, int] = {}
    for span in spans:
        handed = {owners.get(v, v) for v in program.tasks[span.end].op.operands}
        for i in span.body(program):
            for value in program.tasks[i].op.results:
                owner = owners.get(value, value)
                if owner not in handed:
                    found[owner] = span.trips
    return found
