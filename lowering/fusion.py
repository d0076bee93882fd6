"""Elementwise fusion: chains of elementwise ops become one `fusion` op, as XLA's loop fusion
and the IPU backend's map expressions run them.

Poplar does not run a program op by op: the XLA backend fuses elementwise chains (a batch
norm's normalisation, a ReLU, a cast, an optimizer's update) into one popops map-expression
vertex per tile, which reads its inputs once, keeps the intermediate values in registers and
writes one result, in one compute set. Here a `fusion` op holds its members as a region whose
inputs are the chain's external operands; it computes exactly what its members compute, so
values never change, and `partitioner.tiles` costs it as one superstep.

What fuses: an elementwise op joins the fusion of an operand's producer when that operand has
the op's shape, is an elementwise result read by nothing else (not by a later op, a region, or
the graph's outputs), so the intermediate is never stored; it reads through a reshape of
such a result (or a broadcast that only adds dimensions of one: the same elements in the same
order, a bitcast in XLA), which then joins too. Several producers' fusions merge into one (a
tree of ops). A reduction of one tensor takes the chain that makes it the same way,
as its prologue (popops reduces halves into float partials without a cast, and a square into
a sum as one `SQUARE_ADD`). After the reduction only an epilogue joins, what popops' reduce
does to its output as it writes it (`ReduceParams`' scale, and the output's own type): a
scale by a scalar (a mean's division) and a cast, each of the reduction's result alone. A
fusion sits where its last member (its root) sat: its members' operands all exist by then.
The pass runs on each graph of a program, loop bodies and branches included; fusions of one
op are left as the op. A small result (`small_chains.SMALL`) that ops after the chain read
too joins all the same, and the fusion gives it out besides its root's result (a multi-output
fusion), through a view too (the view then joins). A reduction's epilogue may read its sums
through a view. Before grouping, a view of a small result is made again at each reader
(`view_copies`) and a cast that every reader would fuse is copied into each of them
(`cast_copies`); after, two chains of small results join as XLA's multi-output fusion joins
them (`small_chains`), and reductions of one tensor over the same dimensions that do not wait
for each other are joined into one fusion of several results (`siblings`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from lowering.cast_copies import copy_casts, readers_of
from lowering.ir import Graph, Op, Value, max_value_id
from lowering.siblings import FUSION, join_siblings, reduces_one, rename_all
from lowering.small_chains import SMALL, is_bitcast, join_small_chains
from lowering.view_copies import copy_views
from lowering.vocabulary import ELEMENTWISE


def fuse_elementwise(graph: Graph, by_source: bool = False) -> Graph:
    """`graph` with its elementwise chains fused, in its regions too (a loop's body, a case's
    branches); the graph itself when nothing fuses. `by_source`: a fusion's members come from
    one line of the user's code in one scope (a phased or pipelined program: its phases and
    stages are cut between ops, by scope or by repeated structure, and a fusion across a cut
    would carry a block's last op into the next block's phase or stage; Poplar, whose phases
    and stages are programs of their own, never fuses across them)."""
    ids = itertools.count(1 + max_value_id(graph))
    return _fused_graph(graph, ids, _source if by_source else _anywhere)


def fusion_eval_rule(*inputs: Any, regions: Sequence[Callable[..., Any]], **attrs: Any) -> tuple:
    """A fusion computes what its members compute, one after the other."""
    return tuple(regions[0](*inputs))


def _source(op: Op) -> tuple:
    loc = op.loc
    return (loc.file, loc.line, loc.scope.rsplit("/", 1)[0])


def _anywhere(op: Op) -> tuple:
    return ()


def members(op: Op) -> tuple[Op, ...]:
    """A fusion's ops, in order (its root last); an op that is not a fusion is its own."""
    return op.regions[0].ops if op.name == FUSION else (op,)


def _fused_graph(graph: Graph, ids: itertools.count, key: Callable[[Op], tuple]) -> Graph:
    ops = join_siblings(_fused_ops(graph, ids, key), ids, key)
    changed = len(ops) != len(graph.ops) or any(
        a is not b for a, b in zip(ops, graph.ops, strict=True)
    )
    return dataclasses.replace(graph, ops=tuple(ops)) if changed else graph


