"""The stage split: each task's stage and kind (`split_stages`).

Each task is a stage's by its `jax.named_scope`, as `phases` finds blocks (with
`Pipeline(stages="auto")` the blocks are cut into contiguous stages balanced by their cycles,
`balanced_stages`); unnamed work goes with the block of its largest operand, else where it is
first read. Its kind is forward or backward when it runs once per micro-batch
(`microbatch.per_microbatch`), the update when it runs once per step.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from lowering import Value
from partitioner.errors import ConfigError
from partitioner.phases.scopes import (
    BACKWARD,
    FORWARD,
    block_labels,
    direction,
    home_blocks,
    scope_blocks,
)
from partitioner.pipelines.pipeline import Pipeline, stage_names
from partitioner.program import Program

UPDATE = "update"
KINDS = (FORWARD, BACKWARD, UPDATE)  # a stage's tasks run in this order


@dataclass(frozen=True)
class StageSplit:
    """Each task's stage and kind (`FORWARD` or `BACKWARD` once per micro-batch, `UPDATE` once
    per step), and each stage's blocks."""

    blocks: tuple[tuple[str, ...], ...]
    stage_of: tuple[int, ...]
    kind_of: tuple[str, ...]

    @property
    def stages(self) -> int:
        return len(self.blocks)

    @functools.cached_property
    def _members(self) -> dict[tuple[int, str], list[int]]:
        """Each (stage, kind)'s task indices in program order, found once."""
        members: dict[tuple[int, str], list[int]] = {}
        for i, key in enumerate(zip(self.stage_of, self.kind_of, strict=True)):
            members.setdefault(key, []).append(i)
        return members

    def indices(self, stage: int, kinds: Sequence[str] = KINDS) -> list[int]:
        """The stage's task indices, forward, then backward, then update (program order
        within each)."""
        return [i for kind in kinds for i in self._members.get((stage, kind), ())]


def balanced_stages(blocks: Sequence[str], weights: Sequence[int], count: int) -> list[list[str]]:
    """`blocks` in order cut into `count` contiguous non-empty runs whose largest total weight
    is least (dynamic programming over cut points)."""
    n = len(blocks)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for j in range(k, n - count + k + 1):
            for i in range(k - 1, j):
                worst = max(best[k - 1][i], prefix[j] - prefix[i])
                if worst < best[k][j]:
                    best[k][j], cut[k][j] = worst, i
    runs, j = [], n
    for k in range(count, 0, -1):
        i = cut[k][j]
        runs.append(list(blocks[i:j]))
        j = i
    return runs[::-1]


def _stage_blocks(program: Program, pipeline: Pipeline, count: int, each: list[bool]) -> list:
    """Each stage's blocks: as given, or the program's blocks balanced by their per-micro-batch
    cycles."""
    if pipeline.stages != "auto":
        given = [list(names) for names in stage_names(pipeline.stages)]
        if len(given) != count:
            raise ConfigError(
                f"Pipeline(stages=...) names {len(given)} stages, but the mesh axis "
                f"{pipeline.axis!r} has {count} IPUs; give one stage per IPU"
            )
        return given
    blocks = scope_blocks(program)
    if len(blocks) < count:
        raise ConfigError(
            f"Pipeline(stages='auto') found {len(blocks)} jax.named_scope blocks "
            f"({', '.join(blocks) or 'none'}) for {count} stages on axis {pipeline.axis!r}: "
            "wrap each layer in jax.named_scope, or pipeline over fewer IPUs"
        )
    weight = dict.fromkeys(blocks, 0)
    for task, label, per_mb in zip(program.tasks, _labels(program, blocks), each, strict=True):
        if label is not None and per_mb:
            weight[label] += sum(s.cycles for s in task.supersteps)
    return balanced_stages(blocks, [weight[b] for b in blocks], count)


