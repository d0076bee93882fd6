"""Control flow on tiles, derived by hand: a counted loop costs its trips times its body's
supersteps, its body's code is stored once, a loop of unknown trips is charged one trip and its
condition (and the test that ends it), a `case` its dearest branch; values equal `jax.jit`'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax
from lowering import unroll_loops
from partitioner import Options, build
from tests.helpers import assert_trees_close, mesh

D = 64


def _layers(x: jax.Array, ws: jax.Array) -> jax.Array:
    """A scan over stacked layers: x @ w, tanh, per layer."""
    y, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return y


def _args(layers: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, D)).astype(np.float32)
    ws = (rng.normal(size=(layers, D, D)) / 8).astype(np.float32)
    return x, ws


def _compiled(fun, *args) -> ipujax.Compiled:
    return ipujax.jit(fun, mesh=mesh(64)).lower(*args).compile()


def _loop_task(compiled: ipujax.Compiled):
    (task,) = [t for t in compiled.program.tasks if t.op.name == "while"]
    return task


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the loop
def test_a_scan_runs_on_tiles_and_equals_jax_jit() -> None:
    args = _args(4)
    compiled = _compiled(_layers, *args)
    assert_trees_close(compiled(*args), jax.jit(_layers)(*args))
    task = _loop_task(compiled)
    # The body's matmul is planned on the AMP, over many tiles, not run as one kernel.
    matmuls = [s for s in task.supersteps if s.op == "dot_general"]
    assert matmuls and max(s.tiles for s in matmuls) > 1


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the loop
@pytest.mark.parametrize("trips", [1, 3, 8])
def test_a_counted_loop_costs_its_trips_times_its_body(trips: int) -> None:
    one = _loop_task(_compiled(_layers, *_args(1)))
    many = _loop_task(_compiled(_layers, *_args(trips)))
    into = [s for s in one.supersteps if s.name == "while.carry in"]  # once, before the loop
    trip = one.supersteps[len(into) :]
    assert many.supersteps == (*into, *trip * trips)
    cycles = sum(s.cycles for s in into) + trips * sum(s.cycles for s in trip)
    assert sum(s.cycles for s in many.supersteps) == cycles
    # Repeating a body stores no more code: the steps are the same steps.
    assert len(many.regions) == 2  # condition and body, each a program of its own


@pytest.mark.filterwarnings("ignore::ipujax.HostBoundWarning")  # about the loop
def test_the_body_code_is_stored_once() -> None:
    # (From 2 trips up: one stacked layer is sliced out of another layout than several.)
    code = [_compiled(_layers, *_args(n)).memory.code for n in (2, 8)]
    np.testing.assert_array_equal(code[0], code[1])


def test_a_loop_costs_about_what_its_unrolled_copies_cost() -> None:
    """The loop keeps its carried values in its operands' layouts, where the unrolled copies
    take whatever each op makes: a few percent apart, never more than 10%."""
    args = _args(4)
    graph = ipujax.jit(_layers).lower(*args).graph
    on = mesh(64)

    def cycles(g) -> int:
        built = build(g, on, [None] * len(g.inputs), [None] * len(g.outputs), Options(verify=True))
        return sum(s.cycles for s in built.program.supersteps if s.kind != "host")

    looped, unrolled = cycles(graph), cycles(unroll_loops(graph))
    assert abs(looped - unrolled) <= 0.1 * unrolled


def test_the_body_tensors_count_while_the_loop_runs() -> None:
    """The body's own activations live on the tiles during the loop: the loop task holds
    at least one layer's [32, D] float32 result somewhere on the chip."""
    task = _loop_task(_compiled(_layers, *_args(2)))
    held = sum(t.tiles * t.bytes_per_tile for t in task.temporaries)
    assert held >= 32 * D * 4


def _until(x: jax.Array, limit: jax.Array) -> jax.Array:
    """A loop whose trips depend on a value: doubling until past `limit`."""
    return jax.lax.while_loop(lambda v: jnp.sum(v) < limit, lambda v: v * 2.0, x)


def test_a_loop_of_unknown_trips_is_charged_one_trip_and_its_condition() -> None:
    """One trip (its test, its body, the carried values brought back) and the test that ends
    it, until a run counts its trips (tests/ipujax/test_loop_trips.py)."""
    x, limit = np.ones((8, 8), np.float32), np.float32(1000.0)
    with pytest.warns(ipujax.LoopTripsWarning):
        compiled = _compiled(_until, x, limit)
    assert_trees_close(compiled(x, limit), jax.jit(_until)(x, limit))
    task = _loop_task(compiled)
    cond, body = task.regions
    back = tuple(s for s in task.supersteps if s.name == "while.carry")
    assert task.supersteps == cond.supersteps + body.supersteps + back + cond.supersteps


def _branches(i: jax.Array, x: jax.Array) -> jax.Array:
    cheap = lambda v: v + 1.0  # noqa: E731
    dear = lambda v: jnp.tanh(v @ v.T) @ v  # noqa: E731
    return jax.lax.switch(i, [cheap, dear], x)


@pytest.mark.parametrize("index", [0, 1])
def test_a_case_costs_its_dearest_branch(index: int) -> None:
    x = np.random.default_rng(1).normal(size=(16, 16)).astype(np.float32)
    i = np.int32(index)
    compiled = _compiled(_branches, i, x)
    assert_trees_close(compiled(i, x), jax.jit(_branches)(i, x))
    (task,) = [t for t in compiled.program.tasks if t.op.name == "case"]
    costs = [sum(s.cycles for s in region.supersteps) for region in task.regions]
    assert sum(s.cycles for s in task.supersteps) == max(costs)
    assert any(s.op == "dot_general" for s in task.supersteps)
