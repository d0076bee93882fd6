"""Phased execution, as PopXL runs Graphcore's GPT-3: a program too large for the chip runs as a
sequence of phases, one forward and one backward phase per block, then optimizer phases, its
weights and optimizer state in streaming memory (docs/phases.md).

Splitting by name (`phases=["layer0", ...]`):
- a task belongs to the block of the `jax.named_scope` it sits in, forward or backward: jax
  names the backward ops of a scope `transpose(jvp(layer0))`. Every task of one block and
  direction is one phase, wherever it sits in program order, so the micro-batches of an
  unrolled gradient accumulation share their layer's phases (phase-major, as PopXL runs them).
  Phases run in the order their blocks first appear; if that order would run a task before
  something it reads (a scope reused further on), each contiguous run of a block is a phase.
- a task in no named scope joins the latest phase that makes one of its operands. When that
  phase comes after the last phase of the block the task belongs with (its home: the block of
  its largest operand, e.g. a weight's update belongs with the weight's layer), the task goes to
  that block's optimizer phase instead, after every backward phase: an optimizer that needs the
  global gradient norm updates each layer in a phase of its own, as PopXL's does. Scalars stay
  where they are made. Views and sources (broadcasts, iotas, constants), widening conversions
  and tasks that read only arguments join their first reader's phase.

Automatically (`phases="auto"`): the program's own named scopes, when it has any, are its
blocks; a program with no scopes is cut where the fewest bytes cross between phases
(`min_crossing_cuts`), each phase within a byte budget. Either way, a phase that does not fit
the tile memory has its matmuls planned with less temporary memory, as a PopLibs user lowers
`availableMemoryProportion`, and if it still does not fit it is cut where the fewest bytes
cross (`_fitted`).

What phases stream, and what that costs, is `cost.streaming`'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lowering import Value
from partitioner.errors import ConfigError
from partitioner.memory import PhaseBounds, tile_memory, value_uses
from partitioner.program import Program, Task
from partitioner.target import Target
from partitioner.tile_rules.matmul import shrunk_by

AUTO_SHARE = 0.25  # of an IPU's memory: the bytes a phase touches, when cutting without scopes
TINY_BYTES = 4096  # results this small (norms, scales) stay in the phase that makes them
# Views and sources: Poplar makes them where they are read, so they run in their reader's phase.
FLOATING = frozenset({"broadcast_in_dim", "iota", "constant"})
# Names in jax's name stack that are not the user's scopes.
_JAX_NAMES = frozenset(
    {"jvp", "transpose", "vmap", "checkpoint", "rematted_computation", "remat", "while", "body"}
)
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


@dataclass(frozen=True, slots=True)
class PhasePlan:
    names: tuple[str, ...]
    bounds: PhaseBounds


# ---- scopes ------------------------------------------------------------------------------------


def _words(scope: str) -> list[str]:
    """The user's scope names in a name-stack path, transformation wrappers opened
    (`jit(step)/transpose(jvp(layer0))/dot_general` -> ["layer0"]); jit roots and the primitive
    (the last element) are not scopes."""
    parts = scope.split("/")[1:-1]
    words = []
    for part in parts:
        if part.startswith(("jit(", "pjit(")):
            continue
        words += [w for w in re.split(r"[()]", part) if w and w not in _JAX_NAMES]
    return words


def direction(scope: str) -> str:
    return BACKWARD if "transpose(" in scope else FORWARD


def scope_blocks(program: Program) -> list[str]:
    """The program's own named scopes that are blocks: the outermost user scope of each task,
    in order of first appearance."""
    seen: dict[str, None] = {}
    for task in program.tasks:
        words = _words(task.op.loc.scope)
        if words:
            seen.setdefault(words[0], None)
    return list(seen)


def block_label(task: Task, names: Sequence[str]) -> str | None:
    words = _words(task.op.loc.scope)
    for name in names:
        if name in words:
            return name
    return None


# ---- splitting by name -------------------------------------------------------------------------


class _Keys:
    """Phase keys (block, kind, run) in phase order, each with its index."""

    def __init__(self, keys: Iterable[Any]) -> None:
        self.keys = list(dict.fromkeys(keys))
        self._at = {key: i for i, key in enumerate(self.keys)}

    def index(self, key: Any) -> int:
        """The key's phase, a new last phase for a key not seen before."""
        if key not in self._at:
            self._at[key] = len(self.keys)
            self.keys.append(key)
        return self._at[key]


