"""A BERT encoder in plain JAX with its masked-language-model (MLM) loss: embeddings, post-LN
blocks, bidirectional attention, a GELU MLP and the MLM head; plus the LAMB training step that
`train.py` runs and `workloads.py` costs.

As Graphcore's BERT pretraining (graphcore/examples, nlp/bert) and with these simplifications:

- The MLM loss reads a batch of three int32 arrays: tokens [batch, seq], the masked positions
  [batch, mask_tokens] and their labels [batch, mask_tokens]. The encoder's hidden states are
  gathered at the positions (`jnp.take_along_axis`) *before* the MLM head, as Graphcore's BERT
  does, so the head and its vocabulary-sized decoder run on `mask_tokens` positions, not `seq`.
- No next-sentence-prediction head and no pooler: the loss is the MLM's alone.
- No token-type (segment) embeddings, no padding mask (every sequence is full length) and no
  dropout: the word and learned position embeddings are summed and normalised.
- LayerNorm's epsilon is Graphcore's `layer_norm_eps` (1e-3, which float16 represents).

Laid out for Megatron tensor parallelism (see `sharding.py`) as examples/gpt/model.py is, with
the attention, layer norm and loss the two share (examples/shared/transformer.py): q, k and v
come from one weight `[d, heads, 3, head_dim]` whose head axis is a dimension of its own, the
out-projection is `[heads, head_dim, d]`, and activations keep heads as a dimension through
attention. The embeddings run under `jax.named_scope("embed")`, each block under
`jax.named_scope(f"layer{i}")`, the gather and the MLM head under `jax.named_scope("mlm")`: the
names `ipujax.jit(phases=...)` and `ipujax.Pipeline(stages="auto")` cut at.

`Config.dtype` is the parameters' and activations' type (float32 by default; float16 as
Graphcore trained BERT); the optimizer's moments and its update are float32 whatever it is.
"""

from __future__ import annotations

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
from shared.transformer import attention, cast, cross_entropy, norm_params

Params = dict[str, Any]

Batch = tuple[jax.Array, jax.Array, jax.Array]  # tokens, masked positions, labels

LN_EPS = 1e-3  # Graphcore's layer_norm_eps (configs_pretraining.yml)
INIT_STD = 0.02  # BERT's initializer_range


@dataclass(frozen=True)
class Config(transformer.TransformerConfig):
    """vocab, seq, layers, d_model, heads and mlp_ratio (defaults 128, 16, 2, 32, 4, 4), the
    masked tokens per sequence and the parameters' and activations' type."""

    vocab: int = 128
    seq: int = 16
    d_model: int = 32
    mask_tokens: int = 4
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.mask_tokens <= self.seq:
            raise ValueError(f"mask_tokens {self.mask_tokens} is not in 1..seq ({self.seq})")


# ---- parameters ---------------------------------------------------------------------------------


def _normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return INIT_STD * jax.random.normal(key, shape, jnp.float32)


def _block(key: jax.Array, config: Config) -> Params:
    d, h, hd, ff = config.d_model, config.heads, config.head_dim, config.d_ff
    k = jax.random.split(key, 4)
    return {
        "attn": {
            "wqkv": _normal(k[0], (d, h, 3, hd)),
            "bqkv": jnp.zeros((h, 3, hd), jnp.float32),
            "wo": _normal(k[1], (h, hd, d)),
            "bo": jnp.zeros(d, jnp.float32),
        },
        "ln1": norm_params(d),
        "mlp": {
            "w_in": _normal(k[2], (d, ff)),
            "b_in": jnp.zeros(ff, jnp.float32),
            "w_out": _normal(k[3], (ff, d)),
            "b_out": jnp.zeros(d, jnp.float32),
        },
        "ln2": norm_params(d),
    }