def _labels(program: Program, names: Sequence[str]) -> list[str | None]:
    """Each task's block: its scope's, else (a program with no such scopes, a flax linen
    model's) the block its structure repeats (`scopes.block_labels`)."""
    return block_labels(program, names)


def split_stages(program: Program, pipeline: Pipeline, count: int, each: list[bool]) -> StageSplit:
    """Each task's stage and kind. A named task is its block's stage's; an unnamed one goes
    with the block of its largest operand (its home, as phases place an optimizer's update),
    else (or an unnamed broadcast) where it is first read. Its direction is its scope's (jax
    names backward ops `transpose(...)`), or backward when it reads a backward result."""
    blocks = _stage_blocks(program, pipeline, count, each)
    stage_of_block = {b: s for s, names in enumerate(blocks) for b in names}
    names = list(stage_of_block)
    labels = _labels(program, names)
    if not any(labels):
        raise ConfigError(
            f"Pipeline(stages={pipeline.stages!r}): no op is in a jax.named_scope called any "
            f"of {names}"
        )
    homes = home_blocks(program, labels)
    made: dict[Value, int] = {}
    backward: set[Value] = set()
    stage_of: list[int] = []
    kind_of: list[str] = []
    floating: set[int] = set()
    for index, (task, label) in enumerate(zip(program.tasks, labels, strict=True)):
        home = homes.get(task.op.results[0]) if task.op.results else None
        if task.op.name == "broadcast_in_dim" and label is None:
            home = None  # a view: it floats to its reader, which receives its source alone
        if label is not None:
            stage = stage_of_block[label]
        elif home is not None:
            stage = stage_of_block[home]
        else:
            # No block of its own (a constant, or an optimizer's `b1 * mu` on state no block
            # reads): it runs where it is first read.
            stage = max((made[v] for v in task.inputs if v in made), default=0)
            floating.add(index)
        is_backward = direction(task.op.loc.scope) == BACKWARD or any(
            v in backward for v in task.inputs
        )
        kind = (BACKWARD if is_backward else FORWARD) if each[index] else UPDATE
        if kind == BACKWARD:
            backward.update(task.op.results)
        stage_of.append(stage)
        kind_of.append(kind)
        made.update(dict.fromkeys(task.op.results, stage))
    _float_to_readers(program, stage_of, floating)
    if pipeline.stages != "auto":
        _check_order(program, labels, stage_of, kind_of)
    return StageSplit(tuple(tuple(b) for b in blocks), tuple(stage_of), tuple(kind_of))


def _check_order(
    program: Program, labels: Sequence[str | None], stage_of: list[int], kind_of: list[str]
) -> None:
    """Stages given by name run the forward pass from stage 0 up: no block's forward work
    reads what a block on a later stage makes (stages given backwards, or interleaved, would
    send activations back up the pipeline, which its schedule does not)."""
    made: dict[Value, int] = {}
    for index, (task, label) in enumerate(zip(program.tasks, labels, strict=True)):
        if label is None or kind_of[index] != FORWARD:
            continue
        for value in task.inputs:
            source = made.get(value)
            if source is not None and stage_of[source] > stage_of[index]:
                raise ConfigError(
                    f"Pipeline(stages=...): {label} on stage {stage_of[index]} reads what "
                    f"{labels[source]} makes on stage {stage_of[source]}; a pipeline's forward "
                    "pass runs from stage 0 up: give the stages in the model's order"
                )
        made.update(dict.fromkeys(task.op.results, index))


def _float_to_readers(program: Program, stage_of: list[int], floating: set[int]) -> None:
    """Tasks with no home run on the stage of their first reader (last to first, so a chain of
    them follows the reader at its end)."""
    first_reader: dict[Value, int] = {}
    for index in range(len(program.tasks) - 1, -1, -1):
        task = program.tasks[index]
        if index in floating:
            readers = [first_reader[v] for v in task.op.results if v in first_reader]
            if readers:
                stage_of[index] = stage_of[min(readers)]
        for value in task.inputs:
            first_reader[value] = index
