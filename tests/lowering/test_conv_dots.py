"""Dot-like convolutions evaluated as dot_general (lowering/conv_dots.py) equal lax's convolution:
random layouts, strides, paddings, dilations, feature and batch groups, one or two spatial
dimensions each a 1-wide window or a window the output sums whole."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from lowering.conv_dots import convolution_as_dot


def _spatial(draw: st.DrawFn, summed: bool) -> tuple[int, int, int, tuple[int, int], int, int]:
    """(input size, window, stride, padding, lhs dilation, rhs dilation) of one dimension: a
    1-wide window, or (when `summed`) the window whose single output position sums it all."""
    size = draw(st.integers(1, 6))
    lhs_dilation, rhs_dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    low, high = draw(st.integers(0, 1)), draw(st.integers(-1, 1))
    padded = (size - 1) * lhs_dilation + 1 + low + high
    if padded < 1:
        low, high, padded = 0, 0, (size - 1) * lhs_dilation + 1
    stride = draw(st.integers(1, 2))
    if not summed:
        return size, 1, stride, (low, high), lhs_dilation, rhs_dilation
    window = (padded - 1) // rhs_dilation + 1  # the widest window that fits
    leftover = padded - ((window - 1) * rhs_dilation + 1)  # a stride past it: one output
    return size, window, stride + leftover, (low, high), lhs_dilation, rhs_dilation


@st.composite
def dot_like_convolutions(draw: st.DrawFn) -> tuple:
    rank = draw(st.integers(1, 2))
    dims = [_spatial(draw, draw(st.booleans())) for _ in range(rank)]
    feature_groups = draw(st.sampled_from([1, 2]))
    batch_groups = 1 if feature_groups > 1 else draw(st.sampled_from([1, 2]))
    groups = max(feature_groups, batch_groups)
    batch = batch_groups * draw(st.integers(1, 2))
    features = feature_groups * draw(st.integers(1, 3))
    outs = groups * draw(st.integers(1, 3))
    layouts = [tuple(draw(st.permutations(range(rank + 2)))) for _ in range(3)]
    lhs_canonical = (batch, features, *(d[0] for d in dims))
    rhs_canonical = (outs, features // feature_groups, *(d[1] for d in dims))
    shapes = []
    for canonical, layout in zip((lhs_canonical, rhs_canonical), layouts[:2], strict=True):
        shape = [0] * (rank + 2)
        for c, d in enumerate(layout):
            shape[d] = canonical[c]
        shapes.append(shape)
    params = {
        "window_strides": tuple(d[2] for d in dims),
        "padding": tuple(d[3] for d in dims),
        "lhs_dilation": tuple(d[4] for d in dims),
        "rhs_dilation": tuple(d[5] for d in dims),
        "dimension_numbers": tuple(layouts),
        "feature_group_count": feature_groups,
        "batch_group_count": batch_groups,
    }
    seed = draw(st.integers(0, 2**16))
    return shapes, params, seed


@settings(max_examples=150, deadline=None)
@given(dot_like_convolutions())
def test_dot_like_convolutions_equal_lax(case: tuple) -> None:
    (lhs_shape, rhs_shape), params, seed = case
    rng = np.random.default_rng(seed)
    lhs = rng.normal(size=lhs_shape).astype(np.float32)
    rhs = rng.normal(size=rhs_shape).astype(np.float32)
    expected = lax.conv_general_dilated(
        lhs,
        rhs,
        params["window_strides"],
        params["padding"],
        params["lhs_dilation"],
        params["rhs_dilation"],
        lax.ConvDimensionNumbers(*params["dimension_numbers"]),
        params["feature_group_count"],
        params["batch_group_count"],
    )
    ours = convolution_as_dot(lhs, rhs, **params, precision=None, preferred_element_type=None)
    assert ours is not None
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_a_window_with_several_outputs_stays_a_convolution() -> None:
    dims = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))  # NHWC, HWIO, NHWC
    lhs, rhs = np.ones((2, 5, 5, 4), np.float32), np.ones((3, 3, 4, 8), np.float32)
    common = {"lhs_dilation": (1, 1), "rhs_dilation": (1, 1), "dimension_numbers": dims}
    assert (
        convolution_as_dot(
            lhs,
            rhs,
            window_strides=(1, 1),
            padding=((1, 1), (1, 1)),
            feature_group_count=1,
            batch_group_count=1,
            precision=None,
            preferred_element_type=None,
            **common,
        )
        is None
    )


def test_integer_convolutions_are_exact() -> None:
    dims = ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))
    rng = np.random.default_rng(0)
    lhs = rng.integers(-50, 50, size=(3, 4, 4, 6)).astype(np.int32)
    rhs = rng.integers(-50, 50, size=(1, 1, 3, 4)).astype(np.int32)
    params = {
        "window_strides": (2, 1),
        "padding": ((0, 0), (0, 0)),
        "lhs_dilation": (1, 1),
        "rhs_dilation": (1, 1),
        "dimension_numbers": dims,
        "feature_group_count": 2,
        "batch_group_count": 1,
    }
    expected = lax.conv_general_dilated(
        lhs,
        rhs,
        (2, 1),
        "VALID",
        dimension_numbers=lax.ConvDimensionNumbers(*dims),
        feature_group_count=2,
    )
    ours = convolution_as_dot(lhs, rhs, **params, precision=None, preferred_element_type=None)
    np.testing.assert_array_equal(ours, expected)
