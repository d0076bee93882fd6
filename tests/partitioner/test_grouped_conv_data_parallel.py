"""Grouped convolutions split like dense ones over IPUs: the batch of a grouped convolution is a
free factor, and in its weight gradient (jax's `batch_group_count` > 1, the images in the
input-feature role) a reduction, so a data-parallel batch leaves the gradient a partial sum
AllReduced over the replicas, as the dense rule does. An EfficientNet-like network with group
width 16 (as Graphcore trained EfficientNet) runs on dp = 1, 2, 4 with jax.jit's values, no
op run whole, and the same per-IPU work whatever the replicas."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_trees_close, load_example
from jax import lax
from jax.sharding import PartitionSpec as P

import ipujax
from lowering import lower
from partitioner.sharding.factor_rules import FACTOR_RULES

pytestmark = pytest.mark.filterwarnings("error::ipujax.ReplicationWarning")

TARGET = ipujax.Target.bow().with_tiles(64)
GROUPS = 4


def _grouped(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=GROUPS,
    )  # fmt: skip


def _loss(w, x):
    return jnp.mean(jnp.square(_grouped(x, w)))


def _args(batch: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    w = rng.randn(3, 3, 2, 8).astype(np.float32)
    x = rng.randn(batch, 6, 6, 8).astype(np.float32)
    return w, x


def test_a_grouped_convolutions_batch_is_free_and_its_weight_gradients_batch_a_reduction():
    w, x = _args()
    graph = lower(jax.grad(_loss), w, x)
    forward, grad = [op for op in graph.ops if op.name == "convolution"]
    assert forward.attrs["feature_group_count"] == GROUPS
    factors = FACTOR_RULES["convolution"](forward)
    # NHWC images: the batch (dim 0) of the input and the output is one factor, not a
    # reduction; the channels, which hold the groups, are another (whole groups, never a sum).
    assert factors.operands[0][0] == factors.results[0][0] is not None
    assert factors.operands[0][0] not in factors.reduction
    assert factors.operands[0][3] not in (None, factors.operands[0][0], *factors.reduction)
    assert grad.attrs["batch_group_count"] == GROUPS
    factors = FACTOR_RULES["convolution"](grad)
    # The weight gradient reads x and dy with the images as its input features (dim 0 of
    # both): one reduction factor, so a split batch leaves a partial sum.
    (lb, lf, *_), (ro, ri, *_), _ = grad.attrs["dimension_numbers"]
    assert factors.operands[0][lf] == factors.operands[1][ri] in factors.reduction
    # Its lhs batch (x's channels) and rhs output features (dy's channels) are the groups.
    assert factors.operands[0][lb] == factors.operands[1][ro] not in factors.reduction


def test_a_grouped_weight_gradient_over_replicas_is_a_partial_sum_all_reduced() -> None:
    w, x = _args()
    fun = jax.value_and_grad(_loss)
    mesh = ipujax.make_mesh((4,), ("dp",), target=TARGET)
    compiled = ipujax.jit(fun, mesh=mesh, in_shardings=(P(), P("dp"))).lower(w, x).compile()
    assert_trees_close(compiled(w, x), jax.jit(fun)(w, x), rtol=2e-5, atol=2e-6)
    ops = compiled.built.graph.ops
    convs = [op for op in ops if op.name == "convolution"]
    # Forward and weight gradient each on a quarter of the batch, nothing gathered.
    assert len(convs) == 2
    assert all(op.operands[0].shape[0] == x.shape[0] // 4 for op in convs)
    assert not [op for op in ops if op.name == "all_gather"]
    (reduced,) = [op for op in ops if op.name == "all_reduce"]
    assert w.shape in [v.shape for v in reduced.operands]


PER_REPLICA = 2  # images per IPU


def _network_step(dp: int) -> tuple[ipujax.Compiled, tuple, Callable]:
    model = load_example("efficientnet", "model")
    config = model.Config()
    params = model.init(jax.random.PRNGKey(0), config)
    rng = np.random.RandomState(dp)
    size = config.image_size
    x = rng.randn(PER_REPLICA * dp, size, size, config.channels).astype(np.float32)
    labels = rng.randint(0, config.num_classes, PER_REPLICA * dp).astype(np.int32)
    fun = lambda p, x, y: model.train_step(p, x, y, config)  # noqa: E731
    mesh = ipujax.make_mesh((dp,), ("dp",), target=TARGET)
    jitted = ipujax.jit(fun, mesh=mesh, in_shardings=(P(), P("dp"), P("dp")))
    return jitted.lower(params, x, labels).compile(), (params, x, labels), fun


def _per_ipu_work(compiled: ipujax.Compiled) -> tuple[int, int]:
    """Cycles and number of the supersteps each IPU runs on its own: all but collectives and
    the host's."""
    steps = compiled.cost_report().supersteps
    own = [s for s in steps if s.kind not in ("collective", "host")]
    return sum(s.cycles for s in own), len(own)


NORMS = 8  # the stem's, the head's and three in each of the two blocks


def test_a_grouped_convolution_network_runs_data_parallel_at_the_same_work_per_ipu() -> None:
    work = {}
    for dp in (1, 2, 4):
        compiled, args, fun = _network_step(dp)
        assert_trees_close(compiled(*args), jax.jit(fun)(*args), rtol=2e-5, atol=2e-6)
        work[dp] = _per_ipu_work(compiled)
        grouped = [
            op
            for op in compiled.built.graph.ops
            if op.name == "convolution"
            and (op.attrs["feature_group_count"] > 1 or op.attrs["batch_group_count"] > 1)
        ]
        # Each grouped convolution (two forward, two input and two weight gradients) on its
        # replica's images alone.
        assert len(grouped) == 6
        assert not [op for op in compiled.built.graph.ops if op.name == "all_gather"]
    # Each IPU runs the same images whatever the replicas: its own work does not grow with
    # them (the gradients' AllReduces and batch norm's statistics are collectives). On a
    # mesh, each batch norm's two sums (the model's two-pass mean and variance) finish after
    # their AllReduce, their division a step of its own (a few hundred cycles each on this
    # 64-tile target) rather than the reduction's epilogue: that is the step from one IPU to
    # two, and nothing else.
    assert work[4] == work[2], work
    (cycles_1, steps_1), (cycles_2, steps_2) = work[1], work[2]
    assert steps_2 - steps_1 == 2 * NORMS, work
    assert 0 < cycles_2 - cycles_1 <= 2 * NORMS * 1_000, work
