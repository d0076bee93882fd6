"""The per-IPU form of ops planned with halos (`halo`): one `halo_exchange` per source and
region, then each op's rows taken from its sources' extended blocks, the other rows selected by
their global positions (masks and per-IPU starts made once, in the outermost program, before
any loop that reads them). `_Partitioner.rewrite` hands an op here first."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from lowering import ELEMENTWISE, Op, SourceLoc, Value
from partitioner.sharding.builder import Builder
from partitioner.sharding.factor_rules import project
from partitioner.sharding.halo import (
    OFFSET_DIMS,
    Edges,
    Plan,
    Window,
    constant_of,
    plan_op,
    window,
    write_offsets,
)
from partitioner.sharding.propagation import Propagated
from partitioner.sharding.specs import Axes, Sharding

Span = tuple[int, int | None, int]  # start, limit (None: the block's end), stride


class Host(Protocol):
    """What halos need of the partitioner that uses them."""

    @property
    def b(self) -> Builder: ...

    @property
    def prop(self) -> Propagated: ...

    @property
    def producers(self) -> Mapping[Value, Op]: ...

    @property
    def uses(self) -> Counter[Value]: ...

    @property
    def local(self) -> dict[Value, tuple[Value, Sharding]]: ...

    def operand(self, value: Value, want: Sharding, op: Op, why: str) -> Value: ...

    def zeros(self, value: Value) -> bool: ...

    def hoist(self, key: tuple, make: Callable[[Builder], Value]) -> Value: ...


class Halos:
    """The halo plans of one region's ops, the exchange each of their sources needs (as many
    rows each way as the region's readers of it need), and the slices a planned
    concatenation reads through (`absorbed`: nothing else reads them, so they are not made)."""

    def __init__(self, host: Host, ops: Sequence[Op]) -> None:
        self.host = host
        self.plans: dict[Op, tuple[Plan | None, tuple[Axes, ...]]] = {}
        self.exts: dict[tuple[Value, Sharding, int], tuple[Value, Edges]] = {}
        self.demands: dict[tuple[Value, Sharding, int], list[Window]] = {}
        self.absorbed: set[Op] = set()
        self.region = frozenset(ops)
        for op in ops:
            if op.name in OFFSET_DIMS and op in host.prop.factors:
                self.plans[op] = plan_op(op, host.prop, host.b.group, host.producers, self.constant)
        if any(plan for plan, _ in self.plans.values()):
            self.prepare(ops)

    def prepare(self, ops: Sequence[Op]) -> None:
        """The writes' updates made where they land (`shift_update`), the ops no IPU needs
        (`unread`), and the rows each source's exchange brings."""
        readers: dict[Value, list[Op]] = defaultdict(list)
        for op in ops:
            for v in op.operands:
                readers[v].append(op)
        for op, (plan, _) in list(self.plans.items()):
            if plan is not None and op.name in ("dynamic_update_slice", "scatter"):
                self.shift_update(op, plan, readers)
        self.absorbed = self.unread(ops)
        for op, (plan, _) in self.plans.items():
            if plan is not None and op not in self.absorbed:
                for w in plan.windows:
                    self.demands.setdefault(_key(w, plan), []).append(w)

    def unread(self, ops: Sequence[Op]) -> set[Op]:
        """The ops whose results only planned ops read, and those do not (a concatenation's
        pieces, whose source it reads; a write's constant indices): not made on the IPUs."""
        left = Counter(self.host.uses)
        for op, (plan, _) in self.plans.items():
            if plan is not None:
                left.subtract(UNREAD[op.name](op))
                left.update({w.read.source for w in plan.windows} - set(op.operands))
        absorbed = set()
        for op in reversed(ops):
            if op.regions or not all(left[r] == 0 < self.host.uses[r] for r in op.results):
                continue
            absorbed.add(op)
            left.subtract(op.operands)
        return absorbed

    def shift_update(self, op: Op, plan: Plan, readers: Mapping[Value, list[Op]]) -> None:
        """A write's update made where the write needs it: when elementwise ops make it from
        slices of the split dim alone (a stencil's new interior), the slices are taken shifted
        by the write's offset, so each IPU computes the update's rows that land in its block
        (their source's exchange brings a row or so more) and the update needs no exchange."""
        (w,) = plan.windows
        chain = self.chain(w.read.source, w.shift, op, plan, readers) if w.step == 0 else None
        if chain is None:
            return
        for piece, moved in chain.items():
            _, gathered = self.plans[piece]
            found = self.plans[piece][0]
            assert found is not None
            self.plans[piece] = (dataclasses.replace(found, windows=(moved,)), gathered)
        aligned = Window(dataclasses.replace(w.read, shift=0), 0, 0, 0, 0, 0)  # as it is made
        self.plans[op] = (dataclasses.replace(plan, windows=(aligned,)), self.plans[op][1])

    def chain(
        self, value: Value, shift: int, write: Op, plan: Plan, readers: Mapping[Value, list[Op]]
    ) -> dict[Op, Window] | None:
        """The slices `value` is made from by elementwise ops (and broadcasts constant along
        the dim), each with its window moved by `shift`; None unless every value on the way
        is split as `value` is and read only there."""
        members, moved, seen, todo = {write}, {}, set(), [value]
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            made = self.host.producers.get(v)
            if made not in self.region or self.host.prop.shardings[v].dims[plan.dim] != plan.split:
                return None
            if made.name == "slice":
                found = self.moved(made, shift, plan)
                if found is None:
                    return None
                moved[made] = found
            elif made.name in ELEMENTWISE and all(x.shape in (v.shape, ()) for x in made.operands):
                members.add(made)
                todo.extend(x for x in made.operands if x.shape == v.shape)
            elif not _constant_along(made, plan.dim):
                return None
        for v in seen:
            if self.host.uses[v] != len(readers[v]) or any(r not in members for r in readers[v]):
                return None
        return moved

    def moved(self, piece: Op, shift: int, plan: Plan) -> Window | None:
        """A slice's window along the write's dim moved by `shift`, if it still fits and its
        blocks stay the write's."""
        sliced = self.plans.get(piece, (None,))[0]
        if sliced is None or sliced.dim != plan.dim or sliced.windows[0].step:
            return None
        read = sliced.windows[0].read
        rows = piece.results[0].shape[plan.dim]
        moved = dataclasses.replace(read, shift=read.shift + shift)
        found = window(moved, plan.dim, rows, self.host.b.group(plan.split))
        return found if found is not None and not found.step else None

    def constant(self, value: Value) -> np.ndarray | None:
        return constant_of(value, self.host.producers)

    def rewrite(self, op: Op, axes: tuple[Axes, ...]) -> tuple[Axes, ...] | None:
        """Runs `op` with halos if it has a plan (None: done); else the factors' axes to run it
        with, the dims it reads at offsets whole."""
        if op not in self.plans:
            return axes
        plan, gathered = self.plans[op]
        if plan is None:
            return gathered
        made = EMITTERS[op.name](self, op, plan)
        result = project(self.host.prop.factors[op].results[0], plan.axes)
        self.host.local[op.results[0]] = (made, result)
        return None

    def extended(self, w: Window, plan: Plan, op: Op) -> tuple[Value, Edges]:
        """The read's source on this IPU, extended by the edges every reader of it in the
        region needs: one exchange per source, made for its first reader."""
        key = _key(w, plan)
        if key not in self.exts:
            windows = self.demands[key]
            edges = Edges(
                max(w.before for w in windows),
                max(w.after for w in windows),
                any(w.cyclic for w in windows),
            )
            source = w.read.source
            why = f"{op.name} at {op.loc} reads {source.type_str} at an offset along dim {plan.dim}"
            x = self.host.operand(source, key[1], op, why)
            if edges.before or edges.after:
                attrs = {
                    "axes": plan.split,
                    "group_size": self.host.b.group(plan.split),
                    "dimension": plan.dim,
                    "before": edges.before,
                    "after": edges.after,
                    "cyclic": edges.cyclic,
                    "why": why,
                }
                (x,) = self.host.b.emit("halo_exchange", [x], attrs, op.loc)
            self.exts[key] = (x, edges)
        return self.exts[key]

    def take(self, w: Window, plan: Plan, op: Op, rest: Sequence[Span] | None = None) -> Value:
        """IPU i's block of a read: rows from `first + i * step` of its source's extended block
        (a static slice, or a dynamic one at a start made once per IPU), and of the other dims
        what `rest` says (all of them when None)."""
        ext, edges = self.extended(w, plan, op)
        b, dim, loc = self.host.b, plan.dim, op.loc
        first = edges.before + w.shift
        spans = [(0, None, 1)] * len(ext.shape) if rest is None else list(rest)
        ends = [
            (s, n if lim is None else lim, st)
            for (s, lim, st), n in zip(spans, ext.shape, strict=True)
        ]
        if w.step == 0:
            ends[dim] = (first, first + plan.block, 1)
            return _slice(b, ext, ends, loc)
        start = self.ipu_start(plan.split, w.step, first, loc)
        strided = any(st != 1 for k, (_, _, st) in enumerate(ends) if k != dim)
        if strided:
            ends, cut = [(0, n, 1) for n in ext.shape], ends
        starts = [start if k == dim else _int(b, s, loc) for k, (s, _, _) in enumerate(ends)]
        sizes = tuple(plan.block if k == dim else lim - s for k, (s, lim, _) in enumerate(ends))
        (rows,) = b.emit("dynamic_slice", [ext, *starts], {"slice_sizes": sizes}, loc)
        if not strided:
            return rows
        cut[dim] = (0, plan.block, 1)
        return _slice(b, rows, cut, loc)

    def ipu_start(self, axes: Axes, step: int, first: int, loc: SourceLoc) -> Value:
        """`first + i * step` on IPU i along `axes` (an int32 scalar, made once)."""

        def make(b: Builder) -> Value:
            zero = _int(b, 0, loc)
            index = {"axes": axes, "group_size": b.group(axes), "size": abs(step)}
            minus, _ = b.emit("shard_index", [zero], index, loc)  # -i * |step|
            combine = "subtract" if step > 0 else "add"
            return b.emit(combine, [_int(b, first, loc), minus], {}, loc)[0]

        return self.host.hoist(("start", axes, step, first), make)

    def rows(self, plan: Plan, start: int, stop: int, op: Op) -> Value | None:
        """Whether each row of this IPU's block lies in [start, stop) of the whole (a bool
        vector, made once), or None when all do."""
        group = self.host.b.group(plan.split)
        bounds = ((start, start > 0, False), (stop, stop < group * plan.block, True))
        if not any(needed for _, needed, _ in bounds):
            return None

        def make(b: Builder) -> Value:
            masks = []
            for size, needed, below in bounds:
                if needed:  # rows at or past `size` set to `not below`: a bound either way
                    flat = _full(b, np.asarray(below), (plan.block,), op.loc)
                    attrs = {
                        "axes": plan.split,
                        "group_size": group,
                        "dimension": 0,
                        "size": size,
                        "fill": np.asarray(not below),
                    }
                    masks.append(b.emit("shard_mask", [flat], attrs, op.loc)[0])
            if len(masks) == 1:
                return masks[0]
            return b.emit("and", masks, {}, op.loc)[0]

        return self.host.hoist(("rows", plan.split, plan.block, start, stop), make)

    def choose(self, plan: Plan, w: Window, inside: Value, outside: Value, op: Op) -> Value:
        """`inside` on the rows of the read `w`, `outside` on the others."""
        mask = self.rows(plan, w.read.start, w.read.stop, op)
        if mask is None:
            return inside
        spread = {"shape": inside.shape, "broadcast_dimensions": (plan.dim,)}
        (mask,) = self.host.b.emit("broadcast_in_dim", [mask], spread, op.loc)
        return self.host.b.emit("select", [mask, inside, outside], {}, op.loc)[0]


