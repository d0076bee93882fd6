"""Halos: ops that read a split dimension at an offset, planned to run on each IPU's block
extended by its neighbours' edge rows instead of on the gathered tensor (`halo_rewrite` makes
them).

A slice at an offset (`u[1:-1]`, `u[2:]`), a pad, the concatenation of slices `jnp.roll` emits
and a window written at a constant offset (`u.at[1:-1].set(v)`: a scatter, or a dynamic update
slice) make row r of their result, along the dimension, from row r + shift of a source (a
`Read`, over a range of rows; the other rows are a fill or the operand's). Split over n IPUs in
blocks of B rows (the dimension padded to n B), IPU i's block of the result reads the source's
rows from i B + shift on: its own block and, for a shift, the edge of a neighbour's (its
`Window`). When the result's blocks are the source's size, every IPU takes its rows at one
offset; else the offset moves by the difference per IPU. A shift of nearly the whole dimension
(the piece of a roll that wraps round) is a small shift round the group in the padded dimension,
so its exchange goes round the group (`cyclic`). A result's real rows read only real rows of
their source, so padding never leaks in. A shift past a neighbour's block, or a piece that is
not a slice of the op's one source, has no plan: the op runs with the dim gathered, as it did
before halos (`plan_op`'s second answer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering import Op, Value, apply_rule
from partitioner.sharding.factor_rules import Dims, Factors, window_write
from partitioner.sharding.propagation import Propagated
from partitioner.sharding.specs import Axes


@dataclass(frozen=True, slots=True)
class Read:
    """Result rows [start, stop) along the split dim are rows of `source` (whose dims map to the
    op's factors `dims`, the split dim at the same place) shifted by `shift`: result row r is
    source row r + shift."""

    source: Value
    dims: Dims
    shift: int
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class Window:
    """Where IPU i finds its block of a read in its source's extended block (`before` rows of
    the previous IPU's, its own, `after` of the next's): from row `first + i * step`. `shift`
    is the read's, or the read's round the padded group."""

    read: Read
    shift: int
    before: int
    after: int
    first: int
    step: int

    @property
    def cyclic(self) -> bool:
        return self.shift != self.read.shift


@dataclass(frozen=True, slots=True)
class Edges:
    """What one halo exchange brings a source's block: `before` rows of the previous IPU's,
    `after` of the next's, round the group when `cyclic`."""

    before: int
    after: int
    cyclic: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """An op run with halos along its result's dim `dim`, split over `split` in blocks of
    `block` rows; `axes` are its factors' axes (any other dim read at an offset whole)."""

    dim: int
    axes: tuple[Axes, ...]
    split: Axes
    block: int
    windows: tuple[Window, ...]


