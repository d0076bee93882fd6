"""Evaluation rules of the ops over the IPUs of mesh axes: collectives and shard ops, as
`jax.lax` collectives over named axes (the runtime vmaps the per-IPU program once per mesh
axis, with the axis's name). Part of `EVAL_RULES`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np
from jax import lax

from lowering.batched_slices import shard_block, shard_slice
from lowering.manual import manual_eval_rule

Array = Any


_ALL_REDUCES = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}
_REDUCE = {"sum": lax.reduce_sum, "max": lax.reduce_max, "min": lax.reduce_min}

# The mesh axes whose IPUs the runtime holds on one device, as one axis of a vmap.
_LOCAL_AXES: ContextVar[frozenset[str]] = ContextVar("local_axes", default=frozenset())


@contextlib.contextmanager
def local_mesh_axes(axes: Iterable[str]) -> Iterator[None]:
    """While tracing, all-reduces over only these axes gather and combine the IPUs' values.

    Under vmap a `psum` is a reduction over the mesh axis, a major dimension, which XLA:CPU runs
    about 30 times slower than adding the slices (12 ms against 0.4 ms for 8 x 1024 x 256 f32).
    Over an axis spread across real devices, `psum` stays: XLA makes it an all-reduce between
    them, where gathering would copy every IPU's value to every device."""
    token = _LOCAL_AXES.set(frozenset(axes))
    try:
        yield
    finally:
        _LOCAL_AXES.reset(token)


def _all_reduce_eval_rule(
    *xs: Array, axes: tuple[str, ...], group_size: int, reduction: str = "sum", **why: Any
) -> tuple[Array, ...]:
    """Each operand reduced over the IPUs of `axes` (several when a combiner merged them)."""
    if not set(axes) <= _LOCAL_AXES.get():
        return tuple(_ALL_REDUCES[reduction](xs, axes))
    return tuple(_gathered_reduction(x, axes, reduction) for x in xs)


# Below this many elements per IPU, a float sum over IPUs is a reduction (see _gathered_reduction).
DOT_SUM_MIN_ELEMENTS = 4096


def _gathered_reduction(x: Array, axes: tuple[str, ...], reduction: str) -> Array:
    """The IPUs' values of `x` over `axes` combined.

    A large float sum is a product with a vector of ones: XLA:CPU runs it as a matrix-vector
    product, which reads the IPUs' values in whatever order XLA laid them out. As a reduction
    over the IPUs' dimension, the sum read them in logical order, and where a matmul had made
    them transposed (a weight's gradient, its mesh axis in the middle) that read was strided:
    12 ms against 1 ms for 8 x 128 x 1024 f32, a third of the 64-IPU GPT step. But each product
    is a kernel of its own for XLA to compile, about 4 ms: below `DOT_SUM_MIN_ELEMENTS` a
    strided read costs microseconds, and the sum is a reduction over the IPUs' dimension (an
    integer sum, a max or a min always: exact in any order). One reduction compiles faster
    than the pairwise adds of the IPUs' slices it replaced (the equinox MLP on 64 IPUs: XLA's
    compile 1.01 -> 0.68 s, medians of five; warm calls alike). (The runtime folds a sum of
    matmuls into one matmul before it gets here, `ipujax.runtime.fused_sums`; what remains are
    sums of other values.)"""
    gathered = x
    for axis in axes:  # one axis at a time: under vmap, jax gathers over one
        gathered = lax.all_gather(gathered, axis)
    ipus = math.prod(gathered.shape[: len(axes)])
    gathered = lax.reshape(gathered, (ipus, *x.shape))  # [every IPU's value, ...]
    is_float = np.dtype(x.dtype).kind in "fc"
    if reduction == "sum" and is_float and math.prod(x.shape) >= DOT_SUM_MIN_ELEMENTS:
        ones = lax.full((ipus,), 1, x.dtype)
        return lax.dot_general(ones, gathered, (((0,), (0,)), ((), ())))
    return _REDUCE[reduction](gathered, (0,))


def _all_gather_eval_rule(
    x: Array, *, axes: tuple[str, ...], group_size: int, dimension: int, **why: Any
) -> tuple[Array, ...]:
    """The IPUs' blocks along `axes`, major to minor, laid end to end. One axis at a time, the
    minor first (under vmap jax gathers over one: over two it fails its axis size check)."""
    for axis in reversed(axes):
        x = lax.all_gather(x, axis, axis=dimension, tiled=True)
    return (x,)


def _reduce_scatter_eval_rule(
    x: Array, *, axes: tuple[str, ...], group_size: int, dimension: int, **why: Any
) -> tuple[Array, ...]:
    return (lax.psum_scatter(x, axes, scatter_dimension=dimension, tiled=True),)


def _all_to_all_eval_rule(
    x: Array,
    *,
    axes: tuple[str, ...],
    group_size: int,
    split_dimension: int,
    concat_dimension: int,
    **why: Any,
) -> tuple[Array, ...]:
    return (lax.all_to_all(_varying(x, axes), axes, split_dimension, concat_dimension, tiled=True),)


def _varying(x: Array, axes: tuple[str, ...]) -> Array:
    """`x` itself, but batched over `axes` under vmap: jax's all-to-all of a value vmap holds
    once for every IPU (an all-gather's result) returns wrong shapes (jax 0.10)."""
    index = lax.axis_index(axes)
    return lax.select(lax.broadcast(lax.eq(index, index), x.shape), x, x)


