"""A pipeline's stage memory found once and kept (`stage_memory.StageViews`) is what a fresh
sweep finds: over a program `fit_stages` re-planned, each stage's program, memory and tasks'
excess equal those swept anew, and a stage whose tasks no re-plan touched keeps its view. The
stage programs built from `stage_sends` (one pass for every stage) equal `stage_program`'s, and
the update's depth-first order equals the straightforward search's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowering import Op, Value, fuse_elementwise, lower
from partitioner.layout import Layout
from partitioner.memory.tiles import task_excess
from partitioner.pipelines.microbatch import per_microbatch
from partitioner.pipelines.pipeline import Pipeline
from partitioner.pipelines.stage_memory import StageViews, fit_stages, stage_memory
from partitioner.pipelines.stage_program import (
    _depth_first,
    ordered_stage_program,
    stage_order,
    stage_program,
    stage_sends,
)
from partitioner.pipelines.stages import StageSplit, split_stages
from partitioner.program import Program, Task
from partitioner.tiles.schedule import schedule
from tests.helpers import layered_step, spec, target

# 16 tiles of 60,000 B: the first two of three stages of a 64-wide, 256-sample model are over,
# so `fit_stages` re-plans their matmuls, and the last is within (its tasks stay as they are).
TARGET = dataclasses.replace(target(16), bytes_per_tile=60_000)
WIDTH, BATCH, LAYERS, STAGES = 64, 256, 8, 3


@pytest.fixture(scope="module")
def staged() -> tuple[Program, StageSplit]:
    params = {
        "embed": spec((8, WIDTH)),
        "layers": [spec((WIDTH, WIDTH)) for _ in range(LAYERS)],
        "head": spec((WIDTH, 4)),
    }
    graph = fuse_elementwise(lower(layered_step(), params, spec((BATCH, 8))))
    program = schedule(graph, TARGET)
    batch = [i for i, v in enumerate(graph.inputs) if v.shape == (BATCH, 8)]
    pipeline = Pipeline("pp", "auto", 4)
    return program, split_stages(program, pipeline, STAGES, per_microbatch(graph, batch))


def _fields(program: Program) -> tuple:
    """A program's fields and its tasks' and ops', by value (a task's kernel is left out: a
    re-planned matmul's is made anew, as a recomputed task's op)."""
    tasks = tuple(
        tuple(_value(getattr(t, f.name)) for f in dataclasses.fields(t) if f.name != "kernel")
        for t in program.tasks
    )
    kept = (f.name for f in dataclasses.fields(program) if f.name != "tasks")
    return (*(getattr(program, name) for name in kept), tasks)


def _value(field: object) -> object:
    if isinstance(field, Op):
        return tuple(getattr(field, f.name) for f in dataclasses.fields(field))
    return field


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("offchip", [False, True])
def test_kept_views_are_fresh_views_of_the_replan(
    staged: tuple[Program, StageSplit], recompute: bool, offchip: bool
) -> None:
    """Swept, re-planned, swept again through one `StageViews`: each stage as a fresh sweep
    of the re-planned program finds it, the untouched last stage's view kept as it was."""
    program, split = staged
    pipe = Pipeline("pp", "auto", 4, recompute=recompute, optimizer_state_offchip=offchip)
    views = StageViews(split, pipe, TARGET)
    before = [views.view(program, s) for s in range(split.stages)]
    for s in range(split.stages):
        views.memory(program, s)
    fitted = fit_stages(program, split, pipe, TARGET, views=views)
    assert fitted is not program  # matmuls re-planned: the test exercises the reuse
    touched = []
    for s in range(split.stages):
        touched.append(any(fitted.tasks[i] is not program.tasks[i] for i in split.indices(s)))
        assert (views.view(fitted, s) is before[s]) != touched[s]
        own, memory = views.memory(fitted, s)
        fresh_own, fresh = stage_memory(fitted, split, s, pipe, TARGET)
        assert _fields(own) == _fields(fresh_own)
        for name in ("always_live", "not_always_live", "peak_task", "total"):
            np.testing.assert_array_equal(getattr(memory, name), getattr(fresh, name))
        assert memory.phase_peaks == fresh.phase_peaks
        assert memory.storages == fresh.storages
        view = views.view(fitted, s)
        expected = task_excess(fresh_own, TARGET, view.bounds, view.stash)
        assert views.excess(fitted, s) == expected
    assert touched == [True, True, False]


def test_stage_programs_from_stage_sends(staged: tuple[Program, StageSplit]) -> None:
    """What each stage sends, found for all stages at once, makes the stage's own program."""
    program, split = staged
    sends = stage_sends(program, split)
    for s in range(split.stages):
        order = stage_order(program, split, s)
        ours = ordered_stage_program(program, split, s, order, sends[s])
        assert _fields(ours) == _fields(stage_program(program, split, s))
        assert ours.outputs  # the stages send each other activations and gradients


def _straightforward(program: Program, indices: list[int]) -> list[int]:
    """`_depth_first` as first written: a stack of (task, expanded) pairs."""
    chosen = set(indices)
    maker = {v: i for i in indices for v in program.tasks[i].op.results}
    read = {v for i in indices for v in program.tasks[i].inputs}
    order: list[int] = []
    done: set[int] = set()
    for sink in indices:
        if any(v in read for v in program.tasks[sink].op.results):
            continue
        stack = [(sink, False)]
        while stack:
            i, expanded = stack.pop()
            if i in done:
                continue
            if expanded:
                done.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            for value in reversed(program.tasks[i].inputs):
                j = maker.get(value)
                if j is not None and j in chosen and j not in done:
                    stack.append((j, False))
    order += [i for i in indices if i not in done]
    return order


def _dag(reads: list[list[int]]) -> Program:
    """Task i makes value i and reads the values `reads[i]` (earlier ones, repeats allowed)."""
    values = [Value(i, (1,), np.dtype(np.float32)) for i in range(len(reads))]
    layout = Layout((1,), (1,), (1,))
    tasks = tuple(
        Task(
            Op("add", tuple(values[j] for j in js), (values[i],)),
            tuple(values[j] for j in js),
            (layout,) * len(js),
            (layout,),
            lambda *a: a,
        )
        for i, js in enumerate(reads)
    )
    return Program((), (), tasks, (), dict.fromkeys(values, layout), 1)


@st.composite
def _dags(draw: st.DrawFn) -> tuple[Program, list[int]]:
    count = draw(st.integers(1, 30))
    reads = [
        draw(st.lists(st.integers(0, max(0, i - 1)), max_size=3)) if i else [] for i in range(count)
    ]
    chosen = sorted(draw(st.sets(st.integers(0, count - 1), min_size=1)))
    return _dag(reads), chosen


@given(_dags())
def test_depth_first_is_the_straightforward_search(case: tuple[Program, list[int]]) -> None:
    """On random programs and random choices of their tasks, the same order."""
    program, indices = case
    assert _depth_first(program, indices) == _straightforward(program, indices)
