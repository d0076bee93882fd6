"""Loops partitioned as loops: a scan, an RNN, a gradient accumulation on a mesh keep their
`while`, its body split like any program, the carried values' shardings found as a fixed point
(an accumulator that starts at zero stays a partial sum across the trips, reduced once after
the loop), at any trip count; the values are `jax.jit`'s."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import ipujax
from lowering import Op
from tests.helpers import assert_trees_close, target

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def _ops(ops: tuple[Op, ...], depth: int = 0) -> Iterator[tuple[int, Op]]:
    """Every op of a per-IPU program with how many loops deep it sits."""
    for op in ops:
        yield depth, op
        for region in op.regions:
            yield from _ops(region.ops, depth + 1)


def _collectives(compiled: ipujax.Compiled) -> list[tuple[int, Op]]:
    assert compiled.partitioned is not None
    return [(d, op) for d, op in _ops(compiled.partitioned.graph.ops) if op.name in COLLECTIVES]


def _strict(jitted: ipujax.Jitted, *args) -> ipujax.Compiled:
    """Compiled with every ReplicationWarning an error: nothing may be gathered whole."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.ReplicationWarning)
        warnings.simplefilter("ignore", ipujax.HostBoundWarning)
        return jitted.lower(*args).compile()


# ---- an LSTM over 256 steps, its batch split over 4 IPUs -----------------------------------

T, B, D, H = 256, 128, 128, 256