def _fused_ops(graph: Graph, ids: itertools.count, key: Callable[[Op], tuple]) -> list[Op]:
    """The graph's ops with its elementwise chains fused (its regions' too)."""
    ops = [_with_fused_regions(op, ids, key) for op in graph.ops]
    if key is _anywhere:  # a phased or pipelined program is cut by its ops' order: kept
        ops = copy_views(ops, graph.outputs, ids)
    readers = readers_of(ops)  # the casts' copies and the grouping ask alike: made once
    copied = copy_casts(ops, readers, graph.outputs, ids, key)
    if copied is not ops:
        ops, readers = copied, readers_of(copied)
    grouping = _groups(ops, readers, graph.outputs, key)
    groups = grouping.groups
    if any(len(g) > 1 for g in groups.values()):
        ops = _grouped(ops, grouping, ids)
    return join_small_chains(ops, graph.outputs, key, lambda m, e: _fusion(m, ids, e))


def _grouped(ops: list[Op], grouping: _Grouping, ids: itertools.count) -> list[Op]:
    """The ops with each group made one fusion, at its root."""
    groups, root_of = grouping.groups, grouping.root_of
    out: list[Op] = []
    for index, op in enumerate(ops):
        if root_of.get(index, index) != index:
            continue  # a member: its fusion is made at its root
        group = groups.get(index)
        if group is None or len(group) == 1:
            out.append(op)
        else:
            extras = grouping.extras.get(index, ())
            out.append(_fusion([ops[i] for i in group], ids, extras))
    return out


def _with_fused_regions(op: Op, ids: itertools.count, key: Callable[[Op], tuple]) -> Op:
    if op.name not in ("while", "case"):
        return op
    regions = tuple(_fused_graph(r, ids, key) for r in op.regions)
    if all(a is b for a, b in zip(regions, op.regions, strict=True)):
        return op
    return dataclasses.replace(op, regions=regions)


def fusible(op: Op) -> bool:
    """An elementwise op of one result whose operands have its shape or are scalars, the ops
    a map expression runs (it reads tensors of one shape, and scalars)."""
    if op.name not in ELEMENTWISE or len(op.results) != 1:
        return False
    shape = op.results[0].shape
    return all(v.shape in (shape, ()) for v in op.operands)


def _groups(
    ops: list[Op],
    readers: dict[Value, list[int]],
    outputs: Iterable[Value],
    key: Callable[[Op], tuple],
) -> _Grouping:
    """Each fusion's root (an op index) with its members' indices, in program order, and the
    members' results it also gives out (`_Grouping.extras`)."""
    grouping = _Grouping(ops, readers, outputs, key)
    for index, op in enumerate(ops):
        grouping.add(index, op)
    return grouping


