"""Small chains joined after grouping, as XLA's multi-output fusion joins a producer fusion to its
consumer and two sibling fusions that read one operand.

Grouping (`lowering.fusion`) walks the ops in the order jax wrote them, so a chain stops where
jax wrote a reader of its result before the op that could take it in: a batch norm's
`a.astype(f16)[..., None]` is broadcast into the normalisation before jax writes the same for
`b`, and the running statistics' update reads the mean where nothing else of the
normalisation's [C] vectors does. Each such piece would be a superstep of a few hundred
cycles on the same tiles as its neighbour. Once every chain is made, this pass joins two
chains of small results (at most `SMALL` elements each, the [C] vectors of a normalisation):

- a producer and its consumer (read directly or through a view that nothing else reads),
  when every other reader of the producer's results comes after the consumer;
- two siblings that read one tensor of their size (through views), when every reader of the
  earlier one's results comes after the later one.

The joined chain sits where the later one sat, gives out the earlier one's results that are
read outside it, and is costed as one fusion (one superstep). Views of the earlier one's
results that jax wrote between the two wait until after the joined chain (in a phased or
pipelined program only views of the chains' own fusion key, so nothing crosses a cut).
Values never change: the members compute what they computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from lowering.ir import Op, Value, op_reads
from lowering.siblings import FUSION, rename_all
from lowering.vocabulary import ELEMENTWISE

# A small result, in elements: a normalisation's [C] vectors (ResNet-50's widest has 2,048),
# each of which would otherwise be a superstep of its own. Chains give such results out to
# later readers (`fusion`), views of them are made at each reader (`view_copies`) and chains of
# them join here. Larger results stay where they are made and their readers' chains apart:
# joining a later reader's chain would compute it early and keep its result (an activation's
# `1 - tanh` made in the forward pass and held for the backward).
SMALL = 2048

# Views: layouts, not data. They cost nothing where they are made, so one may be made again at
# each reader (`view_copies`) or wait behind a joined chain (a broadcast of a [C] vector into
# an activation is read where its reader runs).
VIEWS = frozenset({"reshape", "broadcast_in_dim"})

Build = Callable[[list[Op], Sequence[Value]], Op]  # members (root last), extras -> a fusion


def join_small_chains(
    ops: list[Op], outputs: Iterable[Value], key: Callable[[Op], tuple], build: Build
) -> list[Op]:
    """`ops` with small chains joined as the module says; `ops` itself when none join."""
    chains = [_chain(op) for op in ops]
    if not any(chains):
        return ops
    joins = _Joins(ops, chains, set(outputs), key)
    for t in range(len(ops)):
        while joins.chains[t]:
            found = joins.partner(t)
            if found is None:
                break
            joins.join(t, *found, build)
    if all(op is not None for op in joins.slots):  # nothing joined
        return ops
    after = joins.after
    return [
        o for i, op in enumerate(joins.slots) if op is not None for o in (op, *after.get(i, ()))
    ]


def _chain(op: Op | None) -> bool:
    """An elementwise op or a fusion without a reduction, of small results of one size (more
    than one element: scalars' chains are grouping's), whose tensor operands have that size
    too (a fusion of them is laid out as one)."""
    if op is None or not op.results:
        return False
    if op.name == FUSION:
        if any(m.name == "reduce" for m in op.regions[0].ops):
            return False
    elif op.name not in ELEMENTWISE or len(op.results) != 1:
        return False
    size = op.results[0].size
    return (
        1 < size <= SMALL
        and all(v.size == size for v in op.results)
        and all(v.size in (1, size) for v in op.operands)
    )


def is_bitcast(op: Op | None) -> bool:
    """A reshape, or a broadcast that only adds dimensions of one: the same elements in the
    same order (a bitcast in XLA), which a map expression reads through as it reads its
    operand."""
    if op is None or op.name not in VIEWS:
        return False
    return op.results[0].size == op.operands[0].size


class _Joins:
    """The ops as joined so far (a joined-away op's slot is None), who makes and who reads each
    value, and which chains read each tensor (through views)."""

    def __init__(
        self, ops: list[Op], chains: list[bool], kept: set[Value], key: Callable[[Op], tuple]
    ) -> None:
        self.slots: list[Op | None] = list(ops)
        self.chains = chains  # whether each slot holds a small chain
        self.kept, self.key = kept, key
        # who makes and who reads the results of chains and views, the only ones asked after
        # (a chain joins a chain, directly or through a view)
        self.made = {
            v: i
            for i, (op, chain) in enumerate(zip(ops, chains, strict=True))
            if chain or op.name in VIEWS
            for v in op.results
        }
        self.tracked = set(self.made)
        self.readers: dict[Value, set[float]] = {}  # x.5: waiting behind slot x
        for i, op in enumerate(ops):
            self._read(i, op)
        self.by_tensor: dict[Value, set[int]] = {}
        for i, op in enumerate(ops):
            if chains[i]:
                for w in self._tensors(op):
                    self.by_tensor.setdefault(w, set()).add(i)
        # views moved to just after a joined chain (they read what it gives out), by slot
        self.after: dict[int, list[Op]] = {}

    def _read(self, index: float, op: Op) -> None:
        for v in op_reads(op) if op.regions else op.operands:
            if v in self.tracked:
                self.readers.setdefault(v, set()).add(index)

    def _unread(self, index: float, op: Op) -> None:
        for v in op_reads(op) if op.regions else op.operands:
            if v in self.tracked:
                self.readers[v].discard(index)

    def _tensors(self, op: Op) -> set[Value]:
        """The tensors of its size `op` reads, and what they are views of."""
        out = set()
        for v in op.operands:
            if v.size > 1:
                out.add(v)
                while v in self.made and is_bitcast(self.slots[self.made[v]]):
                    v = self.slots[self.made[v]].operands[0]  # type: ignore[union-attr]
                    out.add(v)
        return out

    def partner(self, t: int) -> tuple[int, int | None, list[int]] | None:
        """An earlier chain that op `t` can take in, with the view it reads it through and
        the views that would wait behind the joined chain (`_moved`), else None."""
        op = self.slots[t]
        assert op is not None
        candidates: dict[int, int | None] = {}
        for v in op.operands:  # producers, directly or through a view
            at = self.made.get(v)
            if at is None or at >= t:
                continue
            maker = self.slots[at]
            if is_bitcast(maker) and self.readers.get(v) == {t}:
                source = self.made.get(maker.operands[0])  # type: ignore[union-attr]
                if source is not None:
                    candidates.setdefault(source, at)
            else:
                candidates.setdefault(at, None)
        for w in self._tensors(op):  # siblings: chains that read a tensor `op` reads
            for s in self.by_tensor.get(w, ()):
                if s < t:
                    candidates.setdefault(s, None)
        for s, view in sorted(candidates.items(), reverse=True):
            moved = self._joins(s, view, t)
            if moved is not None:
                return s, view, moved
        return None

    def _joins(self, s: int, view: int | None, t: int) -> list[int] | None:
        """The views that would wait behind chains `s` and `t` joined (`_moved`), or None when
        they cannot join."""
        other, op = self.slots[s], self.slots[t]
        if not self.chains[s] or other is None or op is None:
            return None
        if other.results[0].size != op.results[0].size or self.key(other) != self.key(op):
            return None
        if view is not None and self.key(self.slots[view]) != self.key(op):  # type: ignore[arg-type]
            return None
        near = {s, t} if view is None else {s, t, view}
        moved = self._moved(s, t, near)
        if moved is None:
            return None
        later = [v for r in moved for v in self._op(r).results] + [
            v for w in self.after.get(s, ()) for v in w.results
        ]
        return moved if all(r > t for v in later for r in self.readers.get(v, ())) else None

    def _op(self, index: int) -> Op:
        op = self.slots[index]
        assert op is not None
        return op

    def _moved(self, s: int, t: int, near: set[int]) -> list[int] | None:
        """The views between chains `s` and `t` that read the earlier one's results and would
        move to after `t` (each to be read after `t` alone), or None when another op reads
        them before `t`."""
        moved = []
        for v in self._op(s).results:
            for r in self.readers.get(v, ()):
                if r > t or r in near or r == s + 0.5:  # s + 0.5: views waiting behind s
                    continue
                if r != int(r) or self._op(int(r)).name not in VIEWS:
                    return None  # read by a view waiting behind another chain, or an op
                if self.key(self._op(int(r))) != self.key(self._op(t)):
                    return None  # a view of another phase's or stage's source stays put
                moved.append(int(r))
        return moved

    def join(self, t: int, s: int, view: int | None, moved: list[int], build: Build) -> None:
        """Op `t` made one fusion with chain `s` (and the view `view` between them), the views
        `moved` waiting behind it."""
        gone = [s] if view is None else [s, view]
        parts = [self.slots[i] for i in (*gone, t)]
        made = {v for p in parts for v in p.results}  # type: ignore[union-attr]
        outside = {v for v in made if self.readers.get(v, set()).difference(gone, [t])}
        merged = _merged(parts, outside | self.kept, build)  # type: ignore[arg-type]
        for tensor in self._tensors(self._op(s)):
            self.by_tensor.get(tensor, set()).discard(s)
        # views of its results wait until after the joined chain: read at t + 0.5
        waiting = [(r, self._op(r)) for r in moved] + [(s + 0.5, w) for w in self.after.pop(s, [])]
        for r, w in waiting:
            self._unread(r, w)
            self._read(t + 0.5, w)
            for v in w.results:
                self.made[v] = t
            self.after.setdefault(t, []).append(w)
        for r in moved:
            self.slots[r] = None
        for i in gone:
            self._unread(i, self._op(i))
            self.slots[i] = None
            self.chains[i] = False
        for v in merged.results:
            self.made[v] = t
        self._read(t, merged)
        for tensor in self._tensors(merged):
            self.by_tensor.setdefault(tensor, set()).add(t)
        self.slots[t] = merged
        self.chains[t] = _chain(merged)


def _merged(parts: list[Op], read: set[Value], build: Build) -> Op:
    """One fusion of `parts` (the later chain last), giving out the earlier parts' results
    (and the later chain's own extras) that are `read` outside it."""
    members = [m for part in parts for m in _members(part)]
    root = parts[-1].results[0]
    given = [v for p in parts for v in p.results if v is not root and v in read]
    return build(members, given)


def _members(op: Op) -> list[Op]:
    """A fusion's members on its own operands and results; any other op itself."""
    if op.name != FUSION:
        return [op]
    region = op.regions[0]
    outer = {
        **dict(zip(region.inputs, op.operands, strict=True)),
        **dict(zip(region.outputs, op.results, strict=True)),
    }
    return [rename_all(m, outer) for m in region.ops]
