"""A GPT-2-style decoder in plain JAX: embeddings, pre-LN blocks, causal attention, a GELU MLP and
a tied LM head; plus the AdamW training step that `train.py` runs.

Laid out for tensor parallelism (see `sharding.py`):

- q, k and v come from one weight `[d, heads, 3, head_dim]` (Megatron's per-head layout) whose
  head axis is a dimension of its own, which Megatron's tp (or 2D's tp1) splits; q, k and v are
  read off the size-3 axis, which no strategy splits, so one matmul (and in 2D one AllReduce
  over tp2) serves all three. A fused `[d, 3d]` weight would be cut by a `jnp.split` along the
  very dimension tp splits, and ipujax's partitioner gathers a dimension that a split slices.
  (The 3 sits after the heads: a leading `[3, ...]` axis is dropped by a reshape that, in
  ipujax today, loses the batch's dp sharding.) The out-projection is `[heads, head_dim, d]`.
- Activations keep heads as a separate dimension (`[batch, seq, heads, head_dim]`) all the way
  through attention, so every head's work stays on the IPU that holds its weights.
- Each block runs under `jax.named_scope(f"layer{i}")`, the names `train.py --phases layer`
  passes to `ipujax.jit(phases=...)`; with `scopes=False` (`forward`, `loss_fn`,
  `make_train_step`) the same step is built with no named scope at all, as most JAX models are
  written, for `phases="auto"` to find its blocks from the program's structure.
- `Config.dtype` is the parameters' and activations' type (float32 by default; float16 as
  Graphcore trained GPT-3); the optimizer's moments are float32 whatever it is.

The attention, layer norm, loss and weight-decay mask are examples/bert's too
(examples/shared/transformer.py).
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

if (EXAMPLES := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, EXAMPLES)  # examples/, for `shared`: see shared/__init__.py
from shared import transformer
from shared.transformer import attention, cast, cross_entropy, layer_norm, norm_params

Params = dict[str, Any]


@dataclass(frozen=True)
class Config(transformer.TransformerConfig):
    """vocab, seq, layers, d_model, heads and mlp_ratio (defaults 256, 64, 2, 64, 4, 4), and
    the parameters' and activations' type."""

    dtype: str = "float32"


# ---- parameters ---------------------------------------------------------------------------------


def init(key: jax.Array, config: Config) -> Params:
    """GPT-2's initialisation: N(0, 0.02) weights, residual projections scaled by
    1/sqrt(2 layers), zero biases, unit LayerNorm gains."""
    d, h, hd, ff = config.d_model, config.heads, config.head_dim, config.d_ff
    std = 0.02
    residual_std = std / math.sqrt(2 * config.layers)
    keys = jax.random.split(key, 2 + config.layers)

    def normal(k: jax.Array, shape: tuple[int, ...], scale: float = std) -> jax.Array:
        return scale * jax.random.normal(k, shape, jnp.float32)

    blocks = []
    for i in range(config.layers):
        k = jax.random.split(keys[2 + i], 6)
        blocks.append(
            {
                "ln1": norm_params(d),
                "attn": {
                    "wqkv": normal(k[0], (d, h, 3, hd)),
                    "bqkv": jnp.zeros((h, 3, hd), jnp.float32),
                    "wo": normal(k[3], (h, hd, d), residual_std),
                    "bo": jnp.zeros(d, jnp.float32),
                },
                "ln2": norm_params(d),
                "mlp": {
                    "w_in": normal(k[4], (d, ff)),
                    "b_in": jnp.zeros(ff, jnp.float32),
                    "w_out": normal(k[5], (ff, d), residual_std),
                    "b_out": jnp.zeros(d, jnp.float32),
                },
            }
        )
    params = {
        "wte": normal(keys[0], (config.vocab, d)),
        "wpe": normal(keys[1], (config.seq, d), 0.01),
        "blocks": blocks,
        "lnf": norm_params(d),
    }
    return cast(params, config.dtype)


# ---- forward ------------------------------------------------------------------------------------


def mlp(x: jax.Array, p: Params) -> jax.Array:
    return jax.nn.gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def block(x: jax.Array, p: Params) -> jax.Array:
    x = x + attention(layer_norm(x, p["ln1"]), p["attn"], causal=True)
    return x + mlp(layer_norm(x, p["ln2"]), p["mlp"])


def _scope(name: str, scopes: bool) -> contextlib.AbstractContextManager[Any]:
    """`jax.named_scope(name)`, or nothing when the model is built without scopes."""
    return jax.named_scope(name) if scopes else contextlib.nullcontext()


def forward(
    params: Params, tokens: jax.Array, remat: bool = False, scopes: bool = True
) -> jax.Array:
    """Logits [batch, seq, vocab] for tokens [batch, seq]. With `remat`, each block's
    activations are recomputed in the backward pass (`jax.checkpoint`), as Graphcore's GPT-3
    example did, so only the blocks' inputs are kept between forward and backward. Without
    `scopes` no `jax.named_scope` names the embedding, the blocks or the head."""
    layer = jax.checkpoint(block) if remat else block
    with _scope("embed", scopes):
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
    for i, p in enumerate(params["blocks"]):
        with _scope(f"layer{i}", scopes):
            x = layer(x, p)
    with _scope("head", scopes):
        return layer_norm(x, params["lnf"]) @ params["wte"].T  # tied LM head


def loss_fn(
    params: Params, tokens: jax.Array, remat: bool = False, scopes: bool = True
) -> jax.Array:
    """Mean next-token cross-entropy; tokens is [batch, seq + 1]."""
    logits = forward(params, tokens[:, :-1], remat, scopes)
    with _scope("loss", scopes):
        return cross_entropy(logits, tokens[:, 1:])


# ---- training -----------------------------------------------------------------------------------


def make_optimizer(
    lr: float = 1e-3, warmup: int = 20, weight_decay: float = 0.1, clip: float = 1.0
) -> optax.GradientTransformation:
    """AdamW after global-norm clipping (none if `clip` <= 0); the learning rate warms up
    linearly over `warmup` steps and then stays constant, so it does not depend on how many steps
    a run takes (a resumed run follows the same schedule as an uninterrupted one)."""
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, max(warmup, 1)), optax.constant_schedule(lr)],
        [max(warmup, 1)],
    )
    adamw = optax.adamw(
        schedule, b1=0.9, b2=0.95, weight_decay=weight_decay, mask=transformer.decay_mask
    )
    if clip <= 0:  # no clipping
        return optax.chain(optax.identity(), adamw)  # the same state structure either way
    return optax.chain(optax.clip_by_global_norm(clip), adamw)


def init_optimizer(optimizer: optax.GradientTransformation, params: Params) -> Any:
    """The optimizer's state, its moments float32 whatever the parameters' type."""
    return optimizer.init(cast(params, "float32"))


def accumulated_gradients(
    params: Params, tokens: jax.Array, remat: bool, micro_batches: int, scopes: bool = True
) -> tuple[jax.Array, Params]:
    """The mean loss and gradients over `micro_batches` equal micro-batches, summed by a scan
    (rows k, k + n, k + 2n, ... form micro-batch k, so a batch split over dp splits every
    micro-batch over it too)."""
    if micro_batches == 1:
        return jax.value_and_grad(loss_fn)(params, tokens, remat, scopes)
    micro = tokens.reshape(tokens.shape[0] // micro_batches, micro_batches, -1).swapaxes(0, 1)

    def add_micro_batch(carry: Any, batch: jax.Array) -> tuple[Any, None]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, remat, scopes)
        total, summed = carry
        return (total + loss.astype(jnp.float32), jax.tree.map(jnp.add, summed, grads)), None

    start = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
    (total, summed), _ = jax.lax.scan(add_micro_batch, start, micro)
    return total / micro_batches, jax.tree.map(lambda g: g / micro_batches, summed)


def make_train_step(
    optimizer: optax.GradientTransformation,
    remat: bool = False,
    micro_batches: int = 1,
    scopes: bool = True,
) -> Any:
    """The training step: gradients (over `micro_batches` accumulated micro-batches), then the
    optimizer's update; `scopes=False` builds it without named scopes."""

    def train_step(params: Params, opt_state: Any, tokens: jax.Array) -> tuple[Params, Any, Any]:
        loss, grads = accumulated_gradients(params, tokens, remat, micro_batches, scopes)
        grads = cast(grads, "float32")  # the update in float32; no-op for float32 models
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step
