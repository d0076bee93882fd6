"""A call's arguments as `ipujax.jit` sees them: the static ones closed over, the dynamic ones
traced, the flat inputs each dynamic argument's leaves become, the donated and resident ones
(`resident`), and the key under which a compiled program is cached.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np


@dataclass(frozen=True, slots=True)
class Call:
    """One call split into what is traced and what is closed over."""

    fun: Callable[..., Any]  # the function of the dynamic arguments only
    args: tuple  # the dynamic positional arguments
    kwargs: dict  # the dynamic keyword arguments
    key: Any  # the static values, part of the cache key
    positions: tuple[int, ...]  # each dynamic positional argument's position in the call
    count: int  # the positional arguments of the call, static ones included


def split_call(
    fun: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    static_argnums: tuple[int, ...],
    static_argnames: tuple[str, ...],
) -> Call:
    """The function of the dynamic arguments only, with the static ones closed over."""
    count = len(args)
    positions, names = chosen_parameters(fun, count, static_argnums, static_argnames)
    statics = {i: args[i] for i in sorted(positions)}
    static_kw = {k: v for k, v in kwargs.items() if k in names}
    dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_kw}
    key = (tuple(statics.items()), tuple(sorted(static_kw.items())))
    dynamic_positions = tuple(i for i in range(count) if i not in statics)
    if not statics and not static_kw:
        return Call(fun, dyn_args, dyn_kwargs, key, dynamic_positions, count)

    def dynamic(*dargs: Any, **dkwargs: Any) -> Any:
        it = iter(dargs)
        full = [statics[i] if i in statics else next(it) for i in range(count)]
        return fun(*full, **dkwargs, **static_kw)

    _name_parameters(dynamic, fun, set(statics), set(static_kw))
    return Call(dynamic, dyn_args, dyn_kwargs, key, dynamic_positions, count)


def chosen_parameters(
    fun: Callable[..., Any], count: int, argnums: tuple[int, ...], argnames: tuple[str, ...]
) -> tuple[set[int], set[str]]:
    """The positions and names of the parameters `argnums` and `argnames` choose (static or
    resident ones) in a call of `count` positional arguments; like jax.jit, a parameter is
    chosen whether it is passed by position or by keyword."""
    positions = {i % count for i in argnums if -count <= i < count}
    names = set(argnames)
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        return positions, names
    positions |= {i for i, name in enumerate(params[:count]) if name in names}
    names |= {params[i] for i in argnums if 0 <= i < len(params)}
    return positions, names


def _name_parameters(dynamic: Any, fun: Callable[..., Any], positions: set, names: set) -> None:
    """Gives the wrapper the user's signature minus the static parameters, so that jax names
    the arguments (and ipujax's reports name the tensors) as the user did."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return
    kept = [p for i, p in enumerate(params) if i not in positions and p.name not in names]
    dynamic.__signature__ = inspect.Signature(kept)


def leaf_ranges(call: Call) -> list[tuple[int, range]]:
    """Each dynamic argument's position and the flat input indices of its leaves."""
    out, offset = [], 0
    for position, arg in zip(call.positions, call.args, strict=True):
        leaves = len(jax.tree.leaves(arg))
        out.append((position, range(offset, offset + leaves)))
        offset += leaves
    return out


def keyword_ranges(call: Call) -> list[tuple[str, range]]:
    """Each dynamic keyword argument's name and the flat input indices of its leaves, after
    the positional ones (jax flattens a dict's entries in sorted key order)."""
    out, offset = [], len(jax.tree.leaves(call.args))
    for name in sorted(call.kwargs):
        leaves = len(jax.tree.leaves(call.kwargs[name]))
        out.append((name, range(offset, offset + leaves)))
        offset += leaves
    return out


def donated_leaves(
    fun: Callable[..., Any], call: Call, argnums: tuple[int, ...], argnames: tuple[str, ...]
) -> list[int]:
    """Flat input indices of the donated arguments' leaves: those `argnums` and `argnames`
    choose, passed by position or by keyword (as jax.jit's `donate_argnums` and
    `donate_argnames`)."""
    positions, names = chosen_parameters(fun, call.count, argnums, argnames)
    donated = [i for p, flat in leaf_ranges(call) if p in positions for i in flat]
    return donated + [i for name, flat in keyword_ranges(call) if name in names for i in flat]


def cache_key(call: Call) -> tuple | None:
    """The static values, the dynamic arguments' tree, and each leaf's shape and dtype (a
    Python scalar's type): calls with equal keys share a compiled program on one mesh. None
    when a leaf is a jax tracer: the call is being traced by a jax transformation, and there
    is no program of its own to compile."""
    leaves, tree = jax.tree.flatten((call.args, call.kwargs))
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return None
    return (call.key, tree, tuple(leaf_key(x) for x in leaves))


def leaf_key(leaf: Any) -> Any:
    """What a trace reads of a dynamic leaf: a Python scalar's type (traced as a weak-typed
    value whatever its value), an array's shape, dtype and weak type (jax promotes a weak
    float32 with a bfloat16 to bfloat16, a strong one to float32)."""
    if isinstance(leaf, (bool, int, float, complex)):
        return type(leaf).__name__
    dtype = str(getattr(leaf, "dtype", type(leaf).__name__))
    return (tuple(np.shape(leaf)), dtype, bool(getattr(leaf, "weak_type", False)))
