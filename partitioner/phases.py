"""Phased execution: a program too large for the chip runs as a sequence of phases, its weights
and optimizer state in streaming memory (`shared/ipu_facts.md`, "Phased execution").

Splitting (the passes, in order):
- by name (`phases=["layer0", ...]`): a phase is a contiguous run of ops whose `jax.named_scope`
  path contains one of the names (a forward and a backward run of the same layer are two phases).
  An op in no named scope joins the latest phase that makes one of its operands (an optimizer's
  update of a layer's weights joins that layer's backward phase), or, if it reads only
  arguments and constants, the first phase that reads it; tasks are reordered accordingly,
  which keeps every producer before its consumers.
- automatically (`phases="auto"`): program order is cut greedily so that the tensors a phase
  touches (loads and makes) stay within a quarter of the IPU's memory.
Then streaming: an argument is loaded at the start of every phase that reads it, an output is
stored at the end of the phase that makes it, and an activation read in a later phase is stored
at the end of its own phase and loaded again where it is read. With a `dp` mesh axis,
replicated tensor sharding keeps 1/dp of each replicated argument per replica in streaming memory
and gathers the rest over IPU-Links when it is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lowering import Value
from partitioner.links import ring_bytes
from partitioner.memory import PhaseBounds, Storage
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


# ---- streaming ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PhaseStream:
    """What one phase moves to and from streaming memory, per IPU."""

    load_bytes: int
    store_bytes: int
    gather_bytes: int  # replicated tensor sharding, over IPU-Links


def _rts_share(value: Value, replicas: int, replicated: set[Value]) -> int:
    return value.nbytes // replicas if value in replicated else value.nbytes


def streaming(
    program: Program,
    storages: Sequence[Storage],
    plan: PhasePlan,
    replicas: int = 1,
    replicated: set[Value] | None = None,
) -> list[PhaseStream]:
    """Per phase: bytes loaded (arguments, streamed activations), stored (outputs, activations
    read after the next phase) and gathered over IPU-Links (replicated tensor sharding)."""
    replicated = replicated or set()
    count = len(plan.bounds.bounds)
    loads, stores, gathers = [0] * count, [0] * count, [0] * count
    outputs = set(program.outputs)
    inputs = set(program.inputs)
    for s in storages:
        phases = [plan.bounds.phase_of(a) for a, _ in s.spans]
        if not phases:
            continue
        share = _rts_share(s.value, replicas, replicated)
        is_input = s.value in inputs
        loaded = phases if is_input else phases[1:]
        for phase in loaded:
            loads[phase] += share
            if s.value in replicated and replicas > 1:
                gathers[phase] += ring_bytes("all_gather", s.value.nbytes, replicas)[0]
        if s.value in outputs or (len(phases) > 1 and not is_input):
            stores[phases[0]] += share
    return [PhaseStream(*t) for t in zip(loads, stores, gathers, strict=True)]


def streaming_capacity_needed(
    program: Program,
    replicas: int,
    replicated: set[Value],
    storages: Sequence[Storage],
    plan: PhasePlan,
) -> int:
    """The most bytes one IPU keeps in streaming memory at once: its share of every argument
    and output (both, as if nothing were updated in place), plus the activations stored between
    phases that are still to be loaded, at the phase where those peak."""
    kept = set(program.inputs) | set(program.outputs)
    resident = 0
    count = len(plan.bounds.bounds)
    stored = [0] * (count + 1)  # difference array over phases
    for s in storages:
        share = _rts_share(s.value, replicas, replicated)
        if s.value in kept:
            resident += share
        elif len(s.spans) > 1:
            first = plan.bounds.phase_of(s.spans[0][0])
            last = plan.bounds.phase_of(s.spans[-1][0])
            stored[first] += share
            stored[last + 1] -= share
    peak, running = 0, 0
    for delta in stored[:count]:
        running += delta
        peak = max(peak, running)
    return resident + peak


def phase_summary(
    plan: PhasePlan,
    compute: Sequence[int],
    streams: Sequence[PhaseStream],
    target: Target,
    link_cycles: Mapping[int, int],
) -> list[tuple[int, int, int]]:
    """(cycles, stream cycles, overlapped cycles) per phase. Without IO tiles a phase loads,
    computes and stores in turn; with them, its loads and the previous phase's stores run
    while the previous phase computes, so only what compute does not cover is exposed."""
    out = []
    for p, (work, stream) in enumerate(zip(compute, streams, strict=True)):
        moving = target.streaming_cycles(stream.load_bytes + stream.store_bytes)
        moving += link_cycles.get(p, 0)
        hidden = min(moving, compute[p - 1]) if target.io_tiles and p > 0 else 0
        out.append((work + moving - hidden, moving, hidden))
    return out
