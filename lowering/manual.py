"""shard_map's regions: a `manual_computation` runs its body once per IPU of its mesh, each on
its own block of the operands, and the collectives the body writes itself (`jax.lax.psum`,
`all_gather`, `psum_scatter`, `ppermute`, `all_to_all`, `axis_index`) run over mesh axes.

StableHLO names an IPU by its place in the mesh, counted row-major over the mesh's axes, and a
collective by its replica groups. Here a group becomes the mesh axes it spans, major to minor
in the order its members are listed, as the partitioner's own collectives name theirs, so the
body's collectives are costed and run exactly like the ones the partitioner inserts. Groups
that are not a product of mesh axes are refused.

The op's attributes: `mesh` ((axis, size) pairs), `in_specs` and `out_specs` (for each operand
and result, the axes splitting each of its dims) and `manual_axes`. Its semantics here (the
reference interpreter's) vmap the body over the mesh's axes by name; the partitioner instead
inlines the body into the per-IPU program (`partitioner.sharding.partition`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from lowering.errors import UnsupportedFeatureError

Array = Any
Spec = tuple[tuple[str, ...], ...]  # the axes splitting each dim
MeshAxes = tuple[tuple[str, int], ...]


# ---- shapes ---------------------------------------------------------------------------------


def ways(axes: Sequence[str], mesh: Mapping[str, int]) -> int:
    return math.prod(mesh[a] for a in axes)


def global_shape(local: Sequence[int], spec: Spec, mesh: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(n * ways(axes, mesh) for n, axes in zip(local, spec, strict=True))


# ---- replica groups as mesh axes --------------------------------------------------------------


def group_axes(groups: np.ndarray, mesh: MeshAxes) -> tuple[str, ...]:
    """The mesh axes a collective's replica groups span, major to minor as each group lists its
    members; every group must be the product of those axes at one place of the others."""
    names = [name for name, _ in mesh]
    sizes = [size for _, size in mesh]
    devices = math.prod(sizes)
    if groups.size == 0:  # no groups: every device in one
        groups = np.arange(devices)[None, :]
    coords = np.stack(np.unravel_index(groups, sizes), axis=-1)  # [group, member, axis]
    changes = coords[0] != coords[0, 0]  # [member, axis]
    varying = [a for a in range(len(sizes)) if changes[:, a].any()]
    # Major to minor: the minor axis is the one whose coordinate changes first along a group.
    varying.sort(key=lambda a: -int(np.argmax(changes[:, a])))
    fixed = [a for a in range(len(sizes)) if a not in varying]
    counts = [sizes[a] for a in varying]
    expected = np.stack(np.unravel_index(np.arange(math.prod(counts)), counts or [1]), -1)
    ok = groups.size == devices and len(np.unique(groups)) == devices
    for group in coords:
        ok = ok and group.shape[0] == expected.shape[0]
        ok = ok and np.array_equal(group[:, varying], expected[:, : len(varying)])
        ok = ok and bool(np.all(group[:, fixed] == group[0, fixed]))
    if ok:
        return tuple(names[a] for a in varying)
    raise UnsupportedFeatureError(
        f"replica groups {groups.tolist()} that are not a product of the mesh's axes "
        f"{dict(mesh)}; write the collective over named mesh axes"
    )


def permute_axis(pairs: np.ndarray, mesh: MeshAxes) -> tuple[tuple[str, ...], tuple]:
    """A collective permute's one mesh axis and its (source, target) places along it: each pair
    must move along that axis alone, alike at every place of the other axes."""
    names = [name for name, _ in mesh]
    sizes = [size for _, size in mesh]
    src = np.stack(np.unravel_index(pairs[:, 0], sizes), -1)
    dst = np.stack(np.unravel_index(pairs[:, 1], sizes), -1)
    moving = sorted({int(a) for a in np.nonzero(np.any(src != dst, axis=0))[0]})
    if not moving:
        return (), ()
    if len(moving) == 1:
        (axis,) = moving
        perm = sorted({(int(s[axis]), int(d[axis])) for s, d in zip(src, dst, strict=True)})
        places = math.prod(sizes) // sizes[axis]
        if len(perm) * places == len(pairs):
            return (names[axis],), tuple(perm)
    raise UnsupportedFeatureError(
        f"a collective permute with pairs {pairs.tolist()} that move along more than one of "
        f"the mesh's axes {dict(mesh)} or differently at different places; write each "
        "jax.lax.ppermute over one axis"
    )


# ---- the reference interpreter's semantics --------------------------------------------------


def manual_eval_rule(
    *xs: Array,
    regions: Sequence[Any],
    mesh: MeshAxes,
    in_specs: Sequence[Spec],
    out_specs: Sequence[Spec],
    manual_axes: tuple[str, ...],
) -> tuple[Array, ...]:
    """The body run once per IPU of the mesh on its blocks (a vmap per axis, by name), its
    results laid end to end along the dims their specs split and taken once where replicated."""
    (body,) = regions
    names = [name for name, _ in mesh]
    sizes = dict(mesh)
    blocks = [_blocks(x, spec, names, sizes) for x, spec in zip(xs, in_specs, strict=True)]
    fun = lambda *b: tuple(body(*b))  # noqa: E731
    for axis in reversed(names):  # the outermost vmap is the first axis
        fun = jax.vmap(fun, in_axes=0, out_axes=0, axis_name=axis)
    outs = fun(*blocks)
    return tuple(_joined(y, spec, names, sizes) for y, spec in zip(outs, out_specs, strict=True))


def _blocks(x: Array, spec: Spec, names: list[str], sizes: Mapping[str, int]) -> Array:
    """`x` as [*mesh, *block]: every IPU's block, repeated along the axes that do not split it."""
    rank = len(spec)
    shape: list[int] = []
    source: list[int] = []  # for each mesh axis, the dim of the split shape holding it, or -1
    where: dict[str, int] = {}
    for dim, axes in enumerate(spec):
        for axis in axes:
            where[axis] = len(shape)
            shape.append(sizes[axis])
        shape.append(x.shape[dim] // ways(axes, sizes))
        source.append(len(shape) - 1)
    split = lax.reshape(x, tuple(shape))
    order = [where[a] for a in names if a in where] + source
    moved = lax.transpose(split, tuple(order))
    for position, axis in enumerate(names):
        if axis not in where:
            moved = lax.broadcast_in_dim(
                moved,
                (*moved.shape[:position], sizes[axis], *moved.shape[position:]),
                tuple(d for d in range(moved.ndim + 1) if d != position),
            )
    assert moved.ndim == len(names) + rank
    return moved


def _joined(y: Array, spec: Spec, names: list[str], sizes: Mapping[str, int]) -> Array:
    """The global value of a result given as [*mesh, *block]: blocks laid end to end along the
    dims `spec` splits, the first IPU's along the axes it does not (equal on every IPU)."""
    split = {a for axes in spec for a in axes}
    for position in reversed(range(len(names))):
        if names[position] not in split:
            y = lax.index_in_dim(y, 0, position, keepdims=False)
    kept = [a for a in names if a in split]
    block_rank = y.ndim - len(kept)
    order: list[int] = []
    for dim, axes in enumerate(spec):
        order.extend(kept.index(a) for a in axes)
        order.append(len(kept) + dim)
    moved = lax.transpose(y, tuple(order))
    shape = tuple(y.shape[len(kept) + d] * ways(spec[d], sizes) for d in range(block_rank))
    return lax.reshape(moved, shape)


def manual_shape_rule(*operands: Any, regions: Sequence[Any], **attrs: Any) -> tuple[Any, ...]:
    """The global types of the body's results: each block times the IPUs its spec splits it
    over."""
    sizes = dict(attrs["mesh"])
    (body,) = regions
    return tuple(
        jax.ShapeDtypeStruct(global_shape(v.shape, spec, sizes), v.dtype)
        for v, spec in zip(body.outputs, attrs["out_specs"], strict=True)
    )
