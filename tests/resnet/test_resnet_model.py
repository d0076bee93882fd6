"""model.py: the small ResNet's loss, gradients and batch norm statistics under ipujax.jit on one
IPU equal jax.jit's; the program holds convolutions, max pooling and its gradient; ResNet-50 has
torchvision's shapes."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ipujax


def one_ipu() -> ipujax.Mesh:
    return ipujax.make_mesh((1,), ("ipu",), target=ipujax.Target.mk2().with_tiles(64))


def batch(n: int) -> tuple[jax.Array, jax.Array]:
    images = jax.random.normal(jax.random.key(1), (n, 32, 32, 3), jnp.float32)
    return images, jnp.arange(n, dtype=jnp.int32) % 10


def test_loss_and_grads_equal_jax_jit_on_one_ipu(resnet: SimpleNamespace) -> None:
    config = resnet.model.small_config()
    params, bn_state = resnet.model.init(config, jax.random.key(0))
    images, labels = batch(2)

    def loss(p: object, s: object, x: jax.Array, y: jax.Array) -> object:
        return resnet.model.loss_fn(p, s, x, y, config)

    fun = jax.value_and_grad(loss, has_aux=True)
    jitted = ipujax.jit(fun, mesh=one_ipu())
    text = jitted.lower(params, bn_state, images, labels).as_text()
    for op in ("convolution", "reduce_window", "select_and_scatter"):
        assert f"= {op}(" in text, op  # max pooling's gradient is a select_and_scatter
    got = jitted(params, bn_state, images, labels)
    want = jax.jit(fun)(params, bn_state, images, labels)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    (value, new_state), grads = got
    assert np.isfinite(float(value))
    assert jax.tree.structure(new_state) == jax.tree.structure(bn_state)
    assert jax.tree.structure(grads) == jax.tree.structure(params)


def test_batch_norm_statistics_and_eval_mode(resnet: SimpleNamespace) -> None:
    model = resnet.model
    x = 3.0 + 2.0 * jax.random.normal(jax.random.key(2), (4, 8, 8, 5), jnp.float32)
    p = {"scale": jnp.ones(5), "bias": jnp.zeros(5)}
    stats = {"mean": jnp.zeros(5), "var": jnp.ones(5)}
    y, new = model.batch_norm(x, p, stats)
    np.testing.assert_allclose(np.asarray(y.mean(axis=(0, 1, 2))), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(y.std(axis=(0, 1, 2))), 1.0, rtol=1e-3)
    mean = np.asarray(x).mean(axis=(0, 1, 2))
    np.testing.assert_allclose(np.asarray(new["mean"]), (1 - model.BN_MOMENTUM) * mean, rtol=1e-5)
    z, same = model.batch_norm(x, p, new, train=False)
    assert same is new and z.shape == x.shape


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_resnet50_shapes(resnet: SimpleNamespace, dtype: str) -> None:
    config = resnet.model.resnet50_config(dtype)
    params, bn_state = jax.eval_shape(lambda: resnet.model.init(config, jax.random.key(0)))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == 25_557_032  # torchvision
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(dtype)}
    assert {x.dtype for x in jax.tree.leaves(bn_state)} == {jnp.dtype("float32")}
    assert [len(s) for s in params["stages"]] == [3, 4, 6, 3]
    assert params["stem"]["w"].shape == (7, 7, 3, 64)
    assert params["head"]["w"].shape == (2048, 1000)
    images = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.dtype(dtype))
    logits, new_state = jax.eval_shape(
        lambda p, s, x: resnet.model.forward(p, s, x, config), params, bn_state, images
    )
    assert logits.shape == (2, 1000) and logits.dtype == jnp.dtype(dtype)
    assert jax.tree.structure(new_state) == jax.tree.structure(bn_state)


def test_blocks_run_under_their_named_scopes(resnet: SimpleNamespace) -> None:
    config = resnet.model.small_config()
    names = resnet.model.block_names(config)
    assert names == ["stage1/block0", "stage2/block0", "stage3/block0"]
    params, bn_state = resnet.model.init(config, jax.random.key(0))
    images, labels = batch(2)
    lowered = ipujax.jit(
        lambda p, s, x, y: resnet.model.loss_fn(p, s, x, y, config)[0], mesh=one_ipu()
    ).lower(params, bn_state, images, labels)
    scopes = " ".join(op.loc.scope for op in lowered.graph.ops)
    for name in ["stem", *names, "head", "loss"]:
        assert f"{name}/" in scopes, name


def test_unknown_optimizer(resnet: SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="adam"):
        resnet.model.make_optimizer("adam")


@pytest.mark.multi_ipu
def test_per_replica_batch_norm_with_accumulation_equals_jax_jit_on_dp4(
    resnet: SimpleNamespace,
) -> None:
    """Graphcore's data-parallel configuration on a small ResNet: each replica's batch norm
    over its own share of the batch with its own running statistics, 8-bit images, and two
    micro-batches' gradients accumulated before the update; on 4 IPUs it equals jax.jit, and
    the statistics need no collective (only the loss and the gradients are AllReduced)."""
    model = resnet.model
    config = model.small_config()
    optimizer = model.make_optimizer("sgd")
    params, bn_state = model.init(config, jax.random.key(0))
    stats = jax.tree.map(lambda s: jnp.stack([s] * 4), bn_state)
    images = jax.random.randint(jax.random.key(1), (2, 8, 32, 32, 3), 0, 256).astype(jnp.uint8)
    labels = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 10
    args = (params, stats, model.init_optimizer(optimizer, params), images, labels)
    step = model.make_train_step(optimizer, config, replicas=4, accumulation=2)
    mesh = ipujax.make_mesh((4,), ("dp",), target=ipujax.Target.mk2().with_tiles(64))
    specs = resnet.sharding.train_specs(mesh, accumulation=2, per_replica_stats=True)
    compiled = ipujax.jit(step, mesh=mesh, in_shardings=specs).lower(*args).compile()
    got, want = compiled(*args), jax.jit(step)(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    # No collective for the statistics: none at the lines of `_moments`.
    lines, first = inspect.getsourcelines(model._moments)
    moments = {f"model.py:{n}" for n in range(first, first + len(lines))}
    sources = {c.source.rsplit("/", 1)[-1] for c in compiled.cost_report().collectives}
    assert sources and not sources & moments, sources


def test_recomputation_runs_end_at_the_checkpoints(resnet: SimpleNamespace) -> None:
    model = resnet.model
    config = model.resnet50_config()
    # Graphcore's TensorFlow 1 splits: seven runs, every one recomputed but the last, the stem
    # with the first block; the last run reaches the end of the network.
    runs = model.segments(config, resnet.workloads.TF1_CHECKPOINTS)
    checkpoints = resnet.workloads.TF1_CHECKPOINTS
    assert [names[-1] for names, _ in runs] == [*checkpoints, "stage4/block2"]
    assert runs[1][0] == ["stage1/block1", "stage1/block2"]  # unit2 and unit3, recomputed
    assert runs[0][0] == ["stem", "stage1/block0"]
    assert [recomputed for _, recomputed in runs] == [True] * 6 + [False]
    assert sum(len(names) for names, _ in runs) == 1 + 16
    # True: the stem kept, each block recomputed alone; False: one run, kept whole.
    every = model.segments(config, True)
    assert every[0] == (["stem"], False) and len(every) == 17
    assert all(recomputed and len(names) == 1 for names, recomputed in every[1:])
    assert model.segments(config, False) == [(["stem", *model.block_names(config)], False)]
    with pytest.raises(ValueError, match="stage9/block0"):
        model.segments(config, ("stage9/block0",))


@pytest.mark.parametrize("remat", [True, ("stage1/block0",), ("stage2/block0", "stage3/block0")])
def test_checkpointed_gradients_equal_jax_jit(resnet: SimpleNamespace, remat: object) -> None:
    config = resnet.model.small_config()
    params, bn_state = resnet.model.init(config, jax.random.key(0))
    images, labels = batch(2)

    def loss(p: object, s: object, x: jax.Array, y: jax.Array) -> object:
        return resnet.model.loss_fn(p, s, x, y, config, remat)

    fun = jax.value_and_grad(loss, has_aux=True)
    got = ipujax.jit(fun, mesh=one_ipu())(params, bn_state, images, labels)
    want = jax.jit(fun)(params, bn_state, images, labels)
    plain = jax.jit(jax.value_and_grad(lambda *a: resnet.model.loss_fn(*a, config), has_aux=True))
    for a, b, c in zip(
        jax.tree.leaves(got),
        jax.tree.leaves(want),
        jax.tree.leaves(plain(params, bn_state, images, labels)),
        strict=True,
    ):
        # to rounding: the recomputed forward's sums may be split over tiles otherwise
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(b), np.asarray(c), rtol=1e-5, atol=1e-6)
