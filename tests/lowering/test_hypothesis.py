"""Hypothesis-generated programs: random op recipes on random small arrays, checked against jit.

A recipe is a list of steps drawn with the current shape in view, so every step is valid; the
program closes over the recipe (and over the constant weights of its matmuls).
"""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracle import assert_matches_jit, uniform

# Only the settings hypothesis needs because jax compiles are slow; example counts come from the
# profile loaded in tests/conftest.py.
slow_ok = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

UNARY = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tanh": jnp.tanh,
    "abs": jnp.abs,
    "neg": jnp.negative,
    "sigmoid": jax.nn.sigmoid,
    "relu": jax.nn.relu,
    "exp_tanh": lambda x: jnp.exp(jnp.tanh(x)),
    "log1p_abs": lambda x: jnp.log1p(jnp.abs(x)),
    "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x) + 0.5),
}
BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "max": jnp.maximum,
    "min": jnp.minimum,
}
# Partners for a binary op: another view of the current value with the same shape.
PARTNERS = {
    "flip": lambda x: jnp.flip(x, 0),
    "roll": lambda x: jnp.roll(x, 1, -1),
    "cos": jnp.cos,
}
MAX_DIM = 8


def _step_options(shape):
    """Names of the steps that are valid for (and keep dims small at) `shape`."""
    rank = len(shape)
    options = ["unary", "binary", "matmul", "softmax"]
    if rank >= 2:
        options += ["reduce", "transpose"]
    if rank >= 1 and math.prod(shape) > 1:
        options.append("reshape")
    if rank >= 1 and shape[-1] * 2 <= MAX_DIM:
        options.append("concat")
    if any(d >= 2 for d in shape):
        options.append("slice")
    return options


@st.composite
def float_step(draw, shape):
    """One step for a value of `shape`: (description, function, new shape)."""
    kind = draw(st.sampled_from(_step_options(shape)))
    rank = len(shape)
    if kind == "unary":
        name = draw(st.sampled_from(sorted(UNARY)))
        return name, UNARY[name], shape
    if kind == "binary":
        name, partner = (
            draw(st.sampled_from(sorted(BINARY))),
            draw(st.sampled_from(sorted(PARTNERS))),
        )
        op, other = BINARY[name], PARTNERS[partner]
        return f"{name}({partner})", lambda x: op(x, other(x)), shape
    if kind == "matmul":
        n = draw(st.integers(1, MAX_DIM))
        w = uniform((shape[-1], n), seed=draw(st.integers(0, 99))) / np.float32(shape[-1])
        return f"matmul{w.shape}", lambda x: x @ w, (*shape[:-1], n)
    if kind == "softmax":
        return "softmax", lambda x: jax.nn.softmax(x, axis=-1), shape
    if kind == "reduce":
        axis = draw(st.integers(0, rank - 1))
        reducer = draw(st.sampled_from(["sum", "max"]))
        fn = (lambda x: jnp.sum(x, axis)) if reducer == "sum" else (lambda x: jnp.max(x, axis))
        return f"{reducer}(axis={axis})", fn, (*shape[:axis], *shape[axis + 1 :])
    if kind == "transpose":
        perm = tuple(draw(st.permutations(range(rank))))
        return f"transpose{perm}", lambda x: jnp.transpose(x, perm), tuple(shape[p] for p in perm)
    if kind == "reshape":
        size = math.prod(shape)
        lead = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
        new = (lead, size // lead) if lead * (size // lead) == size and lead > 1 else (size,)
        return f"reshape{new}", lambda x: x.reshape(new), new
    if kind == "concat":
        return (
            "concat",
            lambda x: jnp.concatenate([x, 2.0 * x], axis=-1),
            (
                *shape[:-1],
                2 * shape[-1],
            ),
        )
    axis = draw(st.sampled_from([i for i, d in enumerate(shape) if d >= 2]))
    stop = draw(st.integers(1, shape[axis] - 1))
    new = (*shape[:axis], stop, *shape[axis + 1 :])
    return (
        f"slice(axis={axis}, :{stop})",
        lambda x: jax.lax.slice_in_dim(x, 0, stop, axis=axis),
        new,
    )


def _apply(steps, x):
    for _, fn, _ in steps:
        x = fn(x)
    return x


@st.composite
def float_programs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    elements = st.floats(-3, 3, width=32, allow_nan=False, allow_infinity=False)
    x = draw(hnp.arrays(np.float32, shape, elements=elements))
    steps, current = [], shape
    for _ in range(draw(st.integers(3, 8))):
        step = draw(float_step(current))
        steps.append(step)
        current = step[2]
    return steps, x


@slow_ok
@given(float_programs())
def test_random_float_programs(program):
    steps, x = program

    def f(x):
        return _apply(steps, x)

    graph = assert_matches_jit(f, x)
    assert graph.outputs[0].shape == steps[-1][2], [s[0] for s in steps]


@slow_ok
@given(float_programs(), st.integers(0, 2))
def test_random_float_programs_with_grad(program, which):
    """The same recipes under jax.grad (of a bounded scalar), a second family of lowered ops."""
    steps, x = program
    heads = [jnp.sum, lambda y: jnp.mean(jnp.tanh(y)), lambda y: jnp.max(y)]
    assert_matches_jit(jax.grad(lambda x: heads[which](_apply(steps, x))), x)


INT_BINARY = {
    "add": jnp.add,
    "mul": jnp.multiply,
    "xor": jnp.bitwise_xor,
    "and": jnp.bitwise_and,
    "or": jnp.bitwise_or,
    "shl": lambda x, y: jax.lax.shift_left(x, y & 31),
    "sra": lambda x, y: jax.lax.shift_right_arithmetic(x, y & 31),
    "srl": lambda x, y: jax.lax.shift_right_logical(x, y),
    "select_gt": lambda x, y: jnp.where(x > y, x, y),
    "select_eq": lambda x, y: jnp.where(x == (y & 3), x - y, y),
    "max": jnp.maximum,
}
INT_REDUCE = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod}


@st.composite
def int_programs(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    x = draw(hnp.arrays(np.int32, shape))
    y = draw(hnp.arrays(np.int32, shape, elements=st.integers(-(2**31), 2**31 - 1)))
    names = draw(st.lists(st.sampled_from(sorted(INT_BINARY)), min_size=3, max_size=8))
    reducer = draw(st.sampled_from(sorted(INT_REDUCE)))
    axis = draw(st.integers(0, len(shape) - 1))
    return names, reducer, axis, x, y


@slow_ok
@given(int_programs())
def test_random_int_programs(program):
    names, reducer, axis, x, y = program

    def f(x, y):
        for i, name in enumerate(names):
            x = INT_BINARY[name](x, y if i % 2 else jnp.flip(y, -1))
            y = y ^ (x >> 3)
        return x, INT_REDUCE[reducer](x, axis), x < y, x.astype(jnp.uint8)

    assert_matches_jit(f, x, y)
