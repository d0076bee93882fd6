"""Sibling reductions: reductions of one tensor over the same dimensions, made independently of
each other, become one `fusion` of several results, as popops' `reduceMany` runs them.

A batch norm's or a layer norm's statistics (flax computes the mean and the mean of squares of
the same activation), a normalisation's two parameter gradients (the sums of dy and of dy * x)
are each two reductions of one tensor over the same dimensions. Poplar reduces them together:
PopLibs' norm statistics (lib/poplin/Norms.cpp, the mean and the "power" into one list of
compute sets) and `reduceMany` give each tile one vertex per reduction in the same compute
sets, so the partials of both move in one exchange and the pair pays one sync per stage
instead of two. Here the pair becomes one `fusion` whose region holds each
reduction's own members (its prologue chain, the reduction, its epilogue) one after the other,
with one result per reduction; its values are the members' own, and `partitioner.tiles` plans
the reductions' stages together.

Which join: reductions (`fusion`s of one reduction, or bare `reduce`s of one tensor) of
operands of the same shape over the same dimensions, that read a tensor of that size in
common (through casts: x and x cast to float are one tensor), where nothing between the first
and the last reads a result of the earlier ones but a few small ops (a sum's cast), which then
wait until after the last (the joined op sits where the last one sat). A reduction that reads
another's result (a variance's second pass reads the mean) is never its sibling. In a phased
or pipelined program they must also share the fusion key (one line of source in one scope),
so a join never crosses a phase's or stage's cut.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from lowering.ir import Graph, Op, Value, op_reads
from lowering.vocabulary import ELEMENTWISE

FUSION = "fusion"  # the op a fusion is (`lowering.fusion` imports it from here)


def join_siblings(ops: list[Op], ids: itertools.count, key: Callable[[Op], tuple]) -> list[Op]:
    """`ops` with each set of sibling reductions joined into one fusion (at the last one's
    place, the small ops deferred behind it right after it); `ops` itself when none join."""
    found = _sibling_sets(ops, key)
    if not found:
        return ops
    joined = {s.members[-1]: s for s in found}
    dropped = {i for s in found for i in (*s.members[:-1], *s.deferred)}
    out: list[Op] = []
    for index, op in enumerate(ops):
        if index in joined:
            siblings = joined[index]
            out.append(_joined([ops[i] for i in siblings.members], ids))
            out += [ops[i] for i in siblings.deferred]
        elif index not in dropped:
            out.append(op)
    return out


def reduces_one(op: Op) -> bool:
    """A reduction of one tensor (and its initial value), not a variadic one: popops reduces a
    map expression's result as it makes it (a cast to float partials, a square for a
    variance), and reduces several such reductions together (`reduceMany`)."""
    return op.name == "reduce" and len(op.operands) == 2


def reduction_of(op: Op) -> Op | None:
    """The reduction a fusion of one reduction ends with (or a bare reduce of one tensor
    itself); None for anything else."""
    if reduces_one(op):
        return op
    if op.name != FUSION or len(op.results) != 1:
        return None
    reduces = [m for m in op.regions[0].ops if m.name == "reduce"]
    return reduces[0] if len(reduces) == 1 and reduces_one(reduces[0]) else None


# Ops that may wait behind a set of siblings (jax writes a reduction's cast or scale right
# after it, before the next reduction): elementwise ops, views and fused chains without a
# reduction, this many at most, none larger than a result.
_DEFERRED = 4
_SMALL_OPS = ELEMENTWISE | {"reshape", "broadcast_in_dim"}


@dataclass
class _Set:
    """Siblings found so far: their indices, the tensors they reduce (through casts), and the
    small ops that read their results before the last of them, deferred behind it."""

    members: list[int]
    data: set[Value]
    size: int  # elements of a result
    deferred: list[int] = field(default_factory=list)


def _sibling_sets(ops: list[Op], key: Callable[[Op], tuple]) -> list[_Set]:
    """Each set of two or more siblings, in program order."""
    found = _Siblings(ops, key)
    for index, op in enumerate(ops):
        found.add(index, op)
    for signature in list(found.open):
        found.close(signature)
    return sorted(found.closed, key=lambda s: s.members[0])


class _Siblings:
    """The sets of siblings, as `_sibling_sets` walks the ops in program order: those still
    open to more (by signature) and those closed."""

    def __init__(self, ops: list[Op], key: Callable[[Op], tuple]) -> None:
        self.ops, self.key = ops, key
        self.casts = {op.results[0]: op for op in ops if op.name == "convert"}  # by result
        self.open: dict[Hashable, _Set] = {}
        # a result of an open set's member, or of an op deferred behind it -> the signature
        self.made: dict[Value, Hashable] = {}
        self.closed: list[_Set] = []

    def add(self, index: int, op: Op) -> None:
        reads = op_reads(op) if op.regions else op.operands
        reading = {self.made[v] for v in reads if v in self.made}
        reduce = reduction_of(op)
        signature = None
        if reduce is not None:
            x = reduce.operands[0]
            signature = (x.shape, tuple(reduce.attrs["dimensions"]), self.key(op))
        if len(reading) == 1 and signature not in reading and self._defers(op, *reading):
            (behind,) = reading
            self.open[behind].deferred.append(index)
            self.made.update(dict.fromkeys(op.results, behind))
            return
        for each in reading:
            self.close(each)  # a reader of their results: the set joins nothing after it
        if reduce is None:
            return
        data = self._data(op, reduce.operands[0].size)
        siblings = self.open.get(signature)
        if siblings is not None and not siblings.data & data:
            self.close(signature)
            siblings = None
        if siblings is None:
            siblings = self.open[signature] = _Set([], data, op.results[0].size)
        siblings.members.append(index)
        self.made.update(dict.fromkeys(op.results, signature))

    def _defers(self, op: Op, signature: Hashable) -> bool:
        siblings = self.open[signature]
        small = op.name in _SMALL_OPS or (op.name == FUSION and reduction_of(op) is None)
        return (
            small
            and len(siblings.deferred) < _DEFERRED
            and all(v.size <= siblings.size for v in op.results)
        )

    def _data(self, op: Op, size: int) -> set[Value]:
        """The tensors of the reduced size a reduction reads, through casts: a reduction of
        x and one of x cast to float reduce the same tensor."""
        out = set()
        for v in op.operands:
            if v.size != size:
                continue
            while v in self.casts:
                v = self.casts[v].operands[0]
            out.add(v)
        return out

    def close(self, signature: Hashable) -> None:
        siblings = self.open.pop(signature)
        for i in (*siblings.members, *siblings.deferred):
            for v in self.ops[i].results:
                self.made.pop(v, None)
        if len(siblings.members) > 1:
            last = siblings.members[-1]
            siblings.deferred = [i for i in siblings.deferred if i < last]
            self.closed.append(siblings)


def _joined(parts: list[Op], ids: itertools.count) -> Op:
    """One fusion of the reductions `parts` (in order): its operands every operand of theirs,
    in order of first reading; its region each part's members on the shared inputs; its
    results theirs."""
    external = tuple(dict.fromkeys(v for p in parts for v in p.operands))
    inputs = {v: Value(next(ids), v.shape, v.dtype) for v in external}
    body: list[Op] = []
    outputs: list[Value] = []
    for part in parts:
        if part.name == FUSION:
            region = part.regions[0]
            renamed = {
                inner: inputs[v] for inner, v in zip(region.inputs, part.operands, strict=True)
            }
            body += [rename_all(m, renamed) for m in region.ops]
            outputs += region.outputs
        else:  # a bare reduce: its result renamed inside, as `fusion._fusion` renames a root
            result = {v: Value(next(ids), v.shape, v.dtype) for v in part.results}
            body.append(rename_all(part, {**inputs, **result}))
            outputs += result.values()
    region = Graph(
        inputs=tuple(inputs.values()), outputs=tuple(outputs), ops=tuple(body), name=FUSION
    )
    results = tuple(v for p in parts for v in p.results)
    names = tuple(m.name for m in body)
    return Op(FUSION, external, results, {"members": names}, (region,), parts[-1].loc)


def rename_all(op: Op, renamed: Mapping[Value, Value]) -> Op:
    """`op` reading and writing `renamed`'s values in place of their keys."""
    return dataclasses.replace(
        op,
        operands=tuple(renamed.get(v, v) for v in op.operands),
        results=tuple(renamed.get(v, v) for v in op.results),
    )
