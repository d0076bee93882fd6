"""convolution as PopLibs plans it: a matmul over tiles (`matmul_plan`) whose rows are the
output positions (batch x output field), columns the output channels and depth the input
channels times the kernel positions, with AMP vertex costs; each tile reads the input field
its block of outputs touches, halos included (`conv_field`). jax's convolution gradients are
convolutions with other dimension numbers (a weight gradient contracts the batch and the
field), so they are planned the same way."""

from __future__ import annotations

import math

from lowering import Op, Value
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.tiles.context import MappingContext
from partitioner.tiles.conv_field import ConvField
from partitioner.tiles.matmul_plan import MatmulPlan, _plan, _Problem, problem
from partitioner.tiles.rules.common import relayout_step
from partitioner.tiles.rules.matmul import (
    partials_dtype,
    planned_steps,
    planned_temporaries,
)
from partitioner.tiles.rules.whole import whole_kernel


def conv_problem(op: Op) -> _Problem:
    """The [groups, M, K] x [groups, K, N] matmul PopLibs plans for a convolution. The zeros
    an input dilation inserts (the input gradient of a strided convolution) are skipped by
    the vertices' work lists, so they add no depth (A: docs/target.md)."""
    a = op.attrs
    (_, lf, *ls), (_, _, *rs), (ob, of, *os_) = a["dimension_numbers"]
    lhs, rhs = op.operands
    result = op.results[0]
    groups = a["feature_group_count"] * a["batch_group_count"]
    in_chans = lhs.shape[lf] // a["feature_group_count"]
    kernel = tuple(rhs.shape[d] for d in rs)
    out_field = tuple(result.shape[d] for d in os_)
    field = ConvField(
        rows=(result.shape[ob], *out_field),
        depth=(in_chans, *kernel),
        input_field=tuple(lhs.shape[d] for d in ls),
        strides=tuple(a["window_strides"]),
        kernel_dilation=tuple(a["rhs_dilation"]),
        input_dilation=tuple(a["lhs_dilation"]),
    )
    taps = field.kernel_positions
    depth = max(in_chans, -(-in_chans * taps // math.prod(a["lhs_dilation"])))
    partial = partials_dtype(result.dtype).itemsize
    rows = math.prod(field.rows)
    cols = result.shape[of] // groups
    return problem(
        groups, rows, cols, depth, lhs.dtype, partial, result.dtype, (False, False), field
    )


def _result_layout(op: Op, matmul: _Problem, plan: MatmulPlan) -> Layout | None:
    """The output as the plan's grid when its channels are its last dim (NHWC, as jax's CNNs
    write): the output positions by the rows, and the channels, which are the groups' columns
    one group after another, by the groups and their columns. Each tile so holds whole groups'
    outputs (or a share of one), the blocks PopLibs' plan leaves where they were made, with
    conv groups a partition dimension (docs/target.md, "Convolutions on the AMP"). None when
    the channels are not last: the result is laid out otherwise."""
    a = op.attrs
    of = a["dimension_numbers"][2][1]
    result = op.results[0]
    if of != len(result.shape) - 1:
        return None
    if matmul.batch == 1:
        return Layout(result.shape, (1, matmul.rows, matmul.cols), plan.out_grid)
    b, m, n = plan.out_grid
    return Layout(result.shape, (matmul.rows, matmul.batch, matmul.cols), (m, b, n))


def _grid(result: Value, matmul: _Problem, plan: MatmulPlan) -> Layout:
    """The plan's [groups, rows, columns] blocks, as the tiles that make them hold them: what
    a result laid out otherwise is exchanged from."""
    return Layout(result.shape, (matmul.batch, matmul.rows, matmul.cols), plan.out_grid)


def convolution_tile_rule(
    op: Op, inputs: tuple[Value, ...], layouts: tuple[Layout, ...], ctx: MappingContext
) -> Task:
    target = ctx.target
    matmul = conv_problem(op)
    plan = _plan(matmul, target)
    result = op.results[0]
    split = (plan.b, plan.m, plan.n, plan.k)
    itemsize = matmul.in_itemsize
    field = matmul.field
    assert field is not None
    weights = -(-matmul.batch // plan.b) * -(-math.prod(field.depth) // plan.k)
    blocks = (
        matmul.lhs_elements(split) * itemsize,
        weights * -(-matmul.cols // plan.n) * itemsize,
    )
    planned = _result_layout(op, matmul, plan)
    out = planned or _grid(result, matmul, plan)
    steps = planned_steps(op, plan, matmul, sum(blocks), out, matmul.partial_dtype, target)
    outs = (planned or ctx.linear(result),)
    if planned is None:  # the grid's blocks exchanged into the layout the next ops read
        steps = (*steps, relayout_step(op, outs[0], target))
    kernel = whole_kernel(op, inputs)  # the op's own values, as matmuls' (`matmul_tile_rule`)
    temps = planned_temporaries(matmul, plan, *blocks)
    return Task(op, inputs, layouts, outs, kernel, steps, temps)
