"""The matmul planner's search evaluates splits in order of a floor under their cycles and stops
when the next floor is above the best found; it must choose exactly what evaluating every split
chooses, under any budget. The floor holds because every vertex estimate is at least the
products at the AMP's peak rate."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from partitioner.target import Target
from partitioner.tiles.matmul_plan import (
    _block_bytes,
    _evaluate,
    _floor,
    _Space,
    _vertex_cycles,
    problem,
)

TARGETS = {"bow": Target.bow(), "mk1": Target.mk1(), "bow64": Target.bow().with_tiles(64)}
DTYPES = (np.float16, np.float32, np.int8)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["bow", "mk1"]),
    st.sampled_from([np.float16, np.float32]),
    st.tuples(*(st.integers(1, n) for n in (8, 3000, 600, 600))),
)
def test_every_vertex_estimate_is_at_least_the_peak_rate(
    name: str, dtype: type, block: tuple[int, int, int, int]
) -> None:
    target = TARGETS[name]
    p = problem(*block, dtype, 4)
    cycles, _, _ = _vertex_cycles(p, block, target)
    per_cycle = (
        target.amp_flops_per_cycle_half if dtype == np.float16 else target.amp_flops_per_cycle_float
    )
    assert cycles * per_cycle >= 2 * np.prod(block, dtype=np.int64)


def _exhaustive(space: _Space, budget: int) -> tuple:
    plans = [_evaluate(space.problem, *entry, space.target) for entry in space.tried]
    fitting = [
        (p.cycles, p.tiles, i) for i, p in enumerate(plans) if p.temp_bytes_per_tile <= budget
    ]
    smallest = min(range(len(plans)), key=lambda i: plans[i].temp_bytes_per_tile)
    return (plans[min(fitting)[2]] if fitting else None), plans[smallest]


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(sorted(TARGETS)),
    st.sampled_from(DTYPES),
    st.tuples(st.integers(1, 16), st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096)),
    st.sampled_from([(False, False), (True, False), (False, True)]),
    st.integers(256, 600_000),
)
def test_the_bounded_search_chooses_what_evaluating_every_split_chooses(
    name: str, dtype: type, sizes: tuple[int, int, int, int], rearrange: tuple, budget: int
) -> None:
    target = TARGETS[name]
    itemsize = 4
    p = problem(*sizes, dtype, itemsize, np.dtype(dtype) if dtype != np.int8 else None, rearrange)
    space = _Space(p, target)
    fastest, smallest = _exhaustive(space, budget)
    assert space.fastest(budget) == fastest
    assert space.smallest() == smallest
    # and the floors are floors
    for index, plan in space.plans.items():
        split = space.tried[index][0]
        assert _floor(p, split, target, *_block_bytes(p, split)) <= plan.cycles
