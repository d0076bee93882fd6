"""dot_general as PopLibs plans a matmul: operands exchanged into a grid of [B, M, K] and
[B, K, N] blocks, each tile's dot into f32 partials, and the K partials reduced across tiles."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from jax import lax

from lowering import Op, Value, apply_rule, op_cost
from partitioner.context import MappingContext
from partitioner.cost.compute import matmul_cycles, vector_cycles
from partitioner.layout import Layout, tile_bytes
from partitioner.matmul_plan import MatmulPlan, plan_matmul, serialised
from partitioner.program import Superstep, Task, TileBytes
from partitioner.target import Target
from partitioner.tile_rules.common import Array, make_step, permuted


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
    result = op.results[0]
    exact = not np.issubdtype(result.dtype, np.floating) and result.dtype.kind != "V"
    partial_dtype = result.dtype if exact else np.dtype(np.float32)
    return size(lhs, lb), size(lhs, lf), size(rhs, rf), size(lhs, lc), partial_dtype


def dot_general_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    big_b, big_m, big_n, big_k, partial = _problem(op)
    dtype = op.operands[0].dtype
    plan = plan_matmul(big_b, big_m, big_n, big_k, dtype, partial.itemsize, ctx.target)
    return _planned(op, inputs, layouts, plan, ctx.target)


def with_less_memory(task: Task, budget: int, target: Target) -> Task:
    """The matmul re-planned to hold at most `budget` bytes of temporaries per tile where it
    can, by splitting K into more serial chunks; its result's layout stays."""
    op = task.op
    big_b, big_m, big_n, big_k, partial = _problem(op)
    dtype = op.operands[0].dtype
    plan = serialised(big_b, big_m, big_n, big_k, dtype, partial.itemsize, target, budget)
    return _planned(op, task.inputs, task.input_layouts, plan, target)


def _planned(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], plan: MatmulPlan, target: Target
) -> Task:
    lhs, rhs = op.operands
    result = op.results[0]
    lb, lf, lc, rb, rc, rf = _dot_dims(op)
    big_b, big_m, big_n, big_k, partial_dtype = _problem(op)
    grid_l = Layout(permuted(lhs, lb + lf + lc), (big_b, big_m, big_k), (plan.b, plan.m, plan.k))
    grid_r = Layout(permuted(rhs, rb + rc + rf), (big_b, big_k, big_n), (plan.b, plan.k, plan.n))
    out = Layout(result.shape, (big_b, big_m, big_n), (plan.b, plan.m, plan.n))
    contract = _contraction(op, partial_dtype)

    def kernel(lhs_array: Array, rhs_array: Array) -> tuple[Array, ...]:
        return (lax.convert_element_type(contract(lhs_array, rhs_array), result.dtype),)

    steps = _dot_steps(op, plan, grid_l, grid_r, out, partial_dtype, target)
    # With a serial split, each loop iteration receives and holds one chunk of K at a time.
    temps = (
        TileBytes(0, plan.tiles, tile_bytes(grid_l, lhs.dtype) // plan.serial, "lhs blocks"),
        TileBytes(0, plan.tiles, tile_bytes(grid_r, rhs.dtype) // plan.serial, "rhs blocks"),
        TileBytes(0, plan.tiles, tile_bytes(out, partial_dtype), "partial sums"),
    )
    return Task(op, inputs, layouts, (out,), kernel, steps, temps)


def _contraction(op: Op, partial_dtype: np.dtype) -> Callable[..., Array]:
    """Both supersteps of a planned matmul as one contraction: each tile (b, m, n, k) multiplies
    its blocks into partials of `partial_dtype` (PopLibs' partials type, f32 for floats) and
    the k tiles' partials are summed. Over all tiles these are the sums of one `dot_general`
    with f32 accumulation; the cost model charges the steps, the simulator needs the values."""
    attrs = {**op.attrs, "preferred_element_type": partial_dtype}

    def contract(left: Array, right: Array) -> Array:
        if left.dtype.itemsize < partial_dtype.itemsize and partial_dtype.kind == "f":
            # XLA:CPU has no bf16 x bf16 -> f32 dot; widening first is exact.
            left = lax.convert_element_type(left, partial_dtype)
            right = lax.convert_element_type(right, partial_dtype)
        return apply_rule(op, [left, right], attrs, {})[0]

    return contract


def _dot_steps(
    op: Op,
    plan: MatmulPlan,
    grid_l: Layout,
    grid_r: Layout,
    out: Layout,
    partial: np.dtype,
    target: Target,
) -> tuple[Superstep, ...]:
    lhs, rhs = op.operands
    received = tile_bytes(grid_l, lhs.dtype) + tile_bytes(grid_r, rhs.dtype)
    block_flops = 2 * math.prod(out.block) * grid_l.block[2]
    compute = matmul_cycles(target, block_flops, lhs.dtype)
    compute += (plan.serial - 1) * target.compute_set_overhead_cycles
    flops = op_cost(op).flops
    steps = [
        make_step(
            op,
            "matmul",
            target,
            tiles=plan.tiles,
            flops=flops,
            compute_cycles=compute,
            busiest_bytes=received,
            exchange_bytes=received * plan.tiles,
        )
    ]
    if plan.k > 1:
        partials = plan.k * tile_bytes(out, partial)
        steps.append(
            make_step(
                op,
                "reduce_partials",
                target,
                tiles=out.tiles,
                flops=plan.k * math.prod(out.block) * out.tiles,
                compute_cycles=vector_cycles(target, plan.k * out.block_elements, partial),
                busiest_bytes=partials,
                exchange_bytes=partials * out.tiles,
            )
        )
    return tuple(steps)
