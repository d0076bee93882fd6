"""A fused elementwise chain on one tile: one map-expression vertex (docs/target.md, "Fused
elementwise chains").

Poplar's XLA backend runs a chain of elementwise ops as one popops map expression: a codelet
generated for the expression, run by the six workers over the tile's block, which loads each
input once, keeps the intermediates in registers and stores the result once. A worker's
inner loop over a vector of the chain's width (the natural 64-bit vector of its widest
element type) issues the members' arithmetic on one pipeline and the loads and stores on the
other (the IPU issues two instructions a cycle), so a vector costs the larger of:

- arithmetic: each member's thread cycles for the vector, at the rates PopLibs' own vertices
  run it (`cost.vector`'s tables: an `add` of halves 1 cycle per 4, an `exp` 4 per 4);
- memory: one 64-bit load per 8 bytes of each tensor input (a scalar, or a broadcast of one,
  sits in a register) and one store per 8 bytes of the result.

The vertex pays `BinaryOp1D`'s fixed cycles once (29 per worker with float work, else 26, and
11 for the supervisor). For one `add`, this is PopLibs' `BinaryOp1D` estimate (3 cycles per
vector: two loads and a store around one add); PopLibs' own estimate for a generated codelet
(`ExpressionGenerator.cpp`: 20 + inputs x operations per vector) charges every operation once
per input and is the cruder of the two (A, docs/target.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from lowering import Op
from partitioner.cost.vector import (
    VECTOR_OPS,
    compare_cost,
    element_class,
    op_rate,
    vector_width,
)
from partitioner.target import Target


def chain_width(members: Sequence[Op], target: Target) -> int:
    """Elements in one vector of the chain: the natural vector of its widest element type."""
    types = [v.dtype for op in members for v in (*op.operands, *op.results)]
    return min(vector_width(target, t) for t in types)


def _per_element(
    name: str, operand: np.dtype, result: np.dtype, direction: str, target: Target
) -> Fraction:
    """Thread cycles per element of one member's arithmetic, in registers."""
    op = VECTOR_OPS[name]
    if op.kind == "view" or (op.kind == "cast" and np.dtype(operand) == np.dtype(result)):
        return Fraction(0)
    if op.kind == "cast":
        floats = element_class(operand) != "int" and element_class(result) != "int"
        return Fraction(1, 2) if floats else Fraction(2)  # f32v2tof16 / f16v2tof32: 2 a cycle
    if op.kind in ("select", "clamp"):  # compare and move: 2 a natural vector (Clamp's rate)
        return Fraction(2, vector_width(target, operand))
    if op.kind == "composite":
        return sum((_per_element(p, operand, operand, "LT", target) for p in op.parts), Fraction(0))
    if name == "compare":
        return Fraction(compare_cost(direction, operand), 4)
    rate = op_rate(op, operand)
    if rate.natural:
        return Fraction(rate.cycles, vector_width(target, operand))
    return Fraction(rate.cycles, max(1, rate.unroll))


def arithmetic_per_element(members: Sequence[Op], target: Target) -> Fraction:
    """Thread cycles per element of all members' arithmetic."""
    total = Fraction(0)
    for op in members:
        if op.name not in VECTOR_OPS:  # a view the chain reads through (`lowering.fusion`)
            continue
        # select's first operand is its predicate: the values' type sets the cost
        operand = op.operands[-1].dtype if op.name == "select" else op.operands[0].dtype
        direction = op.attrs.get("direction", "") if op.name == "compare" else ""
        total += _per_element(op.name, operand, op.results[0].dtype, direction, target)
    return total


def memory_per_element(loaded: Sequence[np.dtype], result: np.dtype, target: Target) -> Fraction:
    """Thread cycles per element of loads and stores: 8 bytes a cycle each way."""
    per_cycle = target.vector_bytes_per_cycle
    moved = sum(np.dtype(t).itemsize for t in loaded) + np.dtype(result).itemsize
    return Fraction(moved, per_cycle)


def fused_cycles(
    members: Sequence[Op],
    elements: int,
    loaded: Sequence[np.dtype],
    result: np.dtype,
    target: Target,
) -> int:
    """One tile's cycles for a fused chain over `elements` elements of its block, `loaded`
    the element types of its tensor inputs (not its scalars)."""
    if elements <= 0:
        return 0
    workers = target.threads_per_tile
    width = chain_width(members, target)
    per_element = max(
        arithmetic_per_element(members, target), memory_per_element(loaded, result, target)
    )
    vectors = math.ceil(math.ceil(elements / workers) / width)
    inner = math.ceil(vectors * width * per_element)
    floats = any(element_class(v.dtype) == "float" for op in members for v in op.results)
    prologue = 29 if floats else 26
    return workers * (prologue + inner) + 11