def split_by_names(program: Program, names: Sequence[str]) -> tuple[Program, PhasePlan]:
    """One phase per block and direction (phase-major), then optimizer phases; contiguous runs
    when grouping would break the program's order. Tasks are reordered phase by phase."""
    labels = [block_label(task, names) for task in program.tasks]
    if not any(labels):
        raise ValueError(f"no op is in a named scope called any of {list(names)}")
    phase_of, keys = _assign(program, labels, contiguous=False)
    if phase_of is None:
        phase_of, keys = _assign(program, labels, contiguous=True)
    assert phase_of is not None  # contiguous runs always keep the program's order
    return _reordered(program, phase_of, [_title(k, keys) for k in keys])


def _keys_in_order(labels: list[str | None], program: Program, contiguous: bool) -> list[Any]:
    """Each named task's (block, direction, run) key."""
    out: list[Any] = []
    runs: dict[tuple[str, str], int] = {}
    last: tuple[str, str] | None = None
    for label, task in zip(labels, program.tasks, strict=True):
        if label is None:
            out.append(None)
            continue
        pair = (label, direction(task.op.loc.scope))
        if contiguous and pair != last:
            runs[pair] = runs.get(pair, -1) + 1
        last = pair
        out.append((*pair, runs.get(pair, 0)))
    return out


def _assign(
    program: Program, labels: list[str | None], contiguous: bool
) -> tuple[list[int] | None, list[Any]]:
    """Each task's phase index, or None when a task would run before what it reads."""
    task_keys = _keys_in_order(labels, program, contiguous)
    keys = _Keys(k for k in task_keys if k is not None)
    named_phases = len(keys.keys)
    homes = home_blocks(program, labels)
    last_of = {key[0]: i for i, key in enumerate(keys.keys)}
    made_in: dict[Value, int] = {}
    floating: set[Value] = set()  # results of tasks that run in their first reader's phase
    sourced: set[Value] = set()  # of those, the ones made from arguments and constants only
    phase_of: list[int] = []
    for task, key in zip(program.tasks, task_keys, strict=True):
        earliest = max((made_in[v] for v in task.inputs if v in made_in), default=0)
        if key is not None:
            phase = keys.index(key)
            if phase < earliest:
                return None, keys.keys
        elif _floats(task, made_in, sourced):
            floating.update(task.op.results)
            if all(v not in made_in or v in sourced for v in task.inputs):
                sourced.update(task.op.results)
            phase = earliest
        else:
            home = homes.get(task.op.results[0]) if task.op.results else None
            phase = earliest
            if home is not None and earliest > last_of[home] and not _tiny(task):
                # It waits for a phase after its home block's last: its optimizer phase.
                phase = max(keys.index((home, OPTIMIZER, 0)), earliest, named_phases)
        phase_of.append(phase)
        made_in.update(dict.fromkeys(task.op.results, phase))
    _float_to_readers(program, phase_of, floating)
    return phase_of, keys.keys


def _floats(task: Task, made_in: dict[Value, int], sourced: set[Value]) -> bool:
    """Views and sources, widening conversions (storing the narrower value streams less), and
    tasks that read only arguments, constants and what is made from them alone: they run in
    their first reader's phase."""
    if task.op.name in FLOATING or _widens(task):
        return True
    return all(v not in made_in or v in sourced for v in task.inputs)


def _widens(task: Task) -> bool:
    op = task.op
    return op.name == "convert" and op.results[0].nbytes > op.operands[0].nbytes


