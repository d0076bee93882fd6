"""Steps alike by what they are, not by who they are: the key the plan search shares a trace
under across meshes.

A workload factory makes its step afresh for each mesh the search tries (a new closure over a
new optimizer: `make_train_step(make_optimizer())`), so the step's identity says nothing about
whether two meshes trace the same program. Two functions of the same code, whose defaults and
captured values are alike in turn, trace alike on arguments of the same shapes: `alike_key`
says so by a key built from the code and, recursively, the values it captures (plain values
by value, containers by their items, functions, partials and methods by their parts, other
hashable objects by their own equality, anything else by identity). It gives up (None) on a
cycle or on a structure too deep or too wide to be worth the walk; the search then keys the
trace by identity as before.

What a function may read besides (a module's globals, the mesh jax traces it under) is not in
the key: `Traces` shares a trace across meshes only when its program reads no mesh axis
(`reads_a_mesh`: no sharding constraint, `shard_map` or collective), and the globals are the
module's own, the same for every call of one search.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Iterator
from typing import Any

import jax
from jax.sharding import SingleDeviceSharding

from ipujax.arguments import leaf_key
from lowering import COLLECTIVES, SHARD_OPS, Graph, walk

MAX_DEPTH = 64  # nested values walked at most (optax's transformations: about 30)
MAX_NODES = 20_000  # values walked at most, all told

# Ops whose meaning depends on the mesh the step is traced under.
_MESH_OPS = frozenset({"sharding_constraint", "manual_computation"}) | COLLECTIVES | SHARD_OPS
_PLAIN = (type(None), bool, int, str, bytes)
_BY_IDENTITY = (type, types.ModuleType, types.CodeType, types.BuiltinFunctionType)


class _GiveUp(Exception):
    """A cycle, or a structure past `MAX_DEPTH` or `MAX_NODES`."""


class _Identity:
    """A value keyed by identity (an array, a mesh, an object of no equality of its own): the
    key holds it, so no other object takes its id while the key lives."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value


def alike_key(value: Any) -> Hashable | None:
    """A key equal for values that compute alike (see the module docstring), or None."""
    walk = _Walk()
    try:
        return walk.key(value, MAX_DEPTH)
    except _GiveUp:
        return None


class _Walk:
    def __init__(self) -> None:
        self.nodes = 0
        self.open: set[int] = set()  # ids of the containers being walked: a cycle

    def key(self, value: Any, depth: int) -> Hashable:
        self.nodes += 1
        if depth < 0 or self.nodes > MAX_NODES:
            raise _GiveUp
        if isinstance(value, _PLAIN):
            return (type(value), value)
        if isinstance(value, (float, complex)):
            return (type(value), repr(value))  # -0.0 and nan as themselves
        if isinstance(value, _BY_IDENTITY):
            return _Identity(value)
        if id(value) in self.open:
            raise _GiveUp
        self.open.add(id(value))
        try:
            return self._composite(value, depth - 1)
        finally:
            self.open.discard(id(value))

    def _composite(self, value: Any, depth: int) -> Hashable:
        key = functools.partial(self.key, depth=depth)
        if isinstance(value, types.FunctionType):
            return (
                "function",
                value.__code__,
                key(value.__defaults__),
                key(value.__kwdefaults__),
                tuple(key(c) for c in _captured(value)),
                _Identity(value.__globals__),
                key(value.__dict__),
            )
        if isinstance(value, functools.partial):
            return ("partial", key(value.func), key(value.args), key(value.keywords))
        if isinstance(value, types.MethodType):
            return ("method", key(value.__func__), key(value.__self__))
        if isinstance(value, (tuple, list)):  # a NamedTuple by its type and items
            return (type(value), tuple(key(item) for item in value))
        if isinstance(value, dict):
            return (type(value), tuple((key(k), key(v)) for k, v in value.items()))
        try:
            hash(value)
        except TypeError:
            return _Identity(value)
        return ("equal", type(value), value)


_EMPTY_CELL = ("empty cell",)


def _captured(function: types.FunctionType) -> Iterator[Any]:
    for cell in function.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # a cell not yet filled (a name the function defines later)
            yield _EMPTY_CELL


def reads_a_mesh(graph: Graph) -> bool:
    """Whether the program has an op whose meaning depends on the mesh it was traced under."""
    return any(op.name in _MESH_OPS for op in walk(graph))


def shapes_key(tree: Any) -> Hashable | None:
    """The arguments as a trace sees them: their tree and each leaf's `leaf_key` (an array's
    shape, dtype and weak type). None when a leaf has a sharding of its own (which may type
    the trace), beyond one device's placement."""
    leaves, structure = jax.tree.flatten(tree)
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and not isinstance(sharding, SingleDeviceSharding):
            return None
    return (structure, tuple(leaf_key(leaf) for leaf in leaves))
