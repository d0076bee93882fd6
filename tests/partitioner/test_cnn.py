"""A small CNN (convolutions, batch norm, max pooling and their gradients) partitioned over 1,
4 and 16 IPUs, data parallel and with its channels split, against jax.jit; and what the split
means: each IPU convolves its share of the batch, batch-norm statistics over a split batch are
partial sums finished by an AllReduce (distributed batch norm), and the weights' gradients are
AllReduced over the replicas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import ipujax

pytestmark = pytest.mark.filterwarnings("error::ipujax.ReplicationWarning")

TARGET = ipujax.Target.bow().with_tiles(16)
CHANNELS = (8, 16)


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    return lax.conv_general_dilated(
        x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def batch_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, groups: int = 1) -> jax.Array:
    """Statistics over the batch and the field; with `groups`, over each group of the batch
    apart (a replica's batch, as Graphcore's data-parallel CNNs normalise)."""
    n, h, w, c = x.shape
    g = x.reshape(groups, n // groups, h, w, c)
    mean = jnp.mean(g, axis=(1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 3), keepdims=True)
    return ((g - mean) * lax.rsqrt(var + 1e-5)).reshape(x.shape) * scale + bias


def max_pool(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def model(params: dict, x: jax.Array, groups: int = 1) -> jax.Array:
    h = jax.nn.relu(batch_norm(conv(x, params["w1"]), params["g1"], params["b1"], groups))
    h = max_pool(h)
    h = jax.nn.relu(batch_norm(conv(h, params["w2"], 2), params["g2"], params["b2"], groups))
    return jnp.mean(h, axis=(1, 2)) @ params["wo"]


def loss(params: dict, x: jax.Array, y: jax.Array, groups: int = 1) -> jax.Array:
    logits = model(params, x, groups)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


def step(params: dict, x: jax.Array, y: jax.Array, groups: int = 1):
    return jax.value_and_grad(loss)(params, x, y, groups)


def make_args(batch: int = 16, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    a, b = CHANNELS
    params = {
        "w1": 0.3 * rng.randn(3, 3, 3, a),
        "g1": 1 + 0.1 * rng.randn(a),
        "b1": 0.1 * rng.randn(a),
        "w2": 0.2 * rng.randn(3, 3, a, b),
        "g2": 1 + 0.1 * rng.randn(b),
        "b2": 0.1 * rng.randn(b),
        "wo": 0.2 * rng.randn(b, 10),
    }
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x = rng.randn(batch, 12, 12, 3).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.randint(0, 10, batch)]
    return params, x, y


def channel_split(axis: str) -> dict:
    """The first convolution's output channels and the second's input channels over `axis`
    (Megatron's pair for convolutions): the second convolution is a partial sum."""
    return {
        "w1": P(None, None, None, axis),
        "g1": P(axis),
        "b1": P(axis),
        "w2": P(None, None, axis, None),
        "g2": P(),
        "b2": P(),
        "wo": P(),
    }


MESHES = [
    ((1,), ("dp",), None),
    ((4,), ("dp",), None),
    ((16,), ("dp",), None),
    ((2, 2), ("dp", "tp"), "tp"),
    ((4, 4), ("dp", "tp"), "tp"),
]


def _compile(shape, names, split, groups=1, batch=16):
    params, x, y = make_args(batch)
    specs = channel_split(split) if split else {k: P() for k in params}
    mesh = ipujax.make_mesh(shape, names, target=TARGET)
    fun = lambda p, x, y: step(p, x, y, groups)  # noqa: E731
    # Each collective apart, as the partitioner emits it (`test_combine` checks combining).
    jitted = ipujax.jit(
        fun, mesh=mesh, in_shardings=(specs, P("dp"), P("dp")), collective_buffer_bytes=0
    )
    return jitted.lower(params, x, y).compile(), (params, x, y), fun


def _assert_close(got, want) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(("shape", "names", "split"), MESHES)
def test_a_cnn_step_equals_jax_jit(shape, names, split) -> None:
    compiled, args, fun = _compile(shape, names, split)
    _assert_close(compiled(*args), jax.jit(fun)(*args))


@pytest.mark.parametrize("groups", [4, 16])
def test_batch_norm_per_replica_equals_jax_jit_and_needs_no_statistics_collective(groups):
    compiled, args, fun = _compile((groups,), ("dp",), None, groups=groups, batch=2 * groups)
    _assert_close(compiled(*args), jax.jit(fun)(*args))
    # Only the gradients and the loss cross IPUs: one AllReduce per weight (7) and one for
    # the loss's mean over the batch, none for the statistics.
    reduced = [c for c in compiled.cost_report().collectives if c.kind == "all_reduce"]
    assert len(reduced) == 8, [c.why for c in reduced]


def _local(compiled, name: str) -> list:
    return [op for op in compiled.built.graph.ops if op.name == name]


def test_data_parallel_convolutions_run_on_each_replicas_share_of_the_batch() -> None:
    compiled, (_, x, _), _ = _compile((4,), ("dp",), None)
    # Forward, input-gradient and weight-gradient convolutions all read the images' (or
    # their gradients') local batch: 4 of 16.
    convs = _local(compiled, "convolution")
    assert len(convs) == 5  # two forward, one input gradient (none for x), two for weights
    assert all(op.operands[0].shape[0] == x.shape[0] // 4 for op in convs)
    pools = _local(compiled, "reduce_window") + _local(compiled, "select_and_scatter")
    assert pools and all(op.results[0].shape[0] == x.shape[0] // 4 for op in pools)


def test_global_batch_norm_is_distributed_and_weight_gradients_are_all_reduced() -> None:
    compiled, (params, *_), _ = _compile((4,), ("dp",), None)
    collectives = compiled.cost_report().collectives
    kinds = {c.kind for c in collectives}
    assert kinds == {"all_reduce"}
    reduced_bytes = sorted(c.bytes_per_ipu for c in collectives)
    # Ring AllReduce of each weight's f32 gradient over 4: 2 x 3/4 of its bytes.
    for name in ("w1", "w2"):
        assert int(2 * 3 * params[name].nbytes / 4) in reduced_bytes
    # The statistics: each batch norm's mean and variance (forward) and two sums in its
    # gradient, per channel.
    per_channel = [
        c for c in collectives if c.bytes_per_ipu in (2 * 3 * 4 * n // 4 for n in CHANNELS)
    ]
    assert len(per_channel) >= 8


def accumulated_step(params: dict, xs: jax.Array, ys: jax.Array):
    """Gradients accumulated over micro-batches by a scan: xs [micro-batches, batch, ...]."""

    def body(carry, xy):
        value, grads = step(params, *xy)
        return jax.tree.map(jnp.add, carry, (value, grads)), None

    zero = jax.tree.map(jnp.zeros_like, (jnp.zeros(()), params))
    total, _ = lax.scan(body, zero, (xs, ys))
    return total


def test_gradients_accumulated_over_micro_batches_are_all_reduced_once() -> None:
    params, x, y = make_args(16)
    xs, ys = x.reshape(2, 8, *x.shape[1:]), y.reshape(2, 8, *y.shape[1:])
    mesh = ipujax.make_mesh((4,), ("dp",), target=TARGET)
    specs = ({k: P() for k in params}, P(None, "dp"), P(None, "dp"))
    jitted = ipujax.jit(accumulated_step, mesh=mesh, in_shardings=specs, collective_buffer_bytes=0)
    compiled = jitted.lower(params, xs, ys).compile()
    _assert_close(compiled(params, xs, ys), jax.jit(accumulated_step)(params, xs, ys))
    # Every gradient stays a partial sum, the loop's accumulators carrying it from micro-batch
    # to micro-batch on each IPU (through views: the dense layer's is a transpose, the batch
    # norm's scale and bias pass a unit-dim broadcast), and is AllReduced once, after the
    # loop, as is the summed loss (a mean: a sum over a count); the statistics of the global
    # batch norm, once per micro-batch.
    one, _, _ = _compile((4,), ("dp",), None, batch=8)
    single = len(one.cost_report().collectives)
    collectives = compiled.cost_report().collectives
    once = sorted(c.bytes_per_ipu for c in collectives if c.why.startswith("an output"))
    reduced = [int(2 * 3 * value.nbytes / 4) for value in params.values()]
    assert once == sorted([*reduced, 2 * 3 * 4 // 4])  # and the loss, one float32
    assert len(collectives) == 2 * single - len(once)


def _reduced_per_step(micro_batches: int) -> list[tuple[str, int]]:
    """The all-reduces of a data-parallel step over `micro_batches` micro-batches of 8 images
    per replica (batch norm over each replica's own, as Graphcore ran ResNet-50), combined as
    the partitioner combines them: (kind, bytes per IPU), in order."""
    params, x, y = make_args(8 * 4 * micro_batches)
    mesh = ipujax.make_mesh((4,), ("dp",), target=TARGET)
    specs = {k: P() for k in params}
    if micro_batches == 1:
        fun = lambda p, x, y: step(p, x, y, groups=4)  # noqa: E731
        args, batch = (params, x, y), P("dp")
    else:

        def fun(p, xs, ys):
            def body(carry, xy):
                return jax.tree.map(jnp.add, carry, step(p, *xy, groups=4)), None

            zero = jax.tree.map(jnp.zeros_like, (jnp.zeros(()), p))
            return lax.scan(body, zero, (xs, ys))[0]

        shape = lambda a: a.reshape(micro_batches, -1, *a.shape[1:])  # noqa: E731
        args, batch = (params, shape(x), shape(y)), P(None, "dp")
    jitted = ipujax.jit(fun, mesh=mesh, in_shardings=(specs, batch, batch))
    compiled = jitted.lower(*args).compile()
    assert compiled.partitioned is not None
    inside = [op for op in compiled.partitioned.graph.ops if op.name == "while" for _ in op.regions]
    for loop in inside:
        body = loop.regions[1]
        assert not [o for o in body.ops if o.name == "all_reduce" and o.operands[0].size > 1]
    return [(c.kind, c.bytes_per_ipu) for c in compiled.cost_report().collectives]


def test_an_accumulated_step_all_reduces_each_gradient_once() -> None:
    """Over 6 micro-batches, the same all-reduces as over one: every gradient (batch norm's
    scale and bias included) is carried as a partial sum through the loop and reduced once,
    after it, combined into the same buffers."""
    assert _reduced_per_step(6) == _reduced_per_step(1)
