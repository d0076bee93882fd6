"""Partitioned programs compute what `jax.jit` computes: data, Megatron 1D and 2D tensor
parallelism, the tiny GPT's AdamW step, sharding constraints, uneven splits, output shardings,
propagated argument shardings and ZeRO-1 optimiser-state sharding."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import assert_trees_close
from jax.sharding import PartitionSpec as P
from partition_helpers import (
    collective_ops,
    compile_sharded,
    ffn,
    ffn_args,
    ffn_value_and_grads,
    mesh,
    summary,
)

import ipujax
from partitioner.sharding.specs import Sharding

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tiny_gpt

DP, TP = ("dp",), ("tp",)

# ---- the FFN's loss and gradients under each parallelism -----------------------------------------

FFN_CASES = {
    "dp2": ((2,), ("dp",), (P("dp"), P(), P())),
    "dp4": ((4,), ("dp",), (P("dp"), P(), P())),
    "megatron-tp2": ((2,), ("tp",), (P(), P(None, "tp"), P("tp", None))),
    "megatron-tp4": ((4,), ("tp",), (P(), P(None, "tp"), P("tp", None))),
    "2d-2x2": ((2, 2), ("tp1", "tp2"), (P(None, "tp2"), P("tp2", "tp1"), P("tp1", "tp2"))),
}


@pytest.mark.parametrize("case", list(FFN_CASES))
def test_ffn_value_and_grad_equals_jax_jit(case: str) -> None:
    shape, names, specs = FFN_CASES[case]
    args = ffn_args(8, 8)
    compiled = compile_sharded(ffn_value_and_grads, mesh(shape, names), args, specs)
    # The program really is split: every input's sharding is the one asked for.
    sizes = dict(zip(names, shape, strict=True))
    for spec, sharding, arg in zip(specs, compiled.partitioned.input_shardings, args, strict=True):
        assert sharding == _sharding(spec, arg.ndim)
        assert sharding.local_shape(arg.shape, sizes) != arg.shape or not sharding.axes
    assert collective_ops(compiled), "a split FFN's gradients need communication"
    assert_trees_close(compiled(*args), jax.jit(ffn_value_and_grads)(*args))


def _sharding(spec: P, rank: int) -> Sharding:
    entries = tuple(spec) + (None,) * (rank - len(spec))
    return Sharding(tuple(() if e is None else (e,) for e in entries))


# ---- the tiny GPT's AdamW training step ----------------------------------------------------------


def _gpt_param_specs(params: Any, tp: str | None) -> Any:
    block = {
        "ln1": P(),
        "qkv": P(None, tp),
        "proj": P(tp, None),
        "ln2": P(),
        "fc": P(None, tp),
        "out": P(tp, None),
    }
    return {
        "wte": P(),
        "wpe": P(),
        "blocks": [dict(block) for _ in params["blocks"]],
        "lnf": P(),
    }


@pytest.fixture(scope="module")
def gpt_example() -> tuple[Any, Any, Any]:
    """One layer (to keep the suite fast), batch 4, AdamW state as optax makes it."""
    params = tiny_gpt.init(jax.random.key(0), layers=1)
    tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, 64)
    return params, tiny_gpt.optimizer.init(params), tokens


@pytest.fixture(scope="module")
def gpt_expected(gpt_example: tuple[Any, Any, Any]) -> Any:
    return jax.jit(tiny_gpt.train_step)(*gpt_example)


GPT_CASES = {
    "tp4": ((4,), ("tp",), "tp", None),
    "dp2xtp2": ((2, 2), ("dp", "tp"), "tp", "dp"),
    "dp4": ((4,), ("dp",), None, "dp"),
}


@pytest.mark.parametrize("case", list(GPT_CASES))
def test_tiny_gpt_train_step_equals_jax_jit(
    case: str, gpt_example: tuple[Any, Any, Any], gpt_expected: Any
) -> None:
    shape, names, tp, dp = GPT_CASES[case]
    params, opt_state, tokens = gpt_example
    the_mesh = ipujax.make_mesh(shape, names, target=ipujax.Target.mk2().with_tiles(64))
    specs = (_gpt_param_specs(params, tp), None, P(dp))
    compiled = compile_sharded(tiny_gpt.train_step, the_mesh, gpt_example, specs)
    axes = {a for op in collective_ops(compiled) for a in op.attrs["axes"]}
    assert axes == set(names), summary(compiled)
    new_params, new_state, loss = compiled(params, opt_state, tokens)
    expected_params, expected_state, expected_loss = gpt_expected
    assert_trees_close(loss, expected_loss)
    assert_trees_close(new_state, expected_state)  # AdamW's moments: the gradients
    _assert_adam_step_close(new_params, expected_params, expected_state)


def _assert_adam_step_close(ours: Any, expected: Any, expected_state: Any) -> None:
    """Parameters after AdamW's first step, to 1% of a step (lr 1e-3), where the step is well
    conditioned. The step is about lr * g / (|g| + eps) (eps 1e-8): for a gradient within
    100 eps of zero, a sum of cancelling terms, the last bits of g (which follow the order of
    summation) move it by a visible part of lr. There the gradient is checked through the
    moments, and the step only to be at most one step away (lr plus weight decay)."""
    assert_trees_close(ours, expected, atol=1e-3 + 1e-4)
    adam = expected_state[0]  # optax.adamw: (ScaleByAdamState, decay, lr)
    gradients = jax.tree.map(lambda mu: np.abs(np.asarray(mu)) / (1 - 0.9), adam.mu)
    for a, b, g in zip(*(jax.tree.leaves(t) for t in (ours, expected, gradients)), strict=True):
        conditioned = g > 100 * 1e-8
        assert conditioned.mean() > 0.9  # the exceptions stay few
        np.testing.assert_allclose(
            np.asarray(a)[conditioned], np.asarray(b)[conditioned], 1e-5, 1e-5
        )


# ---- with_sharding_constraint --------------------------------------------------------------------


def _model(x: jax.Array, w: jax.Array, constrain: bool = True) -> jax.Array:
    h = jnp.tanh(x @ w)
    if constrain:
        h = jax.lax.with_sharding_constraint(h, P("dp", None))
    return (h * 2.0).sum(axis=1)


_constrained = _model


def _oracle(x: np.ndarray, w: np.ndarray) -> jax.Array:
    """jax.jit of the model; the constraint changes no value, and jax.jit has no mesh here."""
    return jax.jit(functools.partial(_model, constrain=False))(x, w)


def test_with_sharding_constraint_inside_the_model() -> None:
    rng = np.random.RandomState(1)
    x, w = rng.randn(8, 8).astype(np.float32), rng.randn(8, 16).astype(np.float32)
    compiled = compile_sharded(
        _constrained, mesh((2, 2), ("dp", "tp")), (x, w), (P("dp"), P(None, "tp"))
    )
    assert_trees_close(compiled(x, w), _oracle(x, w))
    lines = [line for line in compiled.explain().splitlines() if "sharding_constraint" in line]
    assert len(lines) == 1
    # Without the constraint h would stay [{dp}, {tp}]; the constraint makes it whole over tp.
    assert "[{dp}, {}]" in lines[0]
    assert "with_sharding_constraint at" in lines[0]
    assert ("all_gather", TP) in [(op.name, op.attrs["axes"]) for op in collective_ops(compiled)]


def test_mesh_axis_that_splits_no_input() -> None:
    """dp splits no input: the constraint alone brings it in (each IPU takes its own rows)."""
    rng = np.random.RandomState(1)
    x, w = rng.randn(8, 8).astype(np.float32), rng.randn(8, 16).astype(np.float32)
    compiled = compile_sharded(
        _constrained, mesh((2, 2), ("dp", "tp")), (x, w), (P(), P(None, "tp"))
    )
    assert_trees_close(compiled(x, w), _oracle(x, w))
    only_out = compile_sharded(jnp.tanh, mesh((2,), ("dp",)), (x,), (P(),), P("dp"))
    assert only_out.partitioned.output_shardings == (Sharding((DP, ())),)
    assert_trees_close(only_out(x), jax.jit(jnp.tanh)(x))


# ---- uneven splits: padding is masked ------------------------------------------------------------
# A user's in_shardings must divide (as jax's), so the programs split their uneven rows with
# with_sharding_constraint, which jax lets pad, and the split propagates back to the inputs.


def _rows_split(fun: Any) -> Any:
    """`fun` with its arguments' rows split over dp (jax.jit runs `fun` itself, meshless)."""

    def split(*arrays: jax.Array) -> Any:
        return fun(*(jax.lax.with_sharding_constraint(a, P("dp")) for a in arrays))

    return split


