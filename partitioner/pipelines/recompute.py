"""Recomputation as Graphcore pipelined BERT: a stage's memory with its forward run again,
block by block, in its backward (`recomputed`), and what it stashes per micro-batch
(`checkpoints`).

PopART's `RecomputationType::Pipeline` recomputes each stage's forward in its backward, and
Graphcore's BERT marks each encoder layer's output a checkpoint (`recompute_checkpoint_every_layer`,
true by default in `BertConfig`, graphcore/examples nlp/bert/popart/bert_model.py): "the output
of each encoder layer will be stashed keeping the max liveness of activations to be at most one
layer", except the stage's last layer, whose output is "copied to the next pipelineStage"
(`should_checkpoint`, same file). Here a block (a `jax.named_scope`) is a layer: a value one of a
stage's blocks makes in its forward and another block's forward reads is a checkpoint, kept
from its forward to its backward; every other forward value the backward reads is made again,
its block's forward tasks rerun just before the first backward task that reads them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

from lowering import Value
from partitioner.phases.scopes import FORWARD, block_label
from partitioner.pipelines.stage_program import stage_order, stage_program
from partitioner.pipelines.stages import StageSplit
from partitioner.program import Program, Task


def _segments(program: Program, split: StageSplit, forward: Sequence[int]) -> list[str | None]:
    """Each forward task's block: its scope's, else the block of the forward task before it
    (unnamed work, a constant or a reshape, runs with the block around it), the first
    block's for unnamed work before any named."""
    names = [name for blocks in split.blocks for name in blocks]
    labels = [block_label(program.tasks[i], names) for i in forward]
    out: list[str | None] = []
    for label in labels:
        out.append(label if label is not None else (out[-1] if out else None))
    first = next((label for label in labels if label is not None), None)
    return [first if label is None else label for label in out]


def checkpoints(program: Program, split: StageSplit, stage: int) -> set[Value]:
    """The values one of the stage's blocks makes in its forward and another block's forward
    on the stage reads: each layer's output, stashed, not recomputed."""
    forward = split.indices(stage, (FORWARD,))
    block_of = {
        v: block
        for i, block in zip(forward, _segments(program, split, forward), strict=True)
        for v in program.tasks[i].op.results
    }
    return {
        v
        for i, block in zip(forward, _segments(program, split, forward), strict=True)
        for v in program.tasks[i].inputs
        if v in block_of and block_of[v] != block
    }


def recomputed(program: Program, split: StageSplit, stage: int) -> tuple[Program, list[int]]:
    """The stage's own program (`stage_program`) as its IPU runs it with recomputation, and for
    each of its tasks the position in `stage_order` of the task it runs (a recomputed task
    runs its forward task again). Before the first backward task that reads a forward value
    that is not a checkpoint, the forward tasks of that value's block that lead to the values
    the backward reads run again, making fresh copies that the backward reads instead: the
    forward's own copies are free once the forward is done with them."""
    own = stage_program(program, split, stage)
    order = stage_order(program, split, stage)
    forward = [p for p, i in enumerate(order) if split.kind_of[i] == FORWARD]
    segment = dict(
        zip(forward, _segments(program, split, [order[p] for p in forward]), strict=True)
    )
    kept = checkpoints(program, split, stage)
    maker = {v: p for p in forward for v in own.tasks[p].op.results if v not in kept}
    ids = itertools.count(1 + max(v.id for t in own.tasks for v in (*t.inputs, *t.op.results)))
    tasks: list[Task] = []
    origin: list[int] = []
    fresh: dict[Value, Value] = {}
    done: set[str | None] = set()
    for p, task in enumerate(own.tasks):
        if p not in segment:
            wanted = [maker[v] for v in task.inputs if v in maker and v not in fresh]
            for block in dict.fromkeys(segment[q] for q in wanted):
                if block in done:
                    continue
                done.add(block)
                rerun = _needed(own, maker, segment, block, _read_after(own, maker, p))
                for q in rerun:
                    tasks.append(_copy(own.tasks[q], fresh, ids))
                    origin.append(q)
            task = _renamed(task, fresh)
        tasks.append(task)
        origin.append(p)
    layouts = {**own.layouts, **{new: own.layouts[old] for old, new in fresh.items()}}
    return dataclasses.replace(own, tasks=tuple(tasks), layouts=layouts), origin


def _read_after(own: Program, maker: dict[Value, int], start: int) -> set[Value]:
    """The forward values (not checkpoints) the backward reads from task `start` on."""
    return {v for t in own.tasks[start:] for v in t.inputs if v in maker}


def _needed(
    own: Program,
    maker: dict[Value, int],
    segment: dict[int, str | None],
    block: str | None,
    wanted: Iterable[Value],
) -> list[int]:
    """The positions of `block`'s forward tasks that make `wanted` (those of its values the
    backward reads), with what they read from the block, in forward order."""
    stack = [maker[v] for v in wanted if segment[maker[v]] == block]
    chosen: set[int] = set()
    while stack:
        p = stack.pop()
        if p in chosen:
            continue
        chosen.add(p)
        stack += [
            maker[v] for v in own.tasks[p].inputs if v in maker and segment[maker[v]] == block
        ]
    return sorted(chosen)


def _copy(task: Task, fresh: dict[Value, Value], ids: Iterable[int]) -> Task:
    """`task` run again: reading the copies made so far, making fresh copies of its results."""
    counter = iter(ids)
    for v in task.op.results:
        fresh[v] = Value(next(counter), v.shape, v.dtype)
    task = _renamed(task, fresh)
    op = dataclasses.replace(task.op, results=tuple(fresh[v] for v in task.op.results))
    return dataclasses.replace(task, op=op)


def _renamed(task: Task, fresh: dict[Value, Value]) -> Task:
    """`task` reading the recomputed copies of its inputs where there are any."""
    if not any(v in fresh for v in task.inputs):
        return task
    inputs = tuple(fresh.get(v, v) for v in task.inputs)
    op = dataclasses.replace(task.op, operands=tuple(fresh.get(v, v) for v in task.op.operands))
    return dataclasses.replace(task, op=op, inputs=inputs)
