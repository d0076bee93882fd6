"""Tile rules of the library ops: Cholesky, LU and triangular solves as PopLibs blocks them,
FFTs spread over tiles by transform, and host callbacks as a round trip to the host.

A factorisation runs in blocks of `LINALG_BLOCK` rows (`cost.linalg`), each block a few
supersteps: its diagonal block factored by one vertex per matrix on one worker, the block's
inverse, and the trailing matrix updated by matmuls that `matmul_plan` plans over the tiles, as
poplin's `cholesky` runs (`lib/poplin/Cholesky.cpp`). The report shows one superstep per kind of
step (`cholesky.factorise`, `cholesky.update`, ...) with the blocks' cycles added up; the op's
FLOPs (LAPACK's count, `lowering.linalg`) are on its first. The kernel is the op itself on
whole tensors (`whole_kernel`): where a block sits never changes a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lowering import Op, Value, op_cost
from partitioner.cost.callbacks import host_round_trip_cycles
from partitioner.cost.exchange import exchange_cycles
from partitioner.cost.linalg import (
    LINALG_BLOCK,
    fft_tiles_per_transform,
    real_dtype,
    serial_vertex_cycles,
    vector_flop_cycles,
)
from partitioner.cost.vector import binary_cycles
from partitioner.layout import Layout
from partitioner.program import Superstep, Task
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.matmul_plan import plan_matmul
from partitioner.tiles.rules.whole import whole_kernel


@dataclass
class _Stage:
    compute: int = 0
    exchange: int = 0
    sync: int = 0
    tiles: int = 1
    exchange_bytes: int = 0
    busiest_bytes: int = 0


@dataclass
class _Stages:
    """The cycles of each kind of step, added up over the blocks."""

    target: Target
    dtype: np.dtype
    stages: dict[str, _Stage] = field(default_factory=dict)

    def add(self, name: str, compute: int, busiest: int, tiles: int, syncs: int = 1) -> None:
        stage = self.stages.setdefault(name, _Stage())
        stage.compute += compute
        stage.exchange += exchange_cycles(self.target, busiest)
        stage.sync += syncs * self.target.sync_cycles
        stage.tiles = max(stage.tiles, min(tiles, self.target.tiles_per_ipu))
        stage.exchange_bytes += busiest * tiles
        stage.busiest_bytes = max(stage.busiest_bytes, busiest)

    def vertices(self, name: str, count: int, flops: int, in_bytes: int) -> None:
        """`count` vertices of `flops` each, one per worker, spread over the tiles; each tile
        first receives its vertices' `in_bytes`."""
        tiles = min(count, self.target.tiles_per_ipu)
        per_tile = math.ceil(count / tiles)
        compute = serial_vertex_cycles(flops, per_tile, self.dtype, self.target)
        self.add(name, compute, per_tile * in_bytes, tiles)

    def matmul(self, name: str, batch: int, rows: int, cols: int, depth: int) -> None:
        """A [batch, rows, depth] x [batch, depth, cols] matmul as `matmul_plan` plans it, the
        result subtracted from the trailing matrix (`matMulGroupedAcc`). A complex matmul is
        four real ones."""
        real = real_dtype(self.dtype)
        plan = plan_matmul(batch, rows, cols, depth, real, 4, self.target, real)
        times = 4 if real != self.dtype else 1
        b, m, n, k = plan.b, plan.m, plan.n, plan.k
        block = math.ceil(batch / b) * math.ceil(depth / k)
        received = block * (math.ceil(rows / m) + math.ceil(cols / n)) * real.itemsize
        syncs = 2 if k > 1 else 1
        exchange = exchange_cycles(self.target, received)
        compute = max(0, plan.cycles - exchange - syncs * self.target.sync_cycles)
        outputs = math.ceil(batch * rows * cols / plan.tiles)
        compute += binary_cycles("subtract", outputs, real, self.target, in_place=True)
        self.add(name, times * compute, times * received, plan.tiles, syncs)

    def steps(self, op: Op, start: int) -> tuple[Superstep, ...]:
        flops = op_cost(op).flops
        steps = []
        for i, (name, s) in enumerate(self.stages.items()):
            steps.append(
                Superstep(
                    name=f"{op.name}.{name}",
                    op=op.name,
                    source=str(op.loc),
                    tiles=s.tiles,
                    flops=flops if i == 0 else 0,
                    exchange_bytes=s.exchange_bytes,
                    compute_cycles=s.compute,
                    exchange_cycles=s.exchange,
                    sync_cycles=s.sync,
                    start=min(start, self.target.tiles_per_ipu - s.tiles),
                    busiest_tile_bytes=s.busiest_bytes,
                )
            )
        return tuple(steps)


def _inverse_vertices(block: int, target: Target) -> int:
    """`TriangularInverseWithTranspose` vertices per matrix: one per six columns (a worker
    each, as poplin's `invertAndTranspose` makes them)."""
    return math.ceil(block / target.threads_per_tile)