def _constant_along(op: Op, dim: int) -> bool:
    """A broadcast whose result is the same all along `dim` (a scalar's)."""
    if op.name != "broadcast_in_dim":
        return False
    x, mapped = op.operands[0], op.attrs["broadcast_dimensions"]
    return all(m != dim or x.shape[k] == 1 for k, m in enumerate(mapped))


def _key(w: Window, plan: Plan) -> tuple[Value, Sharding, int]:
    """A source, as its readers want it split, extended along a dim."""
    return w.read.source, project(w.read.dims, plan.axes), plan.dim


def _int(b: Builder, value: int, loc: SourceLoc) -> Value:
    return b.emit("constant", [], {"value": np.asarray(value, np.int32)}, loc)[0]


def _full(b: Builder, value: np.ndarray, shape: tuple[int, ...], loc: SourceLoc) -> Value:
    (scalar,) = b.emit("constant", [], {"value": value}, loc)
    spread = {"shape": shape, "broadcast_dimensions": ()}
    return b.emit("broadcast_in_dim", [scalar], spread, loc)[0]


def _slice(b: Builder, x: Value, ends: Sequence[tuple[int, int, int]], loc: SourceLoc) -> Value:
    if all(end == (0, n, 1) for end, n in zip(ends, x.shape, strict=True)):
        return x
    starts, limits, strides = (tuple(end[j] for end in ends) for j in range(3))
    attrs = {"start_indices": starts, "limit_indices": limits, "strides": strides}
    return b.emit("slice", [x], attrs, loc)[0]


