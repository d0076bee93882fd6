"""The IR: typed values, operations and graphs, one node per StableHLO op.

Records are frozen and slotted; passes build new ones. A `Graph` is a straight-line block: its
inputs, its ops in order, its outputs. Ops with regions (reduce, sort, scatter, while, case) hold
nested graphs; a region may read values of the graphs around it (StableHLO's implicit capture).
The top-level graph also carries the pytree structure of the traced function's arguments and
results, so that evaluation returns exactly what the function returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from lowering.locations import UNKNOWN, SourceLoc


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: a tensor of static shape and dtype, named by a graph-unique id."""

    id: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def type_str(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"

    def __str__(self) -> str:
        return f"%{self.id}"

    def __hash__(self) -> int:
        # By id alone (equal values have equal ids): every pass keys dicts by values, and
        # hashing the shape and dtype too cost a tenth of GPT-3's compile. The id itself, an
        # int, is its own hash; returning it skips a call per lookup (16 M for GPT-3).
        return self.id


def _frozen_attrs(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(attrs or {}))


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """One operation: name (see `lowering.VOCABULARY`), operands, results, attributes, regions."""

    name: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    regions: tuple[Graph, ...] = ()
    loc: SourceLoc = UNKNOWN

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", _frozen_attrs(self.attrs))

    def __str__(self) -> str:
        from lowering.printer import format_op

        return format_op(self)


@dataclass(frozen=True, slots=True, eq=False)
class Graph:
    """A block of ops. The top-level graph also knows the pytree shape of arguments and results."""

    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    ops: tuple[Op, ...]
    input_names: tuple[str, ...] = ()
    in_tree: Any = None
    out_tree: Any = None
    name: str = "main"
    # Per output leaf, the dtype of a typed PRNG key (its key data is what the graph returns),
    # or None; empty when no output is a key.
    out_keys: tuple[Any, ...] = ()
    # `free_values`, kept once found: a graph never changes, and the passes ask again of every
    # fusion's region (GPT-3: 12,700 regions, each asked by half a dozen passes).
    _free: tuple[Value, ...] | None = field(default=None, init=False, repr=False)

    def __str__(self) -> str:
        from lowering.printer import format_graph

        return format_graph(self)


def walk(graph: Graph) -> Iterator[Op]:
    """Every op of a graph, depth first, including the ops nested in regions."""
    for op in graph.ops:
        yield op
        for region in op.regions:
            yield from walk(region)


def max_value_id(graph: Graph) -> int:
    """The largest id of a value the graph defines, in its regions too (0 for none): a pass
    that makes values numbers them after it."""
    ids = [v.id for v in graph.inputs]
    for op in walk(graph):
        ids += [v.id for v in op.results]
        for region in op.regions:
            ids += [v.id for v in region.inputs]
    return max(ids, default=0)


def producers(graph: Graph) -> dict[Value, Op]:
    """The op that makes each value a graph's ops define (not nested ones)."""
    return {result: op for op in graph.ops for result in op.results}


def defined_values(graph: Graph) -> set[Value]:
    """The values a graph defines itself: its inputs and its ops' results (not nested ones)."""
    defined = set(graph.inputs)
    for op in graph.ops:
        defined.update(op.results)
    return defined


def free_values(graph: Graph) -> tuple[Value, ...]:
    """Values a graph (or its regions) reads but does not define: its implicit captures."""
    found = graph._free
    if found is None:
        found = _free_values(graph)
        object.__setattr__(graph, "_free", found)
    return found


def _free_values(graph: Graph) -> tuple[Value, ...]:
    defined = defined_values(graph)
    free: dict[Value, None] = {}
    for op in graph.ops:
        for value in op.operands:
            if value not in defined:
                free[value] = None
        for region in op.regions:
            for value in free_values(region):
                if value not in defined:
                    free[value] = None
    for value in graph.outputs:
        if value not in defined:
            free[value] = None
    return tuple(free)


def op_reads(op: Op) -> tuple[Value, ...]:
    """What an op reads: its operands, then the values its regions capture from the program
    around it (each once, operands not again)."""
    captured: dict[Value, None] = {}
    for region in op.regions:
        for value in free_values(region):
            if value not in op.operands:
                captured[value] = None
    return op.operands + tuple(captured)
