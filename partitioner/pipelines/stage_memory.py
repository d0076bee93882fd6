"""Each stage's IPU memory: its program's by liveness (with recomputation, its forward run again
block by block in its backward, `recompute.recomputed`), plus the activations it stashes for the
micro-batches in flight; stages over budget get their matmuls re-planned (`fit_stages`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from lowering import Value
from partitioner.layout import tile_bytes
from partitioner.memory.liveness import PhaseBounds
from partitioner.memory.tiles import TileMemory, task_excess, tile_memory
from partitioner.phases.scopes import BACKWARD, FORWARD
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.recompute import checkpoints, recomputed
from partitioner.pipelines.stage_program import stage_order, stage_program
from partitioner.pipelines.stages import StageSplit
from partitioner.program import Program
from partitioner.target import Target
from partitioner.tiles.rules.matmul import shrunk_by


def in_flight(stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at once: its forward of micro-batch m runs
    in pipeline cycle m + stage and its backward in m + 2 (stages - 1) - stage."""
    return min(microbatches, 2 * (stages - 1 - stage) + 1)


def stashed(program: Program, split: StageSplit, stage: int, recompute: bool) -> list[Value]:
    """What the stage keeps per micro-batch from its forward to its backward: with
    recomputation, the inputs its forward receives from the previous stage and its blocks'
    checkpoints (`recompute.checkpoints`); without, every value its backward reads that its
    forward made or received."""
    forward = split.indices(stage, (FORWARD,))
    backward = split.indices(stage, (BACKWARD,))
    made_forward = {v for i in forward for v in program.tasks[i].op.results}
    made_here = {v for i in split.indices(stage) for v in program.tasks[i].op.results}
    arguments = set(program.inputs)
    received = {
        v
        for i in forward
        for v in program.tasks[i].inputs
        if v not in made_here and v not in arguments
    }
    if recompute:
        return sorted(received | checkpoints(program, split, stage), key=lambda v: v.id)
    read_back = {v for i in backward for v in program.tasks[i].inputs}
    return sorted(read_back & (made_forward | received), key=lambda v: v.id)


def _stage_view(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> tuple[Program, PhaseBounds | None, np.ndarray, list[int]]:
    """The stage's program as its memory sees it (recomputed, `recompute.recomputed`, with
    `pipeline.recompute`), its phases (with the optimizer state off chip, the update is a
    phase of its own, so what only it reads is on chip only while it runs, and each result
    streams out as it is made), its stash per tile for the other micro-batches in flight, and
    for each of its tasks the position in `stage_order` of the task it runs."""
    if pipeline.recompute:
        own, origin = recomputed(program, split, stage)
    else:
        own = stage_program(program, split, stage)
        origin = list(range(len(own.tasks)))
    per_microbatch = len(split.indices(stage, (FORWARD, BACKWARD)))
    per_microbatch_tasks = sum(p < per_microbatch for p in origin)
    bounds = None
    if pipeline.optimizer_state_offchip and 0 < per_microbatch_tasks < len(own.tasks):
        bounds = PhaseBounds([(0, per_microbatch_tasks), (per_microbatch_tasks, len(own.tasks))])
        updated = {v for t in own.tasks[per_microbatch_tasks:] for v in t.op.results}
        own = dataclasses.replace(own, outputs=tuple(v for v in own.outputs if v not in updated))
    return own, bounds, stash_per_tile(program, split, stage, pipeline, target), origin


def stash_per_tile(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> np.ndarray:
    """The bytes per tile the stage stashes for its other micro-batches in flight."""
    stash = np.zeros(target.tiles_per_ipu, np.int64)
    extra = in_flight(stage, split.stages, pipeline.microbatches) - 1
    if extra > 0:
        for value in stashed(program, split, stage, pipeline.recompute):
            layout = program.layouts[value]
            stash[layout.start : layout.stop] += tile_bytes(layout, value.dtype)
    return extra * stash


def stage_memory(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> tuple[Program, TileMemory]:
    """The stage's own program (`_stage_view`) and its tile memory by liveness over it, its
    stash for the micro-batches in flight among the not-always-live variables (the memory's
    peak tasks index that program)."""
    own, bounds, stash, _ = _stage_view(program, split, stage, pipeline, target)
    memory = tile_memory(own, target, bounds)
    return own, dataclasses.replace(memory, not_always_live=memory.not_always_live + stash)


def fit_stages(
    program: Program, split: StageSplit, pipeline: Pipeline, target: Target, rounds: int = 4
) -> Program:
    """Stages whose tiles are over budget get the matmuls that run while they are over
    re-planned with that much less temporary memory, as Graphcore lowered
    `availableMemoryProportion` per IPU for BERT (0.15 on the embedding's IPU, 0.25 on the
    others); again while that keeps shrinking the excess."""
    producers = {v: t.op for t in program.tasks for v in t.op.results}
    worst: dict[int, int] = {}
    for _ in range(rounds):
        tasks = list(program.tasks)
        changed = False
        for s in range(split.stages):
            order = stage_order(program, split, s)
            own, bounds, extra, origin = _stage_view(program, split, s, pipeline, target)
            excess = _by_origin(task_excess(own, target, bounds, extra), origin, len(order))
            if max(excess, default=0) <= 0 or max(excess) >= worst.get(s, max(excess) + 1):
                continue
            worst[s] = max(excess)
            for i, over in zip(order, excess, strict=True):
                shrunk = shrunk_by(tasks[i], over, producers, target)
                changed |= shrunk is not tasks[i]
                tasks[i] = shrunk
        if not changed:
            break
        program = dataclasses.replace(program, tasks=tuple(tasks))
    return program


def _by_origin(excess: list[int], origin: list[int], count: int) -> list[int]:
    """Each of a stage's `count` tasks' excess, the most of its runs (a recomputed task runs
    with other tensors live than its first run, and one plan serves both)."""
    out = [0] * count
    for p, over in zip(origin, excess, strict=True):
        out[p] = max(out[p], over)
    return out
