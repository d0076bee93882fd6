"""The IPU's own numerics (`ipujax.jit(numerics="ipu")`): float16 results rounded stochastically.

With stochastic rounding enabled (Poplar's floating-point behaviour `esr`, PopTorch's
`enableStochasticRounding`), an IPU rounds a float16 result up or down to one of the two float16
values either side of its higher-precision value, with probability in proportion to how near
it lies: the rounding is unbiased. The runtime pass `round_stochastically` rewrites each task
whose op rounds so (`STOCHASTIC_OPS`, docs/target.md "Stochastic rounding" says which and why)
to compute the op in float32 and round that to float16 with random bits; a fusion's members
each round as they would alone. Everything else computes what `jax.jit` computes.

The bits come from the key the call passes, as its last argument, to the jitted function
`keyed` wraps: each op folds in its result's id (so two ops never share bits and the same key
gives the same bits), and on a mesh each IPU folds in its indices along the mesh axes its
result differs over, so a value every IPU holds alike (a replicated weight's update) rounds
alike on all of them, as Poplar's identical seeds across replicas keep weights in step. The key
is a traced argument: a new key runs the same executable, never a new compile.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering import FUSIONS, Graph, Op, Value, apply_rule, run_op
from partitioner import Program, Task

Array = Any
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

# The key's data while the keyed function traces (kernels read it as they are traced).
_KEY: contextvars.ContextVar[Array | None] = contextvars.ContextVar("ipujax_sr_key", default=None)


# ---- which ops round, and their value before rounding ------------------------------------------


def _arithmetic_f32(op: Op, operands: Sequence[Array]) -> Array:
    """The vector unit's float arithmetic: the op on the operands widened to float32 (exact
    for a product or sum of two float16 values but for far-apart exponents)."""
    return apply_rule(op, [_widened(x) for x in operands], op.attrs, {})[0]


def _contraction_f32(op: Op, operands: Sequence[Array]) -> Array:
    """The AMP's float32 partial sums, before they are cast down to the result's type."""
    attrs = {**op.attrs, "preferred_element_type": F32}
    return apply_rule(op, [_widened(x) for x in operands], attrs, {})[0]


def _convert_f32(op: Op, operands: Sequence[Array]) -> Array:
    """A float32 value converted to float16: the value itself."""
    return _widened(operands[0])


def _widened(x: Array) -> Array:
    return lax.convert_element_type(x, F32)


# Ops whose float16 results an IPU with stochastic rounding rounds stochastically, and the
# float32 value each rounds from (docs/target.md, "Stochastic rounding").
STOCHASTIC_OPS: dict[str, Callable[[Op, Sequence[Array]], Array]] = {
    "add": _arithmetic_f32,
    "subtract": _arithmetic_f32,
    "multiply": _arithmetic_f32,
    "divide": _arithmetic_f32,
    "dot_general": _contraction_f32,
    "convolution": _contraction_f32,
    "convert": _convert_f32,
}


def rounds_stochastically(op: Op) -> bool:
    """Whether the op's result is a float16 an IPU rounds stochastically: one of
    `STOCHASTIC_OPS`, and a convert only from a wider float (others are exact or integer)."""
    if op.name not in STOCHASTIC_OPS or len(op.results) != 1 or op.results[0].dtype != F16:
        return False
    if op.name == "convert":
        source = np.dtype(op.operands[0].dtype)
        return source.kind == "f" and source.itemsize > F16.itemsize
    return True


def touches(op: Op) -> bool:
    """Whether `round_stochastically` changes the op's task: it rounds, or a member does."""
    if op.name in FUSIONS:
        return any(rounds_stochastically(m) for m in op.regions[0].ops)
    return rounds_stochastically(op)


# ---- the rounding ------------------------------------------------------------------------------


