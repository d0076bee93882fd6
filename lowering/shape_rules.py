"""Shape rules: each op's result shapes and dtypes from its operands' and its attributes.

Rules take `jax.ShapeDtypeStruct`s positionally and attributes as keywords (regions as graphs) and
return a tuple of `jax.ShapeDtypeStruct`. Elementwise, layout and structured ops have rules of
their own; the index-heavy ops (gather, scatter, convolution, dot_general, pad, slices) use the
abstract evaluation of their jax.lax evaluation rule, which is exactly jax's own shape rule.
The verifier checks every op's recorded result types against these rules; the partitioner uses
them to derive per-shard shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from lowering.eval_rules import EVAL_RULES
from lowering.ir import Graph, Op
from lowering.library_ops import LIBRARY_SHAPE_RULES
from lowering.manual import manual_shape_rule
from lowering.vocabulary import BINARY, UNARY

Aval = jax.ShapeDtypeStruct
ShapeRule = Callable[..., tuple[Aval, ...]]
_BOOL = np.dtype(np.bool_)


def _same_as_first_shape_rule(x: Aval, *rest: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(x.shape, x.dtype),)


def _same_as_operands_shape_rule(*xs: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return tuple(Aval(x.shape, x.dtype) for x in xs)


def _predicate_shape_rule(x: Aval, *rest: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(x.shape, _BOOL),)


def _real_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.finfo(dtype).dtype if np.issubdtype(dtype, np.complexfloating) else dtype


def _real_part_shape_rule(x: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(x.shape, _real_dtype(x.dtype)),)


def _complex_shape_rule(x: Aval, y: Aval) -> tuple[Aval, ...]:
    return (Aval(x.shape, np.result_type(x.dtype, np.complex64)),)


def _select_shape_rule(pred: Aval, on_true: Aval, on_false: Aval) -> tuple[Aval, ...]:
    return (Aval(on_true.shape, on_true.dtype),)


def _clamp_shape_rule(low: Aval, x: Aval, high: Aval) -> tuple[Aval, ...]:
    return (Aval(x.shape, x.dtype),)


def _convert_shape_rule(x: Aval, *, new_dtype: np.dtype) -> tuple[Aval, ...]:
    return (Aval(x.shape, new_dtype),)


def _bitcast_convert_shape_rule(x: Aval, *, new_dtype: np.dtype) -> tuple[Aval, ...]:
    old, new = np.dtype(x.dtype).itemsize, np.dtype(new_dtype).itemsize
    if old == new:
        return (Aval(x.shape, new_dtype),)
    if old > new:
        return (Aval((*x.shape, old // new), new_dtype),)
    return (Aval(x.shape[:-1], new_dtype),)


def _constant_shape_rule(*, value: np.ndarray) -> tuple[Aval, ...]:
    return (Aval(value.shape, value.dtype),)


def _iota_shape_rule(
    *, dtype: np.dtype, shape: tuple[int, ...], dimension: int
) -> tuple[Aval, ...]:
    return (Aval(shape, dtype),)


def _broadcast_in_dim_shape_rule(
    x: Aval, *, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]
) -> tuple[Aval, ...]:
    return (Aval(shape, x.dtype),)


def _reshape_shape_rule(x: Aval, *, new_sizes: tuple[int, ...]) -> tuple[Aval, ...]:
    return (Aval(new_sizes, x.dtype),)


def _transpose_shape_rule(x: Aval, *, permutation: tuple[int, ...]) -> tuple[Aval, ...]:
    return (Aval(tuple(x.shape[p] for p in permutation), x.dtype),)


def _reduce_shape_rule(
    *operands: Aval, dimensions: tuple[int, ...], regions: Sequence[Graph]
) -> tuple[Aval, ...]:
    half = len(operands) // 2
    xs, inits = operands[:half], operands[half:]
    kept = [d for d in range(len(xs[0].shape)) if d not in dimensions]
    return tuple(
        Aval(tuple(x.shape[d] for d in kept), init.dtype) for x, init in zip(xs, inits, strict=True)
    )


def _window_size(
    size: int, window: int, stride: int, pad: tuple[int, int], base: int, dil: int
) -> int:
    padded = (size - 1) * base + 1 + pad[0] + pad[1]
    extent = (window - 1) * dil + 1
    return max(0, (padded - extent) // stride + 1)


def _reduce_window_shape_rule(
    *operands: Aval,
    window_dimensions: tuple[int, ...],
    window_strides: tuple[int, ...],
    padding: tuple[tuple[int, int], ...],
    base_dilation: tuple[int, ...],
    window_dilation: tuple[int, ...],
    regions: Sequence[Graph],
) -> tuple[Aval, ...]:
    half = len(operands) // 2
    sizes = zip(
        operands[0].shape,
        window_dimensions,
        window_strides,
        padding,
        base_dilation,
        window_dilation,
        strict=True,
    )
    shape = tuple(_window_size(*s) for s in sizes)
    return tuple(Aval(shape, init.dtype) for init in operands[half:])


def _sort_shape_rule(*operands: Aval, regions: Sequence[Graph], **attrs: Any) -> tuple[Aval, ...]:
    return tuple(Aval(x.shape, x.dtype) for x in operands)


def _top_k_shape_rule(x: Aval, *, k: int) -> tuple[Aval, ...]:
    shape = (*x.shape[:-1], k)
    return (Aval(shape, x.dtype), Aval(shape, np.dtype(np.int32)))


def _scatter_shape_rule(operand: Aval, *rest: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(operand.shape, operand.dtype),)


def _while_shape_rule(*state: Aval, regions: Sequence[Graph]) -> tuple[Aval, ...]:
    return tuple(Aval(x.shape, x.dtype) for x in state)


def _case_shape_rule(index: Aval, *, regions: Sequence[Graph]) -> tuple[Aval, ...]:
    return tuple(Aval(v.shape, v.dtype) for v in regions[0].outputs)


def _fusion_shape_rule(*inputs: Aval, regions: Sequence[Graph], **attrs: Any) -> tuple[Aval, ...]:
    return tuple(Aval(v.shape, v.dtype) for v in regions[0].outputs)


def _identity_shape_rule(*xs: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return tuple(Aval(x.shape, x.dtype) for x in xs)


def _abstract_shape_rule(name: str) -> ShapeRule:
    """The shape rule of jax.lax itself: abstract evaluation of the op's evaluation rule."""

    def rule(*operands: Aval, **attrs: Any) -> tuple[Aval, ...]:
        key = (name, operands, tuple(sorted(attrs.items())))
        try:
            return _evaluated(key)
        except TypeError:  # an attribute that does not hash: evaluate without the cache
            return _evaluate(key)

    rule.__name__ = f"_{name}_shape_rule"
    return rule


