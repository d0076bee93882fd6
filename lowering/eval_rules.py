"""Evaluation rules: each op's meaning as a `jax.lax` computation.

A rule takes the operand arrays positionally and the op's attributes as keyword-only arguments,
so its signature is the op's schema. Ops with regions also receive `regions`: one Python callable
per region, which evaluates that region's graph. The same rules are the kernel bodies of the tile
runtime, traced inside one jitted program and under `jax.vmap` over mesh axes, so they use only
jax.lax and never look at concrete values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import lax

# jax.lax has select_and_scatter only as the private primitive behind pooling gradients.
from jax._src.lax.windowed_reductions import _select_and_scatter_add

from lowering.batched_slices import dynamic_slice, dynamic_update_slice
from lowering.conv_dots import convolution_eval_rule
from lowering.dtypes import is_float
from lowering.fusion import fusion_eval_rule
from lowering.library_ops import LIBRARY_EVAL_RULES
from lowering.mesh_rules import MESH_EVAL_RULES
from lowering.regions import binary_op

Array = Any
EvalRule = Callable[..., tuple[Array, ...]]
Region = Callable[..., tuple[Array, ...]]


def _one(fn: Callable[..., Array]) -> EvalRule:
    """A rule for a one-result op from a jax.lax function of the operands."""

    def rule(*operands: Array) -> tuple[Array, ...]:
        return (fn(*operands),)

    rule.__name__ = f"_{getattr(fn, '__name__', 'op')}_eval_rule"
    return rule


_LAX_ELEMENTWISE: dict[str, Callable[..., Array]] = {
    "abs": lax.abs,
    "cbrt": lax.cbrt,
    "ceil": lax.ceil,
    "count_leading_zeros": lax.clz,
    "cosine": lax.cos,
    "exponential": lax.exp,
    "exponential_minus_one": lax.expm1,
    "floor": lax.floor,
    "log": lax.log,
    "log_plus_one": lax.log1p,
    "logistic": lax.logistic,
    "negate": lax.neg,
    "not": lax.bitwise_not,
    "popcnt": lax.population_count,
    "rsqrt": lax.rsqrt,
    "sign": lax.sign,
    "sine": lax.sin,
    "sqrt": lax.sqrt,
    "tan": lax.tan,
    "tanh": lax.tanh,
    "acos": lax.acos,
    "acosh": lax.acosh,
    "asin": lax.asin,
    "asinh": lax.asinh,
    "atan": lax.atan,
    "atanh": lax.atanh,
    "bessel_i1e": lax.bessel_i1e,
    "conj": lax.conj,
    "cosh": lax.cosh,
    "digamma": lax.digamma,
    "erf": lax.erf,
    "erf_inv": lax.erf_inv,
    "erfc": lax.erfc,
    "lgamma": lax.lgamma,
    "sinh": lax.sinh,
    "square": lax.square,
    "is_finite": lax.is_finite,
    "real": lax.real,
    "imag": lax.imag,
    "add": lax.add,
    "subtract": lax.sub,
    "multiply": lax.mul,
    "divide": lax.div,
    "remainder": lax.rem,
    "power": lax.pow,
    "maximum": lax.max,
    "minimum": lax.min,
    "atan2": lax.atan2,
    "and": lax.bitwise_and,
    "or": lax.bitwise_or,
    "xor": lax.bitwise_xor,
    "shift_left": lax.shift_left,
    "shift_right_arithmetic": lax.shift_right_arithmetic,
    "shift_right_logical": lax.shift_right_logical,
    "next_after": lax.nextafter,
    "polygamma": lax.polygamma,
    "zeta": lax.zeta,
    "complex": lax.complex,
    "select": lax.select,
    "clamp": lax.clamp,
    "dynamic_update_slice": lambda x, update, *starts: dynamic_update_slice(x, update, starts),
}


def _round_nearest_afz_eval_rule(x: Array) -> tuple[Array, ...]:
    return (lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),)


def _round_nearest_even_eval_rule(x: Array) -> tuple[Array, ...]:
    return (lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),)


def _is_inf_eval_rule(x: Array) -> tuple[Array, ...]:
    return (lax.eq(lax.abs(x), lax.full_like(x, np.inf)),)


def _is_pos_inf_eval_rule(x: Array) -> tuple[Array, ...]:
    return (lax.eq(x, lax.full_like(x, np.inf)),)


def _is_neg_inf_eval_rule(x: Array) -> tuple[Array, ...]:
    return (lax.eq(x, lax.full_like(x, -np.inf)),)


def _reduce_precision_eval_rule(
    x: Array, *, exponent_bits: int, mantissa_bits: int
) -> tuple[Array, ...]:
    return (lax.reduce_precision(x, exponent_bits, mantissa_bits),)


def _convert_eval_rule(x: Array, *, new_dtype: np.dtype) -> tuple[Array, ...]:
    return (lax.convert_element_type(x, new_dtype),)


def _bitcast_convert_eval_rule(x: Array, *, new_dtype: np.dtype) -> tuple[Array, ...]:
    return (lax.bitcast_convert_type(x, new_dtype),)


_COMPARISONS = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}


def _total_order_key(x: Array) -> Array:
    """An integer with the IEEE total order of a float: -NaN < -inf < -0 < +0 < inf < NaN."""
    bits = lax.bitcast_convert_type(x, np.dtype(f"int{8 * x.dtype.itemsize}"))
    flip = lax.bitwise_not(lax.full_like(bits, np.iinfo(bits.dtype).min))
    return lax.select(lax.lt(bits, lax.full_like(bits, 0)), lax.bitwise_xor(bits, flip), bits)


def _compare_eval_rule(
    x: Array, y: Array, *, direction: str, compare_type: str
) -> tuple[Array, ...]:
    if compare_type == "TOTALORDER" and is_float(np.dtype(x.dtype)):
        x, y = _total_order_key(x), _total_order_key(y)
    return (_COMPARISONS[direction](x, y),)


def _constant_eval_rule(*, value: np.ndarray) -> tuple[Array, ...]:
    return (value,)


def _iota_eval_rule(
    *, dtype: np.dtype, shape: tuple[int, ...], dimension: int
) -> tuple[Array, ...]:
    return (lax.broadcasted_iota(dtype, shape, dimension),)


def _broadcast_in_dim_eval_rule(
    x: Array, *, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
) -> tuple[Array, ...]:
    if tuple(shape) == np.shape(x) and tuple(broadcast_dimensions) == tuple(range(len(shape))):
        return (x,)  # no broadcast: a constant stays one jax can read (a reduction's start)
    return (lax.broadcast_in_dim(x, shape, broadcast_dimensions),)


def _reshape_eval_rule(x: Array, *, new_sizes: tuple[int, ...]) -> tuple[Array, ...]:
    return (lax.reshape(x, new_sizes),)


def _transpose_eval_rule(x: Array, *, permutation: tuple[int, ...]) -> tuple[Array, ...]:
    return (lax.transpose(x, permutation),)


def _slice_eval_rule(
    x: Array, *, start_indices: Sequence[int], limit_indices: Sequence[int], strides: Sequence[int]
) -> tuple[Array, ...]:
    return (lax.slice(x, start_indices, limit_indices, strides),)


def _dynamic_slice_eval_rule(
    x: Array, *starts: Array, slice_sizes: tuple[int, ...]
) -> tuple[Array, ...]:
    return (dynamic_slice(x, starts, slice_sizes),)


def _concatenate_eval_rule(*xs: Array, dimension: int) -> tuple[Array, ...]:
    return (lax.concatenate(xs, dimension),)


def _pad_eval_rule(
    x: Array, padding_value: Array, *, padding_config: tuple[tuple[int, int, int], ...]
) -> tuple[Array, ...]:
    return (lax.pad(x, padding_value, padding_config),)


def _reverse_eval_rule(x: Array, *, dimensions: tuple[int, ...]) -> tuple[Array, ...]:
    return (lax.rev(x, dimensions),)


def _indices_last(indices: Array, index_vector_dim: int) -> Array:
    """jax.lax wants the index vector in the last dimension of the indices."""
    if index_vector_dim == indices.ndim:
        return lax.expand_dims(indices, (indices.ndim,))
    order = [d for d in range(indices.ndim) if d != index_vector_dim] + [index_vector_dim]
    return lax.transpose(indices, order)


def _gather_eval_rule(
    operand: Array,
    indices: Array,
    *,
    offset_dims: tuple[int, ...],
    collapsed_slice_dims: tuple[int, ...],
    start_index_map: tuple[int, ...],
    operand_batching_dims: tuple[int, ...],
    start_indices_batching_dims: tuple[int, ...],
    index_vector_dim: int,
    slice_sizes: tuple[int, ...],
    indices_are_sorted: bool,
) -> tuple[Array, ...]:
    numbers = lax.GatherDimensionNumbers(
        offset_dims=offset_dims,
        collapsed_slice_dims=collapsed_slice_dims,
        start_index_map=start_index_map,
        operand_batching_dims=operand_batching_dims,
        start_indices_batching_dims=_batching_dims_after_move(
            start_indices_batching_dims, index_vector_dim
        ),
    )
    # StableHLO clamps gather starts into bounds; PROMISE_IN_BOUNDS emits the op as it is.
    out = lax.gather(
        operand,
        _indices_last(indices, index_vector_dim),
        numbers,
        slice_sizes,
        indices_are_sorted=indices_are_sorted,
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
    return (out,)


def _batching_dims_after_move(dims: tuple[int, ...], index_vector_dim: int) -> tuple[int, ...]:
    return tuple(d - 1 if d > index_vector_dim else d for d in dims)


_SCATTERS = {
    "set": lax.scatter,
    "add": lax.scatter_add,
    "mul": lax.scatter_mul,
    "min": lax.scatter_min,
    "max": lax.scatter_max,
}


def _scatter_eval_rule(
    operand: Array,
    indices: Array,
    updates: Array,
    *,
    update_window_dims: tuple[int, ...],
    inserted_window_dims: tuple[int, ...],
    scatter_dims_to_operand_dims: tuple[int, ...],
    operand_batching_dims: tuple[int, ...],
    scatter_indices_batching_dims: tuple[int, ...],
    index_vector_dim: int,
    indices_are_sorted: bool,
    unique_indices: bool,
    combiner: str,
    regions: Sequence[Region] = (),
) -> tuple[Array, ...]:
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=update_window_dims,
        inserted_window_dims=inserted_window_dims,
        scatter_dims_to_operand_dims=scatter_dims_to_operand_dims,
        operand_batching_dims=operand_batching_dims,
        scatter_indices_batching_dims=_batching_dims_after_move(
            scatter_indices_batching_dims, index_vector_dim
        ),
    )
    # StableHLO skips out-of-bounds updates, which is jax's FILL_OR_DROP.
    out = _SCATTERS[combiner](
        operand,
        _indices_last(indices, index_vector_dim),
        updates,
        numbers,
        indices_are_sorted=indices_are_sorted,
        unique_indices=unique_indices,
        mode=lax.GatherScatterMode.FILL_OR_DROP,
    )
    return (out,)


def _sort_eval_rule(
    *operands: Array, dimension: int, is_stable: bool, num_keys: int, regions: Sequence[Region]
) -> tuple[Array, ...]:
    return tuple(lax.sort(operands, dimension=dimension, is_stable=is_stable, num_keys=num_keys))


def _top_k_eval_rule(x: Array, *, k: int) -> tuple[Array, ...]:
    return tuple(lax.top_k(x, k))


def _split(values: Sequence[Array]) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    half = len(values) // 2
    return tuple(values[:half]), tuple(values[half:])


def _reducer(region: Region) -> Callable[[Any, Any], Any]:
    """A jax.lax reduction computation from a region over (accumulators..., values...)."""
    return lambda acc, x: tuple(region(*acc, *x))


def _monoid(region: Region) -> Callable[[Array, Array], Array] | None:
    """The jax.lax function a region is when it is one commutative op on its two inputs (a
    sum, a max...): given it and its identity, jax.lax reduces with `reduce_sum` and kin
    rather than tracing the region, a tenth of the time for the same XLA reduce."""
    graph = getattr(region, "graph", None)
    name = binary_op(graph) if graph is not None else None
    return _LAX_ELEMENTWISE[name] if name is not None and name in _MONOIDS else None


def _reduce_eval_rule(
    *operands: Array, dimensions: tuple[int, ...], regions: Sequence[Region]
) -> tuple[Array, ...]:
    xs, inits = _split(operands)
    monoid = _monoid(regions[0]) if len(xs) == 1 else None
    if monoid is not None:
        return (lax.reduce(xs[0], inits[0], monoid, dimensions),)
    return tuple(lax.reduce(xs, inits, _reducer(regions[0]), dimensions))


def _reduce_window_eval_rule(
    *operands: Array,
    window_dimensions: tuple[int, ...],
    window_strides: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    base_dilation: tuple[int, ...],
    window_dilation: tuple[int, ...],
    regions: Sequence[Region],
) -> tuple[Array, ...]:
    xs, inits = _split(operands)
    window = (window_dimensions, window_strides, padding, base_dilation, window_dilation)
    monoid = _monoid(regions[0]) if len(xs) == 1 else None
    if monoid is not None:
        return (lax.reduce_window(xs[0], inits[0], monoid, *window),)
    return tuple(lax.reduce_window(xs, inits, _reducer(regions[0]), *window))


# The region ops jax.lax recognises as a reduction's monoid (given their identity as start).
_MONOIDS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})

_WINDOW_SELECTS = {"GE": lax.ge_p, "GT": lax.gt_p, "LE": lax.le_p, "LT": lax.lt_p}


def _select_and_scatter_eval_rule(
    operand: Array,
    source: Array,
    init_value: Array,
    *,
    window_dimensions: tuple[int, ...],
    window_strides: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    select: str,
    regions: Sequence[Region] = (),
) -> tuple[Array, ...]:
    scattered = _select_and_scatter_add(
        source, operand, _WINDOW_SELECTS[select], window_dimensions, window_strides, padding
    )
    # Every output element starts at init_value and adds the sources that selected it.
    return (lax.add(scattered, lax.broadcast(init_value, scattered.shape)),)


def _lax_precision(precision: tuple[str, ...]) -> Any:
    return tuple(lax.Precision[p] for p in precision)


def _dot_general_eval_rule(
    lhs: Array,
    rhs: Array,
    *,
    dimension_numbers: Any,
    precision: tuple[str, ...],
    preferred_element_type: np.dtype,
) -> tuple[Array, ...]:
    out = lax.dot_general(
        lhs,
        rhs,
        dimension_numbers,
        precision=_lax_precision(precision),
        preferred_element_type=preferred_element_type,
    )
    return (out,)


def _while_eval_rule(
    *state: Array, regions: Sequence[Region], count_trips: bool = False
) -> tuple[Array, ...]:
    # With `count_trips` (the runtime's), an int32 counter beside the state: its trips follow.
    (cond, body), n, counter = regions, len(state), (np.int32(0),) if count_trips else ()
    step = lambda s: (*body(*s[:n]), *(c + np.int32(1) for c in s[n:]))  # noqa: E731
    return tuple(lax.while_loop(lambda s: cond(*tuple(s)[:n])[0], step, (*state, *counter)))


def _case_eval_rule(index: Array, *, regions: Sequence[Region]) -> tuple[Array, ...]:
    # StableHLO runs the last branch for an index out of range; lax.switch clamps, so map first.
    last = len(regions) - 1
    out_of_range = lax.bitwise_or(
        lax.lt(index, lax.full_like(index, 0)), lax.gt(index, lax.full_like(index, last))
    )
    index = lax.select(out_of_range, lax.full_like(index, last), index)
    return tuple(lax.switch(index, [lambda r=r: tuple(r()) for r in regions]))


def _optimization_barrier_eval_rule(*xs: Array) -> tuple[Array, ...]:
    return tuple(lax.optimization_barrier(xs))


def _sharding_constraint_eval_rule(x: Array, **sharding: Any) -> tuple[Array, ...]:
    # A layout annotation for the partitioner; it does not change values.
    return (x,)


EVAL_RULES: dict[str, EvalRule] = {
    **(MESH_EVAL_RULES | LIBRARY_EVAL_RULES),
    **{name: _one(fn) for name, fn in _LAX_ELEMENTWISE.items()},
    "round_nearest_afz": _round_nearest_afz_eval_rule,
    "round_nearest_even": _round_nearest_even_eval_rule,
    "is_inf": _is_inf_eval_rule,
    "is_pos_inf": _is_pos_inf_eval_rule,
    "is_neg_inf": _is_neg_inf_eval_rule,
    "reduce_precision": _reduce_precision_eval_rule,
    "convert": _convert_eval_rule,
    "bitcast_convert": _bitcast_convert_eval_rule,
    "compare": _compare_eval_rule,
    "constant": _constant_eval_rule,
    "iota": _iota_eval_rule,
    "broadcast_in_dim": _broadcast_in_dim_eval_rule,
    "reshape": _reshape_eval_rule,
    "transpose": _transpose_eval_rule,
    "slice": _slice_eval_rule,
    "dynamic_slice": _dynamic_slice_eval_rule,
    "concatenate": _concatenate_eval_rule,
    "pad": _pad_eval_rule,
    "reverse": _reverse_eval_rule,
    "gather": _gather_eval_rule,
    "scatter": _scatter_eval_rule,
    "select_and_scatter": _select_and_scatter_eval_rule,
    "sort": _sort_eval_rule,
    "top_k": _top_k_eval_rule,
    "reduce": _reduce_eval_rule,
    "reduce_window": _reduce_window_eval_rule,
    "dot_general": _dot_general_eval_rule,
    "convolution": convolution_eval_rule,
    "while": _while_eval_rule,
    "case": _case_eval_rule,
    "fusion": fusion_eval_rule,
    "optimization_barrier": _optimization_barrier_eval_rule,
    "sharding_constraint": _sharding_constraint_eval_rule,
}