def _tiny(task: Task) -> bool:
    return all(v.nbytes <= TINY_BYTES for v in task.op.results)


def home_blocks(program: Program, labels: list[str | None]) -> dict[Value, str]:
    """Each value's home block: a named task's results are its block's; an argument belongs to
    the block that reads it first; an unnamed task's results to the home of its largest operand
    that has one (a broadcast weighs what its source does: it is a view)."""
    homes: dict[Value, str] = {}
    weight: dict[Value, int] = {}
    for task, label in zip(program.tasks, labels, strict=True):
        if task.op.name == "broadcast_in_dim":
            weight[task.op.results[0]] = weight.get(task.inputs[0], task.inputs[0].nbytes)
        if label is not None:
            for value in task.inputs:
                homes.setdefault(value, label)
            homes.update(dict.fromkeys(task.op.results, label))
            continue
        homed = [v for v in task.inputs if v in homes]
        if homed:
            biggest = max(homed, key=lambda v: weight.get(v, v.nbytes))
            homes.update(dict.fromkeys(task.op.results, homes[biggest]))
    return homes


def _float_to_readers(program: Program, phase_of: list[int], floating: set[Value]) -> None:
    """Floating tasks run in the first phase that reads them (never before their producers)."""
    readers: dict[Value, int] = {}
    for index in range(len(program.tasks) - 1, -1, -1):
        task = program.tasks[index]
        if task.op.results and task.op.results[0] in floating:
            later = [readers[v] for v in task.op.results if v in readers]
            phase_of[index] = max(phase_of[index], min(later, default=phase_of[index]))
        for value in task.inputs:
            readers[value] = min(readers.get(value, phase_of[index]), phase_of[index])


def _title(key: Any, keys: list[Any]) -> str:
    block, kind, run = key
    runs = sum(1 for k in keys if k[:2] == (block, kind))
    title = block if kind == FORWARD else f"{block} ({kind})"
    return f"{title} [{run + 1}]" if runs > 1 else title


def _reordered(
    program: Program, phase_of: list[int], titles: list[str]
) -> tuple[Program, PhasePlan]:
    """Tasks sorted by phase (program order within one), empty phases dropped."""
    order = sorted(range(len(program.tasks)), key=lambda i: (phase_of[i], i))
    tasks = tuple(program.tasks[i] for i in order)
    bounds: list[tuple[int, int]] = []
    names: list[str] = []
    start = 0
    sorted_phases = [phase_of[i] for i in order]
    for phase, title in enumerate(titles):
        stop = start
        while stop < len(tasks) and sorted_phases[stop] == phase:
            stop += 1
        if stop > start:
            bounds.append((start, stop))
            names.append(title)
        start = stop
    plan = PhasePlan(tuple(names), PhaseBounds(bounds))
    return dataclasses.replace(program, tasks=tasks), plan


# ---- cutting where the fewest bytes cross ----------------------------------------------------


def _views(program: Program) -> set[Value]:
    """Broadcasts: views of their sources, never stored, so never counted as crossing."""
    return {v for t in program.tasks if t.op.name == "broadcast_in_dim" for v in t.op.results}


def _touches(task: Task, views: set[Value]) -> list[Value]:
    return [v for v in (*task.inputs, *task.op.results) if v not in views]


def _crossing(tasks: Sequence[Task], views: set[Value]) -> list[int]:
    """crossing[c]: bytes of the values touched both before and at or after position c (an
    activation stored and loaded, or an argument loaded twice) if a phase boundary sat there."""
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    for i, task in enumerate(tasks):
        for value in _touches(task, views):
            first.setdefault(value, i)
            last[value] = i
    delta = [0] * (len(tasks) + 1)
    for value, a in first.items():
        b = last[value]
        if b > a:
            delta[a + 1] += value.nbytes
            delta[b + 1] -= value.nbytes
    out, running = [], 0
    for d in delta[:-1]:
        running += d
        out.append(running)
    return out


