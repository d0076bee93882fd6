"""Workloads for the CLI tests, named on the command line as tests/cli/workloads.py:NAME."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

import ipujax

SPEC_FILE = str(Path(__file__).resolve())  # name workloads on the command line as SPEC_FILE:NAME
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import tiny_gpt  # noqa: E402


def _specs(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def tiny_gpt_step(mesh: ipujax.Mesh | None = None) -> tuple:
    """The tiny GPT's training step, shapes only; takes the CLI's mesh."""
    params = jax.eval_shape(lambda: tiny_gpt.init(jax.random.key(0)))
    opt_state = jax.eval_shape(tiny_gpt.optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((4, 17), jnp.int32)
    args = (params, opt_state, tokens)
    if mesh is None:
        return tiny_gpt.train_step, args
    return tiny_gpt.train_step, args, {"mesh": mesh}


def _mlp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.tanh(h @ params["w2"])


def mlp() -> tuple:
    """A two-layer MLP on real arrays."""
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((64, 128), dtype=np.float32),
        "b1": np.zeros(128, np.float32),
        "w2": rng.standard_normal((128, 32), dtype=np.float32),
    }
    return _mlp, (params, rng.standard_normal((16, 64), dtype=np.float32))


def mlp_16_tiles() -> tuple:
    """The same MLP on a Bow cut down to 16 tiles (for report comparisons)."""
    fun, args = mlp()
    target = ipujax.Target.bow().with_tiles(16)
    return fun, args, {"mesh": ipujax.make_mesh((1,), ("ipu",), target=target)}


def mlp_data_parallel(mesh: ipujax.Mesh) -> tuple:
    """The MLP with its batch split over the mesh's first axis (data parallel)."""
    fun, (params, x) = mlp()
    batch = PartitionSpec(mesh.axis_names[0], None)
    replicated = jax.tree.map(lambda _: PartitionSpec(), params)
    return fun, (params, x), {"mesh": mesh, "in_shardings": (replicated, batch)}


def too_big() -> tuple:
    """One f32 argument larger than all the tiles of a Bow hold: compiles, but fits NO."""
    target = ipujax.Target.bow()
    elements = 2 * target.tiles_per_ipu * target.bytes_per_tile // 4
    return (lambda x: x * 2.0), (jax.ShapeDtypeStruct((elements,), jnp.float32),)


not_callable = 42


def bad_shape() -> Any:
    return "not a tuple"


def _two_parameters(x: Any, w: Any) -> Any:
    return jnp.tanh(x @ w).sum()


def wrong_arity() -> tuple:
    """A step of two parameters given one argument."""
    return _two_parameters, (jax.ShapeDtypeStruct((6, 8), jnp.float32),)