def _evaluate(key: tuple) -> tuple[Aval, ...]:
    name, operands, attrs = key
    with jax.enable_x64(True):
        out = jax.eval_shape(lambda *xs: EVAL_RULES[name](*xs, **dict(attrs)), *operands)
    return tuple(Aval(o.shape, o.dtype) for o in out)


# jax's abstract evaluation takes milliseconds; a model of many identical layers asks the same
# question thousands of times.
_evaluated = functools.lru_cache(maxsize=65536)(_evaluate)


_ABSTRACT = (
    "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "reverse", "gather",
    "dot_general", "convolution",
)  # fmt: skip


def _resized(x: Aval, dimension: int, size: int) -> tuple[Aval, ...]:
    shape = list(x.shape)
    shape[dimension] = size
    return (Aval(tuple(shape), x.dtype),)


def _all_gather_shape_rule(x: Aval, *, dimension: int, group_size: int, **attrs: Any) -> Any:
    return _resized(x, dimension, x.shape[dimension] * group_size)


def _split_shape_rule(x: Aval, *, dimension: int, group_size: int, **attrs: Any) -> Any:
    return _resized(x, dimension, x.shape[dimension] // group_size)


def _all_to_all_shape_rule(
    x: Aval, *, split_dimension: int, concat_dimension: int, group_size: int, **attrs: Any
) -> tuple[Aval, ...]:
    shape = list(x.shape)
    shape[split_dimension] //= group_size
    shape[concat_dimension] *= group_size
    return (Aval(tuple(shape), x.dtype),)


def _halo_exchange_shape_rule(
    x: Aval, *, dimension: int, before: int, after: int, **attrs: Any
) -> tuple[Aval, ...]:
    """The block with `before` rows of the previous IPU's before it and `after` of the next's
    after it: at most a block each way (one neighbour's)."""
    if not 0 <= before <= x.shape[dimension] or not 0 <= after <= x.shape[dimension]:
        raise ValueError(
            f"a halo of {before} and {after} rows around a block of {x.shape[dimension]}"
        )
    return _resized(x, dimension, x.shape[dimension] + before + after)


def _shard_index_shape_rule(indices: Aval, **attrs: Any) -> tuple[Aval, ...]:
    return (Aval(indices.shape, indices.dtype), Aval(indices.shape, _BOOL))


SHAPE_RULES: dict[str, ShapeRule] = {
    **LIBRARY_SHAPE_RULES,
    "shard_index": _shard_index_shape_rule,
    "all_reduce": _same_as_operands_shape_rule,  # variadic once combined
    "all_gather": _all_gather_shape_rule,
    "reduce_scatter": _split_shape_rule,
    "all_to_all": _all_to_all_shape_rule,
    "shard_slice": _split_shape_rule,
    "shard_mask": _same_as_first_shape_rule,
    "halo_exchange": _halo_exchange_shape_rule,
    **{name: _same_as_first_shape_rule for name in UNARY | BINARY},
    **{name: _predicate_shape_rule for name in ("is_finite", "is_inf", "is_neg_inf", "is_pos_inf")},
    **{name: _abstract_shape_rule(name) for name in _ABSTRACT},
    "compare": _predicate_shape_rule,
    "real": _real_part_shape_rule,
    "abs": _real_part_shape_rule,
    "imag": _real_part_shape_rule,
    "complex": _complex_shape_rule,
    "select": _select_shape_rule,
    "clamp": _clamp_shape_rule,
    "convert": _convert_shape_rule,
    "bitcast_convert": _bitcast_convert_shape_rule,
    "constant": _constant_shape_rule,
    "iota": _iota_shape_rule,
    "broadcast_in_dim": _broadcast_in_dim_shape_rule,
    "reshape": _reshape_shape_rule,
    "transpose": _transpose_shape_rule,
    "reduce": _reduce_shape_rule,
    "reduce_window": _reduce_window_shape_rule,
    "scatter": _scatter_shape_rule,
    "select_and_scatter": _scatter_shape_rule,
    "sort": _sort_shape_rule,
    "top_k": _top_k_shape_rule,
    "while": _while_shape_rule,
    "case": _case_shape_rule,
    "fusion": _fusion_shape_rule,
    "optimization_barrier": _identity_shape_rule,
    "sharding_constraint": _identity_shape_rule,
    "manual_computation": manual_shape_rule,
    "collective_permute": _same_as_first_shape_rule,
    "partition_id": lambda **attrs: (Aval((), np.dtype(np.uint32)),),
}


def infer_types(op: Op) -> tuple[Aval, ...]:
    """An op's result types by its shape rule, from its operands' types and its attributes."""
    operands = [Aval(v.shape, v.dtype) for v in op.operands]
    kwargs = dict(op.attrs)
    if op.regions:
        kwargs["regions"] = op.regions
    return SHAPE_RULES[op.name](*operands, **kwargs)
