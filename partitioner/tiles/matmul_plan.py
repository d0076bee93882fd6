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
from typing import NamedTuple

import numpy as np

from partitioner.cost.amp import amp_cycles, in_chans_per_group, partials_reduce_cycles
from partitioner.cost.copies import transpose_cycles
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.mac import mac_cycles
from partitioner.cost.vector import binary_cycles, cast_cycles
from partitioner.target import Target
from partitioner.tiles.conv_field import ConvField, block_extents, input_elements


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
    spread: int = 1  # a K split's partials reduced on k tiles per output block, N split further
    swap: bool = False  # the vertex's rows are N's and its output channels M's
    vertex: str = "amp"  # the tiles' vertex: "amp" (ConvPartial1x1Out) or "mac" (HorizontalMac)

    @property
    def tiles(self) -> int:
        return self.b * self.m * self.n * self.k

    @property
    def out_grid(self) -> tuple[int, int, int]:
        """The result's grid over [B, M, N]: the output blocks, each cut over the tiles that
        reduce its partials."""
        return (self.b, self.m, self.n * self.spread)


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
    in_dtype: np.dtype
    partial_dtype: np.dtype
    out_dtype: np.dtype
    rearrange: tuple[bool, bool]  # lhs, rhs need grouping by channels on their tiles
    field: ConvField | None = None  # a convolution's geometry: its lhs is an input field

    @property
    def in_itemsize(self) -> int:
        return self.in_dtype.itemsize

    def lhs_elements(self, split: tuple[int, ...]) -> int:
        """Elements of the lhs one tile of `split` reads: a [bb, mb, kb] block of a matmul, or
        the input field (halos included) of a convolution's block (`conv_field`)."""
        b, m, _, k = split
        bb = _ceil(self.batch, b)
        if self.field is not None:
            depth = _ceil(math.prod(self.field.depth), k)
            return bb * input_elements(self.field, _ceil(self.rows, m), depth)
        return bb * _ceil(self.rows, m) * _ceil(self.depth, k)


class TileCycles(NamedTuple):
    """One tile's cycles for a split: operands rearranged for the vertex, the vertex over
    every serial chunk, the chunks' partials added up, the K tiles' partials reduced, and the
    partials cast to the result's type; whether the vertex runs the operands swapped, and
    which vertex it is ("amp" or "mac")."""

    rearrange: int
    amp: int
    accumulate: int
    reduce: int
    cast: int
    swap: bool = False
    vertex: str = "amp"


def _spread(split: tuple[int, ...], cols: int) -> int:
    """Tiles that share each output block's reduction: the K split, at most a column each."""
    _, _, n, k = split
    return min(k, _ceil(cols, n)) if k > 1 else 1


def _regroup(elements: int, p: _Problem, t: Target) -> int:
    """An operand block regrouped so that its channels are innermost in groups the AMP takes:
    PopLibs transposes it in small [16, channels per group] matrices (`regroupTensor`, whose
    transposes are the grouping sizes), never as one large matrix."""
    group = in_chans_per_group(t, p.in_dtype)
    matrices = _ceil(elements, t.amp_out_chans * group)
    return transpose_cycles(matrices, t.amp_out_chans, group, p.in_itemsize, t)


def _is_matrix(p: _Problem) -> bool:
    """Whether a tile's block is a plain matrix to the vertices: a matmul's, or a 1x1
    convolution's with unit strides and no dilation (PopLibs flattens its field into rows)."""
    f = p.field
    if f is None:
        return True
    unit = all(s == 1 for s in (*f.strides, *f.kernel_dilation, *f.input_dilation))
    return f.kernel_positions == 1 and unit


def _mac_geometry(p: _Problem, rows: int, depth: int) -> tuple[int, int, int]:
    """How the MAC vertex sees a tile's block of `rows` outputs and `depth`: the field rows
    its outputs lie in, the input channels of each dot product, and the kernel positions it
    walks (the tile's block is a run of rows, `conv_field.block_extents`). A matrix is one row
    of `rows` outputs and `depth` channels at one position."""
    if _is_matrix(p):
        return 1, depth, 1
    assert p.field is not None
    width = max(1, round(block_extents(p.field.rows, rows)[-1]))
    _, *kernel = block_extents(p.field.depth, depth)
    positions = max(1, round(math.prod(kernel)))
    return _ceil(rows, width), _ceil(depth, positions), positions


