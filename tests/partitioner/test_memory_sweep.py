"""The tile-memory sweep by difference arrays (blocks of tasks, segments of tiles) against the
task-by-task sweep it replaced, on random storages, spans and temporaries; the matmul planner's
ranked candidates against the exhaustive search under any budget."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lowering import Value
from partitioner.layout import Layout
from partitioner.memory.liveness import PhaseBounds, Storage
from partitioner.memory.tiles import _live_by_task
from partitioner.program import TileBytes
from partitioner.target import Target
from partitioner.tiles.matmul_plan import (
    _candidates,
    _evaluate,
    _plan,
    _serial_candidates,
    _stretched,
    problem,
)

TILES = 24


def _naive(tasks: list, found: list[Storage], tiles: int) -> np.ndarray:
    """Live bytes per task and tile, one task at a time, as ipujax swept before."""
    rows = []
    for index, task in enumerate(tasks):
        now = np.zeros(tiles, np.int64)
        for s in found:
            if s.always_live:
                continue
            for a, b in s.spans:
                if a <= index <= min(b, len(tasks) - 1):
                    now[s.layout.start : s.layout.stop] += s.bytes_per_tile
        for temp in task.temporaries:
            now[temp.start : temp.start + temp.tiles] += temp.bytes_per_tile
        rows.append(now)
    return np.array(rows, np.int64).reshape(len(tasks), tiles)


@st.composite
def sweeps(draw: st.DrawFn) -> tuple[list, list[Storage]]:
    count = draw(st.integers(1, 600))  # more than one block of tasks
    found = []
    for i in range(draw(st.integers(0, 12))):
        start = draw(st.integers(0, TILES - 1))
        tiles = draw(st.integers(1, TILES - start))
        elements = draw(st.integers(1, 64)) * tiles
        layout = Layout((elements,), (elements,), (tiles,), start)
        spans = []
        for _ in range(draw(st.integers(0, 3))):
            a = draw(st.integers(0, count + 2))
            spans.append((a, draw(st.integers(a, count + 5))))
        value = Value(i, (elements,), np.dtype(np.float32))
        found.append(Storage(value, layout, tuple(spans), draw(st.booleans())))
    tasks = []
    for _ in range(count):
        temps = []
        if draw(st.integers(0, 9)) == 0:
            start = draw(st.integers(0, TILES - 1))
            temps.append(
                TileBytes(start, draw(st.integers(1, TILES - start)), draw(st.integers(1, 999)))
            )
        tasks.append(SimpleNamespace(temporaries=tuple(temps)))
    return tasks, found


@settings(max_examples=60, deadline=None)
@given(sweeps())
def test_the_block_sweep_equals_the_task_by_task_sweep(case: tuple[list, list[Storage]]) -> None:
    tasks, found = case
    sweep = _live_by_task(SimpleNamespace(tasks=tasks), tuple(found), TILES)  # type: ignore[arg-type]
    blocks = [(b.first, sweep.per_tile(b.spread(b.live))) for b in sweep.blocks()]
    assert [first for first, _ in blocks] == list(range(0, len(tasks), 256))
    got = np.concatenate([live for _, live in blocks])
    np.testing.assert_array_equal(got, _naive(tasks, found, TILES))


def test_phase_of_looks_up_what_it_searched() -> None:
    bounds = PhaseBounds([(0, 3), (3, 4), (4, 9)])
    assert [bounds.phase_of(t) for t in range(-1, 11)] == [0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2]


def _exhaustive(p, target: Target, budget: int):  # type: ignore[no-untyped-def]
    """The planner's search as it was: every split and serial count, in order."""
    sizes = (p.batch, p.rows, p.cols, p.depth)
    best = smallest = None
    for split in itertools.product(*(_candidates(s, target.tiles_per_ipu) for s in sizes)):
        if math.prod(split) > target.tiles_per_ipu:
            continue
        for serial in _serial_candidates(-(-p.depth // split[3])):
            plan = _evaluate(p, split, serial, target)
            if smallest is None or plan.temp_bytes_per_tile < smallest.temp_bytes_per_tile:
                smallest = plan
            if plan.temp_bytes_per_tile <= budget and (
                best is None or (plan.cycles, plan.tiles) < (best.cycles, best.tiles)
            ):
                best = plan
    return _stretched(p, best, target, budget) if best is not None else smallest


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 700),
    st.integers(1, 700),
    st.integers(1, 700),
    st.sampled_from([np.float16, np.float32]),
    st.integers(0, 700_000),
)
def test_planning_under_a_budget_equals_the_exhaustive_search(
    batch: int, rows: int, cols: int, depth: int, dtype: type, budget: int
) -> None:
    target = Target.bow().with_tiles(64)
    p = problem(batch, rows, cols, depth, np.dtype(dtype), 4)
    assert _plan(p, target, budget) == _exhaustive(p, target, budget)