def window(read: Read, dim: int, rows: int, ipus: int) -> Window | None:
    """The window of `read` for a result of `rows` rows along `dim` split over `ipus`, the
    cheapest of the read's shift and that shift round the group; None when some IPU's block
    would reach past its neighbours'."""
    block = -(-rows // ipus)
    source_block = -(-read.source.shape[dim] // ipus)
    step = block - source_block
    on = [i for i in range(ipus) if max(read.start, i * block) < min(read.stop, (i + 1) * block)]
    padded = ipus * source_block
    best = None
    for shift in (read.shift, read.shift - padded, read.shift + padded):
        offsets = [shift + i * step for i in on] or [0]
        before, after = max(0, -min(offsets)), max(0, max(offsets) + step)
        fits = before <= source_block and after <= source_block
        if fits and (best is None or before + after < best.before + best.after):
            best = Window(read, shift, before, after, before + shift, step)
    return best


# ---- the reads of each op, from the op alone ------------------------------------------------

Constants = Callable[[Value], "np.ndarray | None"]
Reads = tuple[Read, ...] | None
ReadRule = Callable[[Op, int, Factors, Mapping[Value, Op], Constants], Reads]


def _slice_reads(op: Op, dim: int, factors: Factors, producers: Any, constant: Any) -> Reads:
    if op.attrs["strides"][dim] != 1:
        return None
    start, rows = op.attrs["start_indices"][dim], op.results[0].shape[dim]
    return (Read(op.operands[0], factors.operands[0], start, 0, rows),)


def _pad_reads(op: Op, dim: int, factors: Factors, producers: Any, constant: Any) -> Reads:
    low, _, interior = op.attrs["padding_config"][dim]
    if interior:
        return None
    rows = op.operands[0].shape[dim]
    stop = min(op.results[0].shape[dim], low + rows)
    return (Read(op.operands[0], factors.operands[0], -low, max(0, low), stop),)


def _concatenate_reads(
    op: Op, dim: int, factors: Factors, producers: Mapping[Value, Op], constant: Any
) -> Reads:
    """Pieces that are slices of one source along the joined dim only (`jnp.roll`)."""
    pieces = [producers.get(v) for v in op.operands]
    slices = [p for p in pieces if p is not None and p.name == "slice"]
    if len(slices) != len(pieces):
        return None
    source = slices[0].operands[0]
    reads, offset = [], 0
    for piece in slices:
        a = piece.attrs
        others = [d for d in range(len(source.shape)) if d != dim]
        plain = all(
            a["start_indices"][d] == 0 and a["limit_indices"][d] == source.shape[d] for d in others
        )
        if piece.operands[0] != source or not plain or a["strides"][dim] != 1:
            return None
        rows = piece.results[0].shape[dim]
        if rows:  # an empty piece (a roll by nothing) reads nothing
            shift = a["start_indices"][dim] - offset
            reads.append(Read(source, factors.results[0], shift, offset, offset + rows))
        offset += rows
    return tuple(reads)


def write_offsets(op: Op, constant: Constants) -> tuple[int, ...] | None:
    """Where a dynamic update slice or a one-window scatter (`window_write`) writes, when its
    indices are constants, in bounds (a dynamic update slice clamps them; a scatter out of
    bounds writes nothing: left to the gather)."""
    x = op.operands[0]
    update = op.operands[1] if op.name == "dynamic_update_slice" else op.operands[2]
    if op.name == "dynamic_update_slice":
        found = [constant(v) for v in op.operands[2:]]
        if any(f is None for f in found):
            return None
        starts = [int(np.asarray(f)) for f in found]
        pairs = zip(starts, x.shape, update.shape, strict=True)
        return tuple(min(max(s, 0), n - m) for s, n, m in pairs)
    index = constant(op.operands[1])
    if not window_write(op) or op.attrs["combiner"] != "set" or index is None:
        return None
    offsets = [0] * len(x.shape)
    for k, d in enumerate(op.attrs["scatter_dims_to_operand_dims"]):
        offsets[d] = int(index[k])
    inside = all(0 <= o <= n - m for o, n, m in zip(offsets, x.shape, update.shape, strict=True))
    return tuple(offsets) if inside else None


def _write_reads(op: Op, dim: int, factors: Factors, producers: Any, constant: Constants) -> Reads:
    offsets = write_offsets(op, constant)
    if offsets is None:
        return None
    k = 1 if op.name == "dynamic_update_slice" else 2
    rows, at = op.operands[k].shape[dim], offsets[dim]
    return (Read(op.operands[k], factors.operands[k], -at, at, at + rows),)


def _offset_slice(op: Op) -> list[int]:
    a, shape = op.attrs, op.operands[0].shape
    return [
        d for d, n in enumerate(shape) if (a["start_indices"][d], a["limit_indices"][d]) != (0, n)
    ]


def _offset_pad(op: Op) -> list[int]:
    return [d for d, (lo, hi, _) in enumerate(op.attrs["padding_config"]) if (lo, hi) != (0, 0)]


def _offset_write(op: Op) -> list[int]:
    update = op.operands[1] if op.name == "dynamic_update_slice" else op.operands[2]
    if op.name == "scatter" and not window_write(op):
        return []
    pairs = zip(op.operands[0].shape, update.shape, strict=True)
    return [d for d, (n, m) in enumerate(pairs) if m < n]


# Per op: the result dims it reads at an offset, and its reads along one of them.
OFFSET_DIMS: dict[str, Callable[[Op], list[int]]] = {
    "slice": _offset_slice,
    "pad": _offset_pad,
    "concatenate": lambda op: [op.attrs["dimension"]],
    "dynamic_update_slice": _offset_write,
    "scatter": _offset_write,
}
READ_RULES: dict[str, ReadRule] = {
    "slice": _slice_reads,
    "pad": _pad_reads,
    "concatenate": _concatenate_reads,
    "dynamic_update_slice": _write_reads,
    "scatter": _write_reads,
}


def plan_op(
    op: Op,
    prop: Propagated,
    group: Callable[[Axes], int],
    producers: Mapping[Value, Op],
    constant: Constants,
) -> tuple[Plan | None, tuple[Axes, ...]]:
    """The op's plan, if it has one, and its factors' axes with the dims it reads at offsets
    whole (as before halos), to run it with when it has none."""
    factors, axes = prop.factors[op], prop.op_factors[op]
    result = factors.results[0]
    split = [(d, f) for d in OFFSET_DIMS[op.name](op) if (f := result[d]) is not None and axes[f]]
    offset = {f for _, f in split}
    gathered = tuple(() if f in offset else a for f, a in enumerate(axes))
    if not split:
        return None, axes
    dim, factor = split[0]
    kept = tuple(() if f in offset and f != factor else a for f, a in enumerate(axes))
    reads = READ_RULES[op.name](op, dim, factors, producers, constant)
    if not reads:
        return None, gathered
    along = kept[factor]
    rows = op.results[0].shape[dim]
    windows = [window(r, dim, rows, group(along)) for r in reads]
    found = tuple(w for w in windows if w is not None)
    if len(found) != len(windows):
        return None, gathered
    return Plan(dim, kept, along, -(-rows // group(along)), found), gathered


_FOLDED = frozenset({"constant", "broadcast_in_dim", "concatenate", "reshape", "convert"})


def constant_of(value: Value, producers: Mapping[Value, Op]) -> np.ndarray | None:
    """`value` when it is made from constants alone (an index vector), else None."""
    op = producers.get(value)
    if op is None or op.name not in _FOLDED or value.size > 64:
        return None
    found = [constant_of(v, producers) for v in op.operands]
    if any(f is None for f in found):
        return None
    (made, *_) = apply_rule(op, found, op.attrs, {})
    return np.asarray(made)