def _triangle_flops(n: int) -> int:
    """A triangular factor or inverse of order n: n^3/3 FLOPs, at least one."""
    return max(1, n**3 // 3)


def _cholesky_stages(x: Value, stages: _Stages) -> None:
    *batch, n, _ = x.shape
    g, e, t = math.prod(batch), x.dtype.itemsize, stages.target
    for top in range(0, n, LINALG_BLOCK):
        b = min(LINALG_BLOCK, n - top)
        below = n - top - b
        stages.vertices("factorise", g, _triangle_flops(b), b * b * e)
        if below == 0:
            break
        per = _inverse_vertices(b, t)
        stages.vertices("invert", g * per, math.ceil(_triangle_flops(b) / per), b * b * e)
        stages.matmul("panel", g, below, b, b)
        stages.matmul("update", g, below, below, b)


def _lu_stages(x: Value, stages: _Stages) -> None:
    """Right-looking LU with partial pivoting in blocks (A): each panel of `LINALG_BLOCK`
    columns factored with its pivot searches on one tile per matrix, its row interchanges
    exchanged across the matrix, the block row solved by the diagonal block's inverse, and the
    trailing matrix updated by a matmul."""
    *batch, rows, cols = x.shape
    g, e, t = math.prod(batch), x.dtype.itemsize, stages.target
    spread = min(t.tiles_per_ipu, g * max(1, cols * e // t.min_bytes_per_tile))
    for top in range(0, min(rows, cols), LINALG_BLOCK):
        b = min(LINALG_BLOCK, min(rows, cols) - top)
        below, right = rows - top - b, cols - top - b
        panel = (below + b) * b * b - b**3 // 3
        stages.vertices("panel", g, max(1, panel), (below + b) * b * e)
        stages.add("interchange", 0, math.ceil(g * 2 * b * cols * e / spread), spread)
        if right == 0:
            continue
        per = _inverse_vertices(b, t)
        stages.vertices("invert", g * per, math.ceil(_triangle_flops(b) / per), b * b * e)
        stages.matmul("row_panel", g, b, right, b)
        if below > 0:
            stages.matmul("update", g, below, right, b)


def _triangular_solve_stages(op: Op, stages: _Stages) -> None:
    """Blocked substitution (A): each diagonal block solved by poplin's `TriangularSolve`
    vertex, one per right-hand side, then the rows after it updated by a matmul."""
    a, b_value = op.operands
    *batch, n, _ = a.shape
    rhs = b_value.shape[-1] if op.attrs["left_side"] else b_value.shape[-2]
    g, e = math.prod(batch), a.dtype.itemsize
    for top in range(0, n, LINALG_BLOCK):
        b = min(LINALG_BLOCK, n - top)
        rest = n - top - b
        stages.vertices("substitute", g * rhs, b * b, (b * b + b) * e)
        if rest > 0:
            stages.matmul("update", g, rest, rhs, b)


def _fft_stages(op: Op, stages: _Stages) -> None:
    """Transforms spread over the tiles, several to a tile when there are more transforms than
    tiles, else each over its share of them (A): a transform over p > 1 tiles runs as the
    four-step FFT, its block exchanged twice more (the transpose between its two passes, and
    back into order)."""
    lengths = op.attrs["fft_lengths"]
    signal = op.results[0] if op.attrs["fft_type"] == "RFFT" else op.operands[0]
    complex_ = signal if np.issubdtype(signal.dtype, np.complexfloating) else op.operands[0]
    t, e = stages.target, complex_.dtype.itemsize
    points = math.prod(lengths)
    transforms = math.prod(signal.shape[: len(signal.shape) - len(lengths)])
    per_transform = fft_tiles_per_transform(transforms, points, e, t)
    tiles = min(t.tiles_per_ipu, transforms * per_transform)
    flops = op_cost(op).flops
    share = math.ceil(flops / tiles)
    block = math.ceil(transforms * points * e / tiles)
    stages.add("transform", vector_flop_cycles(share, complex_.dtype, t), block, tiles)
    if per_transform > 1:
        stages.add("transpose", 0, block, tiles)
        stages.add("transpose", 0, block, tiles)


def _linalg_task(
    op: Op,
    inputs: tuple[Value, ...],
    layouts: tuple[Layout, ...],
    ctx: MappingContext,
    fill: Callable[[_Stages], None],
) -> Task:
    outs = tuple(ctx.linear(r) for r in op.results)
    stages = _Stages(ctx.target, op.operands[0].dtype)
    fill(stages)
    start = outs[0].start if outs else 0
    return Task(op, inputs, layouts, outs, whole_kernel(op, inputs), stages.steps(op, start))


def cholesky_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    return _linalg_task(op, inputs, layouts, ctx, lambda s: _cholesky_stages(op.operands[0], s))


def lu_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    return _linalg_task(op, inputs, layouts, ctx, lambda s: _lu_stages(op.operands[0], s))


def triangular_solve_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    return _linalg_task(op, inputs, layouts, ctx, lambda s: _triangular_solve_stages(op, s))


def fft_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    return _linalg_task(op, inputs, layouts, ctx, lambda s: _fft_stages(op, s))


def host_callback_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    """The operands sent to the host and the results (or jax's acknowledgement) back, a
    superstep of the host kind (`cost.callbacks`); nothing computes on the tiles."""
    sent = sum(v.nbytes for v in op.operands)
    received = sum(v.nbytes for v in op.results)
    step = Superstep(
        name=op.name,
        op=op.name,
        source=str(op.loc),
        tiles=0,
        flops=0,
        exchange_bytes=sent + received,
        compute_cycles=0,
        exchange_cycles=0,
        sync_cycles=0,
        sync_group="host",
        link_cycles=host_round_trip_cycles(ctx.target, sent, received),
        kind="host",
    )
    outs = tuple(ctx.linear(r) for r in op.results)
    return Task(op, inputs, layouts, outs, whole_kernel(op, inputs), (step,))


LIBRARY_TILE_RULES = {
    "cholesky": cholesky_tile_rule,
    "lu": lu_tile_rule,
    "triangular_solve": triangular_solve_tile_rule,
    "fft": fft_tile_rule,
    "host_callback": host_callback_tile_rule,
}
