"""flax.linen models through ipujax.jit against jax.jit: an MLP with `nn.BatchNorm` (its
`batch_stats` collection mutable) and `nn.Dropout` (its rng passed as `rngs={"dropout": key}`),
and a tiny pre-norm transformer block, each as a full training step (loss, gradients with
`jax.value_and_grad`, an optax update) on one IPU, dp=4 and dp=2 x tp=2."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from layouts import Layout

BATCH, FEATURES, HIDDEN, CLASSES = 8, 16, 32, 4
SEQ, D_MODEL, HEADS = 4, 16, 2


class MLP(nn.Module):
    """Dense -> BatchNorm -> relu -> Dropout -> Dense. The first Dense has no bias: BatchNorm
    removes it, so its gradient would be rounding noise that Adam scales up to a full step."""

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Dense(HIDDEN, use_bias=False, name="hidden")(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.relu(x)
        x = nn.Dropout(0.25, deterministic=not train)(x)
        return nn.Dense(CLASSES, name="head")(x)


class Block(nn.Module):
    """A pre-norm transformer block: self-attention and an MLP, each with dropout. The attention
    has no biases: the key bias's gradient is zero (softmax ignores a shift shared by all keys),
    rounding noise that Adam would scale up to a full step."""

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=HEADS, dropout_rate=0.1, use_bias=False)(
            h, h, deterministic=not train
        )
        x = x + nn.Dropout(0.1, deterministic=not train)(h)
        h = nn.LayerNorm()(x)
        h = nn.Dense(2 * D_MODEL, name="up")(h)
        h = nn.Dense(D_MODEL, name="down")(nn.gelu(h))
        return x + nn.Dropout(0.1, deterministic=not train)(h)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    return x, rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)


TX = optax.adamw(1e-2, weight_decay=1e-2)


def _mlp_step(params: Any, stats: Any, opt: Any, key: jax.Array, x: jax.Array, y: jax.Array):
    def loss_fn(p: Any) -> tuple[jax.Array, Any]:
        logits, updates = MLP().apply(
            {"params": p, "batch_stats": stats},
            x,
            train=True,
            rngs={"dropout": key},
            mutable=["batch_stats"],
        )
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates["batch_stats"]

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), stats, opt, loss


def test_mlp_with_batchnorm_and_dropout_train_step(layout: Layout) -> None:
    x, y = _batch()
    variables = MLP().init(jax.random.key(0), x, train=False)
    params, stats = variables["params"], variables["batch_stats"]
    opt = TX.init(params)
    args = (params, stats, opt, jax.random.key(1), x, y)
    specs = (layout.weights(params, ["hidden"]), None, None, None, layout.batch, layout.batch)
    params, stats, _, loss = layout.check(_mlp_step, args, specs)
    assert np.isfinite(loss)
    # The running statistics moved towards this batch's.
    assert not np.allclose(stats["BatchNorm_0"]["mean"], 0.0)


def _block_step(params: Any, opt: Any, key: jax.Array, x: jax.Array, target: jax.Array):
    def loss_fn(p: Any) -> jax.Array:
        out = Block().apply({"params": p}, x, train=True, rngs={"dropout": key})
        return jnp.mean((out - target) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss


def test_transformer_block_train_step(layout: Layout) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BATCH, SEQ, D_MODEL)).astype(np.float32)
    target = rng.normal(size=(BATCH, SEQ, D_MODEL)).astype(np.float32)
    params = Block().init(jax.random.key(2), x, train=False)["params"]
    opt = TX.init(params)
    args = (params, opt, jax.random.key(3), x, target)
    specs = (layout.weights(params, ["up"]), None, None, layout.batch, layout.batch)
    layout.check(_block_step, args, specs)
