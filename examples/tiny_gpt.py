"""A tiny GPT-2-style decoder and its AdamW training step, in plain JAX.

Small enough to compile in seconds; used by `make demo` and the runtime tests. The full example
with tensor parallelism lives in examples/gpt/.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = dict[str, Any]


def init(key: jax.Array, *, vocab: int = 64, d: int = 32, layers: int = 2, seq: int = 16) -> Params:
    keys = jax.random.split(key, 2 + layers)
    normal = lambda k, shape: 0.02 * jax.random.normal(k, shape)  # noqa: E731
    blocks = []
    for layer in range(layers):
        k = jax.random.split(keys[2 + layer], 4)
        blocks.append(
            {
                "ln1": jnp.ones(d),
                "qkv": normal(k[0], (d, 3 * d)),
                "proj": normal(k[1], (d, d)),
                "ln2": jnp.ones(d),
                "fc": normal(k[2], (d, 4 * d)),
                "out": normal(k[3], (4 * d, d)),
            }
        )
    return {
        "wte": normal(keys[0], (vocab, d)),
        "wpe": normal(keys[1], (seq, d)),
        "blocks": blocks,
        "lnf": jnp.ones(d),
    }


def layer_norm(x: jax.Array, gain: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gain


def attention(h: jax.Array, block: Params, heads: int) -> jax.Array:
    batch, seq, d = h.shape
    q, k, v = jnp.split(h @ block["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(batch, seq, heads, d // heads) for t in (q, k, v))
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", weights, v).reshape(batch, seq, d) @ block["proj"]


def forward(params: Params, tokens: jax.Array, heads: int = 4) -> jax.Array:
    x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
    for block in params["blocks"]:
        x = x + attention(layer_norm(x, block["ln1"]), block, heads)
        x = x + jax.nn.gelu(layer_norm(x, block["ln2"]) @ block["fc"]) @ block["out"]
    return layer_norm(x, params["lnf"]) @ params["wte"].T  # tied LM head


def loss_fn(params: Params, tokens: jax.Array) -> jax.Array:
    logits = forward(params, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


optimizer = optax.adamw(1e-3)


def train_step(params: Params, opt_state: Any, tokens: jax.Array) -> tuple[Params, Any, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def example(batch: int = 4, seq: int = 16, vocab: int = 64) -> tuple[Params, Any, jax.Array]:
    params = init(jax.random.key(0), vocab=vocab, seq=seq)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)
    return params, optimizer.init(params), tokens
