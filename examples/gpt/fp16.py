"""Pure float16 training of the GPT, as Graphcore trained in "16.16": weights, optimizer state
and updates all in float16, with static loss scaling, and the numbers an IPU computes with
stochastic rounding (`ipujax.jit(numerics="ipu")`) or round to nearest (`numerics="exact"`).

An update smaller than half the float16 spacing of its weight (about 2^-11 of it) rounds back
to the weight under round to nearest and is lost; rounded stochastically it moves the weight a
whole spacing with the matching probability, so the update survives in expectation. Plain SGD
with momentum keeps every optimizer value in float16 (no second moment to underflow); the loss
is scaled by `LOSS_SCALE` so that small gradients stay float16 normals, and the learning rate
is divided by it to compensate.

`train.py --fp16 --numerics ipu|exact` trains so; `numerics_plot.py` runs both and plots them.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import ipujax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import load, transformer

model = load.example("gpt", "model")

LOSS_SCALE = 1024.0  # a power of two: scaling and unscaling are exact
MOMENTUM = 0.9


def make_optimizer(lr: float) -> optax.GradientTransformation:
    """SGD with momentum on the scaled gradients, its rate divided by the loss scale; a
    constant Python float, so every product stays float16 (a schedule's float32 rate would
    promote the updates to float32)."""
    return optax.sgd(lr / LOSS_SCALE, momentum=MOMENTUM)


def init_optimizer(optimizer: optax.GradientTransformation, params: Any) -> Any:
    """The optimizer's state in the parameters' type: float16 momentum for float16 weights."""
    return optimizer.init(params)


def layer_norm(x: jax.Array, p: Any, eps: float = 1e-5) -> jax.Array:
    """LayerNorm with its statistics in float32 and its result in x's type, as PopLibs' norm
    ops keep them: in float16 the derivative of rsqrt at a small variance v, v^-1.5 / 2, passes
    float16's largest value (65504) and the gradients become infinite."""
    return transformer.layer_norm(x.astype(jnp.float32), p, eps).astype(x.dtype)


def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
    """`model.loss_fn` with `layer_norm`'s float32 statistics; everything else float16."""
    inputs, seq = tokens[:, :-1], tokens.shape[1] - 1
    x = params["wte"][inputs] + params["wpe"][:seq]
    for p in params["blocks"]:
        x = x + transformer.attention(layer_norm(x, p["ln1"]), p["attn"], causal=True)
        x = x + model.mlp(layer_norm(x, p["ln2"]), p["mlp"])
    logits = layer_norm(x, params["lnf"]) @ params["wte"].T  # tied LM head
    return transformer.cross_entropy(logits, tokens[:, 1:])


def make_train_step(optimizer: optax.GradientTransformation) -> Any:
    """The step: float16 gradients of the scaled loss, the float16 update; the loss unscaled."""

    def train_step(params: Any, opt_state: Any, tokens: jax.Array) -> tuple[Any, Any, Any]:
        def scaled_loss(p: Any) -> jax.Array:
            return loss_fn(p, tokens) * LOSS_SCALE

        loss, grads = jax.value_and_grad(scaled_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss / LOSS_SCALE

    return train_step


def numerics_key(numerics: str, seed: int, step: int) -> contextlib.AbstractContextManager[Any]:
    """The stochastic rounding's key for `step` (fresh bits every step, the same for a rerun),
    or nothing under numerics "exact"."""
    if numerics == "exact":
        return contextlib.nullcontext()
    return ipujax.numerics_key(jax.random.fold_in(jax.random.key(seed), step))
