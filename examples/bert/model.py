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

Laid out for Megatron tensor parallelism (see `sharding.py`) as examples/gpt/model.py is: q, k
and v come from one weight `[d, heads, 3, head_dim]` whose head axis is a dimension of its own,
the out-projection is `[heads, head_dim, d]`, and activations keep heads as a dimension through
attention. The embeddings run under `jax.named_scope("embed")`, each block under
`jax.named_scope(f"layer{i}")`, the gather and the MLM head under `jax.named_scope("mlm")`: the
names `ipujax.jit(phases=...)` and `ipujax.Pipeline(stages="auto")` cut at.

`Config.dtype` is the parameters' and activations' type (float32 by default; float16 as
Graphcore trained BERT); the optimizer's moments and its update are float32 whatever it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

Params = dict[str, Any]
Batch = tuple[jax.Array, jax.Array, jax.Array]  # tokens, masked positions, labels

LN_EPS = 1e-3  # Graphcore's layer_norm_eps (configs_pretraining.yml)
INIT_STD = 0.02  # BERT's initializer_range


@dataclass(frozen=True)
class Config:
    vocab: int = 128
    seq: int = 16
    layers: int = 2
    d_model: int = 32
    heads: int = 4
    mlp_ratio: int = 4
    mask_tokens: int = 4
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        if not 0 < self.mask_tokens <= self.seq:
            raise ValueError(f"mask_tokens {self.mask_tokens} is not in 1..seq ({self.seq})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def d_ff(self) -> int:
        return self.mlp_ratio * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def layer_names(config: Config) -> list[str]:
    """The named scopes of the blocks, one phase each for `ipujax.jit(phases=...)`."""
    return [f"layer{i}" for i in range(config.layers)]


# ---- parameters ---------------------------------------------------------------------------------


def _norm(d: int) -> Params:
    return {"scale": jnp.ones(d, jnp.float32), "bias": jnp.zeros(d, jnp.float32)}


def _cast(tree: Any, dtype: str) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype), tree)


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
        "ln1": _norm(d),
        "mlp": {
            "w_in": _normal(k[2], (d, ff)),
            "b_in": jnp.zeros(ff, jnp.float32),
            "w_out": _normal(k[3], (ff, d)),
            "b_out": jnp.zeros(d, jnp.float32),
        },
        "ln2": _norm(d),
    }


def init(key: jax.Array, config: Config) -> Params:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm gains. Weights
    are named `w*`, which is what the optimizer's weight decay reads (`_decay_mask`)."""
    d = config.d_model
    keys = jax.random.split(key, 3 + config.layers)
    params = {
        "wte": _normal(keys[0], (config.vocab, d)),  # tied with the MLM decoder
        "wpe": _normal(keys[1], (config.seq, d)),
        "ln_embed": _norm(d),
        "blocks": [_block(keys[3 + i], config) for i in range(config.layers)],
        "mlm": {
            "w": _normal(keys[2], (d, d)),
            "b": jnp.zeros(d, jnp.float32),
            "ln": _norm(d),
            "bias": jnp.zeros(config.vocab, jnp.float32),  # the decoder's
        },
    }
    return _cast(params, config.dtype)


# ---- forward ------------------------------------------------------------------------------------


def layer_norm(x: jax.Array, p: Params) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * p["scale"] + p["bias"]


def gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)  # BERT's exact (erf) GELU


def attention(x: jax.Array, p: Params) -> jax.Array:
    """Bidirectional multi-head attention; `x` is [batch, seq, d], heads stay a dimension."""
    head_dim = p["wqkv"].shape[-1]
    qkv = jnp.einsum("btd,dhck->bthck", x, p["wqkv"]) + p["bqkv"]
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / math.sqrt(head_dim)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhts,bshk->bthk", weights, v)
    return jnp.einsum("bthk,hkd->btd", out, p["wo"]) + p["bo"]


def mlp(x: jax.Array, p: Params) -> jax.Array:
    return gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def block(x: jax.Array, p: Params) -> jax.Array:
    """BERT's post-LN block: each sublayer's residual sum is normalised."""
    x = layer_norm(x + attention(x, p["attn"]), p["ln1"])
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


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer labels, the label's logit a masked sum over the vocabulary
    (as examples/gpt/model.py's: logits split over the vocabulary cost AllReduces of the
    [batch, mask_tokens] statistics, not an AllGather of the logits)."""
    logits = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    hit = labels[..., None] == jnp.arange(logits.shape[-1])
    label_logit = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    return jnp.mean(log_normalizer - label_logit)


def loss_fn(params: Params, batch: Batch) -> jax.Array:
    """The MLM loss: mean cross-entropy of the labels at the masked positions."""
    tokens, positions, labels = batch
    logits = forward(params, tokens, positions)
    with jax.named_scope("loss"):
        return cross_entropy(logits, labels)


# ---- training -----------------------------------------------------------------------------------


def _decay_mask(params: Params) -> Any:
    """Weight decay on weights (leaves named `w*`: embeddings and matrices), not on biases and
    LayerNorm parameters, as Graphcore's BERT excludes them."""

    def is_weight(path: tuple[Any, ...], _: Any) -> bool:
        return str(getattr(path[-1], "key", "")).startswith("w")

    return jax.tree_util.tree_map_with_path(is_weight, params)


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
    lamb = optax.lamb(schedule, weight_decay=weight_decay, mask=_decay_mask)

    def init(params: Params) -> Any:
        return lamb.init(_cast(params, "float32"))

    def update(grads: Params, state: Any, params: Params | None = None) -> tuple[Params, Any]:
        assert params is not None, "LAMB reads the parameters"
        return lamb.update(_cast(grads, "float32"), state, _cast(params, "float32"))

    return optax.GradientTransformation(init, update)


def make_train_step(optimizer: optax.GradientTransformation) -> Any:
    """`train_step(params, opt_state, (tokens, positions, labels)) -> (params, opt_state, loss)`:
    the MLM loss's gradients over the whole batch, then the optimizer's update."""

    def train_step(params: Params, opt_state: Any, batch: Batch) -> tuple[Params, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step
