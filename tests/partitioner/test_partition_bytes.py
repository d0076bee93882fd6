"""IPU-Link bytes against the ring closed forms of docs/target.md ("IPU-Links and systems"): an
AllReduce sends 2 (n-1)/n N bytes per participant for an N-byte buffer, AllGather and
ReduceScatter (n-1)/n N (N the whole, gathered size). The FFN x [T, h] @ w1 [h, 4h] -> gelu -> @
w2 [4h, h] in f32 (e = 4) under Megatron 1D, data parallelism and 2D tensor parallelism."""

from __future__ import annotations

import functools
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from partition_helpers import (
    F32,
    all_reduce_bytes,
    buffer_bytes,
    collective_ops,
    collectives,
    compile_sharded,
    ffn,
    ffn_args,
    ffn_value_and_grads,
    gather_bytes,
    mesh,
    summary,
    target,
)

import ipujax
from lowering import lower
from partitioner.cost.links import LinkModel
from partitioner.sharding.partition import partition
from partitioner.sharding.propagation import propagate_shardings
from partitioner.sharding.specs import Sharding
from partitioner.tiles.schedule import schedule

T, H = 16, 8  # tokens and hidden width of the FFN

# Each collective as the partitioner emits it, value by value as XLA's SPMD partitioner does
# before its combiner; `test_combine` checks the combining.
_uncombined = functools.partial(compile_sharded, collective_buffer_bytes=0)


def _check_report_totals(compiled: ipujax.Compiled) -> None:
    """Every collective's bytes are its ring's closed form for its own buffer, and the report's
    IPU-Link total is the per-IPU bytes times the IPUs."""
    report = compiled.cost_report()
    for cost, op in collectives(compiled):
        n, buffer = op.attrs["group_size"], buffer_bytes(op)
        ring = all_reduce_bytes if op.name == "all_reduce" else gather_bytes
        assert cost.bytes_per_ipu == ring(n, buffer), (cost, op.operands[0].shape)
    assert report.ipu_link_bytes == sum(c.bytes_per_ipu for c in report.collectives) * report.ipus
    assert report.ipus == compiled.mesh.ipus


def _all_reduces(compiled: ipujax.Compiled) -> list[tuple[tuple[str, ...], tuple[int, ...], int]]:
    """(axes, per-IPU buffer shape, bytes per IPU) of each AllReduce; fails on other kinds."""
    found = []
    for cost, op in collectives(compiled):
        assert op.name == "all_reduce", summary(compiled)
        found.append((tuple(op.attrs["axes"]), tuple(op.operands[0].shape), cost.bytes_per_ipu))
    return found


# ---- (a) Megatron 1D: one AllReduce of [T, h] forward, one backward ------------------------------

MEGATRON = (P(), P(None, "tp"), P("tp", None))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_megatron_forward_is_one_all_reduce_of_the_output(p: int) -> None:
    compiled = _uncombined(ffn, mesh((p,), ("tp",)), ffn_args(T, H), MEGATRON, P())
    expected = all_reduce_bytes(p, T * H * F32)
    assert expected == 2 * (p - 1) * T * H * F32 // p
    assert _all_reduces(compiled) == [(("tp",), (T, H), expected)]
    (cost,) = compiled.cost_report().collectives
    assert cost.group_size == p
    _check_report_totals(compiled)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_megatron_forward_and_backward_cost_the_per_layer_mlp_figure(p: int) -> None:
    compiled = _uncombined(ffn_value_and_grads, mesh((p,), ("tp",)), ffn_args(T, H), MEGATRON)
    found = _all_reduces(compiled)
    activations = [bytes_ for axes, shape, bytes_ in found if axes == ("tp",) and shape == (T, H)]
    assert len(activations) == 2, found  # after the row-parallel matmul, and for dL/dx
    # The output is whole after the forward AllReduce, so the loss needs no reduction of its
    # own: nothing else crosses the links.
    assert len(found) == 2, found
    assert sum(activations) == 2 * all_reduce_bytes(p, T * H * F32)
    assert sum(activations) == 4 * (p - 1) * T * H * F32 // p  # half of 8 (p-1)/p T h e
    _check_report_totals(compiled)


# ---- (b) data parallelism: the weight gradients' AllReduce, and the loss -------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_gradients_all_reduce_the_parameters(n: int) -> None:
    specs = (P("dp"), P(), P())
    compiled = _uncombined(ffn_value_and_grads, mesh((n,), ("dp",)), ffn_args(T, H), specs)
    found = _all_reduces(compiled)
    assert {axes for axes, _, _ in found} == {("dp",)}
    weights = [(shape, b) for _, shape, b in found if shape != ()]
    scalars = [b for _, shape, b in found if shape == ()]
    assert sorted(shape for shape, _ in weights) == [(H, 4 * H), (4 * H, H)]
    param_bytes = 2 * H * 4 * H * F32
    assert sum(b for _, b in weights) == 2 * (n - 1) * param_bytes // n
    assert scalars == [all_reduce_bytes(n, F32)]  # the loss, summed over the batch's shards
    _check_report_totals(compiled)


