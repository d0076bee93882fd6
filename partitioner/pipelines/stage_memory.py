"""Each stage's IPU memory: its program's by liveness (with recomputation, its forward run again
block by block in its backward, `recompute.recomputed`), plus the activations it stashes for the
micro-batches in flight; stages over budget get their matmuls re-planned (`fit_stages`).
`StageViews` keeps what these find across the programs one fit re-plans."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lowering import Value
from partitioner.layout import tile_bytes
from partitioner.memory.liveness import PhaseBounds, Storage, storages
from partitioner.memory.tiles import TileMemory, task_excess, tile_memory
from partitioner.phases.scopes import BACKWARD, FORWARD
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.recompute import checkpoints, recomputed
from partitioner.pipelines.stage_program import ordered_stage_program, stage_order, stage_sends
from partitioner.pipelines.stages import StageSplit
from partitioner.program import Program, Task
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


@dataclass(frozen=True, slots=True, eq=False)
class StageView:
    """The stage's program as its memory sees it, its phases, its stash per tile for the other
    micro-batches in flight, for each of its tasks the position in `order` (its
    `stage_order`) of the task it runs (`_stage_view`)."""

    program: Program
    bounds: PhaseBounds | None
    stash: np.ndarray
    origin: list[int]
    order: list[int]


def _stage_view(
    program: Program,
    split: StageSplit,
    stage: int,
    pipeline: Pipeline,
    target: Target,
    known: _Known | None = None,
) -> StageView:
    """The stage's program as its memory sees it (recomputed, `recompute.recomputed`, with
    `pipeline.recompute`), its phases (with the optimizer state off chip, the update is a
    phase of its own, so what only it reads is on chip only while it runs, and each result
    streams out as it is made), its stash per tile (`stash_per_tile`) and its order; `known`
    holds those of them the caller found already."""
    order = known.order if known is not None else stage_order(program, split, stage)
    sends = known.sends if known is not None else None
    own = ordered_stage_program(program, split, stage, order, sends)
    if pipeline.recompute:
        own, origin = recomputed(program, split, stage, order, own)
    else:
        origin = list(range(len(own.tasks)))
    per_microbatch = len(split.indices(stage, (FORWARD, BACKWARD)))
    per_microbatch_tasks = sum(p < per_microbatch for p in origin)
    bounds = None
    if pipeline.optimizer_state_offchip and 0 < per_microbatch_tasks < len(own.tasks):
        work = [(0, per_microbatch_tasks), (per_microbatch_tasks, len(own.tasks))]
        bounds = PhaseBounds(work, slices=False)
        updated = {v for t in own.tasks[per_microbatch_tasks:] for v in t.op.results}
        own = dataclasses.replace(own, outputs=tuple(v for v in own.outputs if v not in updated))
    if known is not None:
        stash = known.stash
    else:
        stash = stash_per_tile(program, split, stage, pipeline, target)
    return StageView(own, bounds, stash, origin, order)


@dataclass(frozen=True, slots=True)
class _Known:
    """What a stage's view reads that a re-plan leaves alone (see `StageViews`)."""

    order: list[int]
    sends: set[Value]
    stash: np.ndarray


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