class _Grouping:
    """The fusions made so far, as `_groups` walks the ops in program order."""

    def __init__(
        self,
        ops: list[Op],
        readers: dict[Value, list[int]],
        outputs: Iterable[Value],
        key: Callable[[Op], tuple],
    ):
        self.ops, self.readers, self.key = ops, readers, key
        self.outputs = set(outputs)
        self.uses = Counter({v: len(r) for v, r in readers.items()})
        self.uses.update(self.outputs)
        self.made = {v: i for i, op in enumerate(ops) for v in op.results}
        # asked of each op and again of the producers it might join: computed once
        self.fusible = [fusible(op) for op in ops]
        self.root_of: dict[int, int] = {}  # a member's index -> its fusion's root so far
        self.groups: dict[int, list[int]] = {}
        self.reduced: set[int] = set()  # the roots of fusions that hold a reduction
        # A fusion's members' results that ops after it read too (or the graph's outputs):
        # results of the fusion besides its root's, by root.
        self.extras: dict[int, list[Value]] = {}
        self._given: list[Value] = []  # while `add` makes a fusion: what its parts give out

    def add(self, index: int, op: Op) -> None:
        """`op` joined to the fusions it can join, or the root of a fusion of its own."""
        reduces = reduces_one(op)
        if not self.fusible[index] and not reduces:
            return
        tail = _epilogue_of(op, self.ops, self.made, self.uses, self.reduced, self.key)
        if tail is not None:  # the reduction's fusion ends with it (and the view it reads)
            root, view = tail
            self.reduced.discard(root)
            self._make(index, [*self.groups.pop(root), *view, index])
            self.reduced.add(index)
            return
        group = [index]
        self._given = []  # what the fusions taken give out: the only results read outside
        # a reduction takes the chain that makes its operand as its prologue
        for value in op.operands[:1] if reduces else dict.fromkeys(op.operands):
            group += self._joined(value, op, index, reduces)
        if reduces:
            self.reduced.add(index)
        self._make(index, sorted(group))
        if self._given:
            members = set(group)
            extras = [v for v in self._given if self._read_outside(v, members)]
            if extras:
                self.extras[index] = extras

    def _joined(self, value: Value, op: Op, index: int, reduces: bool) -> list[int]:
        """The members `op` takes in with its operand `value`: the fusion that makes it,
        directly or through a view (which then joins too); none when it cannot join."""
        ops, producer = self.ops, self.made.get(value)
        if producer is None:
            return []
        source = None if reduces else self._through_view(value, producer, op, index)
        if source is not None:
            taken = self._take(source, index, through=producer)
            return [producer, *taken] if taken else []
        joins = (
            self.fusible[producer]  # not a reduction: after one, an epilogue only
            and (self.uses[value] == 1 or self._shared(value, op, index, producer, reduces))
            and self.key(ops[producer]) == self.key(op)
            and value.shape == (op.operands[0] if reduces else op.results[0]).shape
        )
        return self._take(producer, index, reduces) if joins else []

    def _through_view(self, value: Value, view: int, op: Op, index: int) -> int | None:
        """The elementwise op whose result `value` is a view of (made by op `view`), when the
        view and that result's chain can join `op` (nothing else reads the view; the result is
        read by nothing else either, or is small and shared as `_shared` says): its index,
        else None."""
        ops = self.ops
        if self.uses[value] != 1 or not is_bitcast(ops[view]):
            return None
        source = ops[view].operands[0]
        producer = self.made.get(source)
        if producer is None or not self.fusible[producer]:
            return None
        if not self.key(ops[producer]) == self.key(ops[view]) == self.key(op):
            return None
        if self.uses[source] == 1 or self._shared(source, op, index, producer, False, view):
            return producer
        return None

    def _shared(
        self,
        value: Value,
        op: Op,
        index: int,
        producer: int,
        reduces: bool,
        through: int | None = None,
    ) -> bool:
        """Whether `op` takes in `value` (read through the view `through`, if given), which
        ops after it read too, the fusion then giving it out as a result of its own (a
        multi-output fusion), stored as the chain writes it."""
        if reduces or value.size > SMALL:
            return False
        owner = self.root_of.get(producer)
        around = {index, *self.groups.get(owner, [])} if owner is not None else {index}
        if through is not None:
            around.add(through)
        return (
            self._later(value, index, around)
            and not self._reduced_later(value)
            and not self._reduced_later(op.results[0])
        )

    def _take(
        self, member: int, index: int, reduces: bool = False, through: int | None = None
    ) -> list[int]:
        """The whole fusion that holds `member`, unless it holds a reduction or is taken, or
        gives out results (its root's besides the one `index` reads, or others) that a
        reduction, or an op before `index`, would then miss (`through`: the view that joins
        with it)."""
        old = self.root_of.get(member)
        if old is None or old in self.reduced or old not in self.groups or old == index:
            return []
        group = self.groups[old]
        # a reduction's prologue (or a chain a reduction will take) gives out nothing else
        prologue = reduces or self._reduced_later(self.ops[index].results[0])
        if prologue and old in self.extras:
            return []
        # what the fusion gives out (its other results are read inside it alone)
        made = [*self.extras.get(old, []), *self.ops[old].results]
        near = (index,) if through is None else (index, through)
        if any(self._read_outside(v, near) for v in made):
            around = {*group, *near}
            if not all(self._later(v, index, around) for v in made):
                return []
            if any(self._read_outside(v, around) and self._reduced_later(v) for v in made):
                return []  # a reduction takes that chain as its prologue
        self.extras.pop(old, None)
        self._given += made
        return self.groups.pop(old)

    def _later(self, value: Value, index: int, members: set[int]) -> bool:
        """Whether every op that reads `value`, but `members`, comes after op `index`."""
        return all(r > index for r in self.readers.get(value, ()) if r not in members)

    def _reduced_later(self, value: Value) -> bool:
        """Whether a reduction reduces `value`: its chain is that reduction's prologue, which
        gives out nothing else (a reduction's vertex writes its sums alone)."""
        return any(
            reduces_one(self.ops[r]) and self.ops[r].operands[0] is value
            for r in self.readers.get(value, ())
        )

    def _read_outside(self, value: Value, members: Collection[int]) -> bool:
        return value in self.outputs or any(r not in members for r in self.readers.get(value, ()))

    def _make(self, index: int, group: list[int]) -> None:
        for i in group:
            self.root_of[i] = index
        self.groups[index] = group


