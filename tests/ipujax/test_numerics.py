"""`ipujax.jit(numerics="ipu")`: float16 results of the ops an IPU rounds stochastically are
rounded so, from their float32 value, with bits from `ipujax.numerics_key`; `"exact"` (the
default) is jax.jit's numbers bit for bit. The rounding is unbiased (a hypothesis property),
reproducible from its key, touches only the named ops' float16 results, never changes a cost,
and keeps an fp16 accumulation moving where round to nearest stalls it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax
from ipujax.runtime.stochastic import round_to_float16

F16 = jnp.float16
SAMPLES = 4096  # roundings of one value per call: its copies, each with bits of its own


def _neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float16 values either side of float32 `x` (equal when float16 holds x)."""
    near = x.astype(np.float16)
    up = np.nextafter(near, np.float16(np.inf))
    down = np.nextafter(near, np.float16(-np.inf))
    above = near.astype(np.float32) >= x
    low = np.where(above & (near.astype(np.float32) != x), down, near)
    high = np.where(~above, up, near)
    return low, high


def _mixed(x: jax.Array, y: jax.Array, n: jax.Array, z: jax.Array) -> tuple[jax.Array, ...]:
    """Named ops with float16 results (add, multiply, a matmul, a cast down), float16 ops not
    named (max, exp, negate) of a float16 argument, float32 and integer work."""
    h = x.astype(F16)  # a cast down: rounds
    named = (h * y.astype(F16) + h, h @ h.T)
    unnamed = (jnp.maximum(z, 0), -z, jnp.exp(z))
    return (*named, *unnamed, x * y + 1.0, jnp.exp(x), n * 3 + 1)


def _args() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 32)).astype(np.float32)
    y = rng.normal(size=(16, 32)).astype(np.float32)
    n = np.arange(16 * 32, dtype=np.int32).reshape(16, 32)
    return x, y, n, y.astype(np.float16)


# ---- numerics="exact" is jax.jit's --------------------------------------------------------


@pytest.mark.parametrize("numerics", [None, "exact"])
def test_exact_numerics_are_jax_jit_bit_for_bit(numerics: str | None) -> None:
    kwargs = {} if numerics is None else {"numerics": numerics}
    ours = ipujax.jit(_mixed, mesh=mesh(), **kwargs)(*_args())
    for a, b in zip(ours, jax.jit(_mixed)(*_args()), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- unbiased -----------------------------------------------------------------------------


@given(st.floats(-60000.0, 60000.0, width=32), st.integers(0, 2**32 - 1))
def test_rounding_is_unbiased_and_lands_either_side(value: float, seed: int) -> None:
    """The mean of SAMPLES stochastic roundings of one float32 value lies within 5 standard
    errors of it: each rounding is its lower or upper float16 neighbour, the upper with chance
    p = (x - low) / gap, so their mean has standard error gap * sqrt(p (1 - p) / SAMPLES) <=
    gap / 128 for SAMPLES = 4096, and 5 of those are 0.04 gaps (plus 2^-24 of p's own rounding)."""
    x = np.full(SAMPLES, value, np.float32)
    bits = jax.random.bits(jax.random.key(seed), (SAMPLES,), jnp.uint32)
    out = np.asarray(jax.jit(round_to_float16)(x, bits)).astype(np.float64)
    low, high = (v.astype(np.float64) for v in _neighbours(x[:1]))
    assert np.all((out == low) | (out == high))
    gap = float(high[0] - low[0])
    assert abs(out.mean() - value) <= 0.04 * gap + 1e-7 * abs(value)


_CAST = ipujax.jit(lambda v: v.astype(F16), mesh=mesh(), numerics="ipu")


@given(st.floats(-1000.0, 1000.0, width=32))
def test_a_compiled_cast_down_is_unbiased(value: float) -> None:
    """The same through ipujax.jit: the cast of SAMPLES copies of a value, each its own bits."""
    x = np.full(SAMPLES, value, np.float32)
    with ipujax.numerics_key(jax.random.key(7)):
        out = np.asarray(_CAST(x)).astype(np.float64)
    low, high = (v.astype(np.float64) for v in _neighbours(x[:1]))
    assert np.all((out == low) | (out == high))
    assert abs(out.mean() - value) <= 0.04 * float(high[0] - low[0]) + 1e-7 * abs(value)


# ---- reproducible, and only the named ops' float16 results --------------------------------


def test_the_same_key_gives_the_same_bits_and_another_key_others() -> None:
    step = ipujax.jit(_mixed, mesh=mesh(), numerics="ipu")
    with ipujax.numerics_key(jax.random.key(0)):
        first = step(*_args())
        again = step(*_args())
    with ipujax.numerics_key(jax.random.key(1)):
        other = step(*_args())
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(first[0]), np.asarray(other[0]))