class StageViews:
    """Each stage's view (`_stage_view`), memory and tasks' excess over a program and the
    programs `fit_stages` re-plans from it, each found once (one `fitted_stages` call sweeps
    them all, and these sweeps cost most of a plan search's pipelined builds).

    A re-plan replaces matmul tasks but keeps each task's op, inputs and result layout
    (`shrunk_by`), and the program's other fields: a stage none of whose tasks it replaced
    keeps its view and what was found on it, and every stage keeps its stash and its storages
    (`liveness.storages`), which read no plan."""

    def __init__(self, split: StageSplit, pipeline: Pipeline, target: Target) -> None:
        self.split, self.pipeline, self.target = split, pipeline, target
        self._program: Program | None = None  # the first program asked about
        self._stash: dict[int, np.ndarray] = {}
        self._sends: list[set[Value]] = []
        self._stored: dict[int, tuple[Storage, ...]] = {}
        self._views: dict[int, tuple[tuple[Task, ...], StageView]] = {}
        self._memories: dict[int, tuple[StageView, TileMemory]] = {}
        self._excess: dict[int, tuple[StageView, list[int]]] = {}

    def stash(self, program: Program, stage: int) -> np.ndarray:
        """`stash_per_tile`."""
        if stage not in self._stash:
            split, pipeline, target = self.split, self.pipeline, self.target
            self._stash[stage] = stash_per_tile(program, split, stage, pipeline, target)
        return self._stash[stage]

    def view(self, program: Program, stage: int) -> StageView:
        """`_stage_view`: made again only when one of the stage's tasks was replaced."""
        if self._program is None:
            self._program = program
        assert _same_but_tasks(program, self._program), "a program other than a re-plan"
        tasks = tuple(program.tasks[i] for i in self.split.indices(stage))
        held = self._views.get(stage)
        if held is None or held[0] != tasks:  # tasks compare by identity
            order = held[1].order if held else stage_order(program, self.split, stage)
            self._sends = self._sends or stage_sends(program, self.split)
            known = _Known(order, self._sends[stage], self.stash(program, stage))
            view = _stage_view(program, self.split, stage, self.pipeline, self.target, known)
            self._views[stage] = held = (tasks, view)
        return held[1]

    def memory(self, program: Program, stage: int) -> tuple[Program, TileMemory]:
        """`stage_memory`."""
        view = self.view(program, stage)
        held = self._memories.get(stage)
        if held is None or held[0] is not view:
            stored = self._storages(stage, view)
            found = tile_memory(view.program, self.target, view.bounds, stored=stored)
            memory = dataclasses.replace(found, not_always_live=found.not_always_live + view.stash)
            self._memories[stage] = held = (view, memory)
        return view.program, held[1]

    def excess(self, program: Program, stage: int) -> list[int]:
        """`task_excess` of each of the stage's view's tasks, its stash added throughout."""
        view = self.view(program, stage)
        held = self._excess.get(stage)
        if held is None or held[0] is not view:
            args = (view.program, self.target, view.bounds, view.stash, self._storages(stage, view))
            self._excess[stage] = held = (view, task_excess(*args))
        return held[1]

    def _storages(self, stage: int, view: StageView) -> tuple[Storage, ...]:
        if stage not in self._stored:
            self._stored[stage] = storages(view.program, view.bounds)
        return self._stored[stage]


def _same_but_tasks(program: Program, other: Program) -> bool:
    """Whether the two programs share every field but their tasks (as a re-plan keeps them)."""
    fields = ("inputs", "input_layouts", "outputs", "layouts")
    return program.tiles == other.tiles and all(
        getattr(program, f) is getattr(other, f) for f in fields
    )


def stage_memory(
    program: Program, split: StageSplit, stage: int, pipeline: Pipeline, target: Target
) -> tuple[Program, TileMemory]:
    """The stage's own program (`_stage_view`) and its tile memory by liveness over it, its
    stash for the micro-batches in flight among the not-always-live variables (the memory's
    peak tasks index that program)."""
    return StageViews(split, pipeline, target).memory(program, stage)


def fit_stages(
    program: Program,
    split: StageSplit,
    pipeline: Pipeline,
    target: Target,
    rounds: int = 4,
    views: StageViews | None = None,
) -> Program:
    """Stages whose tiles are over budget get the matmuls that run while they are over
    re-planned with that much less temporary memory, as Graphcore lowered
    `availableMemoryProportion` per IPU for BERT (0.15 on the embedding's IPU, 0.25 on the
    others); again while that keeps shrinking the excess. `views` holds what the caller found
    on `program`'s stages already."""
    views = StageViews(split, pipeline, target) if views is None else views
    producers = {v: t.op for t in program.tasks for v in t.op.results}
    worst: dict[int, int] = {}
    for _ in range(rounds):
        tasks = list(program.tasks)
        changed = False
        for s in range(split.stages):
            view = views.view(program, s)
            excess = _by_origin(views.excess(program, s), view.origin, len(view.order))
            if max(excess, default=0) <= 0 or max(excess) >= worst.get(s, max(excess) + 1):
                continue
            worst[s] = max(excess)
            for i, over in zip(view.order, excess, strict=True):
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
