"""equinox models through ipujax.jit against jax.jit: an MLP of `eqx.nn.Linear`,
`eqx.nn.LayerNorm` and `eqx.nn.Dropout`, and a scan-over-layers model (layers stacked by
`eqx.filter_vmap`, run by `jax.lax.scan`), each as a training step that differentiates with
`eqx.filter_value_and_grad` and updates with optax. `eqx.partition` splits a model into its
arrays and the static rest; the jitted step takes and returns the arrays and `eqx.combine`s
them with the rest. Run on one IPU, dp=4 and dp=2 x tp=2 (on tp, the stacked layers the scan
runs over are split by columns)."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from layouts import Layout

BATCH, FEATURES, HIDDEN, CLASSES, DEPTH = 8, 16, 32, 4, 3


class MLP(eqx.Module):
    """Linear -> LayerNorm -> gelu -> Dropout -> Linear, on one example."""

    hidden: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    dropout: eqx.nn.Dropout
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(FEATURES, HIDDEN, key=k1)
        self.norm = eqx.nn.LayerNorm(HIDDEN)
        self.dropout = eqx.nn.Dropout(0.25)
        self.head = eqx.nn.Linear(HIDDEN, CLASSES, key=k2)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
        h = jax.nn.gelu(self.norm(self.hidden(x)))
        return self.head(self.dropout(h, key=key))


class Stacked(eqx.Module):
    """An input Linear, DEPTH residual Linear layers stacked along a leading axis and run by
    `jax.lax.scan`, and a head, on one example (it has no dropout: `key` goes unused)."""

    embed: eqx.nn.Linear
    layers: eqx.nn.Linear  # every array with a leading DEPTH axis
    head: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = eqx.nn.Linear(FEATURES, HIDDEN, key=k1)
        make = eqx.filter_vmap(lambda k: eqx.nn.Linear(HIDDEN, HIDDEN, key=k))
        self.layers = make(jax.random.split(k2, DEPTH))
        self.head = eqx.nn.Linear(HIDDEN, CLASSES, key=k3)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        arrays, static = eqx.partition(self.layers, eqx.is_array)

        def layer(h: jax.Array, weights: Any) -> tuple[jax.Array, None]:
            return h + jnp.tanh(eqx.combine(weights, static)(h)), None

        h, _ = jax.lax.scan(layer, self.embed(x), arrays)
        return self.head(h)


TX = optax.adam(1e-2)


def _train_step(static: Any) -> Any:
    """The step for a model whose non-array part is `static`: arrays in, arrays out."""

    def step(params: Any, opt: Any, key: jax.Array, x: jax.Array, y: jax.Array):
        @eqx.filter_value_and_grad
        def loss_fn(params: Any) -> jax.Array:
            model = eqx.combine(params, static)
            keys = jax.random.split(key, x.shape[0])
            logits = jax.vmap(model)(x, keys)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = loss_fn(params)
        updates, opt = TX.update(grads, opt, params)
        return eqx.apply_updates(params, updates), opt, loss

    return step


def _check(layout: Layout, model: eqx.Module, split: list[str]) -> None:
    params, static = eqx.partition(model, eqx.is_array)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)
    args = (params, TX.init(params), jax.random.key(1), x, y)
    specs = (layout.weights(params, split), None, None, layout.batch, layout.batch)
    new_params, _, loss = layout.check(_train_step(static), args, specs)
    assert np.isfinite(loss)
    assert isinstance(eqx.combine(new_params, static), type(model))


def test_mlp_with_layernorm_and_dropout_train_step(layout: Layout) -> None:
    _check(layout, MLP(jax.random.key(0)), ["hidden"])


def test_scan_over_stacked_layers_train_step(layout: Layout) -> None:
    model = Stacked(jax.random.key(0))
    assert model.layers.weight.shape == (DEPTH, HIDDEN, HIDDEN)
    _check(layout, model, ["layers"])  # on tp, each stacked weight and bias by columns
