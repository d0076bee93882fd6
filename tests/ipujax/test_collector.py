"""The public entry points run with Python's cyclic garbage collector paused, and leave it as
they found it, errors included."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax


def test_the_collector_is_paused_while_lowering_and_on_again_after() -> None:
    seen = []

    def f(x: jnp.ndarray) -> jnp.ndarray:
        seen.append(gc.isenabled())
        return x * 2

    assert gc.isenabled()
    compiled = ipujax.jit(f).lower(np.ones(3, np.float32)).compile()
    assert seen == [False]
    assert gc.isenabled()
    np.testing.assert_array_equal(compiled(np.ones(3, np.float32)), np.full(3, 2, np.float32))
    assert gc.isenabled()


def test_the_collector_is_on_again_after_an_error() -> None:
    def f(x: jnp.ndarray) -> jnp.ndarray:
        raise ValueError("from the user's function")

    with pytest.raises(ValueError, match="user's function"):
        ipujax.jit(f).lower(np.ones(3, np.float32))
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        ipujax.jit(lambda x: x + 1).lower(np.ones(3, np.float32)).compile()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_a_block_made_is_handed_to_the_oldest_generation() -> None:
    from ipujax.boundary import collector_paused

    gc.collect()
    with collector_paused():
        made = [[i] for i in range(50_000)]  # tracked containers, young when the block ends
    # Not left young: the collector's sweeps of the young and middle generations do not walk
    # them again (they wait for a full sweep).
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(made[0]) in oldest and id(made[-1]) in oldest


def test_a_warm_call_leaves_the_users_young_objects_young() -> None:
    f = ipujax.jit(lambda x: x * 2)
    x = np.ones(3, np.float32)
    f(x)
    gc.collect()
    young = [[i] for i in range(300)]  # made between two steps, by the user
    f(x)
    # Left to the young sweeps, which free their cycles; only a burst is aged.
    assert id(young[0]) not in {id(o) for o in gc.get_objects(generation=2)}


def _loop_with_halos(w: jnp.ndarray, x: jnp.ndarray) -> jnp.ndarray:
    def body(h: jnp.ndarray, _: None) -> tuple[jnp.ndarray, None]:
        h = jnp.tanh(h @ w)
        return h + jnp.roll(h, 1, axis=0), None  # rows split over dp: a halo each trip

    h, _ = jax.lax.scan(body, x, None, length=3)
    return jnp.sum(h**2)


@pytest.mark.filterwarnings("ignore::ipujax.UnrollLimitWarning")  # the loop in one phase
@pytest.mark.parametrize("phases", [None, "auto"])
def test_a_compile_makes_no_garbage_cycles_of_its_own(phases: str | None) -> None:
    """Every object a compile drops is freed when dropped: a cycle among ipujax's objects (a
    partitioner its halos refer back to, a context holding a function that holds it) would
    wait for a full sweep of the collector, whose walk over a large program's objects is
    seconds."""
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"))
    w = np.full((8, 8), 0.1, np.float32)
    x = np.ones((16, 8), np.float32)
    step = ipujax.jit(
        jax.grad(_loop_with_halos), mesh=mesh, in_shardings=(P(None, "tp"), P("dp")), phases=phases
    )
    ours = ("lowering", "partitioner", "ipujax")
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step.lower(w, x).compile().cost_report()
        gc.collect()
        cycles = [
            o
            for o in gc.garbage
            if type(o).__module__.split(".")[0] in ours
            or getattr(o, "__module__", "").split(".")[0] in ours
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cycles == []
