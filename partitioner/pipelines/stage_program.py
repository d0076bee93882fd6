"""Each stage's own program: its tasks in the order its IPU runs them (each micro-batch's
forward and backward, then the update one result at a time), what it receives and what it
sends."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from lowering import Value
from partitioner.phases.scopes import BACKWARD, FORWARD
from partitioner.pipelines.stages import UPDATE, StageSplit
from partitioner.program import Program, Task


def stage_order(program: Program, split: StageSplit, stage: int) -> list[int]:
    """The stage's task indices in the order it runs them: each micro-batch's forward and
    backward in program order, then the update, one result at a time (`_depth_first`)."""
    order = split.indices(stage, (FORWARD, BACKWARD))
    return order + _depth_first(program, split.indices(stage, (UPDATE,)))


def stage_program(program: Program, split: StageSplit, stage: int) -> Program:
    """The stage's own tasks (`stage_order`); its inputs are the arguments it reads and what
    other stages send it, its outputs the results it sends or returns."""
    return ordered_stage_program(program, split, stage, stage_order(program, split, stage))


def ordered_stage_program(
    program: Program,
    split: StageSplit,
    stage: int,
    order: Sequence[int],
    sends: AbstractSet[Value] | None = None,
) -> Program:
    """`stage_program` given the stage's `stage_order` and, when the caller has them, the
    stage's `stage_sends` (each found once, not once per reader)."""
    tasks = tuple(program.tasks[i] for i in order)
    made = {v for t in tasks for v in t.op.results}
    read = {v: None for t in tasks for v in t.inputs if v not in made}
    if sends is None:  # what other stages read of it
        tasks_of = zip(program.tasks, split.stage_of, strict=True)
        others = itertools.chain.from_iterable(t.inputs for t, s in tasks_of if s != stage)
        sends = made.intersection(others)
    outputs = [v for v in program.outputs if v in made]
    returned = set(outputs)
    outputs += [v for v in made if v in sends and v not in returned]
    inputs = tuple(read)
    return Program(
        inputs=inputs,
        input_layouts=tuple(program.layouts[v] for v in inputs),
        tasks=tasks,
        outputs=tuple(outputs),
        layouts=program.layouts,
        tiles=program.tiles,
    )


def stage_sends(program: Program, split: StageSplit) -> list[set[Value]]:
    """Each stage's results that tasks of other stages read, found in one pass over the
    program (a pass per stage costs a pipeline of 16 stages 16 passes)."""
    maker = {v: s for t, s in zip(program.tasks, split.stage_of, strict=True) for v in t.op.results}
    sends: list[set[Value]] = [set() for _ in range(split.stages)]
    for task, stage in zip(program.tasks, split.stage_of, strict=True):
        for value in task.inputs:
            source = maker.get(value, stage)
            if source != stage:
                sends[source].add(value)
    return sends


def _depth_first(program: Program, indices: Sequence[int]) -> list[int]:
    """`indices` in an order that finishes each result before starting the next (each sink's
    producers, depth first, then the sink), as PopART runs each weight's update to its end
    before the next: an optimizer written leaf by leaf (all first moments, then all second
    moments, ...) then holds one weight's temporaries at a time, not every weight's."""
    tasks = program.tasks
    maker = {v: i for i in indices for v in tasks[i].op.results}
    read = set().union(*(tasks[i].inputs for i in indices))
    order: list[int] = []
    done: set[int] = set()
    for sink in indices:
        if read.isdisjoint(tasks[sink].op.results):
            _post_order(tasks, maker, sink, done, order)
    order += [i for i in indices if i not in done]  # results read by no update task's sink
    return order


def _post_order(
    tasks: Sequence[Task], maker: dict[Value, int], sink: int, done: set[int], order: list[int]
) -> None:
    """Appends to `order` the tasks of `maker` that `sink` needs and `done` lacks, each after
    its producers (first operand's first), then `sink`."""
    # A stack of task indices, `~i` marking i's producers as pushed: no tuple per entry.
    stack = [sink]
    while stack:
        i = stack.pop()
        if i < 0:
            i = ~i
            if i not in done:
                done.add(i)
                order.append(i)
            continue
        if i in done:
            continue
        stack.append(~i)
        for value in reversed(tasks[i].inputs):
            j = maker.get(value)
            if j is not None and j not in done:
                stack.append(j)
