"""Never replicate silently: an op that has no rule to run split gathers its split operands and
runs whole on every IPU, and ipujax says so once per compile (a `ReplicationWarning`) and in
`explain()`, naming the op, its line and the tensor."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from helpers import target
from jax.sharding import PartitionSpec as P

import ipujax


def branchy(x):
    # `cond` (StableHLO `case`) has no factor rule of its own yet: it runs whole on every IPU.
    return jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: y - 1.0, x)


def _jitted(spec):
    mesh = ipujax.make_mesh((2,), ("rows",), target=target(16))
    return ipujax.jit(branchy, mesh=mesh, in_shardings=(spec,))


def test_an_op_that_gathers_a_split_tensor_warns_once_and_explains() -> None:
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    with pytest.warns(ipujax.ReplicationWarning) as caught:
        compiled = _jitted(P("rows")).lower(x).compile()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "case at" in message and "test_forced_whole.py" in message
    assert "float32[8x4] [{rows}, {}]" in message and "explain()" in message
    assert "gathered float32[8x4] [{rows}, {}]" in compiled.explain()
    np.testing.assert_allclose(compiled(x), jax.jit(branchy)(x))


def test_nothing_to_say_when_nothing_was_split() -> None:
    x = np.ones((8, 4), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = _jitted(P()).lower(x).compile()
    assert "ran whole" not in compiled.explain()
