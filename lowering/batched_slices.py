"""Dynamic slices that stay slices under `jax.vmap`.

The tile runtime runs a mesh's per-IPU program vmapped over the mesh axes, and jax batches every
`dynamic_slice` and `dynamic_update_slice` into a gather or a scatter, even when only the operand
differs between IPUs and the start indices are the same on all of them: the usual case, a loop's
trip counter slicing a stacked weight or writing a stacked gradient. XLA's CPU compiler takes
longer over a gather or a scatter than over the slice it stands for (the scanned transformer on
dp2 x tp2 had 72 gathers and 60 scatters in the runtime's program). So the two ops are jax
primitives of their own here, lowered as jax's, whose batching rule keeps them slices while the
starts are unbatched: the same op over one more dimension, started at 0 along it. Starts that
differ between copies (a shard's offset) take jax's own rule, the gather or the scatter.

A shard's slice over one mesh axis (IPU i takes block i of a dimension) is the third: jax gathers
on its start `axis_index * size`, where for a value the same on every IPU of the axis it is a
reshape into the IPUs' blocks.

The dynamic slices follow StableHLO, not `jax.lax`: a start is clamped into range, a negative one
to 0. jax's `lax.dynamic_slice` counts a negative start from the end, as jnp indexing does, and
its lowering has done so before the op reaches StableHLO; doing it again changes such a start,
and costs three ops a start, which every level of vmap traced again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

Array = Any


def _lax_slice(x: Array, *starts: Array, sizes: tuple[int, ...]) -> Array:
    return lax.dynamic_slice(x, starts, sizes, allow_negative_indices=False)


def _lax_update(x: Array, update: Array, *starts: Array) -> Array:
    return lax.dynamic_update_slice(x, update, starts, allow_negative_indices=False)


_slice_p = Primitive("ipujax_dynamic_slice")
_slice_p.def_impl(_lax_slice)
_slice_p.def_abstract_eval(lambda x, *starts, sizes: x.update(shape=sizes))
mlir.register_lowering(_slice_p, mlir.lower_fun(_lax_slice, multiple_results=False))

_update_p = Primitive("ipujax_dynamic_update_slice")
_update_p.def_impl(_lax_update)
_update_p.def_abstract_eval(lambda x, update, *starts: x)
mlir.register_lowering(_update_p, mlir.lower_fun(_lax_update, multiple_results=False))


def dynamic_slice(x: Array, starts: Sequence[Array], sizes: Sequence[int]) -> Array:
    """StableHLO's `dynamic_slice`: a dynamic slice under vmap unless the starts are batched."""
    return _slice_p.bind(x, *starts, sizes=tuple(int(n) for n in sizes))


def dynamic_update_slice(x: Array, update: Array, starts: Sequence[Array]) -> Array:
    """StableHLO's `dynamic_update_slice`: one under vmap unless the starts are batched."""
    return _update_p.bind(x, update, *starts)


def _zero_at(starts: Sequence[Array], dim: int) -> list[Array]:
    """`starts` with a start of 0, of their own type (lax asks for one), inserted at `dim`."""
    zero = np.zeros((), getattr(starts[0], "dtype", np.int32) if starts else np.int32)
    return [*starts[:dim], zero, *starts[dim:]]


def _slice_batched(
    args: Sequence[Array], dims: Sequence[int | None], *, sizes: tuple[int, ...]
) -> tuple[Array, int]:
    x, *starts = args
    if any(d is not None for d in dims[1:]):  # each copy its own offset: jax's gather
        return jax.vmap(functools.partial(_lax_slice, sizes=sizes), tuple(dims))(*args), 0
    at = dims[0]
    assert at is not None  # vmap batches some argument
    n = x.shape[at]
    out = dynamic_slice(x, _zero_at(starts, at), (*sizes[:at], n, *sizes[at:]))
    return out, at


def _update_batched(args: Sequence[Array], dims: Sequence[int | None]) -> tuple[Array, int]:
    x, update, *starts = args
    if any(d is not None for d in dims[2:]):  # each copy its own offset: jax's scatter
        return jax.vmap(_lax_update, tuple(dims))(*args), 0
    x_at, update_at = dims[0], dims[1]
    n = x.shape[x_at] if x_at is not None else update.shape[update_at]
    at = x_at if x_at is not None else update_at
    assert at is not None
    if x_at is None:
        x = batching.broadcast(x, n, at, None)
    if update_at is None:
        update = batching.broadcast(update, n, at, None)
    elif update_at != at:
        order = [d for d in range(update.ndim) if d != update_at]
        update = lax.transpose(update, (*order[:at], update_at, *order[at:]))
    return dynamic_update_slice(x, update, _zero_at(starts, at)), at


batching.primitive_batchers[_slice_p] = _slice_batched
batching.primitive_batchers[_update_p] = _update_batched


# ---- a shard's slice: each IPU of a mesh axis its own block of a dimension -------------------


def shard_block(x: Array, axes: str | tuple[str, ...], dimension: int, count: int) -> Array:
    """The block of `count` along `dimension` that the IPU's index over `axes` (major to
    minor) names, by jax's own ops: under vmap, a gather (see `shard_slice`)."""
    size = x.shape[dimension] // count
    start = lax.mul(lax.axis_index(axes), np.int32(size))
    return lax.dynamic_slice_in_dim(x, start, size, dimension)


def _lax_shard_slice(x: Array, *, axis: str, dimension: int, count: int) -> Array:
    return shard_block(x, axis, dimension, count)


_shard_p = Primitive("ipujax_shard_slice")
_shard_p.def_abstract_eval(
    lambda x, *, axis, dimension, count: x.update(
        shape=(*x.shape[:dimension], x.shape[dimension] // count, *x.shape[dimension + 1 :])
    )
)
mlir.register_lowering(_shard_p, mlir.lower_fun(_lax_shard_slice, multiple_results=False))


def shard_slice(x: Array, axis: str, dimension: int, count: int) -> Array:
    """IPU i of mesh axis `axis` (of `count` IPUs) takes block i of `count` along `dimension`.
    Under the runtime's vmap over `axis`, a value the same on every IPU is cut into its blocks
    by a reshape, where the start `axis_index * size` made jax gather."""
    return _shard_p.bind(x, axis=axis, dimension=dimension, count=count)


def _shard_batched(
    axis_data: Any,
    args: Sequence[Array],
    dims: Sequence[int | None],
    *,
    axis: str,
    dimension: int,
    count: int,
) -> tuple[Array, int | None]:
    (x,), (at,) = args, dims
    inner = dimension + (at is not None and at <= dimension)  # the dimension in batched x
    if axis_data.name != axis:  # another mesh axis: each copy slices as it would alone
        return shard_slice(x, axis, inner, count), at
    size = x.shape[inner] // count
    if at is None:  # the same on every IPU: its blocks, IPU first
        shape = (*x.shape[:dimension], count, size, *x.shape[dimension + 1 :])
        return lax.reshape(x, shape), dimension
    # Each IPU its own value, and its own block of it: jax's gather of block i from copy i.
    starts = lax.mul(lax.iota(np.int32, count), np.int32(size))
    in_axes = (at, 0)

    def block(x: Array, start: Array) -> Array:
        return lax.dynamic_slice_in_dim(x, start, size, dimension, allow_negative_indices=False)

    sliced = jax.vmap(block, in_axes)
    return sliced(x, starts), 0


batching.fancy_primitive_batchers[_shard_p] = _shard_batched
