"""Complex constants (a complex scale, a complex sum's zero start, a table of complex values):
read from the constant's printed form, which the MLIR bindings cannot hand over as an
attribute, and evaluated exactly as jax.jit evaluates them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax

RNG = np.random.default_rng(0)
TABLE = (RNG.standard_normal((64, 33)) * (1 - 0.5j)).astype(np.complex64)  # printed as raw bytes
SMALL = (np.arange(20) * (1 - 0.5j)).astype(np.complex64)  # printed as (re,im) pairs

CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "a complex scale": (lambda x: x * (1 + 2j), (np.ones(4, np.float32),)),
    "a complex sum's zero start": (lambda z: z.sum(), (SMALL,)),
    "a small table": (lambda x: x + jnp.asarray(SMALL), (np.ones(20, np.float32),)),
    "a large table": (lambda x: x * jnp.asarray(TABLE), (np.ones((64, 33), np.float32),)),
    "complex zeros": (lambda x: jnp.zeros(3, jnp.complex64) - x, (np.ones(3, np.float32),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_complex_constants_are_jax_jits(name: str) -> None:
    fun, args = CASES[name]
    want = np.asarray(jax.jit(fun)(*args))
    got = np.asarray(ipujax.jit(fun)(*args))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
