"""flax.nnx through ipujax.jit against jax.jit: a model of `nnx.Linear`, `nnx.BatchNorm` and
`nnx.Dropout` built from `nnx.Rngs`, trained in the functional style: `nnx.split` the model into
its graph and its state (parameters; batch statistics and the dropout stream's typed key and
count), and a pure step that `nnx.merge`s them, takes an optax step and returns the new state,
on one IPU, dp=4 and dp=2 x tp=2."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from layouts import Layout

BATCH, FEATURES, HIDDEN, CLASSES = 8, 16, 32, 4


class Model(nnx.Module):
    """Linear -> BatchNorm -> relu -> Dropout -> Linear. The first Linear has no bias: BatchNorm
    removes it, so its gradient would be rounding noise that Adam scales up to a full step."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(FEATURES, HIDDEN, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(HIDDEN, momentum=0.9, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.head = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.dropout(nnx.relu(self.norm(self.hidden(x)))))


TX = optax.adam(1e-2)


def _model() -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """The model's graph, its parameters and the rest of its state (batch statistics, rngs)."""
    model = Model(nnx.Rngs(params=jax.random.key(0), dropout=jax.random.key(1)))
    return nnx.split(model, nnx.Param, ...)


GRAPHDEF, PARAMS, REST = _model()


def _step(params: nnx.State, rest: nnx.State, opt: Any, x: jax.Array, y: jax.Array):
    def loss_fn(params: nnx.State) -> tuple[jax.Array, nnx.State]:
        # copy=True: Variables of this trace, which BatchNorm and Dropout may update in place
        # (nnx refuses to mutate `rest`'s, which belong to the enclosing jit's trace).
        model = nnx.merge(GRAPHDEF, params, rest, copy=True)
        logits = model(x)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        # The forward pass moved the batch statistics and drew from the dropout stream.
        return loss, nnx.state(model, nnx.Not(nnx.Param))

    (loss, rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), rest, opt, loss


def test_state_has_typed_keys_and_batch_stats() -> None:
    variables = jax.tree.leaves(REST, is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert {"BatchStat", "RngKey", "RngCount"} <= {type(v).__name__ for v in variables}
    keys = [v.get_value() for v in variables if isinstance(v, nnx.RngKey)]
    assert keys and all(jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key) for k in keys)


def test_split_merge_train_step(layout: Layout) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)
    args = (PARAMS, REST, TX.init(PARAMS), x, y)
    specs = (layout.weights(PARAMS, ["hidden"]), None, None, layout.batch, layout.batch)
    params, rest, _, loss = layout.check(_step, args, specs)
    assert np.isfinite(loss)
    # The model runs again from the new state: the dropout stream has moved on by one draw.
    model = nnx.merge(GRAPHDEF, params, rest, copy=True)
    assert int(model.dropout.rngs.count.get_value()) == 1
