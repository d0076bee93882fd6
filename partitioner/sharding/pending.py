"""Pending sums: which ops keep a partial sum pending, so that one collective finishes it later
instead of one per operand or per step (`partition` asks before each op it rewrites).

A partial sum over some mesh axes is a value each IPU of them holds a term of. An op keeps it
pending when applying the op to the terms and summing gives what summing and then applying
gives:
- a linear op (add, subtract, negate) of partial sums over the same axes, a zero operand (an
  accumulator's start) adding nothing, so a gradient accumulated over micro-batches stays a
  partial sum until it is read, and is reduced once; a dynamic update of one sum into another
  (the indices are not among the terms);
- a view of a sum (reshape, transpose, a broadcast that only adds unit dims), a sum of its
  elements from zero, or a cast to a float type no wider (the sum of the casts is the cast of
  the sum to rounding, as Poplar reduces gradients in their own type), when the op is the sum's
  one reader (else finishing it once serves every reader) and its result no larger;
- a scalar sum (a loss) times, or over, a value every IPU of its axes holds alike (a mean's
  count), read by this op alone. Only scalars: a tensor's sum finished before it is scaled is
  finished where the combiner can join it with its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from lowering import Op, Value
from partitioner.sharding.factor_rules import reduction_kind
from partitioner.sharding.specs import Axes

_LINEAR = frozenset({"add", "subtract", "negate", "dynamic_update_slice"})
_VIEWS = frozenset({"reshape", "transpose"})
_SCALINGS = frozenset({"multiply", "divide"})


def pending_axes(
    op: Op,
    partial: Callable[[Value], Axes],
    uses: Mapping[Value, int],
    zeros: Callable[[Value], bool],
) -> Axes:
    """The axes of a sum `op` keeps pending: `partial(v)` gives an operand's pending axes,
    `uses[v]` how many ops read it, `zeros(v)` whether it is zeros by construction."""
    if op.name in _VIEWS or _sums_alone(op, zeros):
        x = op.operands[0]
        return partial(x) if uses[x] == 1 else ()
    if op.name in _SCALINGS:
        return _scaled_sum(op, partial, uses)
    if op.name not in _LINEAR:
        return ()
    terms = op.operands[:2] if op.name == "dynamic_update_slice" else op.operands
    pending = {partial(v) for v in terms if not zeros(v)}
    return pending.pop() if len(pending) == 1 else ()


def _scaled_sum(op: Op, partial: Callable[[Value], Axes], uses: Mapping[Value, int]) -> Axes:
    if op.results[0].shape:
        return ()
    (x, y), (a, b) = op.operands, (partial(v) for v in op.operands)
    if op.name == "divide" or not b:
        return a if a and not b and uses[x] == 1 else ()
    return b if not a and uses[y] == 1 else ()


def _sums_alone(op: Op, zeros: Callable[[Value], bool]) -> bool:
    if op.name == "reduce":
        return reduction_kind(op) == "sum" and zeros(op.operands[1])
    if op.name == "convert":
        (x,), (y,) = op.operands, op.results
        floats = np.issubdtype(x.dtype, np.floating) and np.issubdtype(y.dtype, np.floating)
        return floats and y.dtype.itemsize <= x.dtype.itemsize
    return op.name == "broadcast_in_dim" and op.results[0].size == op.operands[0].size
