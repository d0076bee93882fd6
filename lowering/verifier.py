"""The IR verifier: checks a Graph's invariants after import and after every pass.

Invariants: every op is in the vocabulary; every operand is defined before use, in its graph or
in a graph around it; every value is defined once; every op's result types are what its shape
rule infers; every output is defined; the pytree structures match the inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Set

import jax

from lowering.errors import VerifyError
from lowering.ir import Graph, Op, Value
from lowering.shape_rules import infer_types
from lowering.vocabulary import VOCABULARY


def verify(graph: Graph) -> None:
    """Raises `VerifyError` naming the first broken invariant; returns None for a sound graph."""
    _check_graph(graph, visible=frozenset(), defined=set())
    if graph.in_tree is not None and graph.in_tree.num_leaves != len(graph.inputs):
        raise VerifyError(
            f"in_tree has {graph.in_tree.num_leaves} leaves for {len(graph.inputs)} inputs"
        )
    if graph.out_tree is not None and graph.out_tree.num_leaves != len(graph.outputs):
        raise VerifyError(
            f"out_tree has {graph.out_tree.num_leaves} leaves for {len(graph.outputs)} outputs"
        )


def _define(value: Value, defined: set[int], where: str) -> None:
    if value.id in defined:
        raise VerifyError(f"{value} is defined twice ({where})")
    defined.add(value.id)


def _check_graph(graph: Graph, visible: Set[Value], defined: set[int]) -> None:
    scope = set(visible)
    for value in graph.inputs:
        _define(value, defined, f"input of {graph.name}")
        scope.add(value)
    for op in graph.ops:
        _check_op(op, scope, defined)
        scope.update(op.results)
    for value in graph.outputs:
        if value not in scope:
            raise VerifyError(f"output {value} of {graph.name} is never defined")


def _check_op(op: Op, scope: Set[Value], defined: set[int]) -> None:
    where = f"{op.name} at {op.loc}"
    if op.name not in VOCABULARY:
        raise VerifyError(f"{where}: {op.name!r} is not in the vocabulary")
    for value in op.operands:
        if value not in scope:
            raise VerifyError(f"{where}: operand {value} is used before it is defined")
    for region in op.regions:
        _check_graph(region, frozenset(scope), defined)
    for value in op.results:
        _define(value, defined, where)
    _check_types(op, where)


def _check_types(op: Op, where: str) -> None:
    try:
        expected = infer_types(op)
    except Exception as error:  # a rule that cannot even run on these operands is a broken op
        raise VerifyError(f"{where}: its shape rule fails: {error}") from error
    got = tuple((v.shape, v.dtype) for v in op.results)
    want = tuple((tuple(a.shape), jax.numpy.dtype(a.dtype)) for a in expected)
    if got != want:
        raise VerifyError(f"{where}: results have types {got}, its shape rule gives {want}")
