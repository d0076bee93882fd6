"""The convolution's evaluation rule; convolutions that are dot products as `dot_general`.

A convolution is a dot product when, along every spatial dimension, either the window is one
element wide (each output position reads one input position: a 1x1 convolution, strided or not)
or the output is one element long (the window spans the input: the weight gradient of a 1x1
convolution). Evaluated as a convolution under the runtime's vmap, such an op with both operands
varying over IPUs becomes a convolution grouped over the IPUs, and XLA's SPMD partitioner
(jax 0.10) splits a dot-like grouped convolution wrongly when those IPUs are spread over several
devices: each device pairs the whole input with only its own share of the kernel. A
`dot_general` with the groups as a batch dimension partitions correctly, and on one device
computes the same sums, so these convolutions are always evaluated this way.
"""

from __future__ import annotations

from typing import Any

from jax import lax

Array = Any


def _dot_like(
    lhs_size: int, window: int, stride: int, pads: tuple[int, int], dilations: tuple[int, int]
) -> str | None:
    """How one spatial dimension maps onto a dot: "free" (window 1: an output position reads
    one input position), "contracted" (one output position: the window is summed), or None."""
    lhs_dilation, rhs_dilation = dilations
    padded = (lhs_size - 1) * lhs_dilation + 1 + pads[0] + pads[1]
    out = (padded - ((window - 1) * rhs_dilation + 1)) // stride + 1
    if window == 1:
        return "free"
    if out == 1:
        return "contracted"
    return None


def convolution_eval_rule(lhs: Array, rhs: Array, **params: Any) -> tuple[Array, ...]:
    """`EVAL_RULES["convolution"]`: `params` are the op's attributes, as jax.lax names them."""
    params["precision"] = tuple(lax.Precision[p] for p in params["precision"])
    as_dot = convolution_as_dot(lhs, rhs, **params)
    if as_dot is not None:
        return (as_dot,)
    numbers = lax.ConvDimensionNumbers(*params.pop("dimension_numbers"))
    return (lax.conv_general_dilated(lhs, rhs, dimension_numbers=numbers, **params),)


def convolution_as_dot(
    lhs: Array,
    rhs: Array,
    *,
    window_strides: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    lhs_dilation: tuple[int, ...],
    rhs_dilation: tuple[int, ...],
    dimension_numbers: tuple[tuple[int, ...], ...],
    feature_group_count: int,
    batch_group_count: int,
    precision: Any,
    preferred_element_type: Any,
) -> Array | None:
    """The convolution as a `dot_general`, or None when it is not a dot product."""
    (lb, lf, *ls), (ro, ri, *rs), (ob, of, *os_) = dimension_numbers
    windows = [rhs.shape[k] for k in rs]
    found = [
        _dot_like(lhs.shape[d], w, s, p, (ld, rd))
        for d, w, s, p, ld, rd in zip(
            ls, windows, window_strides, padding, lhs_dilation, rhs_dilation, strict=True
        )
    ]
    kinds = [kind for kind in found if kind is not None]
    if len(kinds) < len(found):
        return None
    # Both operands in canonical order: input [N, C, spatial...], kernel [O, I, window...].
    lhs = lax.transpose(lhs, (lb, lf, *ls))
    steps = [
        s if kind == "free" else rd
        for kind, s, rd in zip(kinds, window_strides, rhs_dilation, strict=True)
    ]
    lhs = _strided(lhs, kinds, windows, steps, padding, lhs_dilation)
    out = _grouped_dot(
        lhs,
        lax.transpose(rhs, (ro, ri, *rs)),
        kinds,
        (feature_group_count, batch_group_count),
        precision,
        preferred_element_type,
    )
    return lax.transpose(out, [[ob, of, *os_].index(j) for j in range(out.ndim)])


def _strided(
    lhs: Array,
    kinds: list[str],
    windows: list[int],
    steps: list[int],
    padding: tuple[tuple[int, int], ...],
    lhs_dilation: tuple[int, ...],
) -> Array:
    """The canonical input padded and dilated, then read every `steps` positions: as many
    positions as the output has along a free dimension (the step is the stride), as the window
    has along a contracted one (the step is the window's dilation)."""
    config = [(0, 0, 0), (0, 0, 0)] + [
        (lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation, strict=True)
    ]
    lhs = lax.pad(lhs, lax.full((), 0, lhs.dtype), config)
    limits, strides = list(lhs.shape), [1, 1, *steps]
    for i, (kind, window, step) in enumerate(zip(kinds, windows, steps, strict=True)):
        reads = (lhs.shape[2 + i] - 1) // step + 1 if kind == "free" else window
        limits[2 + i] = (reads - 1) * step + 1
    return lax.slice(lhs, [0] * lhs.ndim, limits, strides)


def _grouped_dot(
    lhs: Array,
    rhs: Array,
    kinds: list[str],
    group_counts: tuple[int, int],
    precision: Any,
    preferred_element_type: Any,
) -> Array:
    """[batch, out features, spatial...] from the canonical strided input [N, C, S...] and
    kernel [O, I, K...]: the groups are the dot's batch dimension (a feature group pairs a block
    of C with a block of O, a batch group a block of N with a block of O), the input features
    and the contracted windows are summed."""
    n, c, *spatial = lhs.shape
    o, i, *window = rhs.shape
    feature_groups, batch_groups = group_counts
    groups = max(feature_groups, batch_groups)
    if batch_groups > 1:  # [g, N/g, C, S...]
        lhs = lax.reshape(lhs, (groups, n // groups, c, *spatial))
    else:  # [g, N, C/g, S...]
        lhs = lax.reshape(lhs, (n, groups, c // groups, *spatial))
        lhs = lax.transpose(lhs, (1, 0, *range(2, lhs.ndim)))
    rhs = lax.reshape(rhs, (groups, o // groups, i, *window))
    summed = [3 + d for d, kind in enumerate(kinds) if kind == "contracted"]
    contract = ((2, *summed), (2, *summed))
    out = lax.dot_general(
        lhs,
        rhs,
        (contract, ((0,), (0,))),
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    # [g, N', free spatial..., O/g, the kernel's free windows (all of width 1)...]
    free = [s for s, kind in zip(lhs.shape[3:], kinds, strict=True) if kind == "free"]
    batch, per_group = lhs.shape[1], o // groups
    out = lax.reshape(out, (groups, batch, *free, per_group))
    out = lax.transpose(out, (1, 0, out.ndim - 1, *range(2, out.ndim - 1)))
    sizes = iter(free)
    shape = [next(sizes) if kind == "free" else 1 for kind in kinds]
    return lax.reshape(out, (batch, o, *shape))
