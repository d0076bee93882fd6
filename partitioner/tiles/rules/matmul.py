"""dot_general as PopLibs plans a matmul: operands exchanged into a grid of [B, M, K] and
[B, K, N] blocks, each tile's dot into f32 partials, and the K partials reduced across tiles."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from lowering import Op, Value, op_cost
from partitioner.layout import Layout, tile_bytes
from partitioner.program import Superstep, Task, TileBytes
from partitioner.target import Target
from partitioner.tiles.context import MappingContext
from partitioner.tiles.matmul_plan import (
    MatmulPlan,
    _Problem,
    plan_matmul,
    problem,
    tile_cycles,
    with_budget,
)
from partitioner.tiles.rules.common import make_step, permuted, relayout_step
from partitioner.tiles.rules.whole import whole_kernel


def _dot_dims(op: Op) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    (lc, rc), (lb, rb) = op.attrs["dimension_numbers"]
    lhs, rhs = op.operands
    lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
    rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
    return list(lb), lf, list(lc), list(rb), list(rc), rf


def _problem(op: Op) -> tuple[int, int, int, int, np.dtype]:
    """(B, M, N, K, partials' dtype) of a dot_general."""
    lhs, rhs = op.operands
    lb, lf, lc, _, _, rf = _dot_dims(op)
    size = lambda v, dims: math.prod(v.shape[d] for d in dims)  # noqa: E731
    partial_dtype = partials_dtype(op.results[0].dtype)
    return size(lhs, lb), size(lhs, lf), size(rhs, rf), size(lhs, lc), partial_dtype


def partials_dtype(result: np.dtype) -> np.dtype:
    """PopLibs' partials type for a contraction with results of `result`: f32 for floats, the
    result's own type for exact (integer) contractions."""
    exact = not np.issubdtype(result, np.floating) and result.kind != "V"
    return result if exact else np.dtype(np.float32)


def _matmul(op: Op, producers: Mapping[Value, Op]) -> _Problem:
    big_b, big_m, big_n, big_k, partial = _problem(op)
    _, _, lc, _, rc, _ = _dot_dims(op)
    lhs, rhs = op.operands
    rearrange = (
        _rearranged(lhs, lc, producers),
        _rearranged(rhs, rc, producers),
    )
    dtype = lhs.dtype
    out = op.results[0].dtype
    return problem(big_b, big_m, big_n, big_k, dtype, partial.itemsize, out, rearrange)


# Ops whose result Poplar lays out as its consumer wants: a program's inputs (variables
# created for the matmul that reads them), collectives and streamed loads (written into any
# layout), and views and casts of them.
LAID_OUT_FOR_CONSUMER = frozenset(
    {
        "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "convert", "reshape",
        "broadcast_in_dim", "sharding_constraint", "optimization_barrier", "shard_slice",
    }
)  # fmt: skip


def _rearranged(value: Value, contracting: list[int], producers: Mapping[Value, Op]) -> bool:
    """Whether an operand's tiles must group it by channels before the AMP reads it: PopLibs
    wants the contracted dims innermost ([B, M, K] and [B, N, K]); a computed operand with
    other dims inside them is transposed on its tiles (a weight gradient's x and dy, attention's
    V), while a program input is created in the layout its matmul wants."""
    shape = value.shape
    inner = [d for d in range(len(shape)) if shape[d] != 1]
    wanted = [d for d in inner if d not in contracting]
    order = [d for d in inner if d in contracting]
    if inner[len(inner) - len(order) :] == order and (
        not wanted or max(wanted) < min(order, default=0)
    ):
        return False
    producer = producers.get(value)
    while producer is not None and producer.name in LAID_OUT_FOR_CONSUMER:
        producer = producers.get(producer.operands[0])
    return producer is not None


def _plan(op: Op, ctx: MappingContext) -> tuple[_Problem, MatmulPlan]:
    matmul = _matmul(op, ctx.producers)
    plan = plan_matmul(
        matmul.batch, matmul.rows, matmul.cols, matmul.depth, matmul.in_dtype,
        matmul.partial_dtype.itemsize, ctx.target, matmul.out_dtype, matmul.rearrange,
    )  # fmt: skip
    return matmul, plan


def dot_general_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    matmul, plan = _plan(op, ctx)
    return _planned(op, inputs, layouts, plan, matmul, ctx.target)


def operand_layouts(op: Op, ctx: MappingContext) -> tuple[Layout | None, ...]:
    """The layouts the matmul wants its operands created in (PopLibs' `createMatMulInputLHS`
    and `createMatMulInputRHS`), see `_created`."""
    _, plan = _plan(op, ctx)
    return tuple(layout for layout, _ in _created(op, plan))


def _created(op: Op, plan: MatmulPlan) -> tuple[tuple[Layout | None, int], ...]:
    """Each operand as PopLibs creates a matmul's input: its blocks of the plan's grid, each
    spread over the `share` tiles that read it (n for the lhs, m for the rhs) by cutting its
    contracted (or else its free) part further, so a tile holds 1/share of a block and the
    exchange brings the rest. Returned with the share; the layout is None when the operand's
    dims cannot be cut that way (several dims of one role, out of order)."""
    lb, lf, lc, rb, rc, rf = _dot_dims(op)
    big_b, big_m, big_n, big_k, _ = _problem(op)
    found: list[tuple[Layout | None, int]] = []
    for value, roles, sizes, splits, share in (
        (op.operands[0], (lb, lf, lc), (big_b, big_m, big_k), (plan.b, plan.m, plan.k), plan.n),
        (op.operands[1], (rb, rf, rc), (big_b, big_n, big_k), (plan.b, plan.n, plan.k), plan.m),
    ):
        grid = list(splits)
        if -(-sizes[2] // grid[2]) >= share:
            grid[2] *= share
        elif -(-sizes[1] // grid[1]) >= share:
            grid[1] *= share
        else:
            share = 1
        found.append((_own_layout(value, roles, sizes, grid), share))
    return tuple(found)


def _own_layout(
    value: Value, roles: tuple[list[int], ...], sizes: tuple[int, ...], grid: list[int]
) -> Layout | None:
    """A grid over the operand's own dims, each role's dims (batch, free, contracted) cut as
    one, when each role's dims are adjacent; else None."""
    role_of = {d: r for r, dims in enumerate(roles) for d in dims}
    runs: list[int] = []
    for d in range(len(value.shape)):
        if not runs or runs[-1] != role_of[d]:
            runs.append(role_of[d])
    if len(runs) != len(set(runs)) or any(grid[r] > 1 for r in range(3) if r not in runs):
        return None
    return Layout(value.shape, tuple(sizes[r] for r in runs), tuple(grid[r] for r in runs))


def _grids(op: Op, plan: MatmulPlan) -> tuple[Layout, Layout, Layout]:
    """The [B, M, K] and [B, K, N] grids the operands are exchanged into, and the result's."""
    lhs, rhs = op.operands
    lb, lf, lc, rb, rc, rf = _dot_dims(op)
    big_b, big_m, big_n, big_k, _ = _problem(op)
    grid_l = Layout(permuted(lhs, lb + lf + lc), (big_b, big_m, big_k), (plan.b, plan.m, plan.k))
    grid_r = Layout(permuted(rhs, rb + rc + rf), (big_b, big_k, big_n), (plan.b, plan.k, plan.n))
    out = Layout(op.results[0].shape, (big_b, big_m, big_n), plan.out_grid)
    return grid_l, grid_r, out


def with_less_memory(
    task: Task, budget: int, producers: Mapping[Value, Op], target: Target
) -> Task:
    """The matmul re-planned to hold at most `budget` bytes of temporaries per tile where it
    can (`matmul_plan.with_budget`); a new grid's result is exchanged into the old result's
    layout, which the ops after it read. A task charged a loop's trips stays charged them."""
    matmul = _matmul(task.op, producers)
    plan = with_budget(matmul, target, budget)
    planned = _planned(task.op, task.inputs, task.input_layouts, plan, matmul, target)
    (old,), (new,) = task.result_layouts, planned.result_layouts
    steps = planned.supersteps
    if new != old:
        steps = (*steps, relayout_step(task.op, old, target))
    # A loop's body task laid out inline keeps its trips (`phases.loops`).
    return dataclasses.replace(
        planned, result_layouts=(old,), supersteps=steps * task.trips, trips=task.trips
    )


def shrunk_by(task: Task, over: int, producers: Mapping[Value, Op], target: Target) -> Task:
    """A matmul with temporaries re-planned to hold `over` bytes per tile fewer of them
    (`with_less_memory`); any other task, or `over` <= 0, as it is."""
    if over <= 0 or task.op.name != "dot_general" or not task.temporaries:
        return task
    held = sum(t.bytes_per_tile for t in task.temporaries)
    return with_less_memory(task, max(0, held - over), producers, target)


def _planned(
    op: Op,
    inputs: tuple[Value, ...],
    layouts: tuple[Layout, ...],
    plan: MatmulPlan,
    matmul: _Problem,
    target: Target,
) -> Task:
    partial_dtype = matmul.partial_dtype
    grid_l, grid_r, out = _grids(op, plan)
    # An operand created for the matmul holds 1/share of each block on each tile that reads
    # it; the exchange brings the rest. Others arrive block by block. With a serial split, a
    # tile holds one chunk of K at a time.
    blocks = []
    for value, layout, grid, (created, share) in zip(
        op.operands, layouts, (grid_l, grid_r), _created(op, plan), strict=True
    ):
        block = tile_bytes(grid, value.dtype)
        blocks.append(block - block // share if layout == created else block)
    steps = planned_steps(op, plan, matmul, sum(blocks), out, partial_dtype, target)
    temps = planned_temporaries(matmul, plan, blocks[0], blocks[1])
    # The values are the op's own, as jax lowers it (`whole_kernel`): a half-precision
    # contraction widened, summed and rounded as XLA does for jax.jit, where our partials of
    # `partial_dtype` are the cost model's.
    return Task(op, inputs, layouts, (out,), whole_kernel(op, inputs), steps, temps)


def planned_temporaries(
    matmul: _Problem, plan: MatmulPlan, lhs_bytes: int, rhs_bytes: int
) -> tuple[TileBytes, ...]:
    """What each tile of a plan holds while it runs: its operand blocks (one serial chunk of
    them) and its partial sums."""
    partials = block_outputs(matmul, plan) * matmul.partial_dtype.itemsize
    temps = (
        TileBytes(0, plan.tiles, lhs_bytes // plan.serial, "lhs blocks"),
        TileBytes(0, plan.tiles, rhs_bytes // plan.serial, "rhs blocks"),
        TileBytes(0, plan.tiles, partials, "partial sums"),
    )
    return tuple(t for t in temps if t.bytes_per_tile)


def block_outputs(matmul: _Problem, plan: MatmulPlan) -> int:
    """Outputs of one tile's block: the partial sums it makes."""
    return -(-matmul.batch // plan.b) * -(-matmul.rows // plan.m) * -(-matmul.cols // plan.n)


def planned_steps(
    op: Op,
    plan: MatmulPlan,
    matmul: _Problem,
    received: int,
    out: Layout,
    partial: np.dtype,
    target: Target,
) -> tuple[Superstep, ...]:
    """The supersteps PopLibs runs: operands grouped by channels on their tiles (if they must
    be), exchanged into blocks and multiplied, and the partials cast to the result's type (a
    K split's reduced first, each tile taking a share of the outputs)."""
    cycles = tile_cycles(matmul, (plan.b, plan.m, plan.n, plan.k), plan.serial, target)
    steps = []
    if cycles.rearrange:
        steps.append(
            make_step(
                op,
                "rearrange",
                target,
                tiles=plan.tiles,
                compute_cycles=cycles.rearrange,
                kind="copy",
            )
        )
    steps.append(
        make_step(
            op,
            "matmul",
            target,
            tiles=plan.tiles,
            flops=op_cost(op).flops,
            compute_cycles=cycles.amp + cycles.accumulate,
            busiest_bytes=received,
            exchange_bytes=received * plan.tiles,
        )
    )
    if plan.k == 1 and cycles.cast:  # the partials cast to the result's type, on the tiles
        steps.append(make_step(op, "cast", target, tiles=plan.tiles, compute_cycles=cycles.cast))
    if plan.k > 1:  # every tile of the plan reduces its share of the outputs
        partials = plan.k * tile_bytes(out, partial)
        steps.append(
            make_step(
                op,
                "reduce_partials",
                target,
                tiles=out.tiles,
                flops=plan.k * math.prod(out.block) * out.tiles,
                compute_cycles=cycles.reduce + cycles.cast,
                busiest_bytes=partials,
                exchange_bytes=partials * out.tiles,
            )
        )
    return tuple(steps)
