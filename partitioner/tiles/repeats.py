"""Tile rules run once per distinct op: the tasks of a program's repeated ops reused.

A model written with a Python loop over its layers repeats each op of a layer once per layer
(GPT-3: 96 times). A tile rule's task depends only on what its key here names, so the scheduler
runs the rule for the first op of each key and gives the others a copy of its task, bound to
their own op and values:

- the op's structural signature (`lowering.signature`): name, attributes, operand and result
  types, source line, regions;
- its inputs' layouts;
- what the rules read of the ops that make its operands (`_producers`): a broadcast's source,
  whether an operand is a scalar's broadcast, an iota, and the chain of views and collectives a
  matmul looks through to its operand's maker;
- where the next small tensor goes (`MappingContext.next_place`), when the rule placed one
  itself: a rule that asked (`MappingContext.placed`) is kept per starting tile, with where it
  left the next start.

Ops whose rules do more are never reused: constants (their rule also records the value in the
context), and loops and conditionals (their rules schedule their regions against the layouts
around them).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from typing import Any

from lowering import Op, Value, op_signature
from partitioner.layout import Layout
from partitioner.program import Task
from partitioner.tiles.context import MappingContext
from partitioner.tiles.rules.matmul import LAID_OUT_FOR_CONSUMER

# Ops always run through their rule.
_NEVER = frozenset({"constant", "while", "case"})

# A copy takes every field of the task it copies but these two (a field added to `Task` later
# is copied too).
_OP, _INPUTS, *_COPIED = (f.name for f in fields(Task))
assert (_OP, _INPUTS) == ("op", "inputs"), "repeats binds a task's first two fields anew"


# A kept task's fields but its op and inputs, which a copy binds anew.
_Copied = tuple[Any, ...]


@dataclass
class _Kept:
    """A key's task: one for every start (`fixed`), or one per start with the next start."""

    fixed: _Copied | None = None
    by_start: dict[tuple[int, int | None], tuple[_Copied, int]] = field(default_factory=dict)


@dataclass
class Repeats:
    """The tasks made so far by key, for one context. With `reuse` off, every task is made by
    its rule."""

    reuse: bool = True
    kept: dict[Hashable, _Kept] = field(default_factory=dict)
    # `_maker` of each value read so far: a value is read by several ops (a layer's input by
    # its norm, its residual add, ...), and its maker stays the same within one context.
    makers: dict[Value, Hashable] = field(default_factory=dict)

    def task(
        self,
        rule: Callable[[Op, tuple[Value, ...], tuple[Layout, ...], MappingContext], Task],
        op: Op,
        values: tuple[Value, ...],
        layouts: tuple[Layout, ...],
        ctx: MappingContext,
    ) -> Task:
        """`rule(op, values, layouts, ctx)`, or a copy of the task an equal op made."""
        if op.name in _NEVER or not self.reuse:
            return rule(op, values, layouts, ctx)
        key = (op_signature(op), layouts, self._producers(op, ctx))
        kept = self.kept.get(key)
        start = ctx.next_place
        if kept is not None:
            if kept.fixed is not None:
                return Task(op, values, *kept.fixed)
            if start in kept.by_start:
                copied, after = kept.by_start[start]
                ctx.place_next_at(after)
                return Task(op, values, *copied)
        placed = ctx.placed
        task = rule(op, values, layouts, ctx)
        if task.op is not op or task.inputs != values:  # a rule that remade its op: not kept
            return task
        if kept is None:
            kept = self.kept[key] = _Kept()
        # Its fields once, for the copies (quicker than `dataclasses.replace` per copy).
        copied = tuple([getattr(task, name) for name in _COPIED])
        if ctx.placed == placed:
            kept.fixed = copied
        else:
            kept.by_start[start] = (copied, ctx.next_place[0])
        return task

    def _producers(self, op: Op, ctx: MappingContext) -> Hashable:
        """What the rules read of the ops that make `op`'s operands."""
        makers = self.makers
        for value in op.operands:
            if value not in makers:
                makers[value] = _maker(value, ctx)
        return tuple([makers[value] for value in op.operands])


def _maker(value: Value, ctx: MappingContext) -> Hashable:
    producer = ctx.producers.get(value)
    if producer is None:
        return None
    source = producer.operands[0] if producer.operands else None
    through = []  # the chain a matmul looks through, to the first op that is not a view
    while producer is not None and producer.name in LAID_OUT_FOR_CONSUMER:
        through.append(producer.name)
        producer = ctx.producers.get(producer.operands[0])
    return (
        None if source is None else (source.shape, source.dtype.str),
        tuple(through),
        None if producer is None else producer.name,
    )
