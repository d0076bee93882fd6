"""Phased execution: a program too large for the chip runs as a sequence of phases, its weights
and optimizer state in streaming memory (docs/target.md, "Streaming memory and phases").

Splitting (the passes, in order):
- by name (`phases=["layer0", ...]`): a phase is a contiguous run of ops whose `jax.named_scope`
  path contains one of the names (a forward and a backward run of the same layer are two phases).
  An op in no named scope joins the latest phase that makes one of its operands (an optimizer's
  update of a layer's weights joins that layer's backward phase), or, if it reads only
  arguments and constants, the first phase that reads it; tasks are reordered accordingly,
  which keeps every producer before its consumers.
- automatically (`phases="auto"`): program order is cut greedily so that the tensors a phase
  touches (loads and makes) stay within a quarter of the IPU's memory.
What phases stream, and what that costs, is `cost.streaming`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lowering import Value
from partitioner.errors import ConfigError
from partitioner.memory import PhaseBounds, tile_memory
from partitioner.program import Program, Task
from partitioner.target import Target

AUTO_SHARE = 0.25  # of an IPU's memory, for the streamed tensors of one phase


@dataclass(frozen=True, slots=True)
class PhasePlan:
    names: tuple[str, ...]
    bounds: PhaseBounds


# ---- splitting ---------------------------------------------------------------------------


def _label(task: Task, names: Sequence[str]) -> str | None:
    """The named scope an op sits in. jax wraps scopes of derived code in transformation
    names, `jvp(layer0)` and `transpose(jvp(layer0))`, so words are read inside those too."""
    words = task.op.loc.scope.replace("(", "/").replace(")", "/").split("/")[1:]
    for name in names:
        if name in words:
            return name
    return None


def split_by_names(program: Program, names: Sequence[str]) -> tuple[Program, PhasePlan]:
    """One phase per contiguous run of a named scope; tasks reordered so unnamed ones join the
    phase of their latest producer."""
    run_of: list[int | None] = []
    run_names: list[str] = []
    for task in program.tasks:
        label = _label(task, names)
        if label is not None and (not run_names or run_names[-1] != label):
            run_names.append(label)
        run_of.append(len(run_names) - 1 if label is not None else None)
    if not run_names:
        raise ValueError(f"no op is in a named scope called any of {list(names)}")
    phase_of = _assign(program, run_of)
    order = sorted(range(len(program.tasks)), key=lambda i: (phase_of[i], i))
    tasks = tuple(program.tasks[i] for i in order)
    bounds = _bounds([phase_of[i] for i in order], len(run_names))
    titles = _titles(run_names)
    return dataclasses.replace(program, tasks=tasks), PhasePlan(titles, PhaseBounds(bounds))


def _assign(program: Program, run_of: list[int | None]) -> list[int]:
    """A phase per task: its named run. An unnamed task that reads what phased work makes joins
    the latest of those phases (an optimizer update joins its layer's backward phase); one that
    reads only arguments, constants and such floating work joins its first reader's phase (a
    weight's transpose, a broadcast constant, join the layer that uses them)."""
    made_in: dict[Value, int] = {}
    floating: set[Value] = set()
    phase_of: list[int] = []
    for task, run in zip(program.tasks, run_of, strict=True):
        producers = [made_in[v] for v in task.inputs if v in made_in and v not in floating]
        phase = max([run if run is not None else 0, *producers])
        phase_of.append(phase)
        made_in.update(dict.fromkeys(task.op.results, phase))
        if run is None and not producers:
            floating.update(task.op.results)
    readers: dict[Value, int] = {}
    for index in range(len(program.tasks) - 1, -1, -1):
        task = program.tasks[index]
        if task.op.results and task.op.results[0] in floating:
            later = [readers[v] for v in task.op.results if v in readers]
            phase_of[index] = min(later, default=phase_of[index])
        for value in task.inputs:
            readers[value] = min(readers.get(value, phase_of[index]), phase_of[index])
    return phase_of


def _bounds(phase_of_sorted: list[int], phases: int) -> list[tuple[int, int]]:
    bounds = []
    start = 0
    for phase in range(phases):
        stop = start
        while stop < len(phase_of_sorted) and phase_of_sorted[stop] == phase:
            stop += 1
        bounds.append((start, stop))
        start = stop
    return [b for b in bounds if b[1] > b[0]] or [(0, len(phase_of_sorted))]


def _titles(run_names: list[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    titles = []
    for name in run_names:
        seen[name] = seen.get(name, 0) + 1
        titles.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return tuple(titles)


def split_auto(program: Program, target: Target) -> PhasePlan:
    """Greedy cuts in program order, keeping the tensors each phase touches (what it loads and
    what it makes) within a share of the IPU's memory, the rest left for temporaries."""
    budget = AUTO_SHARE * target.tiles_per_ipu * target.bytes_per_tile
    bounds: list[tuple[int, int]] = []
    start = 0
    touched: dict[Value, int] = {}
    for index, task in enumerate(program.tasks):
        values = [*task.inputs, *task.op.results]
        new = {v: v.nbytes for v in values if v not in touched}
        if touched and sum(touched.values()) + sum(new.values()) > budget:
            bounds.append((start, index))
            start, touched = index, {}
            new = {v: v.nbytes for v in values}
        touched.update(new)
    bounds.append((start, len(program.tasks)))
    names = tuple(f"phase {i}" for i in range(len(bounds)))
    return PhasePlan(names, PhaseBounds(bounds))


def split_phases(program: Program, phases: Any, target: Target) -> tuple[Program, PhasePlan | None]:
    """The `phases=` option: None (or "none") keeps one program on chip, "auto" cuts by bytes,
    a list of `jax.named_scope` names cuts by scope."""
    if phases is None or phases == "none":
        return program, None
    if phases == "auto":
        return program, split_auto(program, target)
    if isinstance(phases, (list, tuple)) and phases and all(isinstance(n, str) for n in phases):
        try:
            return split_by_names(program, phases)
        except ValueError as error:
            raise ConfigError(
                f"phases={list(phases)}: {error}; wrap each phase's code in "
                "jax.named_scope(name), or use phases='auto'"
            ) from None
    raise ConfigError(
        f"phases={phases!r} is not understood; use None, 'auto' or a list of jax.named_scope names"
    )


def compute_target(target: Target, phases: Any) -> Target:
    """The tiles that compute: a phased program keeps `io_tiles` of each IPU for streaming."""
    if phases is None or not target.io_tiles:
        return target
    if target.io_tiles >= target.tiles_per_ipu:
        raise ConfigError(
            f"io_tiles={target.io_tiles} leaves no compute tiles of {target.tiles_per_ipu}; "
            "use fewer IO tiles"
        )
    return target.with_tiles(target.tiles_per_ipu - target.io_tiles)


def phased_hint(program: Program, target: Target) -> str:
    """Whether an unphased program that does not fit would fit in phases, with the figure."""
    plan = split_auto(program, target)
    phased = tile_memory(program, target, plan.bounds)
    fullest = int(phased.total.max())
    if fullest <= target.bytes_per_tile:
        return (
            f"It would fit in phases: with phases='auto' ({len(plan.names)} phases, weights in "
            f"streaming memory) the fullest tile needs {fullest:,} bytes."
        )
    return (
        f"Even with phases='auto' ({len(plan.names)} phases) the fullest tile would need "
        f"{fullest:,} bytes: spread it over more IPUs."
    )
