"""PartitionSpecs for the GPT of `model.py`, derived from a mesh's axis names.

Three strategies, chosen by the axes the mesh has (each may be combined with `dp`):

- **data parallel** (`dp` only, or the default one-IPU axis `ipu`): every weight replicated, the
  batch split over `dp`.
- **Megatron 1D** (`tp`): q, k, v and the FFN-in weight are split by columns (heads, d_ff), the
  attention out-projection and FFN-out by rows; the block's two row-parallel matmuls each end in
  an AllReduce over `tp`. The embedding (tied with the LM head) is split over the vocabulary.
- **PopXL-style 2D** (`tp1` x `tp2`, Graphcore's GPT-3 example): the residual stream is
  [T, h/tp2]; QKV and FFN-in weights are [h/tp2, k h/tp1], out-projection and FFN-out
  [k h/tp1, h/tp2]; LayerNorm parameters and the hidden axis of the embeddings follow tp2, the
  vocabulary tp1.

`None` in a spec means "this dimension is whole"; `P()` is a replicated tensor. Optimizer state
specs mirror the parameters' (optax states hold param-shaped trees such as Adam's `mu` and
`nu`); everything else in the state (`count`) is replicated.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

KNOWN_AXES = ("dp", "tp", "tp1", "tp2", "pp", "ipu")  # pp: stages, no split


def _names(mesh: Any) -> tuple[str, ...]:
    return tuple(mesh.axis_names)


def _size(mesh: Any, name: str) -> int:
    return dict(zip(mesh.axis_names, mesh.axis_shapes, strict=True)).get(name, 1)


def strategy(mesh: Any) -> str:
    """'dp' (data parallel or one IPU), '1d' (Megatron: tp) or '2d' (PopXL: tp1 x tp2)."""
    names = set(_names(mesh))
    unknown = sorted(names - set(KNOWN_AXES))
    if unknown:
        raise ValueError(f"mesh axes {unknown} are not GPT axes; use dp, tp or tp1 and tp2")
    if "tp" in names and names & {"tp1", "tp2"}:
        raise ValueError("a mesh has either tp (Megatron 1D) or tp1 and tp2 (2D), not both")
    if ("tp1" in names) != ("tp2" in names):
        raise ValueError("2D tensor parallelism needs both tp1 and tp2 axes")
    if "tp" in names:
        return "1d"
    if "tp1" in names:
        return "2d"
    return "dp"


def batch_spec(mesh: Any) -> P:
    """Tokens [batch, seq + 1]: the batch split over dp, when the mesh has it."""
    return P("dp", None) if "dp" in _names(mesh) else P(None, None)


def _norm(axis: str | None) -> dict[str, P]:
    return {"scale": P(axis), "bias": P(axis)}


def _block_specs(kind: str) -> dict[str, Any]:
    if kind == "dp":
        col = row = hidden = None  # whole
    elif kind == "1d":
        col, row, hidden = "tp", "tp", None
    else:
        col, row, hidden = "tp1", "tp1", "tp2"
    return {
        "ln1": _norm(hidden),
        "attn": {
            "wqkv": P(hidden, col, None, None),  # [d, heads, 3, head_dim]
            "bqkv": P(col, None, None),
            "wo": P(row, None, hidden),  # [heads, head_dim, d]
            "bo": P(hidden),
        },
        "ln2": _norm(hidden),
        "mlp": {
            "w_in": P(hidden, col),  # [d, d_ff]
            "b_in": P(col),
            "w_out": P(row, hidden),  # [d_ff, d]
            "b_out": P(hidden),
        },
    }


def check_divisible(mesh: Any, heads: int) -> None:
    """Heads are what tp (tp1 in 2D) splits: they must divide evenly."""
    kind = strategy(mesh)
    tp = _size(mesh, "tp") if kind == "1d" else _size(mesh, "tp1") if kind == "2d" else 1
    if heads % tp:
        raise ValueError(f"{heads} heads do not split over a tensor-parallel axis of size {tp}")


def param_specs(params: Any, mesh: Any) -> Any:
    """A PartitionSpec for every parameter of `model.init`, for the mesh's strategy."""
    kind = strategy(mesh)
    vocab, hidden = {"dp": (None, None), "1d": ("tp", None), "2d": ("tp1", "tp2")}[kind]
    return {
        "wte": P(vocab, hidden),  # [vocab, d], tied with the LM head
        "wpe": P(None, hidden),  # [seq, d]
        "blocks": [_block_specs(kind) for _ in params["blocks"]],
        "lnf": _norm(hidden),
    }


def state_specs(opt_state: Any, params: Any, pspecs: Any) -> Any:
    """Specs for an optax state: each param-shaped subtree gets the params' specs, every other
    leaf (step counts) is replicated."""
    structure = jax.tree.structure(params)

    def is_params(node: Any) -> bool:
        return jax.tree.structure(node) == structure

    return jax.tree.map(
        lambda node: pspecs if is_params(node) else P(), opt_state, is_leaf=is_params
    )


def train_specs(params: Any, opt_state: Any, mesh: Any) -> tuple[Any, Any, P]:
    """in_shardings for `train_step(params, opt_state, tokens)`."""
    pspecs = param_specs(params, mesh)
    return pspecs, state_specs(opt_state, params, pspecs), batch_spec(mesh)