# ---- the ops ---------------------------------------------------------------------------------


def _slice_rows(h: Halos, op: Op, plan: Plan) -> Value:
    """One slice of the extended block: the split dim's rows, the other dims as the op's (to
    the block's end where the op takes a dim whole)."""
    (w,) = plan.windows
    a, shape = op.attrs, op.operands[0].shape
    rest: list[Span] = [
        (s, None if lim == n else lim, st)
        for s, lim, st, n in zip(
            a["start_indices"], a["limit_indices"], a["strides"], shape, strict=True
        )
    ]
    return h.take(w, plan, op, rest)


def _pad_rows(h: Halos, op: Op, plan: Plan) -> Value:
    """The rows of the operand, the fill outside them (unless a non-cyclic exchange of an
    evenly split operand already brings zeros there, and zeros are the fill), then the other
    dims padded on the block."""
    (w,) = plan.windows
    rows = h.take(w, plan, op)
    why = f"the padding value of pad at {op.loc}"
    value = h.host.operand(op.operands[1], Sharding.replicated(0), op, why)
    _, edges = h.extended(w, plan, op)
    even = op.operands[0].shape[plan.dim] % h.host.b.group(plan.split) == 0
    if not (h.host.zeros(op.operands[1]) and even and w.step == 0 and not edges.cyclic):
        spread = {"shape": rows.shape, "broadcast_dimensions": ()}
        (fill,) = h.host.b.emit("broadcast_in_dim", [value], spread, op.loc)
        rows = h.choose(plan, w, rows, fill, op)
    config = [c if d != plan.dim else (0, 0, 0) for d, c in enumerate(op.attrs["padding_config"])]
    if not any(any(c) for c in config):
        return rows
    return h.host.b.emit("pad", [rows, value], {"padding_config": tuple(config)}, op.loc)[0]


