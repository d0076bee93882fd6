"""A transformer that scans over its stacked layers (flax `nn.scan`, equinox's idiom, `lax.scan`
by hand): `jax.jit`'s numbers on 1 IPU and on dp, tp and dp x tp meshes, its stacked weights
held as each IPU's split share, and nothing gathered whole."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ipujax
from tests.helpers import assert_trees_close, target

LAYERS, D, HEADS, BATCH, SEQ = 4, 64, 4, 8, 16


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return (rng.normal(size=(LAYERS, *shape)) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "qkv": normal(D, 3 * D),
        "out": normal(D, D),
        "up": normal(D, 4 * D),
        "down": normal(4 * D, D),
        "scale": np.ones((LAYERS, D), np.float32),
    }


def _norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * scale * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5)


def _block(x: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
    b, s, _ = x.shape
    q, k, v = jnp.split(_norm(x, p["scale"]) @ p["qkv"], 3, axis=-1)
    heads = lambda t: t.reshape(b, s, HEADS, D // HEADS)  # noqa: E731
    scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(D // HEADS)
    mask = jnp.tril(jnp.ones((s, s), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, heads(v)).reshape(b, s, D)
    x = x + attended @ p["out"]
    return x + jax.nn.gelu(_norm(x, p["scale"]) @ p["up"]) @ p["down"], None


def _loss(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    y, _ = jax.lax.scan(_block, x, params)
    return jnp.mean(y**2)


def _step(params: dict[str, jax.Array], x: jax.Array):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    return loss, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


# Megatron's split of each layer: qkv and up by columns, out and down by rows.
TP = {"qkv": P(None, None, "tp"), "out": P(None, "tp"), "up": P(None, None, "tp")}
TP |= {"down": P(None, "tp"), "scale": None}
MESHES = {
    "1": ((1,), ("ipu",), None, None),
    "dp4": ((4,), ("dp",), None, P("dp")),
    "tp4": ((4,), ("tp",), TP, None),
    "dp2xtp4": ((2, 4), ("dp", "tp"), TP, P("dp")),
}


def _jitted(name: str) -> ipujax.Jitted:
    shape, names, params, batch = MESHES[name]
    mesh = ipujax.make_mesh(shape, names, target=target(64))
    return ipujax.jit(_step, mesh=mesh, in_shardings=(params, batch))


def _x() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(BATCH, SEQ, D)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_a_scan_over_layers_equals_jax_jit(name: str) -> None:
    params, x = _params(), _x()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ipujax.ReplicationWarning)
        got = _jitted(name)(params, x)
    assert_trees_close(got, jax.jit(_step)(params, x), rtol=2e-5, atol=2e-6)


def test_each_ipu_holds_its_share_of_the_stacked_layers() -> None:
    """On tp=4 every weight but the scales is split four ways: each IPU's always-live bytes (the
    program's inputs) are about a quarter of one IPU's, not the whole."""
    params, x = _params(), _x()
    whole = sum(p.nbytes for p in params.values()) + x.nbytes
    split = sum(p.nbytes for k, p in params.items() if k != "scale") // 4
    share = split + params["scale"].nbytes + x.nbytes
    one = _jitted("1").lower(params, x).compile().cost_report()
    four = _jitted("tp4").lower(params, x).compile().cost_report()
    assert one.always_live[0].sum() >= whole
    per_ipu = four.always_live.sum(axis=1)
    assert per_ipu.shape == (4,)
    # The shares, plus constants; well under half the whole.
    assert np.all(per_ipu >= share) and np.all(per_ipu < share + 0.05 * whole)