def init(key: jax.Array, config: Config) -> Params:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm gains. Weights
    are named `w*`, which is what the optimizer's weight decay reads (`decay_mask`)."""
    d = config.d_model
    keys = jax.random.split(key, 3 + config.layers)
    params = {
        "wte": _normal(keys[0], (config.vocab, d)),  # tied with the MLM decoder
        "wpe": _normal(keys[1], (config.seq, d)),
        "ln_embed": norm_params(d),
        "blocks": [_block(keys[3 + i], config) for i in range(config.layers)],
        "mlm": {
            "w": _normal(keys[2], (d, d)),
            "b": jnp.zeros(d, jnp.float32),
            "ln": norm_params(d),
            "bias": jnp.zeros(config.vocab, jnp.float32),  # the decoder's
        },
    }
    return cast(params, config.dtype)


# ---- forward ------------------------------------------------------------------------------------


def layer_norm(x: jax.Array, p: Params) -> jax.Array:
    return transformer.layer_norm(x, p, LN_EPS)


def gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)  # BERT's exact (erf) GELU


def mlp(x: jax.Array, p: Params) -> jax.Array:
    return gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def block(x: jax.Array, p: Params) -> jax.Array:
    """BERT's post-LN block: each sublayer's residual sum is normalised."""
    x = layer_norm(x + attention(x, p["attn"], causal=False), p["ln1"])
    return layer_norm(x + mlp(x, p["mlp"]), p["ln2"])


def encode(params: Params, tokens: jax.Array) -> jax.Array:
    """The encoder's hidden states [batch, seq, d] for tokens [batch, seq]."""
    with jax.named_scope("embed"):
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
        x = layer_norm(x, params["ln_embed"])
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"layer{i}"):
            x = block(x, p)
    return x


def mlm_head(params: Params, hidden: jax.Array) -> jax.Array:
    """Logits [..., vocab]: dense, GELU, LayerNorm, then the decoder tied to `wte`, plus a bias."""
    p = params["mlm"]
    x = layer_norm(gelu(hidden @ p["w"] + p["b"]), p["ln"])
    return x @ params["wte"].T + p["bias"]


def forward(params: Params, tokens: jax.Array, positions: jax.Array | None = None) -> jax.Array:
    """MLM logits for tokens [batch, seq]: at `positions` [batch, mask_tokens] ([batch,
    mask_tokens, vocab]), or at every position when it is None ([batch, seq, vocab])."""
    hidden = encode(params, tokens)
    with jax.named_scope("mlm"):
        if positions is not None:
            hidden = jnp.take_along_axis(hidden, positions[..., None], axis=1)
        return mlm_head(params, hidden)


def loss_fn(params: Params, batch: Batch) -> jax.Array:
    """The MLM loss: mean cross-entropy of the labels at the masked positions."""
    tokens, positions, labels = batch
    logits = forward(params, tokens, positions)
    with jax.named_scope("loss"):
        return cross_entropy(logits.astype(jnp.float32), labels)  # float32 whatever the model's


# ---- training -----------------------------------------------------------------------------------


def make_optimizer(
    lr: float = 6e-3, warmup: int = 20, weight_decay: float = 0.01
) -> optax.GradientTransformation:
    """LAMB (Graphcore's BERT-Large optimizer), weight decay 0.01 on weights only; the learning
    rate warms up linearly over `warmup` steps (step k's is lr (k + 1) / warmup, so the first
    step updates too) and then stays constant. It runs in float32 whatever the parameters'
    type: its `init` makes float32 moments and its `update` reads float32 parameters (for the
    trust ratio's norms and the decay), as a master copy would."""
    steps = max(warmup, 1)
    schedule = optax.linear_schedule(lr / steps, lr, steps - 1)
    lamb = optax.lamb(schedule, weight_decay=weight_decay, mask=transformer.decay_mask)

    def init(params: Params) -> Any:
        return lamb.init(cast(params, "float32"))

    def update(grads: Params, state: Any, params: Params | None = None) -> tuple[Params, Any]:
        assert params is not None, "LAMB reads the parameters"
        return lamb.update(cast(grads, "float32"), state, cast(params, "float32"))

    return optax.GradientTransformation(init, update)


def make_train_step(optimizer: optax.GradientTransformation) -> Any:
    """`train_step(params, opt_state, (tokens, positions, labels)) -> (params, opt_state, loss)`:
    the MLM loss's gradients over the whole batch, then the optimizer's update."""

    def train_step(params: Params, opt_state: Any, batch: Batch) -> tuple[Params, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step