def _concatenate_rows(h: Halos, op: Op, plan: Plan) -> Value:
    """Each piece's rows taken from the source's extended block; pieces at one shift (a roll
    of an evenly split dim: the wrapped piece is the next rows round the group) are one take."""
    takes: dict[int, Value] = {}
    made: Value | None = None
    for w in plan.windows:
        if w.shift not in takes:
            takes[w.shift] = h.take(w, plan, op)
    if len(takes) == 1:
        return next(iter(takes.values()))
    first = plan.windows[0].shift
    made = takes[first]
    for w in plan.windows:
        if w.shift != first:
            made = h.choose(plan, w, takes[w.shift], made, op)
    return made


def _write_rows(h: Halos, op: Op, plan: Plan) -> Value:
    """The update's rows that land in this IPU's block, written where the op writes them on
    the other dims, kept only on the rows it writes."""
    (w,) = plan.windows
    offsets = write_offsets(op, h.constant)
    assert offsets is not None  # planned: constant, in bounds
    factors = h.host.prop.factors[op]
    why = f"the operand of {op.name} at {op.loc}"
    x = h.host.operand(op.operands[0], project(factors.operands[0], plan.axes), op, why)
    rows = h.take(w, plan, op)
    b = h.host.b
    starts = [_int(b, 0 if d == plan.dim else at, op.loc) for d, at in enumerate(offsets)]
    (written,) = b.emit("dynamic_update_slice", [x, rows, *starts], {}, op.loc)
    return h.choose(plan, w, written, x, op)


# What each planned op does not read on the IPUs (`Halos.unread`).
UNREAD: dict[str, Callable[[Op], tuple[Value, ...]]] = {
    "slice": lambda op: (),
    "pad": lambda op: (),
    "concatenate": lambda op: op.operands,
    "dynamic_update_slice": lambda op: op.operands[2:],
    "scatter": lambda op: (op.operands[1],),
}
EMITTERS: dict[str, Callable[[Halos, Op, Plan], Value]] = {
    "slice": _slice_rows,
    "pad": _pad_rows,
    "concatenate": _concatenate_rows,
    "dynamic_update_slice": _write_rows,
    "scatter": _write_rows,
}