def _vertex_cycles(p: _Problem, block: tuple[int, ...], t: Target) -> tuple[int, bool, str]:
    """The cheapest vertex for one tile's [bb, mb, kb] x [bb, kb, nb] block, as PopLibs'
    planner weighs its candidates (`getConvVertexTypeCandidates`): the AMP with the operands
    as given or swapped (the planner's `swapOperands`), and the horizontal MAC, which pays for
    output channels one at a time where the AMP pays for 16 (swapped only for a matrix).
    Returns the cycles, whether swapped, and the vertex; the AMP wins ties."""
    bb, mb, nb, kb = block
    field_rows, chans, positions = _mac_geometry(p, mb, kb)
    options = [
        (amp_cycles(mb, kb, nb, bb, p.in_dtype, t), False, "amp"),
        (amp_cycles(nb, kb, mb, bb, p.in_dtype, t), True, "amp"),
        (mac_cycles(mb, chans, nb, bb, p.in_dtype, t, field_rows, positions), False, "mac"),
    ]
    if _is_matrix(p):
        options.append((mac_cycles(nb, kb, mb, bb, p.in_dtype, t), True, "mac"))
    return min(options, key=lambda option: option[0])


def tile_cycles(p: _Problem, split: tuple[int, ...], serial: int, t: Target) -> TileCycles:
    """What PopLibs' estimators charge the busiest tile of a split (docs/target.md, "Compute"):
    the cheapest vertex over the tile's [bb, mb, kb] x [bb, kb, nb] blocks (`_vertex_cycles`:
    `ConvPartial1x1Out` or `ConvPartialHorizontalMac`, operands as given or swapped), K in
    `serial` chunks each added into the partials, a transpose of an operand whose channels
    are not innermost, and for a K split the partials reduced by the k tiles each taking a
    share of the outputs, then cast to the result's type."""
    b, m, n, k = split
    bb, mb, nb, kb = _ceil(p.batch, b), _ceil(p.rows, m), _ceil(p.cols, n), _ceil(p.depth, k)
    lhs, rhs = p.rearrange
    rearrange = (_regroup(bb * kb * mb, p, t) if lhs else 0) + (
        _regroup(bb * kb * nb, p, t) if rhs else 0
    )
    outputs = bb * mb * nb
    chunk = _ceil(kb, serial)
    swap, vertex = False, "amp"
    if p.partial_dtype.kind in "fV":
        cycles, swap, vertex = _vertex_cycles(p, (bb, mb, nb, chunk), t)
        amp = serial * cycles
    else:  # no AMP for integers: a multiply and an add per product on the vector path
        amp = serial * 2 * binary_cycles("multiply", outputs * chunk, p.partial_dtype, t)
    accumulate = 0
    if serial > 1:  # PopLibs adds each chunk in place (`addInPlaceEstimate`, x serial)
        accumulate = serial * binary_cycles("add", outputs, p.partial_dtype, t, in_place=True)
    share = bb * mb * _ceil(p.cols, n * _spread(split, p.cols))
    # The K tiles' partials reduced, the last stage writing the result's type; without a K
    # split the partials are cast (both `estimateConvReduceCycles`).
    float_out = p.out_dtype.itemsize >= 4 or p.out_dtype.kind not in "fV"
    reduce = partials_reduce_cycles(share, k, t, float_out=float_out)
    cast = 0
    if k == 1 and p.out_dtype != p.partial_dtype:
        cast = cast_cycles(outputs, p.partial_dtype, p.out_dtype, t)
    return TileCycles(rearrange, amp, accumulate, reduce, cast, swap, vertex)


def _block_bytes(p: _Problem, split: tuple[int, ...]) -> tuple[int, int]:
    """(bytes a tile's operand blocks take, its partials' bytes)."""
    b, m, n, k = split
    bb, mb, nb, kb = _ceil(p.batch, b), _ceil(p.rows, m), _ceil(p.cols, n), _ceil(p.depth, k)
    in_bytes = (p.lhs_elements(split) + bb * kb * nb) * p.in_itemsize
    return in_bytes, bb * mb * nb * p.partial_dtype.itemsize


