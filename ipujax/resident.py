"""Resident arguments (`ipujax.jit(resident_argnums=..., resident_argnames=...)`): whole
arguments that live on the IPUs between calls (weights, a KV cache, a compressed operator),
loaded once as Poplar loads a model's weights and never sent from the host per call
(docs/target.md, "Streaming memory, host and phases").

`checked_argnums` / `checked_argnames` check their types when `jit` is called and
`check_against` checks them against the function's signature once it is known, as jax checks
static and donated argnums: in range, parameters of the function, none of them static.
`resident_leaves` turns them into one call's flat inputs, `partitioner.Options.resident_inputs`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ipujax.arguments import Call, chosen_parameters, keyword_ranges, leaf_ranges
from ipujax.options import JitOptions, as_tuple
from partitioner import ConfigError

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def checked_argnums(value: int | Sequence[int]) -> tuple[int, ...]:
    """`resident_argnums=`: an int or a sequence of ints."""
    nums = as_tuple(value)
    bad = [n for n in nums if not isinstance(n, int) or isinstance(n, bool)]
    if bad:
        raise ConfigError(
            f"resident_argnums={value!r}: {bad[0]!r} is not a position; give the positions of "
            "the arguments that stay on the IPUs between calls, e.g. resident_argnums=(0,)"
        )
    return nums


def checked_argnames(value: str | Sequence[str]) -> tuple[str, ...]:
    """`resident_argnames=`: a name or a sequence of names."""
    names = as_tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ConfigError(
            f"resident_argnames={value!r}: {bad[0]!r} is not a name; give the names of the "
            "parameters that stay on the IPUs between calls, e.g. resident_argnames=('params',)"
        )
    return names


def _signature(fun: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None


def _where(fun: Callable[..., Any]) -> str:
    """The function as the user wrote it: its name and file:line, when it has them."""
    name = getattr(fun, "__qualname__", repr(fun))
    code = getattr(fun, "__code__", None)
    return name if code is None else f"{name} ({code.co_filename}:{code.co_firstlineno})"


def _check_argnums(fun: Callable[..., Any], params: list[inspect.Parameter], nums: tuple) -> None:
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return  # any position may be passed; the call checks it
    positional = [p.name for p in params if p.kind in _POSITIONAL]
    count = len(positional)
    for num in nums:
        if not -count <= num < count:
            raise ConfigError(
                f"resident_argnums={nums}: {num} is out of range: {_where(fun)} takes {count} "
                f"positional parameters ({', '.join(positional)}); give positions from 0 to "
                f"{count - 1}"
            )


def _check_argnames(fun: Callable[..., Any], params: list[inspect.Parameter], names: tuple) -> None:
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    known = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for name in names:
        if name not in known:
            raise ConfigError(
                f"resident_argnames={names}: {name!r} is not a parameter of {_where(fun)}, "
                f"whose parameters are {', '.join(known) or 'none'}"
            )


def _named(params: list[inspect.Parameter], chosen: tuple[set[int], set[str]]) -> set[str]:
    positions, names = chosen
    return names | {params[i].name for i in positions if i < len(params)}


def _check_not_static(
    fun: Callable[..., Any], params: list[inspect.Parameter], options: JitOptions
) -> None:
    count = sum(p.kind in _POSITIONAL for p in params)
    resident = chosen_parameters(fun, count, options.resident_argnums, options.resident_argnames)
    static = chosen_parameters(fun, count, options.static_argnums, options.static_argnames)
    both = sorted(_named(params, resident) & _named(params, static))
    if both:
        raise ConfigError(
            f"{_where(fun)}: parameter {both[0]} is both static and resident; a static "
            "argument is a compile-time constant, never sent to the IPUs: drop it from "
            "static_argnums/static_argnames or from resident_argnums/resident_argnames"
        )


def check_against(fun: Callable[..., Any], options: JitOptions) -> None:
    """The resident arguments checked against `fun`'s signature, when it has one."""
    params = _signature(fun)
    if params is None or not (options.resident_argnums or options.resident_argnames):
        return
    _check_argnums(fun, params, options.resident_argnums)
    _check_argnames(fun, params, options.resident_argnames)
    _check_not_static(fun, params, options)


def _check_call(fun: Callable[..., Any], call: Call, nums: tuple[int, ...]) -> None:
    """A position past both the call's arguments and the function's positional parameters
    (a function of `*args`) names nothing."""
    params = _signature(fun) or []
    known = max(call.count, sum(p.kind in _POSITIONAL for p in params))
    for num in nums:
        if not -call.count <= num < known:
            raise ConfigError(
                f"resident_argnums={nums}: {num} is out of range: this call of {_where(fun)} "
                f"passes {call.count} positional arguments"
            )


def resident_leaves(fun: Callable[..., Any], call: Call, options: JitOptions) -> tuple[int, ...]:
    """The flat input indices of one call's resident arguments' leaves, whether each is passed
    by position or by keyword."""
    nums, names = options.resident_argnums, options.resident_argnames
    if not nums and not names:
        return ()
    _check_call(fun, call, nums)
    positions, named = chosen_parameters(fun, call.count, nums, names)
    flat = [i for p, leaves in leaf_ranges(call) if p in positions for i in leaves]
    flat += [i for n, leaves in keyword_ranges(call) if n in named for i in leaves]
    return tuple(sorted(flat))
