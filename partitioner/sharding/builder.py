"""The builder of the per-IPU program: emits its ops with their per-IPU types, and the
resharding between shardings (AllReduce or ReduceScatter of partial sums, AllGather of axes to
drop, a local slice for axes to add, masks of padding), each collective with the reason for it.
`partition` drives it one global op at a time."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lowering import Graph, Op, SourceLoc, Value
from partitioner.sharding.specs import Axes, Sharding
from partitioner.sharding.type_cache import TypeCache


class Builder:
    """Emits the per-IPU ops, one global op at a time."""

    def __init__(self, mesh: Mapping[str, int], first_id: int) -> None:
        self.mesh = mesh
        self.ids = itertools.count(first_id)
        self.ops: list[Op] = []
        self.types = TypeCache()

    def fork(self) -> Builder:
        """A builder for a region: its own ops, values numbered with this one's."""
        forked = Builder(self.mesh, 0)
        forked.ids = self.ids
        forked.types = self.types
        return forked

    def value(self, shape: tuple[int, ...], dtype: np.dtype) -> Value:
        return Value(next(self.ids), tuple(shape), np.dtype(dtype))

    def emit(
        self,
        name: str,
        operands: Sequence[Value],
        attrs: Mapping[str, Any],
        loc: SourceLoc,
        regions: tuple[Graph, ...] = (),
    ) -> tuple[Value, ...]:
        types = self.types.infer(name, operands, attrs, regions, loc)
        return self.append(name, operands, attrs, loc, regions, types)

    def append(
        self,
        name: str,
        operands: Sequence[Value],
        attrs: Mapping[str, Any],
        loc: SourceLoc,
        regions: tuple[Graph, ...],
        types: Sequence[Any],
    ) -> tuple[Value, ...]:
        """`emit` of an op whose result types are known (each has a shape and a dtype)."""
        results = tuple(self.value(a.shape, a.dtype) for a in types)
        self.ops.append(Op(name, tuple(operands), results, attrs, regions, loc))
        return results

    def group(self, axes: Axes) -> int:
        return math.prod(self.mesh[a] for a in axes)

    # ---- resharding ------------------------------------------------------------------------

    def collective(
        self, kind: str, x: Value, axes: Axes, loc: SourceLoc, why: str, **attrs: Any
    ) -> Value:
        full = {"axes": axes, "group_size": self.group(axes), **attrs, "why": why}
        return self.emit(kind, [x], full, loc)[0]

    def shard_slice(self, x: Value, dim: int, axes: Axes, loc: SourceLoc) -> Value:
        groups = self.group(axes)
        size = x.shape[dim]
        padded = -(-size // groups) * groups
        if padded != size:
            x = self.pad(x, dim, padded - size, loc)
        attrs = {"axes": axes, "group_size": groups, "dimension": dim}
        return self.emit("shard_slice", [x], attrs, loc)[0]

    def pad(self, x: Value, dim: int, extra: int, loc: SourceLoc) -> Value:
        zero = self.emit("constant", [], {"value": np.zeros((), x.dtype)}, loc)[0]
        config = tuple((0, extra if d == dim else 0, 0) for d in range(len(x.shape)))
        return self.emit("pad", [x, zero], {"padding_config": config}, loc)[0]

    def unpad(self, x: Value, dim: int, size: int, loc: SourceLoc) -> Value:
        if x.shape[dim] == size:
            return x
        limits = tuple(size if d == dim else n for d, n in enumerate(x.shape))
        attrs = {
            "start_indices": (0,) * len(x.shape),
            "limit_indices": limits,
            "strides": (1,) * len(x.shape),
        }
        return self.emit("slice", [x], attrs, loc)[0]

    def reshard(
        self,
        x: Value,
        cur: Sharding,
        req: Sharding,
        shape: tuple[int, ...],
        loc: SourceLoc,
        why: str,
    ) -> Value:
        """`x` (this IPU's block of a tensor of global `shape` sharded as `cur`) as `req`."""
        if cur.partial and cur.partial != req.partial:
            x, cur = self.finish_partial(x, cur, req, shape, loc, why)
        # Gather first, then slice: while an axis leaves one dim for another, the tensor must
        # never be split over it twice.
        kept = []
        for dim, (have, want) in enumerate(zip(cur.dims, req.dims, strict=True)):
            x, left = self._drop_axes(x, dim, have, want, shape[dim], loc, why)
            kept.append(left)
        for dim, (have, want) in enumerate(zip(kept, req.dims, strict=True)):
            if have != want:
                x = self.shard_slice(x, dim, want[len(have) :], loc)
        return x

    def finish_partial(
        self,
        x: Value,
        cur: Sharding,
        req: Sharding,
        shape: tuple[int, ...],
        loc: SourceLoc,
        why: str,
    ) -> tuple[Value, Sharding]:
        pending = cur.partial
        dims = list(cur.dims)
        for dim, (have, want) in enumerate(zip(cur.dims, req.dims, strict=True)):
            even = shape[dim] % self.group(have + pending) == 0
            if want == have + pending and even:
                x = self.collective("reduce_scatter", x, pending, loc, why, dimension=dim)
                dims[dim] = have + pending
                return x, Sharding(tuple(dims))
        x = self.collective("all_reduce", x, pending, loc, why)
        return x, Sharding(tuple(dims))

    def _drop_axes(
        self, x: Value, dim: int, have: Axes, want: Axes, size: int, loc: SourceLoc, why: str
    ) -> tuple[Value, Axes]:
        """Gathers `dim` down to the axes it keeps on the way to `want`: the common prefix when
        the sizes divide evenly, else none (gathered whole, its padding dropped)."""
        if have == want:
            return x, have
        even = size % self.group(have) == 0 and size % self.group(want) == 0
        common = 0
        while common < min(len(have), len(want)) and have[common] == want[common]:
            common += 1
        keep = have[:common] if even else ()
        if have == keep:
            return x, keep
        x = self.collective("all_gather", x, have[len(keep) :], loc, why, dimension=dim)
        if not keep:
            x = self.unpad(x, dim, size, loc)
        return x, keep

    def split_lookup(
        self, op: Op, operands: list[Value], attrs: dict, dim: int, axes: Axes
    ) -> tuple[Value, ...]:
        """A gather or scatter on a table split along the indexed dim: indices made local to
        this IPU's rows; a gather zeros the rows it does not hold (its result is a partial
        sum over `axes`), a scatter drops them (out-of-bounds updates are skipped)."""
        table, indices = operands[0], operands[1]
        index_attrs = {"axes": axes, "group_size": self.group(axes), "size": table.shape[dim]}
        local, inside = self.emit("shard_index", [indices], index_attrs, op.loc)
        if op.name == "scatter":
            return self.emit("scatter", [table, local, *operands[2:]], attrs, op.loc, op.regions)
        (found,) = self.emit("gather", [table, local, *operands[2:]], attrs, op.loc, op.regions)
        return (self.keep_inside(found, inside, op),)

    def split_iota(self, op: Op, attrs: dict, axes: Axes) -> Value:
        """This IPU's part of an iota split along its counting dim: the local count plus the
        IPU's offset (taken from shard_index of zeros, which is minus the offset)."""
        (count,) = self.emit("iota", [], attrs, op.loc)
        dtype = count.dtype
        zero = self.emit("constant", [], {"value": np.zeros((), dtype)}, op.loc)[0]
        spread = {"shape": count.shape, "broadcast_dimensions": ()}
        (zeros,) = self.emit("broadcast_in_dim", [zero], spread, op.loc)
        dim = attrs["dimension"]
        index = {"axes": axes, "group_size": self.group(axes), "size": count.shape[dim]}
        minus_offset, _ = self.emit("shard_index", [zeros], index, op.loc)
        return self.emit("subtract", [count, minus_offset], {}, op.loc)[0]

    def keep_inside(self, found: Value, inside: Value, op: Op) -> Value:
        """`found` where the index was this IPU's, zero elsewhere."""
        vector = op.attrs["index_vector_dim"]
        batch = tuple(d for d in range(len(found.shape)) if d not in op.attrs["offset_dims"])
        if vector < len(inside.shape):
            shape = tuple(n for d, n in enumerate(inside.shape) if d != vector)
            (inside,) = self.emit("reshape", [inside], {"new_sizes": shape}, op.loc)
        spread = {"shape": found.shape, "broadcast_dimensions": batch}
        (inside,) = self.emit("broadcast_in_dim", [inside], spread, op.loc)
        zero = self.emit("constant", [], {"value": np.zeros((), found.dtype)}, op.loc)[0]
        spread = {"shape": found.shape, "broadcast_dimensions": ()}
        (zeros,) = self.emit("broadcast_in_dim", [zero], spread, op.loc)
        return self.emit("select", [inside, found, zeros], {}, op.loc)[0]

    def mask(
        self, x: Value, dim: int, axes: Axes, size: int, loc: SourceLoc, kind: str | None = "sum"
    ) -> Value:
        attrs = {
            "axes": axes,
            "group_size": self.group(axes),
            "dimension": dim,
            "size": size,
            "fill": _identity(kind, x.dtype),
        }
        return self.emit("shard_mask", [x], attrs, loc)[0]


def _identity(kind: str | None, dtype: np.dtype) -> np.ndarray:
    if kind in ("max", "min"):
        big = np.inf if dtype.kind == "f" or dtype.kind == "V" else np.iinfo(dtype).max
        return np.asarray(-big if kind == "max" else big).astype(dtype)
    return np.zeros((), dtype)
