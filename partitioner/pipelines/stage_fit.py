"""A pipeline's stages against a tile's memory: a floor under its fullest tile read from the
stashes alone (`stash_floor`, which the plan search reads before it builds), and the stages
fitted (`fitted_stages`: `fit_stages` run only when the stages' memory, swept first, is over).
"""

from __future__ import annotations

from dataclasses import dataclass

from partitioner.memory.tiles import TileMemory
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.stage_memory import StageViews, fit_stages, stash_per_tile
from partitioner.pipelines.stages import StageSplit
from partitioner.program import Program
from partitioner.target import Target


@dataclass(frozen=True)
class PeakFloor:
    """At least `bytes` on the fullest tile of a pipelined build: stage `stage`'s stash on its
    tile `tile`."""

    bytes: int
    stage: int
    tile: int


def stash_floor(
    program: Program,
    split: StageSplit,
    pipeline: Pipeline,
    target: Target,
    views: StageViews | None = None,
) -> PeakFloor:
    """The most any stage stashes on one tile for its other micro-batches in flight: at most the
    fullest tile of the stages' memory, whether `fit_stages` re-plans or not. `stage_memory` adds
    exactly that stash to its not-always-live bytes (`fit_stages` re-plans matmuls, but keeps
    every task's op, inputs and result layout, which the stash reads), and every other part of a
    tile's memory is at least 0. `views` keeps each stage's stash for the sweeps after."""
    floor = PeakFloor(0, 0, 0)
    for s in range(split.stages):
        if views is not None:
            stash = views.stash(program, s)
        else:
            stash = stash_per_tile(program, split, s, pipeline, target)
        tile = int(stash.argmax())
        if stash[tile] > floor.bytes:
            floor = PeakFloor(int(stash[tile]), s, tile)
    return floor


def fitted_stages(
    program: Program, split: StageSplit, pipeline: Pipeline, target: Target
) -> tuple[Program, tuple[Program, ...], tuple[TileMemory, ...]]:
    """The program after `fit_stages`, and each stage's own program and memory on it.

    The stages' memory is swept first: when every stage fits, `fit_stages` re-plans nothing
    (it shrinks the matmuls of tasks whose fullest tile is over budget while they run, and a
    stage's memory on a tile is the most any of its tasks holds there, stash included), so the
    program and those memories stand. A stage whose stash alone is over cannot fit: the program
    goes to `fit_stages` without that sweep. All of them share what they find on a stage that
    a re-plan leaves alone (`StageViews`)."""
    budget = target.bytes_per_tile
    swept = None
    views = StageViews(split, pipeline, target)
    if stash_floor(program, split, pipeline, target, views).bytes <= budget:
        swept = stage_memories(program, split, pipeline, target, views)
        if all(int(memory.total.max()) <= budget for memory in swept[1]):
            return program, *swept
    fitted = fit_stages(program, split, pipeline, target, views=views)
    if fitted is program and swept is not None:  # nothing it could shrink
        return program, *swept
    return fitted, *stage_memories(fitted, split, pipeline, target, views)


def stage_memories(
    program: Program,
    split: StageSplit,
    pipeline: Pipeline,
    target: Target,
    views: StageViews | None = None,
) -> tuple[tuple[Program, ...], tuple[TileMemory, ...]]:
    """Each stage's own program and its memory (`stage_memory`), in stage order; `views` holds
    what was found on the stages of `program` or of the program it re-plans."""
    views = StageViews(split, pipeline, target) if views is None else views
    pairs = [views.memory(program, s) for s in range(split.stages)]
    return tuple(p for p, _ in pairs), tuple(m for _, m in pairs)
