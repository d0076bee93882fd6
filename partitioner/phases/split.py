"""Phased execution, as PopXL runs Graphcore's GPT-3: a program too large for the chip runs as a
sequence of phases, one forward and one backward phase per block, then optimizer phases, its
weights and optimizer state in streaming memory (docs/phases.md). This is the `phases=` option's
pass (`split_phases`): by name (`scopes`) or automatically, then fitted to the tile budget.

Automatically (`phases="auto"`): the program's own named scopes, when it has any, are its
blocks; a program with no scopes is cut where the fewest bytes cross between phases
(`min_crossing_cuts`), each phase within a byte budget. Either way, a phase that does not fit
the tile memory has its matmuls planned with less temporary memory, as a PopLibs user lowers
`availableMemoryProportion`, and if it still does not fit it is cut where the fewest bytes
cross (`_fitted`).

What phases stream, and what that costs, is `streaming`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from partitioner.errors import ConfigError
from partitioner.memory.liveness import PhaseBounds, Uses, storages, value_uses
from partitioner.memory.tiles import TileMemory, tile_memory
from partitioner.phases.cuts import broadcast_views, cut_phases, touched_bytes
from partitioner.phases.loops import fissionable, inline_loops, located
from partitioner.phases.plan import PhasePlan, Phases
from partitioner.phases.scopes import split_by_names, split_by_scope_blocks
from partitioner.program import Program
from partitioner.target import Target
from partitioner.tiles.rules.matmul import shrunk_by

AUTO_SHARE = 0.25  # of an IPU's memory: the bytes a phase touches, when cutting without scopes


@dataclass(frozen=True, eq=False)
class Fitted:
    """A program fitted in phases: its tasks, its plan, each value's uses in the plan's phases
    (`value_uses`) and its tile memory there. Passes after the split that keep every task's op,
    inputs and layouts (replicated tensor sharding re-costs supersteps only) take `uses` and
    the memory's storages as they are rather than walk GPT-3's 80,000 tasks again."""

    program: Program
    plan: PhasePlan
    uses: Uses
    memory: TileMemory


def split_auto(program: Program, target: Target) -> tuple[Program, PhasePlan]:
    """The program's named scopes as blocks, a phase per block and direction; phases that do
    not fit the tile memory, or a program without scopes, cut where the fewest bytes cross."""
    fitted = _auto_fitted(program, target)
    return fitted.program, fitted.plan


def _auto_fitted(program: Program, target: Target) -> Fitted:
    by_scopes = split_by_scope_blocks(program)
    if by_scopes is not None:
        program, plan = by_scopes
    else:
        plan = PhasePlan(("phase 0",), PhaseBounds([(0, len(program.tasks))]))
        budget = AUTO_SHARE * target.bytes_per_ipu
        plan = cut_phases(program, plan, {0: budget}, target)
    return _fitted(program, plan, target)


def _fitted(program: Program, plan: PhasePlan, target: Target, rounds: int = 10) -> Fitted:
    """Phases whose fullest tile is over budget fitted as a PopLibs user would: first their
    matmuls re-planned with less temporary memory (K in more serial chunks, as a lower
    `availableMemoryProportion` makes PopLibs plan), then, if still over, cut in two where the
    fewest bytes cross, and again, until every phase fits or nothing helps."""
    # A phase's matmuls are re-planned again while that keeps shrinking its excess.
    shrunk: dict[int, int] = {}
    views = broadcast_views(program)
    # Re-planning keeps every task's op, inputs and result layouts, so the values' uses and
    # storages hold until phases are cut.
    uses = value_uses(program, plan.bounds)
    stored = storages(program, plan.bounds, uses=uses)
    memory = tile_memory(program, target, plan.bounds, uses=uses, stored=stored)
    for _ in range(rounds):
        peaks = memory.phase_peaks
        over = {
            p: peak - target.bytes_per_tile
            for p, peak in enumerate(peaks)
            if peak > target.bytes_per_tile
        }
        if not over:
            break
        fresh = {p: excess for p, excess in over.items() if excess < shrunk.get(p, excess + 1)}
        if fresh:
            assert memory.task_peaks is not None  # phased: each task's fullest tile
            program = _less_memory(program, plan, fresh, memory.task_peaks, target)
            shrunk.update(fresh)
        else:
            budgets = {
                p: touched_bytes(program.tasks[a:b], views) / 2
                for p, (a, b) in enumerate(plan.bounds.bounds)
                if p in over and b - a > 1
            }
            if not budgets:
                break
            plan = cut_phases(program, plan, budgets, target)
            uses = value_uses(program, plan.bounds)
            stored = storages(program, plan.bounds, uses=uses)
            shrunk = {}
        memory = tile_memory(program, target, plan.bounds, uses=uses, stored=stored)
    return Fitted(program, plan, uses, memory)


def _less_memory(
    program: Program,
    plan: PhasePlan,
    phases: Iterable[int],
    task_peaks: np.ndarray,
    target: Target,
) -> Program:
    """The matmuls of `phases` re-planned with less temporary memory: each by what its own
    fullest tile (`task_peaks`) is over budget while it runs (a matmul the peak does not reach
    keeps its plan, as PopLibs plans each matmul within its own available memory)."""
    tasks = list(program.tasks)
    producers = {v: task.op for task in tasks for v in task.op.results}
    for p in phases:
        a, b = plan.bounds.bounds[p]
        overs = (task_peaks[a:b] - target.bytes_per_tile).tolist()
        for i, over in zip(range(a, b), overs, strict=True):
            tasks[i] = shrunk_by(tasks[i], over, producers, target)
    return dataclasses.replace(program, tasks=tuple(tasks))


def split_phases(
    program: Program, phases: Phases, target: Target
) -> tuple[Program, PhasePlan | None, Fitted | None]:
    """The `phases=` option: None keeps one program on chip, "auto" finds blocks and cuts, a
    tuple of `jax.named_scope` names cuts by scope. Counted loops are laid out inline and run
    phase-major (`loops`); a loop whose body the phases cannot run so stays one task. With the
    program and its plan, the fitting that made them (each value's uses in the plan's phases
    and the tile memory there, for the passes after: `Fitted`)."""
    if phases is None:
        return program, None, None
    _check_phases(phases)
    whole: set = set()
    while True:
        inlined, spans = inline_loops(program, skip=whole)
        fitted = _split_one(inlined, phases, target)
        split, plan = fitted.program, fitted.plan
        found = located(split, spans)
        if found is None:  # a body's task left its loop: lay out none of them
            whole.update(s.task.op for s in spans)
            continue
        broken = [s for s in found if not fissionable(split, s, plan.bounds)]
        if not broken:
            return split, dataclasses.replace(plan, loops=found), fitted
        whole.update(s.task.op for s in broken)


def _check_phases(phases: Phases) -> None:
    if phases == "auto":
        return
    if isinstance(phases, (list, tuple)) and phases and all(isinstance(n, str) for n in phases):
        return
    raise ConfigError(
        f"phases={phases!r} is not understood; use None, 'auto' or a list of jax.named_scope names"
    )


def _split_one(program: Program, phases: Phases, target: Target) -> Fitted:
    if phases == "auto" or not isinstance(phases, tuple | list):
        return _auto_fitted(program, target)
    try:
        program, plan = split_by_names(program, phases)
    except ValueError as error:
        raise ConfigError(
            f"phases={list(phases)}: {error}; wrap each phase's code in "
            "jax.named_scope(name), or use phases='auto'"
        ) from None
    return _fitted(program, plan, target)


def compute_target(target: Target, phases: Phases) -> Target:
    """The tiles that compute: a phased program keeps its IO tiles for streaming. The count
    stays on the result (`io_tiles`), which a default would work out anew from fewer tiles."""
    io = target.phase_io_tiles
    if phases is None or not io:
        return target
    if io >= target.tiles_per_ipu:
        raise ConfigError(
            f"io_tiles={io} leaves no compute tiles of {target.tiles_per_ipu}; use fewer IO tiles"
        )
    return dataclasses.replace(target.with_tiles(target.tiles_per_ipu - io), io_tiles=io)


def phased_hint(program: Program, target: Target) -> str:
    """Whether an unphased program that does not fit would fit in phases, with the figure."""
    fitted = _auto_fitted(program, target)
    plan = fitted.plan
    fullest = int(fitted.memory.total.max())
    if fullest <= target.bytes_per_tile:
        return (
            f"It would fit in phases: with phases='auto' ({len(plan.names)} phases, weights in "
            f"streaming memory) the fullest tile needs {fullest:,} bytes."
        )
    return (
        f"Even with phases='auto' ({len(plan.names)} phases) the fullest tile would need "
        f"{fullest:,} bytes: spread it over more IPUs."
    )
