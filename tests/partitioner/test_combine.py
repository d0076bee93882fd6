"""The collective combiner, derived by hand: a dp step's gradient all-reduces, ready before the
first is needed, go as one ring over the sum of their bytes; the buffer bounds a group; an
all-reduce reading another's sum never joins it; values equal `jax.jit`'s."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax
from lowering import Graph, Op, Value
from partitioner.cost.links import LinkModel
from partitioner.sharding.combine import combine_all_reduces
from tests.helpers import assert_trees_close, target

W1, W2, W3 = (16, 32), (32, 32), (32, 8)


def _step(params: dict[str, jax.Array], x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = jnp.tanh(jnp.tanh(x @ p["a"]) @ p["b"])
        return jnp.mean((h @ p["c"]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def _args() -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = dict(zip("abc", (W1, W2, W3), strict=True))
    params = {k: rng.normal(size=s).astype(np.float32) / 4 for k, s in shapes.items()}
    return params, rng.normal(size=(32, 16)).astype(np.float32)


def _compiled(buffer: int | None = None) -> ipujax.Compiled:
    mesh = ipujax.make_mesh((4,), ("dp",), target=target(16))
    kwargs = {} if buffer is None else {"collective_buffer_bytes": buffer}
    jitted = ipujax.jit(_step, mesh=mesh, in_shardings=(None, P("dp")), **kwargs)
    return jitted.lower(*_args()).compile()


def _all_reduces(graph: Graph) -> list[Op]:
    return [op for op in graph.ops if op.name == "all_reduce"]


def test_the_gradients_go_as_one_all_reduce() -> None:
    compiled = _compiled()
    assert_trees_close(compiled(*_args()), jax.jit(_step)(*_args()))
    # The partitioner sums the loss and each of the three gradients over dp; the loss's
    # partial sum stays pending through its mean's division, and every partial sum is made
    # before the first update reads one, so all four run as one.
    assert len(_all_reduces(compiled.partitioned.graph)) == 4
    (combined,) = _all_reduces(compiled.built.graph)
    assert sorted(x.shape for x in combined.operands) == sorted([(), W1, W2, W3])


def test_one_ring_over_the_sum_of_their_bytes() -> None:
    """Apart, each ring pays its latency and a sync; together, once: the combined record is the
    ring of 4 x (16x32 + 32x32 + 32x8 + 1) bytes (the gradients and the loss), and saves the
    others' latencies and syncs."""
    combined, apart = _compiled(), _compiled(buffer=0)
    mesh = combined.mesh
    links = LinkModel.place(mesh.shape, mesh.target, mesh.system)
    total = 4 * (16 * 32 + 32 * 32 + 32 * 8 + 1)
    ring = links.ring("all_reduce", ("dp",), total)
    together = [c for c in combined.cost_report().collectives if c.bytes_per_ipu > 0]
    big = max(together, key=lambda c: c.bytes_per_ipu)
    assert big.bytes_per_ipu == ring.bytes_per_ipu
    assert big.cycles == ring.link_cycles + ring.sync_cycles
    cycles = [sum(c.cycles for c in r.cost_report().collectives) for r in (combined, apart)]
    sizes = [a * b for a, b in (W1, W2, W3)] + [1]
    singles = [links.ring("all_reduce", ("dp",), 4 * n) for n in sizes]
    saved = sum(r.link_cycles + r.sync_cycles for r in singles) - big.cycles
    assert saved > 0 and cycles[1] - cycles[0] == saved


def test_the_buffer_bounds_a_group() -> None:
    # In the update's order a (2 KiB), b (4 KiB), c (1 KiB): 6 KiB holds a and b; c, which
    # would make 7, opens a group of its own, which the loss's 4 bytes join (first fit in
    # program order, as the buffer fills).
    compiled = _compiled(buffer=6144)
    grads = _all_reduces(compiled.built.graph)
    assert sorted(len(op.operands) for op in grads) == [2, 2]
    assert all(sum(x.nbytes for x in op.operands) <= 6144 for op in grads)
    assert_trees_close(compiled(*_args()), jax.jit(_step)(*_args()))


def test_nothing_is_combined_with_a_zero_buffer() -> None:
    compiled = _compiled(buffer=0)
    assert all(len(op.operands) == 1 for op in _all_reduces(compiled.built.graph))


def _value(id: int, shape: tuple[int, ...] = (4,)) -> Value:
    return Value(id, shape, np.dtype(np.float32))


def _all_reduce(x: Value, out: Value) -> Op:
    return Op("all_reduce", (x,), (out,), {"axes": ("dp",), "group_size": 4, "reduction": "sum"})


@pytest.mark.parametrize("chained", [True, False])
def test_an_all_reduce_joins_only_where_its_operand_is_made(chained: bool) -> None:
    """Chained, `a = all_reduce(x); t = tanh(a); b = all_reduce(t)`: t is made after the first
    runs, so b stays apart (c, ready from the start, joins b). Unchained, `t = tanh(x)` comes
    first and all three run as one where the first stood."""
    x, a, t, b, y, c = (_value(i) for i in range(6))
    first = (_all_reduce(x, a), Op("tanh", (a,), (t,)))
    if not chained:
        first = (Op("tanh", (x,), (t,)), _all_reduce(x, a))
    ops = (*first, _all_reduce(t, b), _all_reduce(y, c))
    graph = Graph(inputs=(x, y), ops=ops, outputs=(a, b, c))
    combined = combine_all_reduces(graph)
    counts = Counter(len(op.operands) for op in combined.ops if op.name == "all_reduce")
    assert counts == ({1: 1, 2: 1} if chained else {3: 1})
    # Every value is made before it is read.
    made = set(graph.inputs)
    for op in combined.ops:
        assert set(op.operands) <= made
        made.update(op.results)
