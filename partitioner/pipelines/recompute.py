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
from collections.abc import Callable, Iterable, Sequence

from lowering import Value
from partitioner.phases.scopes import FORWARD, block_label
from partitioner.pipelines.stage_program import ordered_stage_program, stage_order
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
    blocks = list(zip(forward, _segments(program, split, forward), strict=True))
    block_of = {v: block for i, block in blocks for v in program.tasks[i].op.results}
    return {
        v
        for i, block in blocks
        for v in program.tasks[i].inputs
        if v in block_of and block_of[v] != block
    }


def recomputed(
    program: Program,
    split: StageSplit,
    stage: int,
    order: list[int] | None = None,
    own: Program | None = None,
) -> tuple[Program, list[int]]:
    """The stage's own program (`stage_program`) as its IPU runs it with recomputation, and for
    each of its tasks the position in `stage_order` of the task it runs (a recomputed task
    runs its forward task again). Before the first backward task that reads a forward value
    that is not a checkpoint, the forward tasks of that value's block that lead to the values
    the backward reads run again, making fresh copies that the backward reads instead: the
    forward's own copies are free once the forward is done with them. `order` is the stage's
    `stage_order`, `own` its `stage_program`, when the caller has them."""
    order = stage_order(program, split, stage) if order is None else order
    own = ordered_stage_program(program, split, stage, order) if own is None else own
    forward = [p for p, i in enumerate(order) if split.kind_of[i] == FORWARD]
    segment = dict(
        zip(forward, _segments(program, split, [order[p] for p in forward]), strict=True)
    )
    kept = checkpoints(program, split, stage)
    last = _last_readers(own, {v for p in forward for v in own.tasks[p].op.results})
    maker = {v: p for p in forward for v in own.tasks[p].op.results if v not in kept}
    read_after = _reads_from(last, maker, segment)
    ids = itertools.count(1 + max(v.id for v in (*own.inputs, *_results(own))))
    # Past the last reader of a forward value (most of a stage's update) nothing runs again
    # and nothing reads a copy: those tasks stand as they are.
    end = 1 + max(last.values(), default=-1)
    tasks: list[Task] = []
    origin: list[int] = []
    fresh: dict[Value, Value] = {}
    done: set[str | None] = set()
    for p, task in enumerate(own.tasks[:end]):
        if p not in segment:
            wanted = [maker[v] for v in task.inputs if v in maker and v not in fresh]
            for block in dict.fromkeys(segment[q] for q in wanted) if wanted else ():
                if block in done:
                    continue
                done.add(block)
                rerun = _needed(own, maker, segment, block, read_after(block, p))
                for q in rerun:
                    tasks.append(_copy(own.tasks[q], fresh, ids))
                    origin.append(q)
            task = _renamed(task, fresh) if fresh else task
        tasks.append(task)
        origin.append(p)
    tasks += own.tasks[end:]
    origin += range(end, len(own.tasks))
    layouts = {**own.layouts, **{new: own.layouts[old] for old, new in fresh.items()}}
    return dataclasses.replace(own, tasks=tuple(tasks), layouts=layouts), origin


def _results(program: Program) -> list[Value]:
    return [v for t in program.tasks for v in t.op.results]


def _last_readers(own: Program, values: set[Value]) -> dict[Value, int]:
    """The position of the last task that reads each of `values` that any task reads."""
    last: dict[Value, int] = {}
    for p, task in enumerate(own.tasks):
        for v in task.inputs:
            if v in values:
                last[v] = p
    return last


def _reads_from(
    last: dict[Value, int], maker: dict[Value, int], segment: dict[int, str | None]
) -> Callable[[str | None, int], list[Value]]:
    """For a block and a task position, the block's forward values (not checkpoints) that the
    tasks from that position on read (`last` holds each one's last reader). Asking the tasks
    after each block's first backward reader anew would cost a pass over the stage's tasks
    per block."""
    by_block: dict[str | None, list[Value]] = {}
    for v in last:
        if v in maker:
            by_block.setdefault(segment[maker[v]], []).append(v)
    return lambda block, start: [v for v in by_block.get(block, ()) if last[v] >= start]


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
    return _renamed(task, fresh, results=tuple(fresh[v] for v in task.op.results))


def _renamed(
    task: Task, fresh: dict[Value, Value], results: tuple[Value, ...] | None = None
) -> Task:
    """`task` reading the recomputed copies of its inputs where there are any (and making
    `results` when given: a copy)."""
    if results is None and fresh.keys().isdisjoint(task.inputs):
        return task
    inputs = tuple(fresh.get(v, v) for v in task.inputs)
    operands = tuple(fresh.get(v, v) for v in task.op.operands)
    op = dataclasses.replace(
        task.op, operands=operands, results=task.op.results if results is None else results
    )
    return dataclasses.replace(task, op=op, inputs=inputs)
