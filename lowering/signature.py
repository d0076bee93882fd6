"""Structural signatures of ops: what an op does, without which values it does it to.

Two ops with equal signatures have the same name, attributes, operand and result types, source
line and regions (compared structurally, their values numbered in order), so any pass that reads
only those computes the same for both. A model written with a Python loop over its layers repeats
every op of a layer once per layer; a pass keyed by signature does the work once per distinct op
(`partitioner.tiles.schedule`).

A signature holds no `Value`: equal ops of different layers have equal signatures. Attribute
values are compared by value where they can be hashed (arrays, constants' values among them, by
their bytes; a float attribute as Python compares floats, so -0.0 as 0.0) and otherwise by
identity.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from lowering.ir import Graph, Op, Value


def op_signature(op: Op) -> Hashable:
    """`op`'s name, attributes, operand and result types, source file:line and regions."""
    # Built with list comprehensions and a call per list, not per value: the scheduler asks
    # once per op (GPT-3: 63k ops and the 42k ops of their fusions' regions).
    regions = op.regions
    return (
        op.name,
        _attrs(op.attrs),
        _types(op.operands),
        _types(op.results),
        op.loc.file,
        op.loc.line,
        tuple([graph_signature(r) for r in regions]) if regions else (),
    )


def graph_signature(graph: Graph) -> Hashable:
    """A region's ops in order, each reading values by their place in the region (its inputs,
    then the results of its ops in order) or, for a value it captures, by the order of capture."""
    number = {value: place for place, value in enumerate(graph.inputs)}
    captured: dict[Value, int] = {}
    ops = []
    for op in graph.ops:
        reads = tuple([_ref(v, number, captured) for v in op.operands])
        ops.append((op_signature(op), reads))
        for value in op.results:
            number[value] = len(number)
    outputs = tuple([_ref(v, number, captured) for v in graph.outputs])
    return (_types(graph.inputs), tuple(ops), outputs)


def _ref(value: Value, number: dict[Value, int], captured: dict[Value, int]) -> tuple[str, int]:
    place = number.get(value)
    if place is not None:
        return ("local", place)
    return ("captured", captured.setdefault(value, len(captured)))


def _types(values: tuple[Value, ...]) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple([(v.shape, v.dtype.str) for v in values])


def _attrs(attrs: Mapping[str, Any]) -> Hashable:
    if not attrs:
        return ()
    # Most attributes are ints, strings and tuples of them, hashable as they are; with their
    # types, as 1 == True. (Inside a tuple an attribute's items keep the type the importer
    # gives that attribute, the same for every op.)
    items = tuple((name, type(x), x) for name, x in attrs.items())
    try:
        hash(items)
    except TypeError:
        return tuple((name, _hashable(attrs[name])) for name in sorted(attrs))
    return items


def _hashable(x: Any) -> Hashable:
    if isinstance(x, np.ndarray):
        return ("array", x.shape, x.dtype.str, x.tobytes())
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_hashable(item) for item in x))
    if isinstance(x, Mapping):
        return ("mapping", tuple((k, _hashable(x[k])) for k in sorted(x, key=repr)))
    try:
        hash(x)
    except TypeError:
        return ("object", id(x))
    return (type(x).__name__, x)  # 1, 1.0 and True are equal, but not as attributes
