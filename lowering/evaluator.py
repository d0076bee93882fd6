"""The reference interpreter: runs a Graph op by op with each op's jax.lax evaluation rule.

`evaluate(graph, *args)` checks the arguments against the graph's inputs, runs the whole graph as
one jitted jax function (so a call costs one XLA call, not one per op), and rebuilds the pytree the
traced function returned. It runs with 64-bit types enabled because jax's own lowerings use u64
internally (random bits) even when the user's program is 32-bit; every value's type comes from the
graph, so enabling them changes no result type.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from lowering.errors import LoweringError
from lowering.eval_rules import EVAL_RULES
from lowering.ir import Graph, Op, Value

Env = dict[Value, Any]


def run_op(op: Op, operands: list[Any], env: Mapping[Value, Any]) -> tuple[Any, ...]:
    """Applies an op's evaluation rule; regions become callables that see the enclosing env."""
    return apply_rule(op, operands, op.attrs, env)


def apply_rule(
    op: Op, operands: list[Any], attrs: Mapping[str, Any], env: Mapping[Value, Any]
) -> tuple[Any, ...]:
    """An op's evaluation rule with attributes of the caller's choosing (the tile runtime runs
    a reduce over a block's own dimensions, for instance)."""
    kwargs = dict(attrs)
    if op.regions:
        kwargs["regions"] = tuple(_region_callable(region, env) for region in op.regions)
    return EVAL_RULES[op.name](*operands, **kwargs)


@dataclasses.dataclass(frozen=True)
class RegionCall:
    """A region as a function of its inputs; rules read `graph` to spot a plain `add` and
    similar, which jax reduces without tracing a computation."""

    graph: Graph
    env: Mapping[Value, Any]

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        return interpret(self.graph, inputs, self.env)


def _region_callable(region: Graph, env: Mapping[Value, Any]) -> Any:
    return RegionCall(region, env)


def interpret(graph: Graph, inputs: Any, outer: Mapping[Value, Any] | None = None) -> tuple:
    """Runs a graph on jax values (traced or concrete) and returns its outputs."""
    env: Env = dict(outer or {})
    env.update(zip(graph.inputs, inputs, strict=True))
    for op in graph.ops:
        results = run_op(op, [env[v] for v in op.operands], env)
        env.update(zip(op.results, results, strict=True))
    return tuple(env[v] for v in graph.outputs)


@functools.lru_cache(maxsize=64)
def _jitted(graph: Graph) -> Any:
    return jax.jit(lambda *flat: interpret(graph, flat))


def flatten_args(graph: Graph, args: tuple, kwargs: dict, host: bool = False) -> list[Any]:
    """The argument leaves in the graph's input order, cast to the graph's input dtypes. With
    `host`, leaves that are not jax arrays stay numpy arrays (cast on the host), for a caller
    that puts them on its devices itself: straight from the host is faster than through one."""
    leaves, tree = jax.tree.flatten((args, kwargs))
    leaves = [_key_data(leaf) for leaf in leaves]
    if graph.in_tree is not None and tree != graph.in_tree:
        raise LoweringError(
            f"the arguments have structure {tree}, but the graph was lowered for {graph.in_tree}; "
            "call with arguments of the same pytree structure as when lowering"
        )
    for leaf, value in zip(leaves, graph.inputs, strict=True):
        if tuple(np.shape(leaf)) != value.shape:
            raise LoweringError(
                f"an argument has shape {np.shape(leaf)}, but the graph expects {value.shape}; "
                "lower again for the new shapes"
            )
    return [_cast(leaf, v.dtype, host) for leaf, v in zip(leaves, graph.inputs, strict=True)]


def _cast(leaf: Any, dtype: np.dtype, host: bool) -> Any:
    """`leaf` as an array of `dtype`. A jax array already of that dtype, not weakly typed, is
    passed as it is: `jnp.asarray` would cost about 35 us per leaf (6 ms for the GPT step's
    159), and a weakly typed one would make jax.jit trace again."""
    if isinstance(leaf, jax.Array):
        if leaf.dtype == dtype and not leaf.weak_type:
            return leaf
        return jax.numpy.asarray(leaf, dtype=dtype)
    return np.asarray(leaf, dtype=dtype) if host else jax.numpy.asarray(leaf, dtype=dtype)


def _key_data(leaf: Any) -> Any:
    """A typed PRNG key as the uint32 data the graph takes for it; anything else unchanged."""
    dtype = getattr(leaf, "dtype", None)
    # A key's dtype is jax's own, not numpy's: numpy dtypes (every other leaf, every step)
    # skip the slower subtype test.
    if dtype is None or isinstance(dtype, np.dtype):
        return leaf
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def restore_keys(graph: Graph, outputs: list[Any]) -> list[Any]:
    """The graph's outputs with typed PRNG keys where the traced function returned them."""
    if not graph.out_keys:
        return outputs
    # A key dtype carries its implementation (threefry, rbg, ...); wrap_key_data needs it.
    return [
        out if key is None else jax.random.wrap_key_data(out, impl=key._impl)
        for out, key in zip(outputs, graph.out_keys, strict=True)
    ]


def evaluate(graph: Graph, *args: Any, **kwargs: Any) -> Any:
    """Runs a lowered graph on concrete arguments and returns what the traced function returns."""
    with jax.enable_x64(True):
        flat = flatten_args(graph, args, kwargs)
        outputs = _jitted(graph)(*flat)
    if graph.out_tree is None:
        return outputs
    return jax.tree.unflatten(graph.out_tree, restore_keys(graph, list(outputs)))
