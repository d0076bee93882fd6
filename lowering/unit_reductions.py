"""Reductions over dimensions of one element become reshapes, as XLA's algebraic simplifier
makes them before jax.jit runs a program.

A reduction whose reduced dimensions all have size one combines each element with the
reduction's initial value alone; when that value is its combiner's identity (a sum's 0, a max's
-inf), the result is the operand's elements reshaped, which is what jax.jit computes. Kept as a
reduction, it would cost a superstep of its own and stop a chain from fusing through it (a
batch norm's statistics of one replica averaged over the replicas' axis, then updated with
momentum: one map expression instead of a reduction and a map).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lowering.ir import Graph, Op
from lowering.regions import binary_op

# A combiner's identity: the initial value that leaves every element as it is.
_IDENTITY = {"add": 0, "or": 0, "xor": 0, "multiply": 1, "and": -1}
_EXTREMES = {"maximum": -math.inf, "minimum": math.inf}


def reshape_unit_reductions(graph: Graph) -> Graph:
    """`graph` with each reduction over dimensions of size one, from its combiner's identity,
    a reshape (in its regions too); the graph itself when there is none."""
    made = {v: op for op in graph.ops for v in op.results}
    ops = tuple(_rewritten(op, made) for op in graph.ops)
    if all(a is b for a, b in zip(ops, graph.ops, strict=True)):
        return graph
    return dataclasses.replace(graph, ops=ops)


def _rewritten(op: Op, made: dict) -> Op:
    if op.regions and op.name != "reduce":
        regions = tuple(reshape_unit_reductions(r) for r in op.regions)
        if all(a is b for a, b in zip(regions, op.regions, strict=True)):
            return op
        return dataclasses.replace(op, regions=regions)
    if not _reduces_nothing(op, made):
        return op
    (result,) = op.results
    return Op("reshape", op.operands[:1], op.results, {"new_sizes": result.shape}, (), op.loc)


def _reduces_nothing(op: Op, made: dict) -> bool:
    if op.name != "reduce" or len(op.operands) != 2 or not op.regions:
        return False
    x, init = op.operands
    if any(x.shape[d] != 1 for d in op.attrs["dimensions"]):
        return False
    combiner = binary_op(op.regions[0])
    producer = made.get(init)
    if combiner is None or producer is None or producer.name != "constant":
        return False
    return _is_identity(combiner, np.asarray(producer.attrs["value"]), x.dtype)


def _is_identity(combiner: str, value: np.ndarray, dtype: np.dtype) -> bool:
    if value.size != 1:
        return False
    if combiner in _EXTREMES:
        extreme = _EXTREMES[combiner]
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            extreme = info.min if extreme < 0 else info.max
        return bool(value.reshape(()) == extreme)
    if combiner == "and" and dtype == np.bool_:
        return bool(value.reshape(()))
    return combiner in _IDENTITY and bool(value.reshape(()) == _IDENTITY[combiner])
