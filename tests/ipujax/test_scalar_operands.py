"""The runtime hands elementwise ops broadcast scalars as scalars (`runtime/scalar_operands`):
every op it does this for takes a scalar on either side with the broadcast's result, programs
agree with jax.jit, and broadcasts still read elsewhere stay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, compile_for, target
from jax import lax
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.runtime.scalar_operands import SCALAR_OPERAND_OPS, pass_scalars
from lowering import EVAL_RULES
from partitioner import Program

# Operands each op is defined on (positive where a domain needs it), and its attributes.
_INTS = (np.arange(1, 7, dtype=np.int32).reshape(2, 3), np.int32(2))
_FLOATS = (np.linspace(1.5, 3.0, 6, dtype=np.float32).reshape(2, 3), np.float32(1.25))
_OPERANDS = {
    name: _INTS for name in ("and", "or", "xor", "shift_left", "shift_right_arithmetic")
} | {"shift_right_logical": _INTS, "polygamma": (_FLOATS[0].round(), np.float32(1.0))}
_ATTRS = {"compare": {"direction": "LT", "compare_type": "FLOAT"}}


@pytest.mark.parametrize("name", sorted(SCALAR_OPERAND_OPS))
def test_each_op_takes_a_scalar_on_either_side(name: str) -> None:
    full, scalar = _OPERANDS.get(name, _FLOATS)
    attrs = _ATTRS.get(name, {})
    rule = EVAL_RULES[name]
    broadcast = np.broadcast_to(scalar, full.shape)
    for left, right, wide in ((full, scalar, broadcast), (scalar, full, broadcast)):
        got = rule(left, right, **attrs)[0]
        expected = rule(*((full, wide) if left is full else (wide, full)), **attrs)[0]
        assert np.shape(got) == full.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def _affine(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    y = jnp.tanh(x @ w) * 2.0 + 1.0
    return jnp.maximum(y, 0.5) / 3.0, jnp.where(y > 1.5, y, 0.0).sum()


def test_values_equal_jax_jit_on_one_and_four_ipus() -> None:
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)
    expected = jax.jit(_affine)(x, w)
    assert_trees_close(compile_for(_affine, x, w)(x, w), expected)
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"), target=target(16))
    spread = ipujax.jit(_affine, mesh=mesh, in_shardings=(P("dp"), P(None, "tp")))
    assert_trees_close(spread(x, w), expected)


def test_scalar_broadcasts_go_and_others_stay() -> None:
    """The scalar broadcasts read only by binary ops go; a broadcast of a vector stays."""

    def fun(x: jax.Array, b: jax.Array) -> jax.Array:
        return (x * 2.0 + 1.0) - b[None, :]

    x = np.ones((4, 3), np.float32)
    b = np.arange(3, dtype=np.float32)
    program = compile_for(fun, x, b).program
    passed = pass_scalars(program)

    def broadcasts(p: Program) -> list[tuple[int, ...]]:
        return [t.op.operands[0].shape for t in p.tasks if t.op.name == "broadcast_in_dim"]

    assert () in broadcasts(program)
    assert () not in broadcasts(passed)
    assert (3,) in broadcasts(passed) or (1, 3) in broadcasts(passed)
    assert len(passed.tasks) < len(program.tasks)


def test_a_broadcast_scalar_that_is_an_output_stays() -> None:
    def fun(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        ones = jnp.full((4, 3), 2.0, np.float32)
        return x * ones, ones

    x = np.ones((4, 3), np.float32)
    compiled = compile_for(fun, x)
    assert_trees_close(compiled(x), jax.jit(fun)(x))
    passed = pass_scalars(compiled.program)
    produced = {v for t in passed.tasks for v in t.op.results} | set(passed.inputs)
    assert all(v in produced for v in passed.outputs)
    assert all(v in produced for t in passed.tasks for v in t.inputs)


def test_an_op_of_scalars_alone_keeps_its_broadcasts() -> None:
    def fun(s: jax.Array) -> jax.Array:
        return lax.broadcast(s, (2, 3)) + lax.broadcast(s * 2, (2, 3))

    s = np.float32(1.5)
    compiled = compile_for(fun, s)
    assert_trees_close(compiled(s), jax.jit(fun)(s))
