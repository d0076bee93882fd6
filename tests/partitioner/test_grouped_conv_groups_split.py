"""A grouped or depthwise convolution's groups split over IPUs, as its batch does: channels split
over a mesh axis leave each IPU the whole groups it holds, convolved with its group count
rewritten (forward, input gradient and weight gradient alike), with jax.jit's values and no
gather; a split whose shards do not divide the groups would cut a group in two, so the
partitioner gathers the channels instead and says why."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close
from jax import lax
from jax.sharding import PartitionSpec as P
from partition_helpers import compile_sharded, mesh

import ipujax
from lowering import Op, lower
from partitioner.sharding.factor_rules import FACTOR_RULES

CHANNELS_SPLIT = P(None, None, None, "tp")  # NHWC images and HWIO weights: the channels


def _conv(x: jax.Array, w: jax.Array, groups: int) -> jax.Array:
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
    )  # fmt: skip


def _value_and_grads(groups: int):
    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.square(jnp.tanh(_conv(x, w, groups))))

    return jax.value_and_grad(loss, argnums=(0, 1))


def _args(channels: int, groups: int, batch: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(channels + groups)
    w = (0.3 * rng.randn(3, 3, channels // groups, channels)).astype(np.float32)
    x = rng.randn(batch, 6, 6, channels).astype(np.float32)
    return w, x


def _grouped_convs(ops: tuple[Op, ...]) -> dict[str, list[Op]]:
    """The per-IPU program's convolutions by role: forward and input gradient (feature groups,
    images out), weight gradient (batch groups, a 3x3 kernel out). By shape, not group count:
    an IPU holding one group runs a dense convolution."""
    convs = [op for op in ops if op.name == "convolution"]
    kernels = [op for op in convs if op.results[0].shape[:2] == (3, 3)]
    return {"feature": [op for op in convs if op not in kernels], "batch": kernels}


def test_a_depthwise_convolutions_groups_are_one_factor_of_its_channels() -> None:
    w, x = _args(8, 8)
    graph = lower(jax.grad(lambda w, x: jnp.sum(_conv(x, w, 8))), w, x)
    forward, grad = [op for op in graph.ops if op.name == "convolution"][:2]
    factors = FACTOR_RULES["convolution"](forward)
    # NHWC x, HWIO w: x's channels, w's output features and the result's channels.
    groups = factors.operands[0][3]
    assert groups is not None and groups not in factors.reduction
    assert factors.operands[1][3] == factors.results[0][3] == groups
    assert factors.sizes[groups] == 8
    factors = FACTOR_RULES["convolution"](grad)
    # The weight gradient holds the groups in its lhs batch role (x's channels), dy's
    # channels and dw's output features; x's images stay the contracted reduction.
    (lb, lf, *_), (ro, _, *_), (_, of, *_) = grad.attrs["dimension_numbers"]
    groups = factors.operands[0][lb]
    assert groups is not None and groups not in factors.reduction
    assert factors.operands[1][ro] == factors.results[0][of] == groups
    assert factors.operands[0][lf] in factors.reduction


# (channels, groups): depthwise, and group width 16 (as Graphcore trained EfficientNet).
SPLIT = {
    "depthwise-tp2": (8, 8, 2),
    "depthwise-tp4": (8, 8, 4),
    "width16-tp2": (64, 4, 2),
    "width16-tp4": (64, 4, 4),
}


@pytest.mark.filterwarnings("error::ipujax.ReplicationWarning")
@pytest.mark.parametrize("case", list(SPLIT))
def test_grouped_channels_split_over_ipus_convolve_local_groups(case: str) -> None:
    channels, groups, ipus = SPLIT[case]
    fun, args = _value_and_grads(groups), _args(channels, groups)
    compiled = compile_sharded(fun, mesh((ipus,), ("tp",)), args, (CHANNELS_SPLIT, CHANNELS_SPLIT))
    assert_trees_close(compiled(*args), jax.jit(fun)(*args), rtol=2e-5, atol=2e-6)
    ops = compiled.built.graph.ops
    assert not [op for op in ops if op.name == "all_gather"]
    assert compiled.partitioned.forced_whole == ()
    convs = _grouped_convs(ops)
    # Forward and input gradient: each IPU's share of the channels, its share of the groups
    # (one group a dense convolution); the weight gradient likewise in its batch groups.
    assert len(convs["feature"]) == 2 and len(convs["batch"]) == 1
    for op in convs["feature"]:
        assert op.operands[0].shape[3] == channels // ipus
        assert op.attrs["feature_group_count"] == groups // ipus
    (dw,) = convs["batch"]
    assert dw.operands[0].shape[3] == channels // ipus
    assert dw.attrs["batch_group_count"] == groups // ipus
    assert dw.results[0].shape == (3, 3, channels // groups, channels // ipus)


@pytest.mark.filterwarnings("error::ipujax.ReplicationWarning")
def test_batch_over_replicas_and_groups_over_ipus_leave_a_partial_sum_over_replicas() -> None:
    fun, args = _value_and_grads(4), _args(64, 4, batch=8)
    specs = (CHANNELS_SPLIT, P("dp", None, None, "tp"))
    compiled = compile_sharded(fun, mesh((2, 2), ("dp", "tp")), args, specs)
    assert_trees_close(compiled(*args), jax.jit(fun)(*args), rtol=2e-5, atol=2e-6)
    ops = compiled.built.graph.ops
    assert not [op for op in ops if op.name == "all_gather"]
    (dw,) = _grouped_convs(ops)["batch"]
    assert dw.operands[0].shape == (4, 6, 6, 32) and dw.attrs["batch_group_count"] == 2
    # The weight gradient's images are summed over the replicas alone: its groups are split.
    reduced = [op for op in ops if op.name == "all_reduce" and dw.results[0] in op.operands]
    assert reduced and all(op.attrs["axes"] == ("dp",) for op in reduced)


# Shards that do not divide the groups: 4 groups over 3 IPUs, 2 groups over 4 (half a group each).
UNEVEN = {"4-groups-over-3": (12, 4, 3), "2-groups-over-4": (32, 2, 4)}


@pytest.mark.parametrize("case", list(UNEVEN))
def test_shards_that_do_not_divide_the_groups_gather_the_channels_and_say_why(case: str) -> None:
    channels, groups, ipus = UNEVEN[case]
    fun, args = _value_and_grads(groups), _args(channels, groups)
    with pytest.warns(ipujax.ReplicationWarning, match=f"its {groups} groups do not split"):
        compiled = compile_sharded(
            fun, mesh((ipus,), ("tp",)), args, (CHANNELS_SPLIT, CHANNELS_SPLIT)
        )
    assert_trees_close(compiled(*args), jax.jit(fun)(*args), rtol=2e-5, atol=2e-6)
    convs = _grouped_convs(compiled.built.graph.ops)
    assert all(op.attrs["feature_group_count"] == groups for op in convs["feature"])
    assert all(op.attrs["batch_group_count"] == groups for op in convs["batch"])
    assert all(op.operands[0].shape[3] == channels for op in convs["feature"])
    why = f"its {groups} groups do not split evenly over {ipus} IPUs"
    assert any(why in str(f) for f in compiled.partitioned.forced_whole)
    assert why in compiled.explain()
