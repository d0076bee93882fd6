"""PartitionSpecs for the BERT of `model.py`, derived from a mesh's axis names.

- `dp` splits the batch's leading dimension (tokens, masked positions and labels alike); every
  parameter is replicated over it.
- `tp` is Megatron's tensor parallelism, as examples/gpt/sharding.py's 1D strategy: q, k, v and
  the FFN-in weight split by columns (heads, d_ff), the attention out-projection and FFN-out by
  rows, so each block's two row-parallel matmuls end in an AllReduce over `tp`. The word
  embedding, tied with the MLM decoder, and the decoder's bias split over the vocabulary; the
  MLM head's dense layer, the position embedding and the LayerNorms are replicated.
- Any other axis (`pp`, the pipeline axis `ipujax.Pipeline` runs stages on, or the default
  one-IPU axis `ipu`) splits nothing.

Optimizer state specs mirror the parameters' (LAMB's `mu` and `nu` are param-shaped trees);
everything else in the state (step counts) is replicated.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P


def _names(mesh: Any) -> tuple[str, ...]:
    return tuple(mesh.axis_names)


def _size(mesh: Any, name: str) -> int:
    return dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get(name, 1)


def _axis(mesh: Any, name: str) -> str | None:
    return name if name in _names(mesh) else None


def batch_specs(mesh: Any) -> tuple[P, P, P]:
    """(tokens [batch, seq], positions and labels [batch, mask_tokens]): the batch over dp."""
    spec = P(_axis(mesh, "dp"), None)
    return spec, spec, spec


def _norm() -> dict[str, P]:
    return {"scale": P(None), "bias": P(None)}


def _block_specs(tp: str | None) -> dict[str, Any]:
    return {
        "attn": {
            "wqkv": P(None, tp, None, None),  # [d, heads, 3, head_dim]
            "bqkv": P(tp, None, None),
            "wo": P(tp, None, None),  # [heads, head_dim, d]
            "bo": P(None),
        },
        "ln1": _norm(),
        "mlp": {
            "w_in": P(None, tp),  # [d, d_ff]
            "b_in": P(tp),
            "w_out": P(tp, None),  # [d_ff, d]
            "b_out": P(None),
        },
        "ln2": _norm(),
    }


def check_divisible(mesh: Any, heads: int) -> None:
    """Heads are what tp splits: they must divide evenly."""
    tp = _size(mesh, "tp")
    if heads % tp:
        raise ValueError(f"{heads} heads do not split over a tensor-parallel axis of size {tp}")


def param_specs(params: Any, mesh: Any) -> Any:
    """A PartitionSpec for every parameter of `model.init`."""
    tp = _axis(mesh, "tp")
    return {
        "wte": P(tp, None),  # [vocab, d], tied with the MLM decoder
        "wpe": P(None, None),  # [seq, d]
        "ln_embed": _norm(),
        "blocks": [_block_specs(tp) for _ in params["blocks"]],
        "mlm": {"w": P(None, None), "b": P(None), "ln": _norm(), "bias": P(tp)},
    }


def state_specs(opt_state: Any, params: Any, pspecs: Any) -> Any:
    """Specs for an optax state: each param-shaped subtree gets the params' specs, every other
    leaf (step counts) is replicated."""
    structure: Any = jax.tree.structure(params)

    def is_params(node: Any) -> bool:
        return bool(structure == jax.tree.structure(node))

    return jax.tree.map(
        lambda node: pspecs if is_params(node) else P(), opt_state, is_leaf=is_params
    )


def train_specs(params: Any, opt_state: Any, mesh: Any) -> tuple[Any, Any, tuple[P, P, P]]:
    """in_shardings for `train_step(params, opt_state, (tokens, positions, labels))`."""
    pspecs = param_specs(params, mesh)
    return pspecs, state_specs(opt_state, params, pspecs), batch_specs(mesh)