class _Touched:
    """A sliding run of tasks [lo, end) and the distinct bytes they touch."""

    def __init__(self, tasks: Sequence[Task], views: set[Value]) -> None:
        self.tasks, self.views = tasks, views
        self.counts: dict[Value, int] = {}
        self.bytes = 0
        self.lo = 0

    def extend(self, task: Task) -> None:
        for value in _touches(task, self.views):
            self.counts[value] = self.counts.get(value, 0) + 1
            if self.counts[value] == 1:
                self.bytes += value.nbytes

    def shrink(self, budget: float, end: int) -> None:
        """Drops tasks from the front until the run fits `budget` (or one task is left)."""
        while self.bytes > budget and self.lo < end - 1:
            for value in _touches(self.tasks[self.lo], self.views):
                self.counts[value] -= 1
                if not self.counts[value]:
                    del self.counts[value]
                    self.bytes -= value.nbytes
            self.lo += 1


def min_crossing_cuts(
    tasks: Sequence[Task], budget: float, penalty: int, views: set[Value]
) -> list[int]:
    """Cut points (task positions) that split `tasks` into runs each touching at most `budget`
    bytes (a single task may touch more), minimising the bytes that cross the cuts plus
    `penalty` per cut. Dynamic programming over positions with a sliding window: O(tasks)."""
    n = len(tasks)
    if n <= 1:
        return []
    crossing = _crossing(tasks, views)
    best = [0] * (n + 1)
    back = [0] * (n + 1)
    run = _Touched(tasks, views)
    window: deque[int] = deque()  # candidate starts, by increasing best[s] + cost(s)

    def cost(s: int) -> int:
        return best[s] + (crossing[s] + penalty if s > 0 else 0)

    for end in range(1, n + 1):
        run.extend(tasks[end - 1])
        while window and cost(window[-1]) >= cost(end - 1):
            window.pop()
        window.append(end - 1)
        run.shrink(budget, end)
        while window[0] < run.lo:
            window.popleft()
        back[end], best[end] = window[0], cost(window[0])
    cuts = []
    end = back[n]
    while end > 0:
        cuts.append(end)
        end = back[end]
    return cuts[::-1]


def _penalty(target: Target) -> int:
    """Bytes worth one more phase: what streaming moves during one transfer's latency."""
    seconds = target.streaming_latency_cycles / target.clock_hz
    return int(seconds * target.streaming_bytes_per_second)


def split_auto(program: Program, target: Target) -> tuple[Program, PhasePlan]:
    """The program's named scopes as blocks, a phase per block and direction; phases that do
    not fit the tile memory, or a program without scopes, cut where the fewest bytes cross."""
    blocks = scope_blocks(program)
    if blocks:
        program, plan = split_by_names(program, blocks)
    else:
        plan = PhasePlan(("phase 0",), PhaseBounds([(0, len(program.tasks))]))
        budget = AUTO_SHARE * target.bytes_per_ipu
        plan = _cut(program, plan, {0: budget}, target)
    return _fitted(program, plan, target)


def _fitted(
    program: Program, plan: PhasePlan, target: Target, rounds: int = 10
) -> tuple[Program, PhasePlan]:
    """Phases whose fullest tile is over budget fitted as a PopLibs user would: first their
    matmuls re-planned with less temporary memory (K in more serial chunks, as a lower
    `availableMemoryProportion` makes PopLibs plan), then, if still over, cut in two where the
    fewest bytes cross, and again, until every phase fits or nothing helps."""
    # A phase's matmuls are re-planned again while that keeps shrinking its excess.
    shrunk: dict[int, int] = {}
    views = _views(program)
    # Re-planning keeps every task's op, so the values' uses hold until phases are cut.
    uses = value_uses(program, plan.bounds)
    for _ in range(rounds):
        peaks = tile_memory(program, target, plan.bounds, uses=uses).phase_peaks
        over = {
            p: peak - target.bytes_per_tile
            for p, peak in enumerate(peaks)
            if peak > target.bytes_per_tile
        }
        if not over:
            break
        fresh = {p: excess for p, excess in over.items() if excess < shrunk.get(p, excess + 1)}
        if fresh:
            program = _less_memory(program, plan, fresh, target)
            shrunk.update(fresh)
            continue
        budgets = {
            p: _touched_bytes(program.tasks[a:b], views) / 2
            for p, (a, b) in enumerate(plan.bounds.bounds)
            if p in over and b - a > 1
        }
        if not budgets:
            break
        plan = _cut(program, plan, budgets, target)
        uses = value_uses(program, plan.bounds)
        shrunk = {}
    return program, plan