def test_only_float16_results_of_the_named_ops_change() -> None:
    """The named ops' float16 results differ from round to nearest (by a spacing or a few,
    their operands rounded too); every other output is jax.jit's exactly."""
    with ipujax.numerics_key(jax.random.key(3)):
        ours = ipujax.jit(_mixed, mesh=mesh(), numerics="ipu")(*_args())
    exact = jax.jit(_mixed)(*_args())
    for a, b in zip(ours[2:], exact[2:], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(ours[:2], exact[:2], strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert not np.array_equal(a, b)
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)


def test_a_matmul_rounds_its_float32_sum_once() -> None:
    """A float16 matmul's result is a neighbour of the float32 sum of its float16 operands'
    products (the AMP accumulates in float32), not of a float16 sum."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(8, 64)).astype(np.float16)
    b = rng.normal(size=(64, 8)).astype(np.float16)
    with ipujax.numerics_key(jax.random.key(5)):
        got = np.asarray(ipujax.jit(jnp.matmul, mesh=mesh(), numerics="ipu")(a, b))
    exact = a.astype(np.float32) @ b.astype(np.float32)
    low, high = _neighbours(exact)
    assert np.all((got == low) | (got == high))


# ---- round to nearest stalls an accumulation, stochastic rounding does not -----------------


def _adds(total: jax.Array, step: jax.Array) -> jax.Array:
    for _ in range(50):  # 50 adds, each rounded with bits of its own
        total = total + step
    return total


def test_round_to_nearest_stalls_an_fp16_sum_and_stochastic_rounding_does_not() -> None:
    """Adding 1e-4 to a float16 total 4,000 times: from 0.25 the float16 spacing is 2^-12 =
    2.44e-4, so 0.25 + 1e-4 rounds back to 0.25 and round to nearest stalls there (Graphcore's
    half-precision tutorial shows the same). Rounded stochastically each add moves up a
    spacing with chance 1e-4 / 2.44e-4, so the total's mean follows 4,000 x 1e-4 = 0.4; over 64
    totals, within 0.02 of it (each total's standard deviation is about 0.01)."""
    exact = jax.jit(_adds)
    stochastic = ipujax.jit(_adds, mesh=mesh(), numerics="ipu")
    step = np.full(64, 1e-4, np.float16)
    nearest = ours = np.zeros(64, np.float16)
    for call in range(80):
        nearest = exact(nearest, step)
        with ipujax.numerics_key(jax.random.fold_in(jax.random.key(0), call)):
            ours = stochastic(ours, step)
    assert np.all(np.asarray(nearest) == np.float16(0.25))
    assert abs(float(np.asarray(ours, np.float64).mean()) - 0.4) < 0.02


# ---- costs, the report, and mistakes ------------------------------------------------------


def test_costs_are_the_same_and_the_report_says_which_numerics() -> None:
    args = _args()
    exact = ipujax.jit(_mixed, mesh=mesh()).lower(*args).compile().cost_report()
    ours = ipujax.jit(_mixed, mesh=mesh(), numerics="ipu").lower(*args).compile().cost_report()
    assert exact.numerics == "exact" and ours.numerics == "ipu"
    assert dataclasses.replace(ours, numerics="exact") == exact
    assert "numerics        ipu" in ours.summary()
    assert ipujax.CostReport.from_json(ours.to_json()).numerics == "ipu"


def test_a_call_without_a_key_and_a_bad_setting_are_config_errors() -> None:
    step = ipujax.jit(_mixed, mesh=mesh(), numerics="ipu")
    with pytest.raises(ipujax.ConfigError, match="numerics_key"):
        step(*_args())
    with pytest.raises(ipujax.ConfigError, match=r"'exact'.*'ipu'"):
        ipujax.jit(_mixed, numerics="stochastic")
    with pytest.raises(ipujax.ConfigError, match="jax key"), ipujax.numerics_key(3):
        pass


def test_ops_in_a_loop_body_keep_round_to_nearest_and_the_report_says_so() -> None:
    def loop(total: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, 200, lambda i, t: t + jnp.float16(1e-4), total)

    compiled = ipujax.jit(loop, mesh=mesh(), numerics="ipu").lower(np.zeros(4, F16)).compile()
    assert any("round to nearest" in line for line in compiled.cost_report().caveats)


def test_a_mesh_rounds_each_ipus_values_and_agrees_with_its_neighbours() -> None:
    """On two IPUs (the batch split over them) each float16 result is still a neighbour of
    its float32 value."""
    two = ipujax.make_mesh((2,), ("dp",), target=mesh().target)
    x, y, *_ = _args()
    fun = ipujax.jit(
        lambda a, b: (a * b).astype(F16), mesh=two, in_shardings=(P("dp"), None), numerics="ipu"
    )
    with ipujax.numerics_key(jax.random.key(2)):
        got = np.asarray(fun(x, y))
    low, high = _neighbours(x * y)
    assert np.all((got == low) | (got == high))
