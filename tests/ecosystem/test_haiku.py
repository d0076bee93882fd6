"""dm-haiku models through ipujax.jit against jax.jit: `hk.transform_with_state` of an MLP with
`hk.BatchNorm` (its moving averages the state) and `hk.dropout` (drawing from the rng the step
is given), and `hk.transform` of a plain MLP, each as a training step with optax on one IPU,
dp=4 and dp=2 x tp=2."""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import numpy as np
import optax
from layouts import Layout

BATCH, FEATURES, HIDDEN, CLASSES = 8, 16, 32, 4
TX = optax.adam(1e-2)


def _with_batchnorm(x: jax.Array, is_training: bool) -> jax.Array:
    # No bias before BatchNorm: it removes it, so its gradient would be rounding noise that
    # Adam scales up to a full step.
    x = hk.Linear(HIDDEN, with_bias=False, name="hidden")(x)
    x = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(x, is_training)
    x = jax.nn.relu(x)
    if is_training:
        x = hk.dropout(hk.next_rng_key(), 0.25, x)
    return hk.Linear(CLASSES, name="head")(x)


def _plain(x: jax.Array) -> jax.Array:
    x = jax.nn.gelu(hk.Linear(HIDDEN, name="hidden")(x))
    x = hk.dropout(hk.next_rng_key(), 0.25, x)
    return hk.Linear(CLASSES, name="head")(x)


WITH_STATE = hk.transform_with_state(_with_batchnorm)
PLAIN = hk.transform(_plain)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    return x, rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)


def _stateful_step(params: Any, state: Any, opt: Any, key: jax.Array, x: jax.Array, y: jax.Array):
    def loss_fn(params: Any) -> tuple[jax.Array, Any]:
        logits, state_ = WITH_STATE.apply(params, state, key, x, is_training=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), state_

    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), state, opt, loss


def _step(params: Any, opt: Any, key: jax.Array, x: jax.Array, y: jax.Array):
    def loss_fn(params: Any) -> jax.Array:
        logits = PLAIN.apply(params, key, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss


def test_transform_with_state_batchnorm_train_step(layout: Layout) -> None:
    x, y = _batch()
    params, state = WITH_STATE.init(jax.random.key(0), x, is_training=True)
    args = (params, state, TX.init(params), jax.random.key(1), x, y)
    specs = (layout.weights(params, ["hidden"]), None, None, None, layout.batch, layout.batch)
    _, state, _, loss = layout.check(_stateful_step, args, specs)
    assert np.isfinite(loss)
    assert int(state["batch_norm/~/mean_ema"]["counter"]) == 1


def test_transform_train_step(layout: Layout) -> None:
    x, y = _batch()
    params = PLAIN.init(jax.random.key(0), x)
    args = (params, TX.init(params), jax.random.key(1), x, y)
    specs = (layout.weights(params, ["hidden"]), None, None, layout.batch, layout.batch)
    layout.check(_step, args, specs)
