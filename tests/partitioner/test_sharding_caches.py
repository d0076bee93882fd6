"""The shortcuts that keep propagation and partitioning fast give the answers of the long way:
factor rules cached by shape, an op visited again only when a visit could change its decision
(never, where no sharding reaches it), and per-IPU result types inferred once per form of op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from partition_helpers import ffn_value_and_grads

from lowering import Graph, Op, infer_types, lower, walk
from partitioner.sharding import factor_rules
from partitioner.sharding.factor_rules import FACTOR_RULES, Factors, project
from partitioner.sharding.propagation import _refine, decide_factors, propagate_shardings
from partitioner.sharding.specs import Sharding
from partitioner.sharding.type_cache import TypeCache

DP, TP = ("dp",), ("tp",)


def _spec(*shape: int, dtype: type = np.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _ffn_grads() -> Graph:
    return lower(ffn_value_and_grads, _spec(8, 4), _spec(4, 16), _spec(16, 4))


def _with_an_unreached_part() -> Graph:
    """x @ w takes the inputs' shardings; c's sine, its bitcast to bytes and their sum do not."""

    def fun(x: jax.Array, w: jax.Array, c: jax.Array) -> tuple[jax.Array, ...]:
        s = jnp.sin(c) * 2.0 + c
        return jnp.tanh(x @ w), s, jax.lax.bitcast_convert_type(s, jnp.int8)

    return lower(fun, _spec(8, 4), _spec(4, 6), _spec(3, 5))


def _clear_factor_caches() -> None:
    for cached in (
        factor_rules._replicated_factors,
        factor_rules._elementwise_factors,
        factor_rules._broadcast_factors,
    ):
        cached.cache_clear()


def _rules(ops: list[Op]) -> list[Factors]:
    return [FACTOR_RULES[op.name](op) for op in ops]


def test_factor_rules_cached_by_shape_do_not_depend_on_the_order_ops_ask() -> None:
    ops = [*_ffn_grads().ops, *_with_an_unreached_part().ops]
    _clear_factor_caches()
    forward = _rules(ops)
    _clear_factor_caches()
    backward = _rules(ops[::-1])[::-1]
    assert forward == backward


def test_cached_elementwise_rules_by_hand() -> None:
    graph = _with_an_unreached_part()
    multiply = next(op for op in graph.ops if op.name == "multiply")  # sin(c) * 2.0
    bitcast = next(op for op in graph.ops if op.name == "bitcast_convert")
    assert FACTOR_RULES["multiply"](multiply) == Factors(
        tuple((0, 1) if v.shape else () for v in multiply.operands),
        ((0, 1),),
        (3, 5),
        rule="elementwise",
    )
    # f32 to bytes adds a dim of 4: the shapes differ, so nothing corresponds
    assert FACTOR_RULES["bitcast_convert"](bitcast) == Factors(
        ((None, None),), ((None, None, None),), (), rule="replicated"
    )


def _op_factors_are_decisions_on_the_final_shardings(
    graph: Graph, inputs: dict, outputs: dict
) -> dict:
    """Every op's factors are what it decides on the shardings propagation ends with (none was
    left unvisited that a visit would change), and they offer no tensor anything new."""
    prop = propagate_shardings(graph, inputs, outputs)
    fixed = {*inputs, *outputs}
    for op in graph.ops:
        factors = prop.factors[op]
        axes = prop.op_factors[op]
        assert axes == decide_factors(op, factors, prop.shardings, fixed), op
        values, dims_of = (*op.operands, *op.results), (*factors.operands, *factors.results)
        for value, dims in zip(values, dims_of, strict=True):
            if value not in fixed:
                assert _refine(prop.shardings[value], project(dims, axes)) is None, op
    return prop.op_factors


def test_each_ops_factors_are_its_decision_on_the_final_shardings() -> None:
    graph = _ffn_grads()
    x, w1, w2 = graph.inputs
    inputs = {x: Sharding((DP, ())), w1: Sharding(((), TP)), w2: Sharding((TP, ()))}
    _op_factors_are_decisions_on_the_final_shardings(graph, inputs, {})
    _op_factors_are_decisions_on_the_final_shardings(graph, {}, {graph.outputs[0]: Sharding(())})


def test_ops_no_sharding_reaches_split_no_factor() -> None:
    graph = _with_an_unreached_part()
    x, _, c = graph.inputs
    found = _op_factors_are_decisions_on_the_final_shardings(graph, {x: Sharding((DP, ()))}, {})
    dot = next(op for op in graph.ops if op.name == "dot_general")
    assert found[dot] == (DP, (), ())
    unreached = [op for op in graph.ops if c in op.operands]
    assert unreached
    for op in unreached:
        assert not any(found[op]) and len(found[op]) == len(FACTOR_RULES[op.name](op).sizes)


def _types(types: tuple) -> list[tuple[tuple[int, ...], np.dtype]]:
    return [(tuple(t.shape), np.dtype(t.dtype)) for t in types]


def test_type_cache_gives_infer_types_answers_twice() -> None:
    big = np.arange(100, dtype=np.float32)  # more elements than a key holds: inferred each time

    def fun(x: jax.Array, n: jax.Array) -> tuple[jax.Array, ...]:
        total = jnp.sum(x, axis=0) + jnp.max(x, axis=1).sum()
        return total, n + 1, x[0, :1] + big[:1], jnp.argmax(x, axis=1)

    graph = lower(fun, _spec(8, 4), _spec(3, dtype=np.int32))
    cache = TypeCache()
    for op in [*walk(graph), *walk(graph)]:
        found = cache.infer(op.name, op.operands, op.attrs, op.regions, op.loc)
        assert _types(found) == _types(infer_types(op)), op.name


def test_type_cache_tells_constants_of_equal_bytes_apart() -> None:
    """0 as int32 and 0.0 as float32 have the same bytes: the dtype keeps them apart."""
    cache = TypeCache()
    for value in (np.zeros((), np.int32), np.zeros((), np.float32), np.zeros((1,), np.int32)):
        op = Op("constant", (), (), {"value": value})
        assert _types(cache.infer("constant", (), op.attrs, (), op.loc)) == [
            (value.shape, value.dtype)
        ]


def test_an_op_its_own_result_tips_decides_again() -> None:
    """x [8, 16] @ w [16, 4], x split along K and w along N over dp, both given: N keeps dp at
    first (gathering x moves 128 elements, as many as w's 64 and twice the result's 32 for an
    AllReduce of the partial sum); once the result takes N's split, the partial sum could be
    reduce-scattered instead (64 + 32 < 128), so the dot decides again and K takes dp."""
    graph = lower(lambda x, w: x @ w, _spec(8, 16), _spec(16, 4))
    x, w = graph.inputs
    given = {x: Sharding(((), DP)), w: Sharding(((), DP))}
    found = _op_factors_are_decisions_on_the_final_shardings(graph, given, {})
    (dot,) = graph.ops
    assert found[dot] == ((), (), DP)  # M, N, K
