"""Differential fuzzing: random programs (elementwise, matmuls, reductions, reshapes and
transposes, softmax, concatenation, gather and scatter, control flow, convolutions, pooling,
batch norm, gradients) on random
meshes of 1 to 8 IPUs with random PartitionSpecs, uneven dims included, must give jax.jit's
values. The default hypothesis profile runs 25 cases in `make test`;
IPUJAX_HYPOTHESIS_PROFILE=long runs 2,000."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax

# Random programs put sorts, control flow and the like on split tensors: gathering them whole
# is the expected, correct answer here, not something to warn about.
pytestmark = pytest.mark.filterwarnings("ignore::ipujax.ReplicationWarning")

TARGET = ipujax.Target.bow().with_tiles(16)
MESHES = [
    ((1,), ("a",)),
    ((2,), ("a",)),
    ((4,), ("a",)),
    ((8,), ("a",)),
    ((2, 2), ("a", "b")),
    ((2, 4), ("a", "b")),
    ((4, 2), ("a", "b")),
]


KINDS = [
    "matmul", "matmul_sum", "softmax", "max", "transpose", "concat", "reshape", "grad",
    "gather", "scatter", "cond", "while", "scatter_rows", "embed_grad", "two_products",
    "conv", "conv_grad", "pool_grad", "batch_norm",
]  # fmt: skip


def _program(kind: str):
    """Programs of two [m, n] and [n, k] operands, each exercising a family of rules."""
    programs = {
        "matmul": lambda x, w: jnp.tanh(x @ w) + 1.0,
        "matmul_sum": lambda x, w: (x @ w).sum(axis=0),
        "softmax": lambda x, w: jax.nn.softmax(x @ w, axis=-1),
        "max": lambda x, w: jnp.max(x, axis=1) + jnp.min(w, axis=0).sum(),
        "transpose": lambda x, w: (x.T * 2.0).T @ (w.T @ w),
        "concat": lambda x, w: jnp.concatenate([x, x * 2.0], axis=1) @ jnp.concatenate([w, w]),
        "reshape": lambda x, w: (x.reshape(-1) * 3.0).reshape(x.shape) @ w,
        "grad": lambda x, w: jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w),
        "gather": lambda x, w: x[jnp.array([0, x.shape[0] - 1, 0])] @ w,
        "scatter": lambda x, w: x.at[jnp.array([0, x.shape[0] - 1])].add(1.0) @ w,
        "cond": lambda x, w: jax.lax.cond(x.sum() > 0, lambda: x @ w, lambda: -(x @ w)),
        "while": lambda x, w: jax.lax.fori_loop(0, 3, lambda i, v: jnp.tanh(v) * 1.5, x) @ w,
        # scatter-adds of split updates (partial sums), into a nonzero operand and into zeros
        "scatter_rows": lambda x, w: x.at[_rows(x)].add(jnp.sin(x)) @ w,
        "embed_grad": lambda x, w: jax.grad(lambda x: jnp.sum(jnp.tanh(x[_rows(x)] @ w)))(x),
        # a linear op of two partial sums
        "two_products": lambda x, w: x @ w - (jnp.cos(x) @ w),
        # images [m, n, 3, 1] (batch m) through a [3, 3, 1, k] kernel: channels k
        "conv": lambda x, w: jnp.tanh(_conv(_image(x), _kernel(w))).sum(axis=(1, 2)),
        "conv_grad": lambda x, w: jax.grad(
            lambda w: jnp.sum(jnp.tanh(_conv(_image(x), _kernel(w), 2)) ** 2)
        )(w),
        "pool_grad": lambda x, w: jax.grad(lambda x: jnp.sum(_pool(_image(x) * 1.5) ** 2))(x),
        "batch_norm": lambda x, w: _batch_norm(_conv(_image(x), _kernel(w))).sum(axis=(1, 2)),
    }
    return programs[kind]


def _image(x: jax.Array) -> jax.Array:
    """x [m, n] as m images of n x 3 pixels, one channel."""
    return (x[:, :, None] * jnp.array([1.0, -0.5, 0.25]))[..., None]


def _kernel(w: jax.Array) -> jax.Array:
    """A [3, 3, 1, k] kernel from w [n, k]."""
    return jnp.sin(jnp.arange(9.0)).reshape(3, 3, 1, 1) * w.mean(axis=0)


def _conv(x: jax.Array, k: jax.Array, stride: int = 1) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x, k, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _pool(x: jax.Array) -> jax.Array:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")


def _batch_norm(x: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=(0, 1, 2))
    return (x - mean) * jax.lax.rsqrt(jnp.mean(jnp.square(x - mean), axis=(0, 1, 2)) + 1e-3)


def _rows(x: jax.Array) -> jax.Array:
    """Row indices of x, shuffled: (5 i + 1) mod m, with repeats when 5 divides m."""
    return (jnp.arange(x.shape[0]) * 5 + 1) % x.shape[0]


def _spec(draw, dims: tuple[int, ...], sizes: dict[str, int]):
    """A spec that uses each mesh axis at most once, on a dim it divides (as jax requires of a
    user's spec; the partitioner's own splits of the uneven sizes still pad), or None."""
    if draw(st.booleans()):
        return None
    free = list(sizes)
    entries = []
    for dim in dims:
        fits = [a for a in free if dim % sizes[a] == 0]
        if fits and draw(st.booleans()):
            axis = fits[draw(st.integers(0, len(fits) - 1))]
            free.remove(axis)
            entries.append(axis)
        else:
            entries.append(None)
    return P(*entries)


@st.composite
def cases(draw):
    shape, names = draw(st.sampled_from(MESHES))
    m, n, k = (draw(st.integers(1, 9)) for _ in range(3))  # uneven sizes on purpose
    kind = draw(st.sampled_from(KINDS))
    sizes = dict(zip(names, shape, strict=True))
    w_dims = (n, n) if kind == "transpose" else (n, k)
    specs = (_spec(draw, (m, n), sizes), _spec(draw, w_dims, sizes))
    seed = draw(st.integers(0, 2**16))
    return shape, names, (m, n, k), kind, specs, seed


@settings(deadline=None)
@given(cases())
def test_random_programs_on_random_meshes_equal_jax_jit(case):
    shape, names, (m, n, k), kind, specs, seed = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (m, n)).astype(np.float32)
    w = rng.uniform(-2, 2, (n, k)).astype(np.float32)
    if kind == "transpose":
        w = rng.uniform(-2, 2, (n, n)).astype(np.float32)
    fun = _program(kind)
    mesh = ipujax.make_mesh(shape, names, target=TARGET)
    got = ipujax.jit(fun, mesh=mesh, in_shardings=specs)(x, w)
    want = jax.jit(fun)(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 9), st.sampled_from(MESHES[1:]))
def test_a_user_spec_that_does_not_divide_is_refused(rows, mesh_shape):
    shape, names = mesh_shape
    x = np.ones((rows, 3), np.float32)
    mesh = ipujax.make_mesh(shape, names, target=TARGET)
    jitted = ipujax.jit(jnp.tanh, mesh=mesh, in_shardings=(P(names[0]),))
    if rows % shape[0] == 0:
        np.testing.assert_array_equal(np.asarray(jitted(x)), np.tanh(x))
        return
    with pytest.raises(ipujax.ShardingError, match=rf"dimension 0 of shape \({rows}, 3\)"):
        jitted(x)