def _lstm(params: tuple[jax.Array, ...], xs: jax.Array) -> jax.Array:
    wx, wh, b = params

    def cell(carry, x):
        h, c = carry
        i, f, g, o = jnp.split(x @ wx + h @ wh + b, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    start = jnp.zeros((xs.shape[1], H), xs.dtype)
    _, hs = jax.lax.scan(cell, (start, start), xs)
    return hs.mean(0)


def _lstm_args() -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    rng = np.random.default_rng(0)
    params = (
        (rng.normal(size=(D, 4 * H)) / np.sqrt(D)).astype(np.float32),
        (rng.normal(size=(H, 4 * H)) / np.sqrt(H)).astype(np.float32),
        np.zeros(4 * H, np.float32),
    )
    return params, rng.normal(size=(T, B, D)).astype(np.float32)


@pytest.fixture(scope="module")
def lstm() -> dict[str, ipujax.CostReport]:
    params, xs = _lstm_args()
    reports = {}
    for ipus in (1, 4):
        mesh = ipujax.make_mesh((ipus,), ("dp",))
        jitted = ipujax.jit(_lstm, mesh=mesh, in_shardings=(None, P(None, "dp")))
        compiled = _strict(jitted, params, xs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ipujax.HostBoundWarning)
            assert_trees_close(compiled(params, xs), jax.jit(_lstm)(params, xs), rtol=1e-4)
        reports[ipus] = compiled.cost_report()
    return reports


def test_an_lstm_split_over_its_batch_does_a_quarter_of_the_work_on_each_ipu(lstm) -> None:
    """Each IPU runs 256 trips on its 32 sequences: a quarter of the matmuls' FLOPs."""
    matmuls = 2 * T * B * (D + H) * 4 * H  # the gates' two matmuls, every step
    assert lstm[1].flops >= matmuls
    assert lstm[4].flops <= 0.3 * lstm[1].flops
    assert lstm[4].flops >= matmuls / 4


def test_an_lstm_split_over_its_batch_costs_less_than_on_one_ipu(lstm) -> None:
    assert lstm[4].seconds <= 0.8 * lstm[1].seconds


# ---- gradients accumulated over micro-batches, reduced once -----------------------------------


def _loss(w: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.mean(jnp.tanh(x @ w["a"]) @ w["b"])


def _accumulated(w: dict[str, jax.Array], xs: jax.Array) -> dict[str, jax.Array]:
    def micro_batch(total, x):
        return jax.tree.map(jnp.add, total, jax.grad(_loss)(w, x)), None

    total, _ = jax.lax.scan(micro_batch, jax.tree.map(jnp.zeros_like, w), xs)
    return jax.tree.map(lambda p, g: p - 0.1 * g, w, total)


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": (rng.normal(size=(32, 32)) / 6).astype(np.float32),
        "b": (rng.normal(size=(32, 8)) / 6).astype(np.float32),
    }


@pytest.mark.parametrize("micro_batches", [3, 200])
def test_accumulated_gradients_are_reduced_once_after_the_loop(micro_batches: int) -> None:
    """Each IPU sums its micro-batches' partial gradients in the loop's carried accumulators;
    one AllReduce per gradient follows the loop, none runs inside it, at any trip count."""
    rng = np.random.default_rng(1)
    w, xs = _weights(rng), rng.normal(size=(micro_batches, 16, 32)).astype(np.float32)
    mesh = ipujax.make_mesh((4,), ("dp",), target=target(64))
    compiled = _strict(
        ipujax.jit(_accumulated, mesh=mesh, in_shardings=(None, P(None, "dp"))), w, xs
    )
    assert_trees_close(compiled(w, xs), jax.jit(_accumulated)(w, xs), rtol=1e-4, atol=1e-6)
    big = [(d, op) for d, op in _collectives(compiled) if op.operands[0].size > 1]
    assert sorted(op.operands[0].shape for _, op in big) == [(32, 8), (32, 32)]
    assert all(d == 0 for d, _ in big)
    (loop,) = [op for d, op in _ops(compiled.partitioned.graph.ops) if op.name == "while"]
    assert (micro_batches, 4, 32) in [v.shape for v in loop.operands]  # its quarter of each


def test_the_micro_batches_stream_from_the_host_one_per_trip() -> None:
    """The stacked micro-batches are read a slice per trip: they are never on chip whole, so
    200 micro-batches hold the always-live bytes that 2 do, though 200 would fill the tiles."""
    rng = np.random.default_rng(2)
    w = _weights(rng)
    held, peaks = [], []
    for micro_batches in (2, 200):
        xs = rng.normal(size=(micro_batches, 16, 32)).astype(np.float32)
        mesh = ipujax.make_mesh((4,), ("dp",), target=target(64))
        jitted = ipujax.jit(_accumulated, mesh=mesh, in_shardings=(None, P(None, "dp")))
        report = _strict(jitted, w, xs).cost_report()
        held.append(report.always_live.sum())
        peaks.append(report.peak_tile_bytes)
    assert held[0] == held[1]
    share = 200 * 4 * 32 * 4 / 64  # each IPU's share of the 200 micro-batches, per tile
    assert peaks[1] < peaks[0] + share / 4


# ---- a scan over layers: its gradient's loop keeps the weights' gradients pending ------------


def _layers(ws: jax.Array, x: jax.Array) -> jax.Array:
    y, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return jnp.mean(y**2)


def test_a_scan_gradient_on_dp_reduces_the_stacked_gradients_once() -> None:
    rng = np.random.default_rng(3)
    ws = (rng.normal(size=(32, 16, 16)) / 4).astype(np.float32)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    mesh = ipujax.make_mesh((4,), ("dp",), target=target(64))
    step = jax.grad(_layers)
    compiled = _strict(ipujax.jit(step, mesh=mesh, in_shardings=(None, P("dp"))), ws, x)
    assert_trees_close(compiled(ws, x), jax.jit(step)(ws, x), rtol=1e-4, atol=1e-6)
    shapes = [(d, op.operands[0].shape) for d, op in _collectives(compiled)]
    assert (0, (32, 16, 16)) in shapes
    assert not [s for d, s in shapes if d > 0 and len(s) > 1]


# ---- the fixed point: any mix of accumulators and other carried values ----------------------


@settings(max_examples=12, deadline=None)
@given(
    starts=st.lists(st.sampled_from(["zeros", "ones", "x"]), min_size=1, max_size=3),
    trips=st.integers(1, 5),
)
def test_carried_values_of_any_start_give_jax_jit_values(starts: list[str], trips: int) -> None:
    """Accumulators that start at zero stay partial sums; those that start elsewhere, or that
    the body also reads, are finished where needed: the values never change."""
    rng = np.random.default_rng(4)
    w = (rng.normal(size=(8, 8)) / 3).astype(np.float32)
    xs = rng.normal(size=(trips, 8, 8)).astype(np.float32)

    def fun(w, xs):
        begin = {"zeros": jnp.zeros((8, 8)), "ones": jnp.ones((8, 8)), "x": xs[0]}
        init = tuple(begin[s] for s in starts)

        def body(carry, x):
            g = x.T @ jnp.tanh(x @ w)  # a sum over the split batch rows: a partial sum
            out = tuple(c + g if i % 2 == 0 else c * 0.5 + g.sum() for i, c in enumerate(carry))
            return out, None

        return jax.lax.scan(body, init, xs)[0]

    mesh = ipujax.make_mesh((2,), ("dp",), target=target(16))
    compiled = _strict(ipujax.jit(fun, mesh=mesh, in_shardings=(None, P(None, "dp"))), w, xs)
    assert_trees_close(compiled(w, xs), jax.jit(fun)(w, xs), rtol=1e-4, atol=1e-5)