def round_to_float16(x: Array, bits: Array) -> Array:
    """float32 `x` rounded to one of the two float16 values either side of it, the farther
    one with probability |x - nearest| / (their gap), taken when the top 24 of the uint32
    `bits` (as a fraction of 2^24) fall below it: unbiased, E[result] = x. Values float16
    holds exactly, infinities, NaNs and values past float16's largest keep round to nearest.
    The differences are exact in float32 (Sterbenz: x and its nearest float16 are within a
    factor of two, or the nearest is zero)."""
    x = _widened(x)
    nearest = lax.convert_element_type(x, F16)
    near32 = _widened(nearest)
    toward = jnp.where(near32 < x, jnp.inf, -jnp.inf).astype(F16)
    other = jnp.nextafter(nearest, toward)
    chance = jnp.abs(x - near32) / jnp.abs(_widened(other) - near32)
    uniform = _widened(lax.shift_right_logical(bits, jnp.uint32(8))) * np.float32(2.0**-24)
    return jnp.where(uniform < chance, other, nearest)


def op_bits(op: Op, shape: tuple[int, ...], axes: Sequence[str]) -> Array:
    """uint32 random bits for the op's result: the call's key, folded with the result's id and
    the IPU's index along each of `axes` (the mesh axes the result differs over)."""
    data = _KEY.get()
    if data is None:
        raise RuntimeError("a stochastic kernel ran outside `keyed`; the runtime passes the key")
    key = jax.random.wrap_key_data(data, impl="threefry2x32")
    key = jax.random.fold_in(key, op.results[0].id)
    for axis in axes:
        key = jax.random.fold_in(key, lax.axis_index(axis))
    return jax.random.bits(key, shape, jnp.uint32)


def rounded(op: Op, operands: Sequence[Array], axes: Sequence[str]) -> Array:
    """The op's float16 result rounded stochastically from its float32 value."""
    value = STOCHASTIC_OPS[op.name](op, operands)
    return round_to_float16(value, op_bits(op, jnp.shape(value), axes))


def keyed(run: Callable[..., tuple]) -> Callable[..., tuple]:
    """`run` taking the key's uint32 data as one more, last, argument, which the stochastic
    kernels read while `run` traces."""

    def with_key(*flat: Array) -> tuple:
        token = _KEY.set(flat[-1])
        try:
            return run(*flat[:-1])
        finally:
            _KEY.reset(token)

    return with_key


# ---- the runtime pass --------------------------------------------------------------------------


def round_stochastically(
    program: Program, varying: Mapping[Value, frozenset[str]] | None, axes: Sequence[str]
) -> Program:
    """`program` with each task `touches` names computing its float16 results stochastically
    rounded; the same program when none is. `varying`: the mesh axes each value differs over
    (None on one IPU); `axes`: the mesh's axes, in order."""

    def differs(value: Value) -> tuple[str, ...]:
        over = varying.get(value, frozenset()) if varying is not None else frozenset()
        return tuple(a for a in axes if a in over)

    tasks = tuple(
        dataclasses.replace(t, kernel=_kernel(t, differs)) if touches(t.op) else t
        for t in program.tasks
    )
    if all(a is b for a, b in zip(tasks, program.tasks, strict=True)):
        return program
    return dataclasses.replace(program, tasks=tasks)


def _kernel(task: Task, differs: Callable[[Value], tuple[str, ...]]) -> Callable[..., tuple]:
    op = task.op
    if op.name in FUSIONS:
        region = op.regions[0]
        over = differs(op.results[0])  # members' values differ where the fusion's result does

        def fused(*arrays: Array) -> tuple:
            return _interpret(region, arrays, over)

        return fused

    def kernel(*arrays: Array) -> tuple:
        return (rounded(op, arrays[: len(op.operands)], differs(op.results[0])),)

    return kernel


def _interpret(region: Graph, inputs: Sequence[Array], axes: Sequence[str]) -> tuple:
    """A fusion's members in order, those that round stochastically rounded, the rest as
    `jax.lax` computes them (a fused reduction's reduce too)."""
    env: dict[Value, Array] = dict(zip(region.inputs, inputs, strict=True))
    for member in region.ops:
        operands = [env[v] for v in member.operands]
        if rounds_stochastically(member):
            env[member.results[0]] = rounded(member, operands, axes)
        else:
            env.update(zip(member.results, run_op(member, operands, env), strict=True))
    return tuple(env[v] for v in region.outputs)
