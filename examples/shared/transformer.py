"""What the GPT's and BERT's transformers share: their configs' sizes, the blocks' scope
names, the padded vocabulary, parameter helpers, layer norm, multi-head attention over
Megatron's per-head QKV weight, a vocabulary-parallel cross-entropy and the weight-decay mask.

The attention weights are laid out for tensor parallelism: q, k and v come from one weight
`wqkv` [d, heads, 3, head_dim] whose head axis is a dimension of its own, the out-projection
`wo` is [heads, head_dim, d], and activations keep heads as a dimension through attention.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


@dataclass(frozen=True)
class TransformerConfig:
    """The sizes a GPT's or a BERT's config shares, what they imply, and the check that the
    heads split `d_model`. The defaults are a small byte-level model (the GPT example's); a
    model's `Config` subclasses this, setting its own defaults and adding its own fields."""

    vocab: int = 256
    seq: int = 64
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def d_ff(self) -> int:
        return self.mlp_ratio * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pad_vocab(vocab: int, multiple: int = 128) -> int:
    """The vocabulary rounded up to a multiple of 128, as trainers pad GPT-2's and BERT's."""
    return -(-vocab // multiple) * multiple


def layer_names(config: TransformerConfig) -> list[str]:
    """The named scopes of the blocks, one phase each for `ipujax.jit(phases=...)`."""
    return [f"layer{i}" for i in range(config.layers)]


def norm_params(d: int) -> Params:
    """A LayerNorm's unit gains and zero biases."""
    return {"scale": jnp.ones(d, jnp.float32), "bias": jnp.zeros(d, jnp.float32)}


def cast(tree: Any, dtype: str) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype), tree)


def layer_norm(x: jax.Array, p: Params, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def attention(x: jax.Array, p: Params, causal: bool) -> jax.Array:
    """Multi-head attention, causal (each position sees those before it) or bidirectional;
    `x` is [batch, seq, d], heads stay a dimension of their own."""
    head_dim = p["wqkv"].shape[-1]
    qkv = jnp.einsum("btd,dhck->bthck", x, p["wqkv"]) + p["bqkv"]
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / math.sqrt(head_dim)
    if causal:
        seq = x.shape[1]
        scores = jnp.where(
            jnp.tril(jnp.ones((seq, seq), bool)), scores, jnp.finfo(scores.dtype).min
        )
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhts,bshk->bthk", weights, v)
    return jnp.einsum("bthk,hkd->btd", out, p["wo"]) + p["bo"]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer labels, as Megatron's vocab-parallel loss computes it: the
    label's logit is a masked sum over the vocabulary rather than a gather, so logits split over
    the vocabulary cost AllReduces of the per-position statistics (max, sum) instead of an
    AllGather of the logits."""
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    hit = labels[..., None] == jnp.arange(logits.shape[-1])
    label_logit = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    return jnp.mean(log_normalizer - label_logit)


def decay_mask(params: Params) -> Any:
    """Weight decay on the weights and embeddings (the leaves named `w...`), not on biases and
    LayerNorm parameters, as GPT-2 and Graphcore's BERT do. By name, not by rank: the fused
    QKV bias is 3-D."""

    def decayed(path: tuple[Any, ...], _: Any) -> bool:
        return str(getattr(path[-1], "key", "")).startswith("w")

    return jax.tree_util.tree_map_with_path(decayed, params)
