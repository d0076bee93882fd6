"""Unrolling counted loops: scans and fori_loops with static bounds become copies of their body
that evaluate exactly as jax.jit does; other loops stay loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowering
from lowering.loops import MAX_TRIPS, counted_trips


def _ops(graph: lowering.Graph) -> list[str]:
    return [op.name for op in graph.ops]


def _check(fun, *args) -> lowering.Graph:
    graph = lowering.lower(fun, *args)
    unrolled = lowering.unroll_loops(graph)
    lowering.verify(unrolled)
    want = jax.jit(fun)(*args)
    got = lowering.evaluate(unrolled, *args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    return unrolled


def test_a_scan_becomes_its_body_repeated() -> None:
    def cumulative(xs):
        return jax.lax.scan(lambda c, x: (c + x, c * x), jnp.zeros(3), xs)

    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = lowering.lower(cumulative, xs)
    assert "while" in _ops(graph)
    unrolled = _check(cumulative, xs)
    assert "while" not in _ops(unrolled)


def test_a_fori_loop_with_a_reduction_inside() -> None:
    """The body's reduce has a region: every copy defines values of its own."""

    def norms(x):
        return jax.lax.fori_loop(0, 5, lambda i, v: v + jnp.sum(v**2) * 1e-3 + i, x)

    unrolled = _check(norms, np.ones(4, np.float32))
    assert _ops(unrolled).count("reduce") == 5


def test_a_scanned_gradient() -> None:
    def loss(w, xs):
        def body(c, x):
            with jax.named_scope("layer0"):
                return c + jnp.tanh(x @ w).sum(), None

        return jax.lax.scan(body, 0.0, xs)[0]

    w = np.full((4, 4), 0.1, np.float32)
    xs = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 2, 4)
    unrolled = _check(jax.value_and_grad(loss), w, xs)
    # Scopes inside the body keep the loop's path in front, transposes included.
    scopes = [op.loc.scope for op in unrolled.ops if "layer0" in op.loc.scope]
    assert any(s.startswith("jit(") and "/while/body/layer0/" in s for s in scopes)
    assert any("transpose(" in s for s in scopes)


def test_loops_that_are_not_counted_stay_loops() -> None:
    def until_big(x):
        return jax.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: v * 2.0, x)

    graph = lowering.lower(until_big, np.ones(3, np.float32))
    (loop,) = [op for op in graph.ops if op.name == "while"]
    assert counted_trips(loop, lowering.producers(graph)) is None
    assert _ops(lowering.unroll_loops(graph)) == _ops(graph)


@pytest.mark.parametrize("trips", [MAX_TRIPS, MAX_TRIPS + 1])
def test_long_loops_stay_loops(trips: int) -> None:
    def counting(x):
        return jax.lax.fori_loop(0, trips, lambda i, v: v + 1.0, x)

    graph = lowering.lower(counting, np.zeros(2, np.float32))
    (loop,) = [op for op in graph.ops if op.name == "while"]
    assert counted_trips(loop, lowering.producers(graph)) == trips
    unrolled = lowering.unroll_loops(graph)
    assert ("while" in _ops(unrolled)) == (trips > MAX_TRIPS)
