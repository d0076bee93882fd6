"""Factor rules and sharding propagation on small lowered graphs, and the per-IPU program that
partitioning makes of them: which dims correspond, which factor is a reduction, how conflicts are
resolved, where the one AllReduce of a Megatron FFN appears."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from partition_helpers import ffn

from lowering import VOCABULARY, Graph, Op, lower
from partitioner.sharding.factor_rules import FACTOR_RULES
from partitioner.sharding.partition import partition
from partitioner.sharding.propagation import propagate_shardings
from partitioner.sharding.specs import Sharding

DP, TP = ("dp",), ("tp",)
REPLICATED_2D = Sharding(((), ()))


def _spec(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.float32)


def _only(graph: Graph, name: str) -> Op:
    (op,) = [op for op in graph.ops if op.name == name]
    return op


def _comms(graph: Graph) -> list[tuple[str, tuple[str, ...], int, tuple[int, ...]]]:
    """(kind, axes, dimension or -1, per-IPU operand shape) of each collective."""
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    return [
        (op.name, tuple(op.attrs["axes"]), op.attrs.get("dimension", -1), op.operands[0].shape)
        for op in graph.ops
        if op.name in kinds
    ]


# ---- factor rules --------------------------------------------------------------------------------


def test_every_op_of_the_vocabulary_has_a_factor_rule() -> None:
    assert set(FACTOR_RULES) == set(VOCABULARY)


def test_dot_general_contracting_factor_is_a_reduction_factor() -> None:
    graph = lower(lambda x, w: x @ w, _spec(8, 4), _spec(4, 6))
    factors = FACTOR_RULES["dot_general"](_only(graph, "dot_general"))
    # Factors: lhs free (M), rhs free (N), then the contracting one (K).
    assert factors.operands == ((0, 2), (2, 1))
    assert factors.results == ((0, 1),)
    assert factors.sizes == (8, 6, 4)
    assert factors.reduction == frozenset({2})
    assert factors.rule == "dot_general"


def test_batched_dot_general_batch_factor_is_not_a_reduction() -> None:
    graph = lower(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), _spec(2, 8, 4), _spec(2, 4, 6))
    factors = FACTOR_RULES["dot_general"](_only(graph, "dot_general"))
    assert factors.operands == ((0, 1, 3), (0, 3, 2))
    assert factors.results == ((0, 1, 2),)
    assert factors.sizes == (2, 8, 6, 4)
    assert factors.reduction == frozenset({3})


def test_reduce_rules_sum_and_max_split_argmax_does_not() -> None:
    graph = lower(
        lambda x: (jnp.sum(x, axis=1), jnp.max(x, axis=0), jnp.argmax(x, axis=0)), _spec(8, 6)
    )
    reduces = [op for op in graph.ops if op.name == "reduce"]
    total = next(op for op in reduces if op.attrs["dimensions"] == (1,))
    largest, index = [op for op in reduces if op.attrs["dimensions"] == (0,)]
    if len(index.operands) == 2:
        largest, index = index, largest
    summed = FACTOR_RULES["reduce"](total)
    assert summed.operands[0] == (0, 1) and summed.results == ((0,),)
    assert summed.reduction == frozenset({1})
    maxed = FACTOR_RULES["reduce"](largest)
    assert maxed.operands[0] == (0, 1)  # each IPU takes its max, an AllReduce(max) finishes
    assert maxed.results == ((1,),)
    assert maxed.reduction == frozenset({0})
    argmax = FACTOR_RULES["reduce"](index)  # a two-operand reduce: gathered whole first
    assert argmax.operands[0] == (None, 1)
    assert argmax.reduction == frozenset()


def test_elementwise_transpose_and_broadcast_rules() -> None:
    graph = lower(lambda x, b: (jnp.tanh(x) + b).T, _spec(8, 6), _spec(6))
    add = _only(graph, "add")
    assert FACTOR_RULES["add"](add).operands == ((0, 1), (0, 1))
    assert FACTOR_RULES["tanh"](_only(graph, "tanh")).results == ((0, 1),)
    transpose = FACTOR_RULES["transpose"](_only(graph, "transpose"))
    assert (transpose.operands, transpose.results) == (((0, 1),), ((1, 0),))
    # b [6] -> [1, 6] -> [8, 6]: b's dim is the result's dim 1; a size-1 dim that grows
    # corresponds to nothing.
    to_row, to_matrix = [
        FACTOR_RULES[op.name](op) for op in graph.ops if op.name == "broadcast_in_dim"
    ]
    assert (to_row.operands, to_row.results) == (((1,),), ((0, 1),))
    assert (to_matrix.operands, to_matrix.results) == (((None, 1),), ((0, 1),))


def test_reshape_merging_dims_follows_the_major_one() -> None:
    graph = lower(lambda x: x.reshape(8, 5), _spec(2, 4, 5))
    factors = FACTOR_RULES["reshape"](_only(graph, "reshape"))
    # [2, 4, 5] -> [8, 5]: the merged dim corresponds to the major input dim (2) only.
    assert factors.operands == ((0, None, 1),)
    assert factors.results == ((0, 1),)
    assert factors.sizes == (2, 5)


# ---- propagation ---------------------------------------------------------------------------------


def test_propagation_origins_and_fixed_annotations() -> None:
    graph = lower(lambda x, w: jnp.tanh(x @ w), _spec(8, 4), _spec(4, 6))
    x, w = graph.inputs
    prop = propagate_shardings(graph, {x: Sharding((DP, ()))}, {})
    dot, tanh = graph.ops
    assert prop.shardings[x] == Sharding((DP, ()))
    assert prop.origins[x] == "in_shardings"
    assert prop.shardings[dot.results[0]] == Sharding((DP, ()))
    assert prop.origins[dot.results[0]].startswith("propagated through dot_general")
    assert prop.shardings[tanh.results[0]] == Sharding((DP, ()))
    assert prop.shardings[w] == REPLICATED_2D
    assert prop.origins[w] == "replicated: no sharding reaches it"


def test_propagation_runs_backward_from_outputs() -> None:
    graph = lower(lambda x, w: jnp.tanh(x @ w), _spec(8, 4), _spec(4, 6))
    out = graph.outputs[0]
    prop = propagate_shardings(graph, {}, {out: Sharding(((), TP))})
    assert prop.origins[out] == "out_shardings"
    assert prop.shardings[graph.inputs[1]] == Sharding(((), TP))  # w split by columns
    assert prop.shardings[graph.inputs[0]] == REPLICATED_2D


def test_batch_factor_wins_over_the_contracting_factor() -> None:
    """lhs (dp, None) and rhs (dp, None): rows of x are a batch factor, rows of w the reduction
    factor; the batch factor keeps dp and w is gathered."""
    graph = lower(lambda x, w: x @ w, _spec(8, 4), _spec(4, 6))
    x, w = graph.inputs
    sizes = {"dp": 2}
    prop = propagate_shardings(graph, {x: Sharding((DP, ())), w: Sharding((DP, ()))}, {})
    dot = _only(graph, "dot_general")
    assert prop.op_factors[dot] == (DP, (), ())  # M, N, K
    assert prop.shardings[dot.results[0]] == Sharding((DP, ()))
    part = partition(graph, prop, sizes)
    assert _comms(part.graph) == [("all_gather", DP, 0, (2, 6))]
    assert part.graph.inputs[1].shape == (2, 6)  # w's half ...
    assert _only(part.graph, "dot_general").operands[1].shape == (4, 6)  # ... gathered whole
    assert part.output_shardings == (Sharding((DP, ())),)


def test_user_annotation_wins_over_a_propagated_sharding() -> None:
    """h = tanh(x) takes dp by propagation; w's dp on N is annotated: N keeps dp although h is
    the larger tensor, and h is gathered."""
    graph = lower(lambda x, w: jnp.tanh(x) @ w, _spec(64, 8), _spec(8, 4))
    x, w = graph.inputs
    prop = propagate_shardings(graph, {x: Sharding((DP, ())), w: Sharding(((), DP))}, {})
    dot = _only(graph, "dot_general")
    assert prop.shardings[dot.operands[0]] == Sharding((DP, ()))
    assert prop.op_factors[dot] == ((), DP, ())


@pytest.mark.parametrize("larger", ["x", "w"])
def test_between_equals_the_larger_tensor_keeps_its_axes(larger: str) -> None:
    shapes = {"x": (_spec(64, 8), _spec(8, 4)), "w": (_spec(4, 8), _spec(8, 64))}[larger]
    graph = lower(lambda x, w: x @ w, *shapes)
    x, w = graph.inputs
    prop = propagate_shardings(graph, {x: Sharding((DP, ())), w: Sharding(((), DP))}, {})
    expected = (DP, (), ()) if larger == "x" else ((), DP, ())
    assert prop.op_factors[_only(graph, "dot_general")] == expected


def test_with_sharding_constraint_is_fixed() -> None:
    def model(x: Any) -> Any:
        return jnp.tanh(
            jax.lax.with_sharding_constraint(jnp.exp(x), jax.sharding.PartitionSpec(None, "tp"))
        )

    mesh = jax.sharding.AbstractMesh((2, 2), ("dp", "tp"))
    with jax.sharding.use_abstract_mesh(mesh):
        graph = lower(model, _spec(8, 6))
    x = graph.inputs[0]
    prop = propagate_shardings(graph, {x: Sharding((DP, ()))}, {})
    constraint = _only(graph, "sharding_constraint")
    assert prop.shardings[constraint.results[0]] == Sharding(((), TP))
    assert prop.origins[constraint.results[0]].startswith("with_sharding_constraint at")
    assert prop.shardings[_only(graph, "tanh").results[0]] == Sharding(((), TP))


# ---- Megatron column -> row parallel FFN ---------------------------------------------------------


def _megatron(tp: int = 2) -> tuple[Graph, Any, dict[str, int]]:
    graph = lower(ffn, _spec(8, 8), _spec(8, 32), _spec(32, 8))
    _, w1, w2 = graph.inputs
    inputs = {w1: Sharding(((), TP)), w2: Sharding((TP, ()))}
    return graph, propagate_shardings(graph, inputs, {}), {"tp": tp}


def test_megatron_intermediate_is_column_split() -> None:
    graph, prop, _ = _megatron()
    first, second = [op for op in graph.ops if op.name == "dot_general"]
    assert prop.op_factors[first] == ((), TP, ())  # column parallel: N split
    assert prop.op_factors[second] == ((), (), TP)  # row parallel: K split -> partial sums
    # Everything between the matmuls (gelu) is [T, 4h/tp].
    between = [op for op in graph.ops if op not in (first, second) and op.results]
    for op in between:
        (value,) = op.results
        if value.shape == (8, 32):
            assert prop.shardings[value] == Sharding(((), TP)), op
    assert prop.shardings[second.results[0]] == REPLICATED_2D
    assert prop.shardings[graph.inputs[0]] == REPLICATED_2D


@pytest.mark.parametrize("tp", [2, 4])
def test_megatron_forward_has_exactly_one_all_reduce(tp: int) -> None:
    graph, prop, sizes = _megatron(tp)
    part = partition(graph, prop, sizes)
    assert _comms(part.graph) == [("all_reduce", TP, -1, (8, 8))]
    reduce_op = _only(part.graph, "all_reduce")
    second = [op for op in part.graph.ops if op.name == "dot_general"][1]
    assert reduce_op.operands[0] is second.results[0]  # the row-parallel output, partial
    assert reduce_op.attrs["group_size"] == tp
    assert part.graph.outputs == reduce_op.results
    assert [v.shape for v in part.graph.inputs] == [(8, 8), (8, 32 // tp), (32 // tp, 8)]
    assert part.output_shardings == (REPLICATED_2D,)


def test_megatron_output_left_split_is_reduce_scattered() -> None:
    graph, prop, sizes = _megatron()
    part = partition(graph, prop, sizes, {0: Sharding((TP, ()))})
    assert _comms(part.graph) == [("reduce_scatter", TP, 0, (8, 8))]
    assert part.graph.outputs[0].shape == (4, 8)