def _shard_slice_eval_rule(
    x: Array, *, axes: tuple[str, ...], group_size: int, dimension: int, **why: Any
) -> tuple[Array, ...]:
    if len(axes) == 1:  # a reshape under the runtime's vmap, not a gather
        return (shard_slice(x, axes[0], dimension, group_size),)
    return (shard_block(x, axes, dimension, group_size),)


def _shard_mask_eval_rule(
    x: Array, *, axes: tuple[str, ...], group_size: int, dimension: int, size: int, fill: Any
) -> tuple[Array, ...]:
    """Sets the padding of an unevenly sharded dimension (positions at or past the global
    `size`) to `fill`, the identity of the reduction about to read it."""
    local = x.shape[dimension]
    start = lax.mul(lax.axis_index(axes), np.int32(local))
    position = lax.add(lax.broadcasted_iota(np.int32, x.shape, dimension), start)
    valid = lax.lt(position, lax.full_like(position, size))
    return (lax.select(valid, x, lax.full_like(x, fill)),)


def _halo_exchange_eval_rule(
    x: Array,
    *,
    axes: tuple[str, ...],
    group_size: int,
    dimension: int,
    before: int,
    after: int,
    cyclic: bool,
    **why: Any,
) -> tuple[Array, ...]:
    """This IPU's block along `dimension` with the last `before` rows of the previous IPU's
    block before it and the first `after` rows of the next's after it, the IPUs numbered along
    `axes` as `shard_slice` numbers them. Round the group when `cyclic` (the first IPU's
    previous is the last); else the first gets zeros for its previous's rows, the last for
    its next's."""
    size = x.shape[dimension]
    parts = []
    if before:
        tail = lax.slice_in_dim(x, size - before, size, axis=dimension)
        parts.append(_from_neighbour(tail, axes, 1, cyclic))
    parts.append(x)
    if after:
        head = lax.slice_in_dim(x, 0, after, axis=dimension)
        parts.append(_from_neighbour(head, axes, -1, cyclic))
    return (lax.concatenate(parts, dimension),)


def _from_neighbour(x: Array, axes: tuple[str, ...], step: int, cyclic: bool) -> Array:
    """`x` of the IPU `step` (1: previous, -1: next) before this one in the order of `axes`,
    major to minor. One axis at a time (under vmap, jax permutes over one): a shift along the
    minor axis, and where it wraps round (the minor axis's first IPU for the previous), the
    value one step along the major axes instead, as a carry in counting."""
    *major, minor = axes
    ipus = lax.axis_size(minor)
    moved = lax.ppermute(x, minor, [(i, (i + step) % ipus) for i in range(ipus)])
    if major:
        wrapped = _from_neighbour(moved, tuple(major), step, cyclic)
    elif cyclic:
        return moved
    else:
        wrapped = lax.full_like(moved, 0)
    edge = 0 if step > 0 else ipus - 1
    at_edge = lax.eq(lax.axis_index(minor), np.int32(edge))
    return lax.select(lax.broadcast(at_edge, moved.shape), wrapped, moved)


def _shard_index_eval_rule(
    indices: Array, *, axes: tuple[str, ...], group_size: int, size: int
) -> tuple[Array, ...]:
    """Indices into a dimension split over `axes`, made local to this IPU's `size` rows, and
    whether each falls in this IPU's rows (a vocabulary-parallel embedding lookup)."""
    offset = lax.mul(lax.axis_index(axes), np.int32(size)).astype(indices.dtype)
    local = lax.sub(indices, lax.full_like(indices, offset))
    inside = lax.bitwise_and(
        lax.ge(local, lax.full_like(local, 0)), lax.lt(local, lax.full_like(local, size))
    )
    return local, inside


def _collective_permute_eval_rule(
    x: Array, *, axes: tuple[str, ...], group_size: int, pairs: tuple, **why: Any
) -> tuple[Array, ...]:
    """Each IPU's `x` to its target along the one axis of `axes`; an IPU no pair sends to gets
    zeros (`jax.lax.ppermute`)."""
    (axis,) = axes
    return (lax.ppermute(x, axis, perm=list(pairs)),)


def _partition_id_eval_rule(*, axes: tuple[str, ...], group_size: int) -> tuple[Array, ...]:
    """This IPU's place in the mesh, counted row-major over `axes` (the mesh's axes of more
    than one IPU: the others count nothing)."""
    if not axes:
        return (np.uint32(0),)
    return (lax.convert_element_type(lax.axis_index(axes), np.uint32),)


MESH_EVAL_RULES: dict[str, Callable[..., tuple[Array, ...]]] = {
    "manual_computation": manual_eval_rule,
    "collective_permute": _collective_permute_eval_rule,
    "partition_id": _partition_id_eval_rule,
    "shard_index": _shard_index_eval_rule,
    "all_reduce": _all_reduce_eval_rule,
    "all_gather": _all_gather_eval_rule,
    "reduce_scatter": _reduce_scatter_eval_rule,
    "all_to_all": _all_to_all_eval_rule,
    "shard_slice": _shard_slice_eval_rule,
    "shard_mask": _shard_mask_eval_rule,
    "halo_exchange": _halo_exchange_eval_rule,
}
