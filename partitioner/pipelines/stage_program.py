"""Each stage's own program: its tasks in the order its IPU runs them (each micro-batch's
forward and backward, then the update one result at a time), what it receives and what it
sends."""

from __future__ import annotations

from collections.abc import Sequence

from partitioner.phases.scopes import BACKWARD, FORWARD
from partitioner.pipelines.stages import UPDATE, StageSplit
from partitioner.program import Program


def stage_order(program: Program, split: StageSplit, stage: int) -> list[int]:
    """The stage's task indices in the order it runs them: each micro-batch's forward and
    backward in program order, then the update, one result at a time (`_depth_first`)."""
    order = split.indices(stage, (FORWARD, BACKWARD))
    return order + _depth_first(program, split.indices(stage, (UPDATE,)))


def stage_program(program: Program, split: StageSplit, stage: int) -> Program:
    """The stage's own tasks (`stage_order`); its inputs are the arguments it reads and what
    other stages send it, its outputs the results it sends or returns."""
    tasks = tuple(program.tasks[i] for i in stage_order(program, split, stage))
    made = {v for t in tasks for v in t.op.results}
    read = {v: None for t in tasks for v in t.inputs if v not in made}
    elsewhere = {
        v for i, t in enumerate(program.tasks) if split.stage_of[i] != stage for v in t.inputs
    }
    outputs = [v for v in program.outputs if v in made]
    outputs += [v for v in made if v in elsewhere and v not in outputs]
    inputs = tuple(read)
    return Program(
        inputs=inputs,
        input_layouts=tuple(program.layouts[v] for v in inputs),
        tasks=tasks,
        outputs=tuple(outputs),
        layouts=program.layouts,
        tiles=program.tiles,
    )


def _depth_first(program: Program, indices: Sequence[int]) -> list[int]:
    """`indices` in an order that finishes each result before starting the next (each sink's
    producers, depth first, then the sink), as PopART runs each weight's update to its end
    before the next: an optimizer written leaf by leaf (all first moments, then all second
    moments, ...) then holds one weight's temporaries at a time, not every weight's."""
    chosen = set(indices)
    maker = {v: i for i in indices for v in program.tasks[i].op.results}
    read = {v for i in indices for v in program.tasks[i].inputs}
    order: list[int] = []
    done: set[int] = set()
    for sink in indices:
        if any(v in read for v in program.tasks[sink].op.results):
            continue
        stack = [(sink, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            for value in reversed(program.tasks[i].inputs):
                j = maker.get(value)
                if j is not None and j in chosen and j not in done:
                    stack.append((j, False))
    order += [i for i in indices if i not in done]  # results read by no update task's sink
    return order