def _temp(in_bytes: int, partial_bytes: int, serial: int, k: int) -> int:
    """A tile's temporaries: one serial chunk of its operand blocks, and its partials (twice
    for a K split, whose reduction receives them)."""
    return in_bytes // serial + partial_bytes * (2 if k > 1 else 1)


def _moves(p: _Problem, split: tuple[int, ...], in_bytes: int, partial_bytes: int, t: Target):
    """The split's exchanges and syncs: its operand blocks in, a rearrangement's sync, and for
    a K split the partials each tile receives to reduce."""
    k = split[3]
    total = exchange_cycles(t, in_bytes) + t.sync_cycles
    if any(p.rearrange):
        total += t.sync_cycles
    if k > 1:  # each tile receives the k partials of its share of an output block
        spread = _spread(split, p.cols)
        total += exchange_cycles(t, k * _ceil(partial_bytes, spread)) + t.sync_cycles
    return total


def _evaluate(p: _Problem, split: tuple[int, ...], serial: int, t: Target) -> MatmulPlan:
    b, m, n, k = split
    in_bytes, partial_bytes = _block_bytes(p, split)
    cycles = tile_cycles(p, split, serial, t)
    total = _moves(p, split, in_bytes, partial_bytes, t) + sum(cycles[:5])
    temp = _temp(in_bytes, partial_bytes, serial, k)
    spread = _spread(split, p.cols)
    return MatmulPlan(b, m, n, k, serial, total, temp, spread, cycles.swap, cycles.vertex)


def _floor(
    p: _Problem, split: tuple[int, ...], t: Target, in_bytes: int, partial_bytes: int
) -> int:
    """At most the cycles `_evaluate` charges the split with any serial count: its exchanges
    and syncs as charged, and its products at the AMP's peak rate (every vertex's estimate is
    at least that, a property tests/partitioner/test_matmul_plan_search.py checks); what else
    a tile does costs no less than nothing. `in_bytes` and `partial_bytes`: `_block_bytes`."""
    b, m, n, k = split
    products = _ceil(p.batch, b) * _ceil(p.rows, m) * _ceil(p.cols, n) * _ceil(p.depth, k)
    compute = 0
    if p.partial_dtype.kind in "fV":
        half = p.in_itemsize == 2
        per_cycle = t.amp_flops_per_cycle_half if half else t.amp_flops_per_cycle_float
        compute = products * 2 // per_cycle
    return _moves(p, split, in_bytes, partial_bytes, t) + compute


def problem(
    batch: int,
    rows: int,
    cols: int,
    depth: int,
    in_dtype: np.dtype,
    partial_itemsize: int,
    out_dtype: np.dtype | None = None,
    rearrange: tuple[bool, bool] = (False, False),
    field: ConvField | None = None,
) -> _Problem:
    """A [batch, rows, depth] x [batch, depth, cols] matmul with partials of
    `partial_itemsize` bytes (f32 for floats), results of `out_dtype` (the partials' type by
    default), the operands that need grouping by channels and, for a convolution, its field."""
    in_dtype = np.dtype(in_dtype)
    floating = in_dtype.kind in "fV"
    partial = np.dtype(np.float32) if floating else np.dtype(f"i{partial_itemsize}")
    if floating and partial_itemsize == 8:
        partial = np.dtype(np.float64)
    out = np.dtype(out_dtype) if out_dtype is not None else partial
    return _Problem(batch, rows, cols, depth, in_dtype, partial, out, rearrange, field)


def plan_matmul(
    batch: int,
    rows: int,
    cols: int,
    depth: int,
    in_dtype: np.dtype,
    partial_itemsize: int,
    target: Target,
    out_dtype: np.dtype | None = None,
    rearrange: tuple[bool, bool] = (False, False),
) -> MatmulPlan:
    """The fastest split whose temporaries fit the tile budget; if none fits, the smallest."""
    return _plan(
        problem(batch, rows, cols, depth, in_dtype, partial_itemsize, out_dtype, rearrange),
        target,
    )


