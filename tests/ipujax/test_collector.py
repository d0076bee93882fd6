"""The public entry points run with Python's cyclic garbage collector paused, and leave it as
they found it, errors included."""

from __future__ import annotations

import gc

import jax.numpy as jnp
import numpy as np
import pytest

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
