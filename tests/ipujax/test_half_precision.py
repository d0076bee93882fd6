"""Half-precision contractions give jax.jit's values exactly: the simulator runs each matmul
and convolution as jax lowers it, so XLA widens, sums and rounds it as it does for jax.jit
(where a cast back to float32 follows, XLA keeps the sums unrounded; a kernel that widened and
rounded explicitly kept the rounding, and a bfloat16 model's values differed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import mesh

import ipujax

CASES: dict[str, Callable[..., Any]] = {
    "a mean of a matmul": lambda w, x: jnp.mean(x @ w, axis=0),
    "a matmul cast to float32": lambda w, x: (x @ w).astype(jnp.float32),
    "a gradient through tanh": lambda w, x: jax.grad(
        lambda w: jnp.sum(jnp.tanh(x @ w).astype(jnp.float32))
    )(w),
    "a convolution cast to float32": lambda w, x: jax.lax.conv_general_dilated(
        x[None, None], w[None, None, :3, :3], (1, 1), "SAME"
    ).astype(jnp.float32),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_half_precision_contractions_are_jax_jits(name: str, dtype: Any) -> None:
    w = (jax.random.normal(jax.random.key(0), (32, 32)) * 0.1).astype(dtype)
    x = jax.random.normal(jax.random.key(9), (8, 32)).astype(dtype)
    fun = CASES[name]
    want = np.asarray(jax.jit(fun)(w, x), np.float32)
    got = np.asarray(ipujax.jit(fun, mesh=mesh())(w, x), np.float32)
    np.testing.assert_array_equal(got, want)