_EPILOGUE = {"convert": 0, "divide": 0, "multiply": None}  # op -> where the result is read


def _epilogue_of(
    op: Op,
    ops: list[Op],
    made: dict[Value, int],
    uses: Counter[Value],
    reduced: set[int],
    key: Callable[[Op], tuple],
) -> tuple[int, tuple[int, ...]] | None:
    """The root of the reduction's fusion `op` ends, as the epilogue popops' reduce applies to
    its output, with the view `op` reads it through (none, or one: a reduction writes its
    result in any shape of its size): `op` a cast, or a scale by a scalar (a broadcast of one),
    of the fusion's result, which nothing else reads; else None."""
    if op.name not in _EPILOGUE or len(op.results) != 1:
        return None
    for at, value in enumerate(op.operands):
        producer = made.get(value)
        view: tuple[int, ...] = ()
        if producer is not None and is_bitcast(ops[producer]) and uses[value] == 1:
            value, view = ops[producer].operands[0], (producer,)
            producer = made.get(value)
        if producer is None or producer not in reduced or uses[value] != 1:
            continue
        others = [v for i, v in enumerate(op.operands) if i != at]
        fits = (
            _EPILOGUE[op.name] in (None, at)
            and all(key(ops[i]) == key(op) for i in (producer, *view))
            and value.size == op.results[0].size
            and all(scalar_operand(v, ops[made[v]] if v in made else None) for v in others)
        )
        return (producer, view) if fits else None
    return None


def scalar_operand(value: Value, producer: Op | None) -> bool:
    """A scalar, or a broadcast of one (`producer` makes `value`): a vertex's scalar parameter,
    held in a register rather than loaded per element."""
    if value.size == 1:
        return True
    return (
        producer is not None
        and producer.name == "broadcast_in_dim"
        and producer.operands[0].size == 1
    )


def _fusion(ops: list[Op], ids: itertools.count, extras: Sequence[Value] = ()) -> Op:
    """One `fusion` op of `ops` (in order, the root last): its operands the values the members
    read from outside, in order of first reading; its region those members on fresh inputs,
    the root's result and the `extras` it gives out renamed inside (the fusion's own results
    are the root's, then the extras)."""
    inside = {v for op in ops for v in op.results}
    external = tuple(dict.fromkeys(v for op in ops for v in op.operands if v not in inside))
    inputs = {v: Value(next(ids), v.shape, v.dtype) for v in external}
    root = ops[-1]
    given = (*root.results, *extras)
    result = {v: Value(next(ids), v.shape, v.dtype) for v in given}
    renamed = {**inputs, **result}
    body = tuple(rename_all(op, renamed) for op in ops)
    region = Graph(
        inputs=tuple(inputs.values()), outputs=tuple(result.values()), ops=body, name=FUSION
    )
    names = tuple(op.name for op in ops)
    return Op(FUSION, external, given, {"members": names}, (region,), root.loc)