def _elementwise_and_sums(x: jax.Array, k: jax.Array) -> tuple[jax.Array, ...]:
    y = jnp.exp(x) * 2.0 + 1.0  # padding with zeros would add 3 per padded row to the sums
    return y.sum(axis=0), jnp.sum(x * x), jnp.max(x, axis=0), jnp.sum(k, axis=0), k * 3


@pytest.mark.parametrize("rows", [10, 6])
def test_uneven_rows_elementwise_and_reductions(rows: int) -> None:
    rng = np.random.RandomState(rows)
    x = (-np.abs(rng.randn(rows, 3)) - 1.0).astype(np.float32)  # all < 0: a max sees padding
    k = rng.randint(-100, 100, (rows, 3)).astype(np.int32)
    the_mesh = mesh((4,), ("dp",))
    compiled = compile_sharded(_rows_split(_elementwise_and_sums), the_mesh, (x, k))
    local = compiled.partitioned.graph.inputs[0].shape
    assert local == (-(-rows // 4), 3)  # split with padding, not replicated
    assert_trees_close(compiled(x, k), jax.jit(_elementwise_and_sums)(x, k))


def _contract_rows(x: jax.Array, w: jax.Array) -> jax.Array:
    return x.T @ w


@pytest.mark.parametrize("rows", [10, 6])
def test_uneven_rows_contracted_by_a_matmul(rows: int) -> None:
    rng = np.random.RandomState(rows)
    x, w = rng.randn(rows, 3).astype(np.float32), rng.randn(rows, 5).astype(np.float32)
    compiled = compile_sharded(_rows_split(_contract_rows), mesh((4,), ("dp",)), (x, w))
    names = [op.name for op in compiled.partitioned.graph.ops]
    assert "shard_mask" in names
    assert [(op.name, op.attrs["axes"]) for op in collective_ops(compiled)] == [("all_reduce", DP)]
    assert_trees_close(compiled(x, w), jax.jit(_contract_rows)(x, w))


# ---- output shardings, propagated argument shardings ---------------------------------------------


def _layer(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w)


def test_out_shardings_replicated_or_split_give_the_same_values() -> None:
    rng = np.random.RandomState(2)
    x, w = rng.randn(8, 6).astype(np.float32), rng.randn(6, 5).astype(np.float32)
    expected = jax.jit(_layer)(x, w)
    the_mesh = mesh((4,), ("dp",))
    whole = compile_sharded(_layer, the_mesh, (x, w), (P("dp"), P()), P())
    split = compile_sharded(_layer, the_mesh, (x, w), (P("dp"), P()), P("dp"))
    assert whole.partitioned.output_shardings == (Sharding(((), ())),)
    assert split.partitioned.output_shardings == (Sharding((DP, ())),)
    assert [op.name for op in collective_ops(whole)] == ["all_gather"]
    assert collective_ops(split) == []
    assert_trees_close(whole(x, w), expected)
    assert_trees_close(split(x, w), expected)


def test_unannotated_argument_gets_its_sharding_by_propagation() -> None:
    args = ffn_args(8, 8, seed=3)
    the_mesh = mesh((2,), ("tp",))
    compiled = compile_sharded(ffn, the_mesh, args, (P(), P(None, "tp"), None))
    assert compiled.partitioned.input_shardings[2] == Sharding((TP, ()))
    (w2_line,) = [line for line in compiled.explain().splitlines() if line.startswith("  w2 ")]
    assert "propagated through dot_general" in w2_line
    # w2 is split by rows where it is stored, so the only traffic is Megatron's one AllReduce.
    assert summary(compiled) == [("all_reduce", TP, (8, 8))]
    assert_trees_close(compiled(*args), jax.jit(ffn)(*args))


# ---- ZeRO-1: optimiser state split over dp -------------------------------------------------------

_adamw = optax.adamw(1e-2)


def _mlp_loss(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jnp.mean(ffn(x, params["w1"], params["w2"]) ** 2)


def _zero1_step(params: Any, state: Any, x: jax.Array) -> tuple[Any, Any, jax.Array]:
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x)
    updates, state = _adamw.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss


def _zero1_compiled(tokens: int = 32) -> tuple[ipujax.Compiled, tuple[Any, ...]]:
    x, w1, w2 = ffn_args(tokens, 8, seed=4)
    params = {"w1": w1, "w2": w2}
    state = _adamw.init(params)
    state_specs = jax.tree.map(lambda a: P("dp") if np.ndim(a) else P(), state)
    args = (params, state, x)
    compiled = compile_sharded(
        _zero1_step,
        mesh((2,), ("dp",)),
        args,
        (P(), state_specs, P("dp")),
        (P(), state_specs, P()),
    )
    return compiled, args


def test_zero1_values_and_parameter_all_gather() -> None:
    compiled, args = _zero1_compiled()
    kinds = {(op.name, op.attrs["axes"]) for op in collective_ops(compiled)}
    assert ("all_gather", DP) in kinds  # the updated parameters, made whole again
    assert_trees_close(compiled(*args), jax.jit(_zero1_step)(*args))


def test_zero1_reduce_scatters_gradients() -> None:
    compiled, _ = _zero1_compiled()
    kinds = [(op.name, op.attrs["axes"]) for op in collective_ops(compiled)]
    assert ("reduce_scatter", DP) in kinds, summary(compiled)
    assert ("all_gather", DP) in kinds