# ---- (c) 2D tensor parallelism -------------------------------------------------------------------

TWO_D = (P(None, "tp2"), P("tp2", "tp1"), P("tp1", "tp2"))


def _two_d_expected(tp1: int, tp2: int) -> Counter:
    first = (("tp2",), (T, 4 * H // tp1), all_reduce_bytes(tp2, T * 4 * H // tp1 * F32))
    second = (("tp1",), (T, H // tp2), all_reduce_bytes(tp1, T * H // tp2 * F32))
    return Counter([first, second])


@pytest.mark.parametrize("tp1,tp2", [(2, 2), (2, 4)])
def test_two_d_forward_all_reduces_over_tp2_then_tp1(tp1: int, tp2: int) -> None:
    the_mesh = mesh((tp1, tp2), ("tp1", "tp2"))
    compiled = _uncombined(ffn, the_mesh, ffn_args(T, H), TWO_D)
    found = _all_reduces(compiled)
    assert Counter(found) == _two_d_expected(tp1, tp2)
    assert [axes for axes, _, _ in found] == [("tp2",), ("tp1",)]  # first matmul, then second
    _check_report_totals(compiled)


@pytest.mark.parametrize("tp1,tp2", [(2, 2), (2, 4)])
def test_two_d_backward_repeats_the_forward_all_reduces(tp1: int, tp2: int) -> None:
    the_mesh = mesh((tp1, tp2), ("tp1", "tp2"))
    compiled = _uncombined(ffn_value_and_grads, the_mesh, ffn_args(T, H), TWO_D)
    found = Counter(_all_reduces(compiled))
    # The loss sums an output split over tp2: one scalar AllReduce over tp2.
    loss = (("tp2",), (), all_reduce_bytes(tp2, F32))
    assert found == _two_d_expected(tp1, tp2) + _two_d_expected(tp1, tp2) + Counter([loss])
    _check_report_totals(compiled)


# ---- AllGather and ReduceScatter -----------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_all_gather_sends_the_missing_share_of_the_whole(n: int) -> None:
    x = jax.ShapeDtypeStruct((T, H), jnp.float32)
    compiled = _uncombined(jnp.tanh, mesh((n,), ("dp",)), (x,), (P("dp"),), P())
    ((cost, op),) = collectives(compiled)
    assert (op.name, tuple(op.results[0].shape)) == ("all_gather", (T, H))
    assert cost.bytes_per_ipu == (n - 1) * T * H * F32 // n
    _check_report_totals(compiled)


def _row_parallel(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scatter_of_a_partial_sum_sends_the_missing_share(n: int) -> None:
    """The partitioner's own path: a row-parallel matmul's partial sum delivered split by rows
    is reduce-scattered, and the scheduler charges (n-1)/n of the whole [T, 2h] sum."""
    x = jax.ShapeDtypeStruct((T, H), jnp.float32)
    w = jax.ShapeDtypeStruct((H, 2 * H), jnp.float32)
    graph = lower(_row_parallel, x, w)
    sizes = {"dp": n}
    split_k = {graph.inputs[0]: Sharding(((), ("dp",))), graph.inputs[1]: Sharding((("dp",), ()))}
    prop = propagate_shardings(graph, split_k, {})
    assert prop.op_factors[graph.ops[0]] == ((), (), ("dp",))  # M, N, K: K is split
    rows = Sharding((("dp",), ()))
    part = partition(graph, prop, sizes, {0: rows})
    assert [op.name for op in part.graph.ops] == ["dot_general", "reduce_scatter"]
    scatter = part.graph.ops[1]
    assert scatter.operands[0].shape == (T, 2 * H) and scatter.results[0].shape == (T // n, 2 * H)
    links = LinkModel.place(sizes, target())
    program = schedule(part.graph, target(), links)
    (step,) = [s for s in program.supersteps if s.kind == "collective"]
    assert step.collective is not None
    sent = step.collective.bytes_per_ipu
    assert sent == (n - 1) * T * 2 * H * F32 // n
    # Inside one machine: a pair's rung of 4 links, which both ways round a ring of two share,
    # or the ring 0-1-3-2 whose cross hops have 2: 2 links each way, 4 x 15.75e9 x 0.85 =
    # 53.55e9 bytes/s (docs/target.md). 512 B x 1.85e9 / 53.55e9 = 17.7 -> 18 cycles + 1 step;
    # 768 B -> 26.5 -> 27 cycles + 3 steps of 3,000.
    assert step.link_cycles == {2: 18 + 3000, 4: 27 + 9000}[n]


def test_row_parallel_output_split_by_rows_is_reduce_scattered() -> None:
    """out_shardings P('dp') of x[8,64] @ w[64,8] split over K: the row factor would take dp
    by rule 2 and all-gather x and w (1536 B per IPU), but reduce-scattering the 256 B partial
    sum moves 128 B per IPU, so the contraction keeps dp."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    specs = (P(None, "dp"), P("dp", None))
    compiled = _uncombined(_row_parallel, mesh((2,), ("dp",)), (x, w), specs, P("dp"))
    assert summary(compiled) == [("reduce_scatter", ("dp",), (8, 8))]
    assert compiled.cost_report().ipu_link_bytes == 2 * gather_bytes(2, 8 * 8 * F32)
    np.testing.assert_allclose(compiled(x, w), jax.jit(_row_parallel)(x, w), rtol=1e-5, atol=1e-5)


def test_a_contraction_split_gives_way_when_gathering_moves_less() -> None:
    """The same conflict with a small K and a wide result: gathering x[8,2] and w[2,512] (4,160
    B) is cheaper than reduce-scattering the 16 KiB partial sum, so rule 2 stands."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    w = rng.standard_normal((2, 512)).astype(np.float32)
    specs = (P(None, "dp"), P("dp", None))
    compiled = _uncombined(_row_parallel, mesh((2,), ("dp",)), (x, w), specs, P(None, "dp"))
    kinds = {kind for kind, _, _ in summary(compiled)}
    assert kinds == {"all_gather"}, summary(compiled)
    np.testing.assert_allclose(compiled(x, w), jax.jit(_row_parallel)(x, w), rtol=1e-5, atol=1e-5)


# ---- sums kept pending: linear ops of partial sums, scatter-adds of split updates ---------------


def test_a_sum_of_row_parallel_matmuls_is_one_all_reduce() -> None:
    """x1 @ w1 + x2 @ w2 with both contractions split over tp: each product is a partial sum
    over tp, so is their sum, and one AllReduce of [T, H] finishes it (two before)."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(T, 4 * H), (4 * H, H)] * 2]
    specs = (P(None, "tp"), P("tp", None)) * 2
    fun = lambda x1, w1, x2, w2: x1 @ w1 - (-(x2 @ w2))  # noqa: E731
    compiled = _uncombined(fun, mesh((4,), ("tp",)), args, specs, P())
    assert _all_reduces(compiled) == [(("tp",), (T, H), all_reduce_bytes(4, T * H * F32))]
    np.testing.assert_allclose(compiled(*args), jax.jit(fun)(*args), rtol=1e-5, atol=1e-5)


def _embedding_loss(table: jax.Array, tokens: jax.Array) -> jax.Array:
    return jnp.sum(jnp.tanh(table[tokens]))


@pytest.mark.parametrize("dp", [2, 4])
def test_an_embedding_gradient_scatters_each_replicas_tokens(dp: int) -> None:
    """The gradient of table[tokens] is a scatter-add of one row per token into zeros. With the
    tokens split over dp, each IPU scatters its own and the table's gradient is all-reduced, as
    every dp gradient is: no AllGather of the tokens or their updates."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((32, H)).astype(np.float32)
    tokens = rng.integers(0, 32, (8, 6)).astype(np.int32)
    grad = jax.grad(_embedding_loss)
    compiled = _uncombined(grad, mesh((dp,), ("dp",)), (table, tokens), (P(), P("dp")), P())
    assert _all_reduces(compiled) == [(("dp",), (32, H), all_reduce_bytes(dp, 32 * H * F32))]
    np.testing.assert_allclose(compiled(table, tokens), jax.jit(grad)(table, tokens), rtol=1e-5)


def test_a_scatter_add_into_a_nonzero_operand_counts_it_once() -> None:
    """Only the first IPU of the group adds its updates into the operand; the others into
    zeros, so the AllReduce adds the operand once."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((16, H)).astype(np.float32)
    rows = rng.integers(0, 16, (12,)).astype(np.int32)
    updates = rng.standard_normal((12, H)).astype(np.float32)
    fun = lambda base, rows, updates: base.at[rows].add(updates)  # noqa: E731
    args = (base, rows, updates)
    compiled = _uncombined(fun, mesh((4,), ("dp",)), args, (P(), P("dp"), P("dp")), P())
    assert [op.name for op in collective_ops(compiled)] == ["all_reduce"]
    np.testing.assert_allclose(compiled(*args), jax.jit(fun)(*args), rtol=1e-5, atol=1e-6)
