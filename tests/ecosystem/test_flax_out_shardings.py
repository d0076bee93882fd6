"""A flax transformer block trained with optax on dp2 x tp2, its params and optimizer state
split over tp in `in_shardings`: leaving `out_shardings` out costs what spelling them out does,
as jax.jit leaves results where the program puts them (the updated state stays on the IPUs)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import ipujax

D, SEQ, BATCH, HEADS = 64, 16, 8, 4
TX = optax.adamw(1e-3)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, use_bias=False)(h, h)
        h = nn.Dense(4 * D, name="up")(nn.LayerNorm()(x))
        return x + nn.Dense(D, name="down")(nn.gelu(h))


def _step(params: Any, opt: Any, x: jax.Array, target: jax.Array) -> tuple[Any, Any, Any]:
    def loss_fn(p: Any) -> jax.Array:
        return jnp.mean((Block().apply({"params": p}, x) - target) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = TX.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss


def _megatron(path: tuple, leaf: Any) -> P | None:
    """The MLP's kernels split over tp, column then row (Megatron); the rest left free."""
    names = {str(getattr(k, "key", k)) for k in path}
    if jnp.ndim(leaf) == 2 and "up" in names:
        return P(None, "tp")
    if jnp.ndim(leaf) == 2 and "down" in names:
        return P("tp", None)
    return None


def test_results_left_where_the_step_puts_them_cost_as_with_out_shardings() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, SEQ, D)).astype(np.float32)
    target = rng.normal(size=(BATCH, SEQ, D)).astype(np.float32)
    params = Block().init(jax.random.key(0), x)["params"]
    opt = TX.init(params)
    specs = (
        jax.tree_util.tree_map_with_path(_megatron, params),
        jax.tree_util.tree_map_with_path(_megatron, opt),
        P("dp"),
        P("dp"),
    )
    mesh = ipujax.make_mesh((2, 2), ("dp", "tp"))
    seconds = []
    for outs in (None, (specs[0], specs[1], None)):
        jitted = ipujax.jit(_step, mesh=mesh, in_shardings=specs, out_shardings=outs)
        compiled = jitted.lower(params, opt, x, target).compile()
        report = compiled.cost_report()
        seconds.append(report.seconds)
        # The batch comes in (each half to the two IPUs of its tp pair) and only the loss
        # leaves the device, 4 bytes from each IPU: the state stays on the IPUs.
        assert report.host_bytes == 2 * (x.nbytes + target.nbytes) + 4 * 4
    assert max(seconds) <= 1.15 * min(seconds)
    got = compiled(params, opt, x, target)
    want = jax.jit(_step)(params, opt, x, target)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
