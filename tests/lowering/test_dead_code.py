"""Dead-code elimination keeps exactly what the outputs need."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import lowering
from lowering import Op, Value


def test_dead_ops_are_dropped_and_values_unchanged():
    def f(x):
        return jnp.sin(x) * 2.0

    x = np.arange(6.0, dtype=np.float32)
    graph = lowering.lower(f, x)
    dead = Op("cosine", (graph.inputs[0],), (Value(10_000, (6,), np.dtype(np.float32)),))
    padded = dataclasses.replace(graph, ops=(dead, *graph.ops))
    pruned = lowering.eliminate_dead_code(padded)
    assert [op.name for op in pruned.ops] == [op.name for op in graph.ops]
    assert lowering.eliminate_dead_code(graph) is graph  # nothing dead: the same graph
    np.testing.assert_array_equal(lowering.evaluate(pruned, x), lowering.evaluate(graph, x))


def test_values_read_only_by_a_region_stay():
    def f(x, i):
        y = x * 3.0  # read only inside the branches of the cond
        return jax.lax.cond(i > 0, lambda: y + 1.0, lambda: y - 1.0)

    graph = lowering.lower(f, np.ones(3, np.float32), 1)
    pruned = lowering.eliminate_dead_code(graph)
    assert "multiply" in {op.name for op in pruned.ops}
    assert lowering.verify(pruned) is None
