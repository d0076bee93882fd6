"""Reductions over dimensions of one element (`lowering.unit_reductions`): a reshape when the
initial value is the combiner's identity, as XLA's simplifier makes them; the values are
jax.jit's, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lowering import interpret, lower, reshape_unit_reductions

X = np.array([[[-0.0, 1.5, -2.0, np.inf]]], np.float32)  # [1, 1, 4]


@pytest.mark.parametrize(
    "reduction",
    [
        lambda x: x.sum(axis=(0, 1)),
        lambda x: x.max(axis=0),
        lambda x: x.min(axis=1),
        lambda x: jnp.prod(x, axis=0),
        lambda x: (x > 0).any(axis=(0, 1)),
        lambda x: (x > 0).all(axis=0),
        lambda x: x.astype(jnp.int32).max(axis=1),
    ],
)
def test_a_reduction_over_ones_from_its_identity_is_a_reshape(reduction) -> None:
    graph = lower(reduction, X)
    simple = reshape_unit_reductions(graph)
    assert "reduce" in [op.name for op in graph.ops]
    assert "reduce" not in [op.name for op in simple.ops]
    (ours,) = interpret(simple, [X])
    want = jax.jit(reduction)(X)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))
    assert (np.signbit(np.asarray(ours)) == np.signbit(np.asarray(want))).all()


def test_a_reduction_from_another_value_or_over_more_stays() -> None:
    def from_five(x):
        return lax.reduce(x, np.float32(5.0), lax.add, (0,))

    def over_four(x):
        return x.sum(axis=2)

    for fun in (from_five, over_four):
        graph = lower(fun, X)
        assert reshape_unit_reductions(graph) is graph
