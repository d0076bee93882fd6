"""Cutting a run of tasks into phases where the fewest bytes cross between them
(`min_crossing_cuts`), each phase touching at most a byte budget: how `phases="auto"` splits a
program without named scopes, and how a phase that does not fit the tile memory is cut.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from lowering import Value
from partitioner.memory.liveness import PhaseBounds
from partitioner.phases.plan import PhasePlan
from partitioner.program import Program, Task
from partitioner.target import Target


def broadcast_views(program: Program) -> set[Value]:
    """Broadcasts: views of their sources, never stored, so never counted as crossing."""
    return {v for t in program.tasks if t.op.name == "broadcast_in_dim" for v in t.op.results}


def _touches(task: Task, views: set[Value]) -> list[Value]:
    return [v for v in (*task.reads, *task.op.results) if v not in views]


def view_sources(tasks: Sequence[Task]) -> dict[Value, Value]:
    """Each broadcast's result and the value it is a view of (through chains of broadcasts)."""
    sources: dict[Value, Value] = {}
    for task in tasks:
        if task.op.name == "broadcast_in_dim":
            sources[task.op.results[0]] = sources.get(task.inputs[0], task.inputs[0])
    return sources


def crossing_at(
    tasks: Sequence[Task], views: set[Value], sources: dict[Value, Value] | None = None
) -> list[int]:
    """crossing_at[c]: bytes of the values touched both before and at or after position c (an
    activation stored and loaded, or an argument loaded twice) if a phase boundary sat there.
    With `sources` (`view_sources`), touching a view touches its source instead: a view is made
    where it is read, from a source that must be there."""
    first: dict[Value, int] = {}
    last: dict[Value, int] = {}
    for i, task in enumerate(tasks):
        for touched in _touches(task, views):
            value = sources.get(touched, touched) if sources else touched
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
    crossing = crossing_at(tasks, views)
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


def touched_bytes(tasks: Sequence[Task], views: set[Value]) -> int:
    return sum(v.nbytes for v in {v for task in tasks for v in _touches(task, views)})


def cut_phases(
    program: Program, plan: PhasePlan, budgets: dict[int, float], target: Target
) -> PhasePlan:
    """The phases in `budgets` cut, each into runs within its budget."""
    views = broadcast_views(program)
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
