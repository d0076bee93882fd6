"""optax optimizers through ipujax.jit against jax.jit: AdamW, and a chain of
`clip_by_global_norm` and Adam whose learning rate follows a warmup-cosine schedule, each
updating a tiny linear classifier, on one IPU, dp=4 and dp=2 x tp=2 (the weight matrix split by
columns over tp)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from layouts import Layout

BATCH, FEATURES, CLASSES = 8, 16, 8
SCHEDULE = optax.warmup_cosine_decay_schedule(
    init_value=1e-3, peak_value=1e-2, warmup_steps=2, decay_steps=10, end_value=1e-4
)
OPTIMIZERS = {
    "adamw": optax.adamw(1e-2, weight_decay=1e-2),
    # max_norm well under the gradients' norm, so the clipping acts.
    "clip-adam-schedule": optax.chain(optax.clip_by_global_norm(0.1), optax.adam(SCHEDULE)),
}


def _loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _train_step(tx: optax.GradientTransformation) -> Any:
    def step(params: Any, opt: Any, x: jax.Array, y: jax.Array):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss, optax.tree.norm(grads)

    return step


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_step(layout: Layout, name: str) -> None:
    tx = OPTIMIZERS[name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)
    params = {
        "w": jnp.asarray(rng.normal(size=(FEATURES, CLASSES)) * 0.3, jnp.float32),
        "b": jnp.zeros((CLASSES,), jnp.float32),
    }
    step = _train_step(tx)
    # Two steps first (by jax.jit), so the moments are not zero and the schedule is past its
    # first value: the step compared starts mid-warmup.
    opt = tx.init(params)
    for _ in range(2):
        params, opt, _, _ = jax.jit(step)(params, opt, x, y)
    specs = ({"w": layout.columns, "b": None}, None, layout.batch, layout.batch)
    _, opt, _, norm = layout.check(step, (params, opt, x, y), specs)
    counts = [int(count) for _, count in optax.tree.get_all_with_path(opt, "count")]
    assert counts and all(count == 3 for count in counts)
    if name == "clip-adam-schedule":
        assert norm > 0.1  # the clipping was active
