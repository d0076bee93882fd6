"""Kernels on tensors in logical order: the parts of a tile split that can change a value are
kept (a reduction's two stages over uneven runs, f32 matmul partials), and an all-reduce over
IPUs held on one device (gathered and added pairwise) equals jax's collective. The staged
reductions run under `numerics="ipu"`; under "exact" the runtime reduces in one go
(`runtime/whole_sums`), as jax.jit does."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipujax
import lowering
from lowering import EVAL_RULES
from lowering.mesh_rules import DOT_SUM_MIN_ELEMENTS, local_mesh_axes

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 10_007)).astype(np.float32)  # a prime depth: the last run is short

REDUCTIONS = {
    "sum": lambda x: x.sum(axis=1),
    "max": lambda x: x.max(),
    "argmax": lambda x: jnp.argmax(x, axis=1),  # a variadic reduce: values and indices
    "int sum over rows": lambda x: (x * 100).astype(jnp.int32).sum(axis=0),
    "sum over a middle axis": lambda x: x.reshape(3, 1, 10_007).sum(axis=(0, 2)),
}


def _staged(compiled: Any) -> list[int]:
    """How many supersteps each reduce runs in (2 or more: its depth is split over tiles and
    combined in stages)."""
    return [
        len(t.supersteps)
        for t in compiled.program.tasks
        if lowering.members(t.op)[-1].name == "reduce"  # alone, or ending a fusion
    ]


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the kernels
@pytest.mark.parametrize("numerics", ["exact", "ipu"])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_split_reductions_equal_jax_jit(name: str, numerics: str) -> None:
    fun = REDUCTIONS[name]
    # a Bow IPU: spare tiles split the depth
    compiled = ipujax.jit(fun, numerics=numerics).lower(X).compile()
    assert max(_staged(compiled)) >= 2 or name == "int sum over rows"
    expected = jax.jit(fun)(X)
    with ipujax.numerics_key(jax.random.key(0)):
        ours = compiled(X)
    if numerics == "exact" or np.issubdtype(np.asarray(expected).dtype, np.integer):
        np.testing.assert_array_equal(ours, expected)  # XLA's order of additions: jax.jit's
    else:
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-4)


def test_a_bf16_matmul_accumulates_in_f32() -> None:
    """PopLibs' partials are f32: 4,096 products of 129/128 sum exactly to 4,128 in f32, which
    bf16 holds. A bf16 running sum could not: past 256, its spacing is 2 and more."""
    x = jnp.full((1, 4096), 129 / 128, jnp.bfloat16)
    w = jnp.ones((4096, 1), jnp.bfloat16)
    ours = ipujax.jit(lambda x, w: x @ w)(x, w)
    assert ours.dtype == jnp.bfloat16
    assert float(ours[0, 0]) == 4128.0


REDUCE = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}


@pytest.mark.parametrize("reduction", list(REDUCE))
@pytest.mark.parametrize("axes", [("a",), ("b",), ("a", "b")])
@pytest.mark.parametrize("values", [7, DOT_SUM_MIN_ELEMENTS])  # added as slices, or a product
def test_a_gathered_all_reduce_equals_jax_collective(
    reduction: str, axes: tuple, values: int
) -> None:
    """Over axes held on one device, the rule gathers and combines; elsewhere it is jax's
    psum / pmax / pmin. Both give every IPU the reduction over the axes' IPUs."""
    x = jnp.asarray(RNG.standard_normal((3, 5, values)).astype(np.float32))  # IPUs a x b
    rule = EVAL_RULES["all_reduce"]

    def run(local: bool) -> jax.Array:
        def per_ipu(v: jax.Array) -> jax.Array:
            with local_mesh_axes(("a", "b") if local else ()):
                return rule(v, axes=axes, group_size=0, reduction=reduction)[0]

        return jax.jit(jax.vmap(jax.vmap(per_ipu, axis_name="b"), axis_name="a"))(x)

    dims = tuple("ab".index(a) for a in axes)
    expected = jnp.broadcast_to(REDUCE[reduction](x, axis=dims, keepdims=True), x.shape)
    np.testing.assert_allclose(run(True), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(run(False), expected, rtol=1e-6, atol=1e-6)


REDUCERS = {
    "sum": lambda x, axes: x.sum(axis=axes),
    "max": lambda x, axes: x.max(axis=axes),
    "min": lambda x, axes: x.min(axis=axes),
    "argmax": lambda x, axes: jnp.argmax(x.reshape(*x.shape[:1], -1), axis=-1),
}


@st.composite
def reductions(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...], str, int]:
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    axes = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    kind = draw(st.sampled_from(list(REDUCERS)))
    tiles = draw(st.sampled_from([4, 16, 64]))
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x, axes, kind, tiles


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the kernels
@given(reductions())
def test_reductions_split_any_way_equal_jax_jit(case: tuple) -> None:
    """Whatever the kept and reduced dims and however the tiles split them (uneven runs
    included), the staged reduction (`numerics="ipu"`: no float16 here to round) is jax.jit's
    to rounding; argmax exactly."""
    x, axes, kind, tiles = case
    fun = lambda x: REDUCERS[kind](x, axes)  # noqa: E731
    the_mesh = ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.bow().with_tiles(tiles))
    with ipujax.numerics_key(jax.random.key(0)):
        ours = ipujax.jit(fun, mesh=the_mesh, numerics="ipu")(x)
    expected = jax.jit(fun)(x)
    if kind == "argmax":
        np.testing.assert_array_equal(ours, expected)
    else:
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
