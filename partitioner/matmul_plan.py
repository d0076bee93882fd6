"""Planning a matmul over tiles, as PopLibs plans it.

PopLibs treats a matmul as a 1x1 convolution and splits its batch (B), rows (M), columns (N) and
contraction (K) over tiles; a K split makes partial sums that further supersteps reduce across
tiles, and a serial split of K runs a loop of smaller matmuls to save memory. It picks the split
with the fewest estimated cycles whose temporaries fit `available_memory_proportion` of a tile
(docs/target.md, "Tile memory and mapping"). This module does the same search,
with the cost formulas of the `Target`, so the plan is chosen by the cycles it will be charged.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from partitioner.cost.compute import matmul_cycles, vector_cycles
from partitioner.cost.exchange import exchange_cycles
from partitioner.target import Target


@dataclass(frozen=True, slots=True)
class MatmulPlan:
    """A split of [B, M, K] x [B, K, N] over `b * m * n * k` tiles, K in `serial` chunks."""

    b: int
    m: int
    n: int
    k: int
    serial: int
    cycles: int
    temp_bytes_per_tile: int

    @property
    def tiles(self) -> int:
        return self.b * self.m * self.n * self.k


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _candidates(size: int, tiles: int) -> list[int]:
    """Splits worth trying: powers of two below the size, and the size itself if it fits."""
    found = {1 << i for i in range(int(math.log2(max(1, min(size, tiles)))) + 1)}
    if size <= tiles:
        found.add(size)
    return sorted(found)


_SERIAL = (1, 2, 4, 8, 16)
_MORE_SERIAL = (32, 64, 128)  # when memory is short in a phase (`serialised`)


def _serial_candidates(k_block: int, splits: tuple[int, ...] = _SERIAL) -> list[int]:
    return [s for s in splits if k_block % s == 0]


@dataclass(frozen=True, slots=True)
class _Problem:
    batch: int
    rows: int
    cols: int
    depth: int
    in_itemsize: int
    partial_itemsize: int
    in_dtype: np.dtype


def _evaluate(p: _Problem, split: tuple[int, ...], serial: int, t: Target) -> MatmulPlan:
    b, m, n, k = split
    bb, mb, nb, kb = _ceil(p.batch, b), _ceil(p.rows, m), _ceil(p.cols, n), _ceil(p.depth, k)
    in_bytes = (bb * mb * kb + bb * kb * nb) * p.in_itemsize
    partial_bytes = bb * mb * nb * p.partial_itemsize
    cycles = exchange_cycles(t, in_bytes) + t.sync_cycles
    cycles += matmul_cycles(t, 2 * bb * mb * nb * kb, p.in_dtype)
    cycles += (serial - 1) * t.compute_set_overhead_cycles
    if k > 1:  # partials reduced on the output tiles: receive k blocks, add them up
        cycles += exchange_cycles(t, k * partial_bytes) + t.sync_cycles
        cycles += vector_cycles(t, k * bb * mb * nb, np.dtype(np.float32))
    temp = in_bytes // serial + partial_bytes * (2 if k > 1 else 1)
    return MatmulPlan(b, m, n, k, serial, cycles, temp)


@functools.lru_cache(maxsize=4096)
def plan_matmul(
    batch: int,
    rows: int,
    cols: int,
    depth: int,
    in_dtype: np.dtype,
    partial_itemsize: int,
    target: Target,
) -> MatmulPlan:
    """The fastest split whose temporaries fit the tile budget; if none fits, the smallest."""
    problem = _Problem(
        batch, rows, cols, depth, np.dtype(in_dtype).itemsize, partial_itemsize, np.dtype(in_dtype)
    )
    tiles = target.tiles_per_ipu
    sizes = (batch, rows, cols, depth)
    best: MatmulPlan | None = None
    smallest: MatmulPlan | None = None
    for split in itertools.product(*(_candidates(s, tiles) for s in sizes)):
        if math.prod(split) > tiles:
            continue
        for serial in _serial_candidates(_ceil(depth, split[3])):
            plan = _evaluate(problem, split, serial, target)
            if smallest is None or plan.temp_bytes_per_tile < smallest.temp_bytes_per_tile:
                smallest = plan
            if plan.temp_bytes_per_tile <= target.matmul_memory_budget and (
                best is None or (plan.cycles, plan.tiles) < (best.cycles, best.tiles)
            ):
                best = plan
    if best is not None:
        best = _stretched(problem, best, target)
    chosen = best or smallest
    assert chosen is not None  # the all-ones split is always a candidate
    return chosen


def _stretched(problem: _Problem, plan: MatmulPlan, target: Target) -> MatmulPlan:
    """The plan with one dimension split further, to use the tiles a power-of-two grid leaves
    idle (1,472 = 23 x 64), when that is faster and fits: PopLibs searches uneven splits too."""
    tiles = target.tiles_per_ipu
    sizes = (problem.batch, problem.rows, problem.cols, problem.depth)
    split = (plan.b, plan.m, plan.n, plan.k)
    best = plan
    for dim, size in enumerate(sizes):
        others = math.prod(split) // split[dim]
        wider = min(size, tiles // others)
        if wider <= split[dim]:
            continue
        candidate = (*split[:dim], wider, *split[dim + 1 :])
        for serial in _serial_candidates(_ceil(problem.depth, candidate[3])):
            trial = _evaluate(problem, candidate, serial, target)
            if trial.temp_bytes_per_tile <= target.matmul_memory_budget and (
                trial.cycles < best.cycles
            ):
                best = trial
    return best


def serialised(
    batch: int,
    rows: int,
    cols: int,
    depth: int,
    in_dtype: np.dtype,
    partial_itemsize: int,
    target: Target,
    budget: int,
) -> MatmulPlan:
    """The planned split with K in more serial chunks, the fewest whose temporaries fit
    `budget` bytes per tile (or the most there are): what PopLibs plans when given less
    memory, keeping the output's layout, since the grid of tiles is unchanged."""
    plan = plan_matmul(batch, rows, cols, depth, in_dtype, partial_itemsize, target)
    problem = _Problem(
        batch, rows, cols, depth, np.dtype(in_dtype).itemsize, partial_itemsize, np.dtype(in_dtype)
    )
    split = (plan.b, plan.m, plan.n, plan.k)
    choices = _serial_candidates(_ceil(depth, plan.k), _SERIAL + _MORE_SERIAL)
    best = plan
    for serial in (s for s in choices if s > plan.serial):
        best = _evaluate(problem, split, serial, target)
        if best.temp_bytes_per_tile <= budget:
            break
    return best
