"""Views of small results made again at each reader, as XLA's fusion reads a bitcast or a
broadcast inside each consumer rather than as an op of its own.

jax writes a batch norm's [C] vectors through views: `a[:, None, None, None]` is a broadcast
that adds dimensions of one, made once and read by the forward normalisation and by the backward
pass, and jax often makes it well before its reader. A view read by several ops cannot join any
of their chains (`fusion` joins a view with its one reader), and one made early stands between a
chain and the ops after it that would take it in. A view costs nothing (a layout, not data), so
each reader gets its own copy, made just before it; the chain that makes the viewed value can
then give it out to each. Only views of small tensors (a normalisation's vectors,
`small_chains.SMALL`) made by elementwise ops or reductions are copied: larger tensors keep
their one view, so nothing about a program's activations changes. A phased or pipelined program
keeps its views where jax wrote them (`fusion` does not call this pass there): its phases
and stages are cut by its ops' order, and a view moved into its reader's block would carry a
parameter's view from one block's phase into another's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from lowering.cast_copies import made_at_readers
from lowering.ir import Op, Value, op_reads
from lowering.small_chains import SMALL, VIEWS
from lowering.vocabulary import ELEMENTWISE

_MAKERS = ELEMENTWISE | {"reduce"}


def copy_views(ops: list[Op], outputs: Iterable[Value], ids: itertools.count) -> list[Op]:
    """`ops` with each view of a small elementwise or reduced result made again just before
    each op that reads it as an operand; `ops` itself when there is none."""
    views = _small_views(ops, set(outputs))
    copied = _copied(ops, views) if views else set()
    if not copied:
        return ops
    return made_at_readers(ops, {v: op for v, op in views.items() if v in copied}, ids)


def _small_views(ops: list[Op], kept: set[Value]) -> dict[Value, Op]:
    """The views of small results of elementwise ops or reductions, by their result."""
    made = {v: op for op in ops for v in op.results}
    return {
        op.results[0]: op
        for op in ops
        if op.name in VIEWS
        and op.results[0] not in kept
        and op.operands[0].size <= SMALL
        and op.operands[0] in made
        and made[op.operands[0]].name in _MAKERS
    }


def _copied(ops: list[Op], views: dict[Value, Op]) -> set[Value]:
    """The views read as operands, and not captured by a region (which keeps them)."""
    read: set[Value] = set()
    captured: set[Value] = set()
    for op in ops:
        if op.regions:
            captured.update(set(op_reads(op)).difference(op.operands))
        read.update(v for v in op.operands if v in views)
    return read - captured