@functools.lru_cache(maxsize=4096)
def _plan(problem: _Problem, target: Target, budget: int | None = None) -> MatmulPlan:
    """The fastest split whose temporaries fit `budget` bytes per tile (by default the
    Target's `matmul_memory_budget`); if none fits, the smallest."""
    budget = target.matmul_memory_budget if budget is None else budget
    space = _space(problem, target)
    best = space.fastest(budget)
    if best is None:
        return space.smallest()
    return _stretched(problem, best, target, budget)


class _Space:
    """Every split of a problem with each serial count, in the order they are tried, each
    with its temporaries and a floor under its cycles (both cheap), evaluated only when a
    search needs it and then kept: fitting phases re-plans one problem under many budgets."""

    def __init__(self, problem: _Problem, target: Target) -> None:
        tiles = target.tiles_per_ipu
        sizes = (problem.batch, problem.rows, problem.cols, problem.depth)
        self.problem, self.target = problem, target
        self.tried: list[tuple[tuple[int, ...], int]] = []
        self.temps: list[int] = []
        self.floors: list[int] = []
        for split in itertools.product(*(_candidates(s, tiles) for s in sizes)):
            if math.prod(split) > tiles:
                continue
            in_bytes, partial_bytes = _block_bytes(problem, split)
            # the same for every serial count
            floor = _floor(problem, split, target, in_bytes, partial_bytes)
            for serial in _serial_candidates(_ceil(problem.depth, split[3])):
                self.tried.append((split, serial))
                self.temps.append(_temp(in_bytes, partial_bytes, serial, split[3]))
                self.floors.append(floor)
        self.by_floor = sorted(range(len(self.tried)), key=self.floors.__getitem__)
        self.plans: dict[int, MatmulPlan] = {}

    def plan(self, index: int) -> MatmulPlan:
        if index not in self.plans:
            self.plans[index] = _evaluate(self.problem, *self.tried[index], self.target)
        return self.plans[index]

    def fastest(self, budget: int) -> MatmulPlan | None:
        """The fitting split of fewest cycles, then fewest tiles, then tried first (what a
        full sort of every split would give): splits are evaluated in order of their floors
        until the next floor is above the best found."""
        best: tuple[int, int, int] | None = None
        for index in self.by_floor:
            if self.temps[index] > budget:
                continue
            if best is not None and self.floors[index] > best[0]:
                break
            plan = self.plan(index)
            key = (plan.cycles, plan.tiles, index)
            best = key if best is None or key < best else best
        return None if best is None else self.plans[best[2]]

    def smallest(self) -> MatmulPlan:
        """The split of the smallest temporaries (the all-ones split is always one)."""
        return self.plan(min(range(len(self.tried)), key=self.temps.__getitem__))


@functools.lru_cache(maxsize=1024)
def _space(problem: _Problem, target: Target) -> _Space:
    return _Space(problem, target)


def _stretched(problem: _Problem, plan: MatmulPlan, target: Target, budget: int) -> MatmulPlan:
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
            if trial.temp_bytes_per_tile <= budget and trial.cycles < best.cycles:
                best = trial
    return best


def with_budget(problem: _Problem, target: Target, budget: int) -> MatmulPlan:
    """What PopLibs plans when given less memory: the planned split with K in more serial
    chunks, the fewest whose temporaries fit `budget` bytes per tile, which keeps the output's
    grid; if none does, the fastest split of all that fits (or the smallest there is)."""
    plan = serialised(problem, target, budget)
    if plan.temp_bytes_per_tile <= budget:
        return plan
    return _plan(problem, target, budget)


def serialised(problem: _Problem, target: Target, budget: int) -> MatmulPlan:
    """The planned split with K in more serial chunks, the fewest whose temporaries fit
    `budget` bytes per tile (or the most there are)."""
    plan = _plan(problem, target)
    split = (plan.b, plan.m, plan.n, plan.k)
    choices = _serial_candidates(_ceil(problem.depth, plan.k), _SERIAL + _MORE_SERIAL)
    best = plan
    for serial in (s for s in choices if s > plan.serial):
        best = _evaluate(problem, split, serial, target)
        if best.temp_bytes_per_tile <= budget:
            break
    return best