def _less_memory(
    program: Program, plan: PhasePlan, excess: dict[int, int], target: Target
) -> Program:
    """The matmuls of the phases in `excess` re-planned with that much less temporary memory."""
    tasks = list(program.tasks)
    producers = {v: task.op for task in tasks for v in task.op.results}
    for p, over in excess.items():
        a, b = plan.bounds.bounds[p]
        for i in range(a, b):
            tasks[i] = shrunk_by(tasks[i], over, producers, target)
    return dataclasses.replace(program, tasks=tuple(tasks))


def _touched_bytes(tasks: Sequence[Task], views: set[Value]) -> int:
    return sum(v.nbytes for v in {v for task in tasks for v in _touches(task, views)})


def _cut(program: Program, plan: PhasePlan, budgets: dict[int, float], target: Target) -> PhasePlan:
    """The phases in `budgets` cut, each into runs within its budget."""
    views = _views(program)
    bounds: list[tuple[int, int]] = []
    names: list[str] = []
    for p, ((a, b), name) in enumerate(zip(plan.bounds.bounds, plan.names, strict=True)):
        if p not in budgets:
            bounds.append((a, b))
            names.append(name)
            continue
        cuts = min_crossing_cuts(program.tasks[a:b], budgets[p], _penalty(target), views)
        edges = [a, *(a + c for c in cuts), b]
        parts = list(itertools.pairwise(edges))
        bounds += parts
        if len(parts) == 1:
            names.append(name)
        elif name.startswith("phase "):
            names += [f"phase {len(names) + i}" for i in range(len(parts))]
        else:
            names += [f"{name} {i + 1}/{len(parts)}" for i in range(len(parts))]
    if all(n.startswith("phase ") for n in names):
        names = [f"phase {i}" for i in range(len(names))]
    return PhasePlan(tuple(names), PhaseBounds(bounds))


def split_phases(program: Program, phases: Any, target: Target) -> tuple[Program, PhasePlan | None]:
    """The `phases=` option: None (or "none") keeps one program on chip, "auto" finds blocks
    and cuts, a list of `jax.named_scope` names cuts by scope."""
    if phases is None or phases == "none":
        return program, None
    if phases == "auto":
        return split_auto(program, target)
    if isinstance(phases, (list, tuple)) and phases and all(isinstance(n, str) for n in phases):
        try:
            program, plan = split_by_names(program, phases)
            return _fitted(program, plan, target)
        except ValueError as error:
            raise ConfigError(
                f"phases={list(phases)}: {error}; wrap each phase's code in "
                "jax.named_scope(name), or use phases='auto'"
            ) from None
    raise ConfigError(
        f"phases={phases!r} is not understood; use None, 'auto' or a list of jax.named_scope names"
    )


def compute_target(target: Target, phases: Any) -> Target:
    """The tiles that compute: a phased program keeps its IO tiles for streaming."""
    io = target.phase_io_tiles
    if phases is None or phases == "none" or not io:
        return target
    if io >= target.tiles_per_ipu:
        raise ConfigError(
            f"io_tiles={io} leaves no compute tiles of {target.tiles_per_ipu}; use fewer IO tiles"
        )
    return target.with_tiles(target.tiles_per_ipu - io)


def phased_hint(program: Program, target: Target) -> str:
    """Whether an unphased program that does not fit would fit in phases, with the figure."""
    program, plan = split_auto(program, target)
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
