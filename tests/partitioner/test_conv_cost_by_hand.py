"""Convolutions costed by hand: the input field a tile reads (halos included), the matmul
PopLibs plans for a convolution and for each of its gradients, and a 1x1 convolution costed
exactly as the matmul it is."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import ipujax
from lowering import lower
from partitioner.tiles.conv_field import ConvField, block_extents, input_elements
from partitioner.tiles.matmul_plan import _plan, problem
from partitioner.tiles.rules.conv import conv_problem

TARGET = ipujax.Target.bow()


def _conv(x, w, stride=1, padding="SAME"):
    return lax.conv_general_dilated(
        x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def test_a_block_is_a_run_of_whole_inner_dims() -> None:
    assert block_extents((2, 8, 8), 32) == (1, 4, 8)  # 4 rows of 8
    assert block_extents((2, 8, 8), 128) == (2, 8, 8)
    assert block_extents((2, 8, 8), 12) == (1, 1.5, 8)  # 12 outputs: a row and a half
    assert block_extents((16, 3, 3), 18) == (2, 3, 3)  # 2 channels' kernels


def test_a_tiles_input_field_includes_its_halo() -> None:
    field = ConvField(
        rows=(2, 8, 8),
        depth=(16, 3, 3),
        input_field=(8, 8),
        strides=(1, 1),
        kernel_dilation=(1, 1),
        input_dilation=(1, 1),
    )
    # 32 outputs: 4 rows of 8 of one image; depth 72 = 8 channels x 9 positions. Input rows
    # (4 - 1) + (3 - 1) + 1 = 6, columns 7 + 2 + 1 = 10 capped at 8.
    assert input_elements(field, 32, 72) == 1 * 8 * 6 * 8
    # Everything on one tile: the whole input (the padding is not exchanged).
    assert input_elements(field, 128, 144) == 2 * 16 * 8 * 8
    strided = ConvField((1, 4, 4), (4, 3, 3), (8, 8), (2, 2), (1, 1), (1, 1))
    # One row of 4 outputs: input rows 0 + 2 + 1 = 3, columns 3 x 2 + 2 + 1 = 9 capped at 8.
    assert input_elements(strided, 4, 36) == 4 * 3 * 8
    # A dilated input (the gradient of a strided convolution): its zeros are not read.
    dilated = ConvField((1, 8, 8), (4, 3, 3), (4, 4), (1, 1), (1, 1), (2, 2))
    # 4 rows of 8: reach 6 rows, 10 columns of the dilated input: 3 and 5 -> 4 real ones.
    assert input_elements(dilated, 32, 36) == 4 * 3 * 4


def _convolutions(fun, *args) -> list:
    graph = lower(fun, *args)
    return [op for op in graph.ops if op.name == "convolution"]


def test_a_convolution_and_its_gradients_as_matmuls() -> None:
    n, h, cin, cout = 4, 8, 16, 32
    x = jax.ShapeDtypeStruct((n, h, h, cin), jnp.float16)
    w = jax.ShapeDtypeStruct((3, 3, cin, cout), jnp.float16)
    loss = lambda x, w: jnp.sum(_conv(x, w, stride=2).astype(jnp.float32))  # noqa: E731
    forward, *grads = _convolutions(jax.value_and_grad(loss, argnums=(0, 1)), x, w)
    p = conv_problem(forward)
    # Rows: 4 images x 4 x 4 outputs; columns 32 channels; depth 16 channels x 9 positions.
    assert (p.batch, p.rows, p.cols, p.depth) == (1, n * 4 * 4, cout, cin * 9)
    assert p.partial_dtype == np.float32 and p.out_dtype == np.float16
    by_shape = {op.results[0].shape: conv_problem(op) for op in grads}
    dx = by_shape[(n, h, h, cin)]
    # The input gradient: dy dilated by the stride; of its 9 kernel positions about 9 / 4 meet
    # a real element, so the depth is ceil(32 x 9 / 4).
    assert (dx.rows, dx.cols, dx.depth) == (n * h * h, cin, -(-cout * 9 // 4))
    (dw,) = [p for shape, p in by_shape.items() if shape != (n, h, h, cin)]
    # The weight gradient contracts the batch and the output field: rows are the input
    # channels x kernel positions, depth the images x outputs.
    assert (dw.rows, dw.cols, dw.depth) == (cin * 9, cout, n * 4 * 4)


def test_a_1x1_convolution_is_planned_and_costed_as_its_matmul() -> None:
    n, h, cin, cout = 8, 16, 64, 128
    x = jax.ShapeDtypeStruct((n, h, h, cin), jnp.float16)
    w = jax.ShapeDtypeStruct((1, 1, cin, cout), jnp.float16)
    (op,) = _convolutions(lambda x, w: _conv(x, w), x, w)
    conv = conv_problem(op)
    matmul = problem(1, n * h * h, cout, cin, np.dtype(np.float16), 4, np.dtype(np.float16))
    # Its input field is the [rows, depth] block for any split: no halo, nothing shared.
    for m, k in itertools.product((1, 3, 23, 184, 2048), (1, 2, 64)):
        rows, depth = -(-n * h * h // m), -(-cin // k)
        assert conv.lhs_elements((1, m, 1, k)) == matmul.lhs_elements((1, m, 1, k)) == rows * depth
    planned, expected = _plan(conv, TARGET), _plan(matmul, TARGET)
    assert planned == expected
